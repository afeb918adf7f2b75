package projection_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// StoredError replaces the personal values of the payloads it is given,
// in each form an error text may quote them, and nothing else.
func TestStoredErrorRedactsPersonalValues(t *testing.T) {
	t.Parallel()
	p := projector.Personal{Subject: "customer", Fields: []string{"name", "email", "address", "age", "initials"}}
	data := json.RawMessage(`{"customer":"c-1","name":"Anna \"Nan\" Søre","email":"anna<x>@example.org",
		"address":{"street":"Long Road 12","zip":1234,"city":"Oslo"},"age":42,"initials":"AS","plan":"pro"}`)
	opened := []projection.Opened{{Personal: p, Data: data}}
	for _, tc := range []struct{ err, want string }{
		{`bad name Anna "Nan" Søre`, `bad name [personal:name]`},
		{fmt.Sprintf("bad name %q", `Anna "Nan" Søre`), `bad name "[personal:name]"`},
		{fmt.Sprintf("bad name %+q", `Anna "Nan" Søre`), `bad name "[personal:name]"`},
		{`payload {"name":"Anna \"Nan\" Søre","email":"anna\u003cx\u003e@example.org"}`, `payload {"name":"[personal:name]","email":"[personal:email]"}`},
		{fmt.Sprintf("wrapped %q", fmt.Sprintf("bad name %q", `Anna "Nan" Søre`)), fmt.Sprintf("wrapped %q", `bad name "[personal:name]"`)},
		{`no street Long Road 12 in 1234 Oslo`, `no street [personal:address] in [personal:address] [personal:address]`},
		// Short values (initials AS, age 42) are left: replaced, they would
		// take "AS" and "42" out of every text.
		{`AS is 42, plan pro`, `AS is 42, plan pro`},
		// A marker already in the text stays whole.
		{`was [personal:name]`, `was [personal:name]`},
		{`customer c-1`, `customer c-1`},
	} {
		if got := projection.StoredError(errors.New(tc.err), opened...); got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.err, got, tc.want)
		}
	}
	// The longest value first: a value inside another does not leave a
	// part of the other behind.
	p2 := projector.Personal{Subject: "customer", Fields: []string{"first", "full"}}
	d2 := json.RawMessage(`{"customer":"c-1","first":"Anna","full":"Anna Smith"}`)
	if got := projection.StoredError(errors.New("Anna Smith (Anna)"), projection.Opened{Personal: p2, Data: d2}); got != "[personal:full] ([personal:first])" {
		t.Errorf("nested values: %s", got)
	}
	// Redacting again (a saga's step failure, then its dead letter) changes
	// nothing, even where a value is part of a marker.
	p3 := projector.Personal{Subject: "customer", Fields: []string{"note"}}
	d3 := json.RawMessage(`{"customer":"c-1","note":"note"}`)
	once := projection.RedactError(errors.New("bad note"), projection.Opened{Personal: p3, Data: d3})
	if got := projection.StoredError(once, projection.Opened{Personal: p3, Data: d3}); got != "bad [personal:note]" {
		t.Errorf("twice: %s", got)
	}
	sentinel := errors.New("sentinel")
	if err := projection.RedactError(fmt.Errorf("Anna Smith: %w", sentinel), projection.Opened{Personal: p2, Data: d2}); !errors.Is(err, sentinel) || err.Error() != "[personal:full]: sentinel" {
		t.Errorf("redacted error: %v, is sentinel %v", err, errors.Is(err, sentinel))
	}
	// Replaced before the cut: no prefix of a value is left at the end.
	long := strings.Repeat("x", projection.MaxErrorBytes-5) + " Anna Smith"
	if got := projection.StoredError(errors.New(long), projection.Opened{Personal: p2, Data: d2}); strings.Contains(got, "Anna") {
		t.Errorf("cut: %s", got[len(got)-40:])
	}
}

