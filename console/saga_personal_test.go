package console_test

import (
	"context"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/console"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/postgres"
)

type welcomeState struct {
	Customer string `json:"customer"`
	Name     string `json:"name"`
	Email    string `json:"email"`
	Plan     string `json:"plan"`
}

// TestSagaPageOpensPersonalState: with payloads shown, a saga instance's
// page opens its state's sealed personal fields with the store's master
// key and the saga's declaration (Config.SagaPersonal), says a forgotten
// subject was forgotten, and without the declaration or the master key
// shows each sealed field as "(sealed)" and why — never the envelope, as
// `projector saga show` does.
func TestSagaPageOpensPersonalState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.NewPersonal()
	k1, err := postgres.NewMasterKey("k1", testevents.MasterKey("one"))
	if err != nil {
		t.Fatal(err)
	}
	store := pgtest.Store(t, types.Registry, postgres.Config{MasterKey: k1})
	personal := projector.Personal{Subject: "customer", Fields: []string{"name", "email"}}
	s := saga.New[welcomeState]("welcome", saga.Config{Personal: personal})
	if err := saga.StartOn(s, types.Registered, func(_ projector.Event, e testevents.CustomerRegistered) string { return e.Customer },
		func(_ context.Context, in *saga.Instance[welcomeState], _ projector.Event, e testevents.CustomerRegistered) error {
			in.State = welcomeState{Customer: e.Customer, Name: e.Name, Email: e.Email, Plan: e.Plan}
			return nil
		}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []testevents.CustomerRegistered{
		{Customer: "c-1", Name: "Ada Lovelace", Email: "ada@example.com", Plan: "pro"},
		{Customer: "c-2", Name: "Grace Hopper", Email: "grace@example.com", Plan: "free"},
	} {
		if err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
			_, err := store.Append(ctx, tx, projector.TenantStream("acme", "customer", c.Customer), projector.NoStream, c)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	p, err := s.Projection(store)
	if err != nil {
		t.Fatal(err)
	}
	d, err := projection.New(projection.Config{Store: store, Projections: []*projection.Async{p}, PollMax: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stop, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := d.Stop(stop); err != nil {
			t.Error(err)
		}
	})
	catchUp, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(catchUp); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Forget(ctx, postgres.SubjectRef{Tenant: "acme", ID: "c-2"}); err != nil {
		t.Fatal(err)
	}
	keyless, err := postgres.New(ctx, store.Pool(), postgres.Config{Schema: store.Schema(), Registry: types.Registry, AllowNoMasterKey: true})
	if err != nil {
		t.Fatal(err)
	}
	page := func(cfg console.Config, subject string) string {
		t.Helper()
		cfg.ShowPayloads = true
		c, err := console.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(c)
		defer srv.Close()
		in, err := saga.Show(ctx, store, "welcome", "acme", subject)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.Get(srv.URL + "/sagas/welcome/" + in.ID.String())
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("instance page of %s: %d %v\n%s", subject, resp.StatusCode, err, b)
		}
		return html.UnescapeString(string(b))
	}
	declared := map[string]projector.Personal{"welcome": personal}
	for _, c := range []struct {
		name, subject string
		cfg           console.Config
		want, never   []string
	}{
		{"opened", "c-1", console.Config{Store: store, SagaPersonal: declared},
			[]string{`id="state-note"`, "opened: fields name, email of subject c-1", `"name": "Ada Lovelace"`, `"email": "ada@example.com"`}, nil},
		{"forgotten", "c-2", console.Config{Store: store, SagaPersonal: declared},
			[]string{"forgotten: subject c-2 was forgotten", `"name": null`, `"plan": "free"`}, []string{"Grace", "grace@"}},
		{"not declared", "c-1", console.Config{Store: store},
			[]string{`"name": "(sealed)"`, "not given saga welcome's personal declaration", `"plan": "pro"`}, []string{"Ada", "ada@"}},
		{"no master key", "c-1", console.Config{Store: keyless, SagaPersonal: declared},
			[]string{`"email": "(sealed)"`, "sealed, not shown: no master key"}, []string{"Ada", "ada@"}},
	} {
		got := page(c.cfg, c.subject)
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: no %q in the page:\n%s", c.name, w, got)
			}
		}
		for _, n := range append(c.never, "pjx1.", "pjx2.") {
			if strings.Contains(got, n) {
				t.Errorf("%s: %q in the page:\n%s", c.name, n, got)
			}
		}
	}
	if _, err := console.New(console.Config{Store: store, SagaPersonal: map[string]projector.Personal{"welcome": {}}}); err == nil {
		t.Error("a SagaPersonal declaration without a Subject was accepted")
	}
}
