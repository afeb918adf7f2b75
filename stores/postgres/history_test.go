package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// seedLog appends n events to f's store: streams of perStream events over
// two tenants and the system tenant, some with causation, actor and
// headers, in appends of several events each.
func seedLog(t *testing.T, f fixture, n, perStream int) {
	t.Helper()
	const perAppend, perTx = 50, 5000
	for base := 0; base < n; base += perTx {
		// Several transactions, as a real log has.
		err := pgx.BeginFunc(f.ctx, f.store.Pool(), func(tx pgx.Tx) error {
			for i := base; i < min(base+perTx, n); i += perAppend {
				s := i / perStream
				tenant := []string{projector.SystemTenant, "acme", "globex"}[s%3]
				stream := projector.TenantStream(tenant, "ticket", fmt.Sprintf("t-%d", s))
				ctx := f.ctx
				if s%7 == 0 {
					ctx = projector.WithActor(projector.WithHeader(ctx, "source", "seed"), "agent-7")
				}
				payloads := make([]any, 0, perAppend)
				for j := range perAppend {
					if (i+j)%perStream == 0 {
						payloads = append(payloads, testevents.TicketOpened{Title: fmt.Sprintf("ticket <%d> & co", s), Customer: "c@example.com"})
					} else {
						payloads = append(payloads, testevents.TicketCommented{Body: "hello", N: i + j})
					}
				}
				if _, err := f.store.Append(ctx, tx, stream, projector.AnyVersion, payloads...); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("seed: %v", err)
		}
	}
}

// logDifference counts the rows in which two schemas' logs differ, event
// by event in log order, comparing everything but the log position.
func logDifference(t *testing.T, f fixture, a, b string) int64 {
	t.Helper()
	q := func(schema string) string {
		return `SELECT row_number() OVER (ORDER BY tx_id, seq) AS n, id, tenant_id, stream_type, stream_id, version, type,
			schema_version, data, correlation_id, causation_id, actor, headers, recorded_at FROM ` + pgx.Identifier{schema, "projector_events"}.Sanitize()
	}
	var diff int64
	err := f.store.Pool().QueryRow(f.ctx, `SELECT count(*) FROM (`+q(a)+`) x FULL JOIN (`+q(b)+`) y USING (n)
		WHERE x IS DISTINCT FROM y`).Scan(&diff)
	if err != nil {
		t.Fatal(err)
	}
	var heads int64
	err = f.store.Pool().QueryRow(f.ctx, `SELECT count(*) FROM (SELECT tenant_id, stream_type, stream_id, version FROM `+pgx.Identifier{a, "projector_streams"}.Sanitize()+`) x
		FULL JOIN (SELECT tenant_id, stream_type, stream_id, version FROM `+pgx.Identifier{b, "projector_streams"}.Sanitize()+`) y
		USING (tenant_id, stream_type, stream_id) WHERE x.version IS DISTINCT FROM y.version`).Scan(&heads)
	if err != nil {
		t.Fatal(err)
	}
	return diff + heads
}

// TestHistory_RoundTrip100k exports 100k events of many streams, tenants
// and transactions, imports them into an empty schema and compares the two
// logs row by row. Under the race detector (make test) it runs 20k events
// in 3 batches; make test-short runs the full 100k in 15.
func TestHistory_RoundTrip100k(t *testing.T) {
	t.Parallel()
	n, batches := 100_000, 15
	if raceEnabled {
		n, batches = 20_000, 3
	}
	src := setup(t)
	start := time.Now()
	seedLog(t, src, n, 100)
	t.Logf("seeded in %s", time.Since(start))
	start = time.Now()

	var file bytes.Buffer
	exp, err := src.store.Export(src.ctx, &file, postgres.ExportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if exp.Events != int64(n) {
		t.Fatalf("exported %d events, want %d", exp.Events, n)
	}

	t.Logf("exported in %s", time.Since(start))
	start = time.Now()
	dst := pgtest.Store(t, src.types.Registry)
	res, err := dst.Import(src.ctx, bytes.NewReader(file.Bytes()), postgres.ImportOptions{BatchSize: 7_000})
	if err != nil {
		t.Fatal(err)
	}
	if res.Imported != int64(n) || res.Skipped != 0 || res.Batches != batches {
		t.Fatalf("import: %+v, want %d imported in %d batches", res, n, batches)
	}
	t.Logf("imported in %s", time.Since(start))
	start = time.Now()
	if d := logDifference(t, src, src.store.Schema(), dst.Schema()); d != 0 {
		t.Fatalf("the imported log differs from the exported one in %d rows", d)
	}
	t.Logf("compared in %s", time.Since(start))

	// A consumer of the imported log reads every event once, in the file's
	// order. The import's events are read once the horizon passes them: a
	// transaction another test holds open on the server holds it back, so
	// a short batch before all of them are read is polled again, as a
	// consumer would, and one read past the last must find nothing more.
	var read int64
	ids := map[uuid.UUID]bool{}
	after := projector.Start
	deadline := time.Now().Add(time.Minute)
	for {
		b, err := dst.ReadLog(src.ctx, postgres.LogQuery{After: after, Limit: 5000, Raw: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range b.Events {
			if ids[ev.ID] {
				t.Fatalf("event %s read twice", ev.ID)
			}
			ids[ev.ID] = true
			read++
		}
		after = b.Next(after)
		if b.Full {
			continue
		}
		if read >= int64(n) {
			break
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not synchronisation
	}
	if read != int64(n) {
		t.Fatalf("a consumer read %d imported events, want %d", read, n)
	}
	// Running an import again is TestHistory_ImportCrashResumes and
	// TestHistory_ImportFailingBatchWritesNothing; at 100k events it would
	// double this test's time.
}

// historyFile writes a header and the given event lines.
func historyFile(lines ...string) string {
	return `{"format":"projector.history","version":1}` + "\n" + strings.Join(lines, "\n") + "\n"
}

// eventLine is one event line of a history file.
func eventLine(stream string, version int64, typ, payload string) string {
	return eventLineID(uuid.NewString(), stream, version, typ, payload)
}

func eventLineID(id, stream string, version int64, typ, payload string) string {
	return fmt.Sprintf(`{"stream":{"tenant":"acme","type":"ticket","id":%q},"version":%d,"type":%q,"schema_version":1,"id":%q,`+
		`"recorded_at":"2026-01-02T03:04:05.123456Z","payload":%s,"metadata":{}}`, stream, version, typ, id, payload)
}

func countEvents(t *testing.T, f fixture) int64 {
	t.Helper()
	var n int64
	if err := f.store.Pool().QueryRow(f.ctx, `SELECT count(*) FROM `+f.store.Table("projector_events")).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestHistory_ImportBadInput(t *testing.T) {
	t.Parallel()
	opened := `{"title":"x"}`
	dupID := uuid.NewString()
	tests := []struct {
		name string
		file string
		line int // 0: no line number expected
		want string
	}{
		{"empty file", "", 0, "no header"},
		{"not a header", eventLine("a", 1, "ticket.opened", opened) + "\n", 1, "not a history header"},
		{"newer format", `{"format":"projector.history","version":2}` + "\n", 1, "format version 2"},
		{"not JSON", historyFile(eventLine("a", 1, "ticket.opened", opened), "{nope"), 3, "invalid character"},
		{"two values on a line", historyFile(eventLine("a", 1, "ticket.opened", opened) + ` {}`), 2, "after top-level value"},
		{"missing field", historyFile(strings.Replace(eventLine("a", 1, "ticket.opened", opened), `"schema_version":1`, `"schema_verison":1`, 1)), 2, "schema_version 0"},
		{"undefined type", historyFile(eventLine("a", 1, "ticket.opened", opened), eventLine("a", 2, "ticket.exploded", `{}`)), 3, "never defined"},
		{"payload not JSON", historyFile(eventLine("a", 1, "ticket.opened", opened), eventLine("a", 2, "ticket.closed", `{"reason":"x",}`)), 3, "invalid character '}'"},
		{"payload not JSON, of a type it would decode into", historyFile(eventLine("a", 1, "ticket.commented", `{"body":"x"}x`)), 2, "invalid character 'x' after object key:value pair"},
		{"invalid payload", historyFile(eventLine("a", 1, "ticket.opened", `{"title":""}`)), 2, "title is required"},
		{"payload of the wrong shape", historyFile(eventLine("a", 1, "ticket.commented", `{"n":"seven"}`)), 2, "decode"},
		{"NUL in payload", historyFile(eventLine("a", 1, "ticket.commented", `{"body":"a\u0000b"}`)), 2, "NUL"},
		{"version gap in the file", historyFile(eventLine("a", 1, "ticket.opened", opened), eventLine("a", 3, "ticket.closed", `{}`)), 3, "follows version 1"},
		{"version gap in the log", historyFile(eventLine("b", 2, "ticket.opened", opened)), 2, "would leave a gap"},
		{"repeated id", historyFile(eventLineID(dupID, "a", 1, "ticket.opened", opened), eventLineID(dupID, "b", 1, "ticket.opened", opened)), 3, "repeats line 2"},
		{"version zero", historyFile(eventLine("a", 0, "ticket.opened", opened)), 2, "version 0"},
		{"no payload", historyFile(eventLine("a", 1, "ticket.opened", `null`)), 2, "no payload"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			_, err := f.store.Import(f.ctx, strings.NewReader(tt.file), postgres.ImportOptions{})
			if err == nil {
				t.Fatal("import succeeded")
			}
			if !errors.Is(err, postgres.ErrInvalidHistory) && !errors.Is(err, projector.ErrUnknownEventType) && !errors.Is(err, projector.ErrInvalidPayload) {
				t.Errorf("error %v matches none of the sentinels", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not say %q", err, tt.want)
			}
			var le *postgres.HistoryLineError
			if tt.line > 0 && (!errors.As(err, &le) || le.Line != tt.line) {
				t.Errorf("error %v: want line %d", err, tt.line)
			}
			if got := countEvents(t, f); got != 0 {
				t.Errorf("%d events written", got)
			}
		})
	}
}

func TestHistory_ImportFailingBatchWritesNothing(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var lines []string
	for i := 1; i <= 25; i++ {
		lines = append(lines, eventLine("a", int64(i), "ticket.commented", `{"body":"b"}`))
	}
	lines[22] = eventLine("a", 23, "ticket.opened", `{"title":""}`) // line 24 of the file
	res, err := f.store.Import(f.ctx, strings.NewReader(historyFile(lines...)), postgres.ImportOptions{BatchSize: 10})
	var le *postgres.HistoryLineError
	if !errors.As(err, &le) || le.Line != 24 {
		t.Fatalf("err %v: want a line 24 error", err)
	}
	if got := countEvents(t, f); got != 20 || res.Imported != 20 {
		t.Fatalf("%d events in the log, %d reported: want the two batches before the bad one (20)", got, res.Imported)
	}
	// Fixed and run again, the import continues where it stopped.
	lines[22] = eventLine("a", 23, "ticket.opened", `{"title":"fixed"}`)
	res, err = f.store.Import(f.ctx, strings.NewReader(historyFile(lines...)), postgres.ImportOptions{BatchSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	if got := countEvents(t, f); got != 25 || res.Imported != 5 {
		t.Fatalf("%d events in the log, %d imported: want 25 and 5", got, res.Imported)
	}
}

func TestHistory_ImportContinuesAppendedStreams(t *testing.T) {
	t.Parallel()
	f := setup(t)
	s := projector.TenantStream("acme", "ticket", "a")
	first := f.appendTx(t, s, projector.NoStream, testevents.TicketOpened{Title: "x"}, testevents.TicketCommented{Body: "1"})
	other := uuid.NewString()
	file := historyFile(eventLine("a", 3, "ticket.commented", `{"body":"3"}`), eventLine("a", 4, "ticket.closed", `{}`))
	if _, err := f.store.Import(f.ctx, strings.NewReader(file), postgres.ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	// The head moved with the import: an append expecting version 4 works.
	res := f.appendTx(t, s, projector.ExactVersion(4), testevents.TicketCommented{Body: "5"})
	if res.Version != 5 {
		t.Fatalf("version %d after import and append, want 5", res.Version)
	}
	events, err := f.store.ReadStream(f.ctx, s, postgres.StreamQuery{})
	if err != nil {
		t.Fatal(err)
	}
	for i, ev := range events {
		if ev.Version != int64(i+1) || (i > 0 && !events[i-1].Position.Less(ev.Position)) {
			t.Fatalf("event %d: version %d at %s: versions and log order disagree", i, ev.Version, ev.Position)
		}
	}
	// An event already in the log at another place is named by its line.
	file = historyFile(eventLine("b", 1, "ticket.closed", `{}`), eventLineID(first.Events[0].ID.String(), "c", 1, "ticket.closed", `{}`))
	_, err = f.store.Import(f.ctx, strings.NewReader(file), postgres.ImportOptions{})
	var le *postgres.HistoryLineError
	if !errors.As(err, &le) || le.Line != 3 || !strings.Contains(err.Error(), "already in the log, at acme/ticket/a version 1") {
		t.Fatalf("err %v: want line 3, id already in the log at acme/ticket/a version 1", err)
	}
	// A different event at a version the stream has is refused.
	file = historyFile(eventLineID(other, "a", 2, "ticket.closed", `{}`))
	if _, err = f.store.Import(f.ctx, strings.NewReader(file), postgres.ImportOptions{}); !errors.As(err, &le) || le.Line != 2 {
		t.Fatalf("err %v: want line 2, version taken", err)
	}
	if got := countEvents(t, f); got != 5 {
		t.Fatalf("%d events, want 5", got)
	}
}

func TestHistory_ExportFiltersAndRedacts(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.appendTx(t, projector.TenantStream("acme", "ticket", "a"), projector.NoStream, testevents.TicketOpened{Title: "x", Customer: "ann@example.com"})
	f.appendTx(t, projector.TenantStream("globex", "ticket", "b"), projector.NoStream, testevents.TicketOpened{Title: "y", Customer: "bob@example.com"})
	f.appendTx(t, projector.TenantStream("acme", "user", "u"), projector.NoStream, testevents.TicketClosed{})
	// A transaction still open when the export starts is left out whole.
	open, err := f.store.Pool().Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback(f.ctx)
	if _, err := f.store.Append(f.ctx, open, projector.TenantStream("acme", "ticket", "late"), projector.NoStream, testevents.TicketOpened{Title: "late"}); err != nil {
		t.Fatal(err)
	}
	redact, err := postgres.RedactFields([]string{"customer"})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	res, err := f.store.Export(f.ctx, &out, postgres.ExportOptions{Tenant: "acme", StreamTypes: []string{"ticket"}, Redact: redact})
	if err != nil {
		t.Fatal(err)
	}
	if res.Events != 1 {
		t.Fatalf("exported %d events, want 1:\n%s", res.Events, out.String())
	}
	dec := postgres.NewHistoryDecoder(&out)
	var h postgres.HistoryEvent
	if err := dec.Next(&h); err != nil {
		t.Fatal(err)
	}
	if h.Stream.ID != "a" || string(h.Payload) != `{"customer":"","title":"x"}` {
		t.Fatalf("exported %+v (payload %s), want stream a with the customer redacted", h, h.Payload)
	}
	// A second export after the first one's horizon holds only what
	// committed since: the open transaction's event, once it commits.
	if err := open.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	var next bytes.Buffer
	if res, err = f.store.Export(f.ctx, &next, postgres.ExportOptions{After: res.Horizon}); err != nil || res.Events != 1 || !strings.Contains(next.String(), `"late"`) {
		t.Fatalf("export after the first one: %+v, %v:\n%s", res, err, next.String())
	}
	var none bytes.Buffer
	if res, err = f.store.Export(f.ctx, &none, postgres.ExportOptions{From: time.Now().Add(time.Hour)}); err != nil || res.Events != 0 {
		t.Fatalf("export from the future: %+v, %v", res, err)
	}
	if _, err := postgres.NewHistoryDecoder(&none).Header(); err != nil {
		t.Fatalf("an empty export is not a valid file: %v", err)
	}
}

func FuzzHistoryDecoder(f *testing.F) {
	f.Add([]byte(historyFile(eventLine("a", 1, "ticket.opened", `{"title":"x"}`))))
	f.Add([]byte(historyFile(`{"stream":{"tenant":"t","type":"s","id":"i"},"version":1,"type":"x","schema_version":1,` +
		`"id":"0190a4c8-0000-7000-8000-000000000001","recorded_at":"2026-01-01T00:00:00Z","payload":[1,"\u00e9"],` +
		`"metadata":{"correlation_id":"0190a4c8-0000-7000-8000-000000000002","actor":"a","headers":{"k":"v"}}}`)))
	f.Add([]byte(`{"format":"projector.history","version":1}` + "\n\n{}\n"))
	f.Add([]byte("\xff\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		dec := postgres.NewHistoryDecoder(bytes.NewReader(data))
		for range 100 {
			var h postgres.HistoryEvent
			if err := dec.Next(&h); err != nil {
				return
			}
			// Whatever decodes is valid, and encodes and decodes again to
			// the same event.
			var buf bytes.Buffer
			enc := postgres.NewHistoryEncoder(&buf)
			if err := enc.Encode(h); err != nil {
				t.Fatalf("re-encode %+v: %v", h, err)
			}
			if err := enc.Flush(); err != nil {
				t.Fatal(err)
			}
			var again postgres.HistoryEvent
			if err := postgres.NewHistoryDecoder(&buf).Next(&again); err != nil {
				t.Fatalf("re-decode %s: %v", buf.String(), err)
			}
			if !again.RecordedAt.Equal(h.RecordedAt) || again.ID != h.ID || again.Stream != h.Stream || again.Version != h.Version {
				t.Fatalf("round trip changed the event: %+v, then %+v", h, again)
			}
		}
	})
}

// TestHistory_ImportRacingAppend puts an append in the gap between the
// import's version check and its copy: the append's transaction is open,
// holding version 1 of the stream, when the import reads the stream at
// version 0 and copies its version 1. Exactly one wins: the append
// commits, the import fails with a concurrency error and writes nothing of
// its batch; run again, it names the line that no longer fits.
func TestHistory_ImportRacingAppend(t *testing.T) {
	t.Parallel()
	f := setup(t)
	s := projector.TenantStream("acme", "ticket", "a")
	tx, err := f.store.Pool().Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(f.ctx)
	if _, err := f.store.Append(f.ctx, tx, s, projector.NoStream, testevents.TicketOpened{Title: "appended"}); err != nil {
		t.Fatal(err)
	}
	file := historyFile(eventLine("b", 1, "ticket.opened", `{"title":"b"}`), eventLine("a", 1, "ticket.opened", `{"title":"imported"}`))
	done := make(chan error, 1)
	go func() {
		_, err := f.store.Import(f.ctx, strings.NewReader(file), postgres.ImportOptions{})
		done <- err
	}()
	// The import is in the gap once it waits on the appender's rows (the
	// stream head, which the import writes before its COPY, as an append
	// does).
	for deadline := time.Now().Add(30 * time.Second); ; {
		var waiting bool
		err := f.store.Pool().QueryRow(f.ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0)`, f.store.Schema()).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the import never waited on the append's rows")
		}
		time.Sleep(2 * time.Millisecond) // polling with a deadline
	}
	if err := tx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	err = <-done
	if !errors.Is(err, projector.ErrConcurrency) {
		t.Fatalf("import beside a racing append: %v, want a concurrency error", err)
	}
	if got := countEvents(t, f); got != 1 {
		t.Fatalf("%d events in the log, want only the append's", got)
	}
	_, err = f.store.Import(f.ctx, strings.NewReader(file), postgres.ImportOptions{})
	var le *postgres.HistoryLineError
	if !errors.As(err, &le) || le.Line != 3 {
		t.Fatalf("import again: %v, want line 3 (version 1 of a is another event)", err)
	}
}

// TestHistory_ImportAppliesInline imports into a store with an inline
// projection: it sees every imported event, in stream runs, with its log
// position, in the batch's transaction; a refusing one fails the batch
// with its line and writes nothing; WithoutInline skips it.
func TestHistory_ImportAppliesInline(t *testing.T) {
	t.Parallel()
	types := testevents.New()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	schema := pgtest.Schema(t)
	table := pgx.Identifier{schema, "counts"}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (stream_id text PRIMARY KEY, n int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	inline := &countInline{table: table}
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: types.Registry, Inline: []postgres.InlineProjection{inline}})
	if err != nil {
		t.Fatal(err)
	}
	f := fixture{ctx: ctx, types: types, store: store}
	var lines []string
	for v := 1; v <= 4; v++ {
		for _, s := range []string{"a", "b", "c"} {
			lines = append(lines, eventLine(s, int64(v), "ticket.commented", `{"body":"x"}`))
		}
	}
	file := historyFile(lines...)

	inline.fail.Store(true)
	_, err = store.Import(ctx, strings.NewReader(file), postgres.ImportOptions{BatchSize: 5})
	var le *postgres.HistoryLineError
	if !errors.As(err, &le) || le.Line != 2 || !strings.Contains(err.Error(), "inline projection") {
		t.Fatalf("import with a refusing inline projection: %v, want line 2", err)
	}
	if got := countEvents(t, f); got != 0 {
		t.Fatalf("%d events written beside a refusing inline projection", got)
	}

	inline.fail.Store(false)
	if _, err := store.Import(ctx, strings.NewReader(file), postgres.ImportOptions{BatchSize: 5}); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM `+table+` WHERE n = 4`); n != 3 {
		t.Fatalf("%d streams counted 4 events by the inline projection, want 3", n)
	}

	other := historyFile(eventLine("d", 1, "ticket.commented", `{"body":"x"}`))
	if _, err := store.Import(ctx, strings.NewReader(other), postgres.ImportOptions{WithoutInline: true}); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, pool, `SELECT count(*) FROM `+table+` WHERE stream_id = 'd'`); n != 0 {
		t.Fatal("WithoutInline applied the inline projection")
	}
}

// A payload holding bytes that are not UTF-8 (inside a JSON string, which
// json.Valid passes) is refused at its line, and nothing of its batch is
// written: PostgreSQL's refusal came back as a bare COPY error without the
// line (a hostile-input audit).
func TestHistory_ImportNamesTheLineOfAPayloadNotUTF8(t *testing.T) {
	t.Parallel()
	f := setup(t)
	file := historyFile(
		eventLine("u", 1, "ticket.opened", `{"title":"fine"}`),
		eventLine("u", 2, "ticket.commented", "{\"body\":\"a\xffb\"}"),
	)
	_, err := f.store.Import(f.ctx, strings.NewReader(file), postgres.ImportOptions{})
	var le *postgres.HistoryLineError
	if !errors.As(err, &le) || le.Line != 3 || !errors.Is(err, postgres.ErrInvalidHistory) || !strings.Contains(err.Error(), "not valid UTF-8") {
		t.Fatalf("err %v: want line 3, payload not valid UTF-8", err)
	}
	if got := countEvents(t, f); got != 0 {
		t.Fatalf("%d events written, want none of the failing batch", got)
	}
	// The same bytes in an actor or a header were imported as U+FFFD,
	// the log other than the file: refused at the line too.
	for _, meta := range []string{"{\"actor\":\"a\xffb\"}", "{\"headers\":{\"k\":\"v\xffw\"}}", "{\"headers\":{\"k\xff\":\"v\"}}"} {
		line := strings.Replace(eventLine("m", 1, "ticket.opened", `{"title":"fine"}`), `"metadata":{}`, `"metadata":`+meta, 1)
		_, err := f.store.Import(f.ctx, strings.NewReader(historyFile(line)), postgres.ImportOptions{})
		if !errors.As(err, &le) || le.Line != 2 || !strings.Contains(err.Error(), "not valid UTF-8") {
			t.Errorf("metadata %q: err %v, want line 2 not valid UTF-8", meta, err)
		}
	}
	if got := countEvents(t, f); got != 0 {
		t.Fatalf("%d events written, want none", got)
	}
}

// TestFieldRedactorCounts: each path counts the events it found its field
// in, an already empty field and an array's elements included, and a path
// that found none counts zero, whatever the other paths redacted.
func TestFieldRedactorCounts(t *testing.T) {
	t.Parallel()
	r, err := postgres.NewFieldRedactor([]string{"email", "ticket.email", "lines.sku"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{`{"email":"a@example.com"}`, `{"email":""}`, `{"lines":[{"sku":"x"},{"sku":"y"}]}`, `{"title":"t"}`} {
		h := postgres.HistoryEvent{Payload: []byte(p)}
		if err := r.Redact(&h); err != nil {
			t.Fatal(err)
		}
	}
	want := []postgres.PathCount{{Path: "email", Events: 2}, {Path: "ticket.email"}, {Path: "lines.sku", Events: 1}}
	if got := r.Matched(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("matched %v, want %v", got, want)
	}
}