// A handler that quotes a customer's personal fields in its error (the
// common fmt.Errorf("... %q", c.Name)) had the values stored whole in the
// dead letter, the park and the shard's last_error, where a forget does not
// reach them and the console, `parked show` and `dead-letters show` print
// them (promise 19). They hold markers now, and after the forget no text
// or JSON column of the schema holds anything of the values.
func TestHandlerErrorsKeepNoPersonalValues(t *testing.T) {
	t.Parallel()
	types := testevents.NewPersonal()
	master, err := postgres.NewMasterKey("k1", testevents.MasterKey("one"))
	if err != nil {
		t.Fatal(err)
	}
	store := pgtest.Store(t, types.Registry, postgres.Config{MasterKey: master})
	e := &env{t: t, ctx: context.Background(), schema: store.Schema(), store: store}
	const subject = "c-7"
	c := testevents.CustomerRegistered{Customer: subject, Name: `SECRETNAME "Ann" Ø`, Email: "SECRET<MAIL>&x.io", Plan: "pro"}
	failing := func(ctx context.Context, tx pgx.Tx, ev projector.Event, c testevents.CustomerRegistered) error {
		if ev.Forgotten {
			return nil
		}
		doc, err := json.Marshal(c)
		if err != nil {
			return err
		}
		return fmt.Errorf("cannot take %q (ascii %+q), document %s, mail %s", c.Name, c.Name, doc, c.Email)
	}
	consumer := func(name string, mode projection.ErrorMode, attempts int) *projection.Async {
		p := projection.NewAsync(name, projection.AsyncConfig{ErrorMode: mode, MaxAttempts: attempts, RetryBackoff: 20 * time.Millisecond})
		must(projection.On(p, types.Registered, failing))
		return p
	}
	deadLettering, parking := consumer("dead_lettering", projection.SkipApplyErrors, 1), consumer("parking", projection.ParkStream, 1)
	// Per-event spans record the handler's error and are exported: they
	// hold markers too (they recorded the raw error).
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	e.dispatcher(projection.Config{Projections: []*projection.Async{deadLettering, parking, consumer("halting", projection.HaltOnError, 1000)},
		TracerProvider: tp, EventSpans: true})
	if err := pgx.BeginFunc(e.ctx, store.Pool(), func(tx pgx.Tx) error {
		_, err := store.Append(e.ctx, tx, projector.TenantStream("acme", "customer", subject), projector.AnyVersion, c)
		return err
	}); err != nil {
		t.Fatal(err)
	}

	var deadLetter, park int64
	texts := func() map[string]string {
		out := map[string]string{}
		dls, err := projection.ListDeadLetters(e.ctx, store, projection.DeadLetterFilter{Consumer: "dead_lettering"})
		if err != nil {
			t.Fatal(err)
		}
		for _, dl := range dls {
			out["dead letter"], deadLetter = dl.Error, dl.ID
		}
		parks, err := projection.ListParks(e.ctx, store, projection.ParkFilter{Consumer: "parking"})
		if err != nil {
			t.Fatal(err)
		}
		for _, pk := range parks {
			out["park"], park = pk.Error, pk.ID
		}
		var last string
		if err := store.Pool().QueryRow(e.ctx, `SELECT coalesce(last_error, '') FROM `+e.table("projector_consumers")+
			` WHERE name = 'halting'`).Scan(&last); err == nil && last != "" {
			out["last_error"] = last
		}
		return out
	}
	var got map[string]string
	pgtest.Eventually(t, time.Minute, "a dead letter, a park and a last_error", func() bool {
		got = texts()
		return len(got) == 3
	})
	check := func(where, text string) {
		t.Helper()
		if strings.Contains(text, "SECRET") || !strings.Contains(text, `"[personal:name]"`) || !strings.Contains(text, "mail [personal:email]") ||
			!strings.Contains(text, `{"customer":"c-7","name":"[personal:name]","email":"[personal:email]","plan":"pro"}`) {
			t.Errorf("%s: %s; want the values replaced by markers, the rest kept", where, text)
		}
	}
	for where, text := range got {
		check(where, text)
	}
	spansWithError := 0
	for _, sp := range rec.Ended() {
		if sp.Status().Code == codes.Error {
			spansWithError++
		}
		texts := []string{sp.Status().Description}
		for _, ev := range sp.Events() {
			for _, a := range ev.Attributes {
				texts = append(texts, a.Value.String())
			}
		}
		for _, text := range texts {
			if strings.Contains(text, "SECRET") {
				t.Errorf("span %s records a personal value: %s", sp.Name(), text)
			}
		}
	}
	if spansWithError == 0 {
		t.Error("no span recorded the handlers' failures")
	}
	// An operator's retry that fails again records its error, and returns
	// it, the same way.
	dlRes, err := projection.RetryDeadLetter(e.ctx, store, deadLettering, deadLetter, nil)
	if err != nil {
		t.Fatal(err)
	}
	pkRes, err := projection.RetryPark(e.ctx, store, parking, park, "tester", nil)
	if err != nil {
		t.Fatal(err)
	}
	check("dead letter retry", dlRes.Error)
	check("park retry", pkRes.Error)
	got = texts()
	for _, where := range []string{"dead letter", "park"} {
		if !strings.HasPrefix(got[where], "retry: ") {
			t.Errorf("%s after a failed retry: %s", where, got[where])
		}
		check(where+" after a failed retry", got[where])
	}

	if _, err := store.Forget(e.ctx, postgres.SubjectRef{Tenant: "acme", ID: subject}); err != nil {
		t.Fatal(err)
	}
	// Every text, JSON and character column of every table of the schema,
	// as pg_dump would write them out.
	rows, err := store.Pool().Query(e.ctx, `SELECT table_name, column_name FROM information_schema.columns
		WHERE table_schema = $1 AND data_type IN ('text', 'jsonb', 'json', 'character varying', 'character', 'ARRAY')`, store.Schema())
	if err != nil {
		t.Fatal(err)
	}
	columns, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ Table, Column string }])
	if err != nil || len(columns) == 0 {
		t.Fatalf("columns: %v, %v", columns, err)
	}
	for _, col := range columns {
		var n int
		if err := store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+e.table(col.Table)+` WHERE `+pgx.Identifier{col.Column}.Sanitize()+
			`::text LIKE '%SECRET%'`).Scan(&n); err != nil {
			t.Fatalf("%s.%s: %v", col.Table, col.Column, err)
		}
		if n > 0 {
			t.Errorf("%s.%s: %d rows hold a personal value of the forgotten subject", col.Table, col.Column, n)
		}
	}
}
