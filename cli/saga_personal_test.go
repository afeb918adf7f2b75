package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/postgres"
)

type welcomeState struct {
	Customer string `json:"customer"`
	Name     string `json:"name"`
	Email    string `json:"email"`
	Plan     string `json:"plan"`
}

// `saga show` opens a state's sealed personal fields with the master key
// and the wired saga's declaration, says a forgotten subject was
// forgotten, and without the key, with another key or without the saga's
// wiring shows each sealed field as "(sealed)" and why, never the
// envelope. Not parallel: it sets the environment.
func TestSagaShowOpensPersonalState(t *testing.T) {
	ctx := context.Background()
	types := testevents.NewPersonal()
	k1, err := postgres.NewMasterKey("k1", testevents.MasterKey("one"))
	if err != nil {
		t.Fatal(err)
	}
	store := pgtest.Store(t, types.Registry, postgres.Config{MasterKey: k1})
	s := saga.New[welcomeState]("welcome", saga.Config{Personal: projector.Personal{Subject: "customer", Fields: []string{"name", "email"}}})
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
		err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
			_, err := store.Append(ctx, tx, projector.TenantStream("acme", "customer", c.Customer), projector.NoStream, c)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	p, err := s.Projection(store)
	if err != nil {
		t.Fatal(err)
	}
	caughtUpDispatcher(t, store, p)
	if _, err := store.Forget(ctx, postgres.SubjectRef{Tenant: "acme", ID: "c-2"}); err != nil {
		t.Fatal(err)
	}
	wired := Config{Registry: types.Registry, Wire: func(string) (Wiring, error) {
		return Wiring{Sagas: func(*postgres.Store) ([]saga.Definition, error) { return []saga.Definition{s}, nil }}, nil
	}}
	run := func(cfg Config, args ...string) (string, int) {
		root := New(cfg)
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(append(args, "--database-url", pgtest.URL(t), "--schema", store.Schema()))
		err := root.ExecuteContext(ctx)
		if err != nil {
			out.WriteString(message(err) + "\n")
		}
		return out.String(), ExitCode(err)
	}
	key := func(id, seed string) string {
		return id + ":" + base64.StdEncoding.EncodeToString(testevents.MasterKey(seed))
	}
	for _, c := range []struct {
		name, master string
		cfg          Config
		args         []string
		want, never  []string
	}{
		{"opened", key("k1", "one"), wired, []string{"c-1"},
			[]string{"opened: fields name, email of subject c-1", `"name": "Ada Lovelace"`, `"email": "ada@example.com"`, `"plan": "pro"`}, nil},
		{"opened, json", key("k1", "one"), wired, []string{"c-1", "-o", "json"},
			[]string{`"personal": "opened: fields name, email of subject c-1"`, `Ada Lovelace`}, nil},
		{"forgotten", key("k1", "one"), wired, []string{"c-2"},
			[]string{"forgotten: subject c-2 was forgotten", `"name": null`, `"plan": "free"`}, []string{"Grace", "grace@"}},
		{"no master key", "", wired, []string{"c-1"},
			[]string{`"name": "(sealed)"`, "sealed, not shown: no master key (set PROJECTOR_MASTER_KEY", `"plan": "pro"`}, []string{"Ada", "ada@"}},
		{"another master key", key("k2", "two"), wired, []string{"c-1"},
			[]string{`"email": "(sealed)"`, "sealed, not shown: master key changed"}, []string{"Ada", "ada@"}},
		{"not wired", key("k1", "one"), Config{Registry: types.Registry}, []string{"c-1"},
			[]string{`"name": "(sealed)"`, "does not wire saga welcome"}, []string{"Ada", "ada@"}},
	} {
		t.Setenv(postgres.MasterKeyEnv, c.master)
		out, code := run(c.cfg, append([]string{"saga", "show", "welcome", "--tenant", "acme"}, c.args...)...)
		if code != ExitOK {
			t.Errorf("%s: exit %d:\n%s", c.name, code, out)
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: no %q in:\n%s", c.name, w, out)
			}
		}
		for _, n := range append(c.never, "pjx1.", "pjx2.") {
			if strings.Contains(out, n) {
				t.Errorf("%s: %q in:\n%s", c.name, n, out)
			}
		}
	}
}

// `run` in a binary whose registry declares personal fields refuses to
// start without a master key (exit 2, naming the types) rather than
// failing every event it meets; the inspecting commands still run.
func TestRunRefusesWithoutMasterKey(t *testing.T) {
	t.Setenv(postgres.MasterKeyEnv, "")
	types := testevents.NewPersonal()
	store := pgtest.Store(t, types.Registry, postgres.Config{AllowNoMasterKey: true})
	s := saga.New[welcomeState]("welcome", saga.Config{Personal: projector.Personal{Subject: "customer", Fields: []string{"name", "email"}}})
	if err := saga.StartOn(s, types.Registered, func(_ projector.Event, e testevents.CustomerRegistered) string { return e.Customer },
		func(_ context.Context, in *saga.Instance[welcomeState], _ projector.Event, e testevents.CustomerRegistered) error {
			return nil
		}); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Registry: types.Registry, Wire: func(string) (Wiring, error) {
		return Wiring{Sagas: func(*postgres.Store) ([]saga.Definition, error) { return []saga.Definition{s}, nil }}, nil
	}}
	for _, c := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"run"}, ExitUsage, "no master key for personal data (set PROJECTOR_MASTER_KEY): event types customer.registered declare personal fields"},
		{[]string{"status"}, ExitOK, ""},
	} {
		root := New(cfg)
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(append(c.args, "--database-url", pgtest.URL(t), "--schema", store.Schema()))
		// Bounded: a run that started would run until cancelled.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := root.ExecuteContext(ctx)
		cancel()
		if err != nil {
			out.WriteString(message(err) + "\n")
		}
		if code := ExitCode(err); code != c.code || !strings.Contains(out.String(), c.out) {
			t.Errorf("%q: exit %d, want %d with %q:\n%s", c.args, code, c.code, c.out, out.String())
		}
	}
}
