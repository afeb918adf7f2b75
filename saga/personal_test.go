package saga_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/postgres"
)

// welcomeState copies personal fields of the customer it welcomes.
type welcomeState struct {
	Customer string `json:"customer"`
	Name     string `json:"name"`
	Email    string `json:"email"`
	Plan     string `json:"plan"`
	Steps    int    `json:"steps"`
}

var welcomePersonal = projector.Personal{Subject: "customer", Fields: []string{"name", "email"}}

// newWelcome defines the "welcome" saga: a registration starts it (copying
// the name and e-mail into its state) and schedules "nudge"; a plain
// registration of the same customer and the nudge are further steps. seen
// records the name each later step found in the state.
func newWelcome(ty testevents.PersonalTypes, now func() time.Time, p projector.Personal) (*saga.Saga[welcomeState], func() []string) {
	var mu sync.Mutex
	var seen []string
	see := func(name string) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, name)
	}
	s := saga.New[welcomeState]("welcome", saga.Config{Now: now, Personal: p})
	must(saga.StartOn(s, ty.Registered, func(_ projector.Event, e testevents.CustomerRegistered) string { return e.Customer },
		func(_ context.Context, in *saga.Instance[welcomeState], _ projector.Event, e testevents.CustomerRegistered) error {
			in.State = welcomeState{Customer: e.Customer, Name: e.Name, Email: e.Email, Plan: e.Plan, Steps: in.State.Steps + 1}
			in.After("nudge", time.Hour)
			return nil
		}))
	must(saga.On(s, ty.Plain, func(_ projector.Event, e testevents.CustomerPlain) string { return e.Customer },
		func(_ context.Context, in *saga.Instance[welcomeState], _ projector.Event, _ testevents.CustomerPlain) error {
			see(in.State.Name)
			in.State.Steps++
			return nil
		}))
	must(saga.OnTimeout(s, "nudge", func(_ context.Context, in *saga.Instance[welcomeState], _ saga.Timeout) error {
		see(in.State.Name)
		in.State.Steps++
		return nil
	}))
	return s, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
}

// TestSagaStateSealsPersonalFields: a saga whose Config declares personal
// state fields stores them sealed under the subject's key, never in the
// clear, and its handlers see them opened; after the subject is forgotten
// the state row is unchanged, loads with zero values for those fields, and
// the instance keeps running (an event's step and a timeout's).
func TestSagaStateSealsPersonalFields(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ty := testevents.NewPersonal()
	master, err := postgres.NewMasterKey("k1", testevents.MasterKey("one"))
	if err != nil {
		t.Fatal(err)
	}
	store := pgtest.Store(t, ty.Registry, postgres.Config{MasterKey: master})
	e := &env{t: t, ctx: ctx, store: store}
	clk := newClock()
	s, seen := newWelcome(ty, clk.Now, welcomePersonal)
	d := e.dispatcher(s, projection.Config{})
	stream := projector.TenantStream("acme", "customer", "c-1")
	e.append(stream, testevents.CustomerRegistered{Customer: "c-1", Name: "Ada Lovelace", Email: "ada@example.com", Plan: "pro"})
	e.catchUp(d)
	raw := func() string {
		var st string
		if err := store.Pool().QueryRow(ctx, `SELECT state::text FROM `+store.Table("projector_saga_instances")+` WHERE saga = 'welcome'`).Scan(&st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	sealedRow := func(st string) {
		t.Helper()
		if strings.Contains(st, "Ada") || strings.Contains(st, "ada@") || !strings.Contains(st, `"plan": "pro"`) || !(strings.Contains(st, "pjx1.") || strings.Contains(st, "pjx2.")) {
			t.Fatalf("saga state %s: want name and e-mail sealed, the rest in the clear", st)
		}
	}
	sealedRow(raw())
	e.append(stream, testevents.CustomerPlain{Customer: "c-1"})
	e.catchUp(d)
	before := raw()
	sealedRow(before)
	if got := seen(); !slices.Equal(got, []string{"Ada Lovelace"}) {
		t.Fatalf("the step saw names %q, want the opened name", got)
	}
	if _, err := store.Forget(ctx, postgres.SubjectRef{Tenant: "acme", ID: "c-1"}); err != nil {
		t.Fatal(err)
	}
	if after := raw(); after != before {
		t.Fatalf("the forget rewrote the saga state: %s → %s", before, after)
	}
	e.append(stream, testevents.CustomerPlain{Customer: "c-1"})
	e.catchUp(d)
	clk.Advance(2 * time.Hour)
	if n := e.fire(e.runner(s)); n != 1 {
		t.Fatalf("fired %d timeouts, want 1", n)
	}
	if got := seen(); !slices.Equal(got, []string{"Ada Lovelace", "", ""}) {
		t.Fatalf("the steps saw names %q, want the name, then zero values after the forget", got)
	}
	st := raw()
	if strings.Contains(st, "Ada") || strings.Contains(st, "ada@") || !strings.Contains(st, `"steps": 4`) || !strings.Contains(st, `"plan": "pro"`) {
		t.Fatalf("saga state after the forget %s: want no personal data, four steps, the rest kept", st)
	}
	var status string
	if err := store.Pool().QueryRow(ctx, `SELECT status FROM `+store.Table("projector_saga_instances")).Scan(&status); err != nil || status != "active" {
		t.Fatalf("instance status %q (%v), want active", status, err)
	}
}

// TestSagaPersonalChecked: a saga's Personal declaration must name fields
// of its state, and a step may not put personal data in a state whose
// subject field is empty (it has no key to seal it under).
func TestSagaPersonalChecked(t *testing.T) {
	t.Parallel()
	ty := testevents.NewPersonal()
	for _, p := range []projector.Personal{
		{Subject: "customer", Fields: []string{"phone"}},
		{Subject: "steps", Fields: []string{"name"}},
		{Subject: "customer"},
		{Fields: []string{"name"}},
	} {
		s, _ := newWelcome(ty, time.Now, p)
		if err := s.Validate(ty.Registry); !errors.Is(err, saga.ErrInvalidDefinition) {
			t.Errorf("saga personal %+v: got %v, want ErrInvalidDefinition", p, err)
		}
	}
	s, _ := newWelcome(ty, time.Now, welcomePersonal)
	if err := s.Validate(ty.Registry); err != nil {
		t.Fatal(err)
	}
	ev := projector.Event{Type: "customer.registered", Stream: projector.TenantStream("acme", "customer", "c-2"),
		Payload: testevents.CustomerRegistered{Name: "Grace Hopper", Email: "grace@example.com"}}
	_, err := s.Decide(context.Background(), ty.Registry, saga.Snapshot[welcomeState]{Key: "k", Tenant: "acme"}, true, ev, time.Now())
	if !errors.Is(err, saga.ErrInvalidStep) {
		t.Fatalf("a personal name without a subject: got %v, want ErrInvalidStep", err)
	}
	ev.Payload = testevents.CustomerRegistered{Plan: "free"}
	if _, err := s.Decide(context.Background(), ty.Registry, saga.Snapshot[welcomeState]{Key: "k", Tenant: "acme"}, true, ev, time.Now()); err != nil {
		t.Fatalf("no subject and no personal data: %v", err)
	}
}

// ownerState is a saga state declaring a personal field, in a registry
// that declares none.
type ownerState struct {
	Owner string `json:"owner"`
	Title string `json:"title"`
}

// TestPersonalStateRefusedWithoutMasterKey: a saga whose state declares
// personal fields, on a store without a master key, fails when its
// consumer or its runner is built, as postgres.New fails for event types,
// rather than at its first step; a store allowed to run without one
// (AllowNoMasterKey) or with one builds both.
func TestPersonalStateRefusedWithoutMasterKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.New()
	store := pgtest.Store(t, types.Registry)
	s := saga.New[ownerState]("owners", saga.Config{Personal: projector.Personal{Subject: "owner", Fields: []string{"title"}}})
	must(saga.StartOn(s, types.Opened, saga.ByStream, func(_ context.Context, in *saga.Instance[ownerState], ev projector.Event, o testevents.TicketOpened) error {
		in.State = ownerState{Owner: ev.Stream.ID, Title: o.Title}
		return nil
	}))
	build := func(st *postgres.Store) []error {
		_, perr := s.Projection(st)
		_, rerr := saga.NewRunner(saga.RunnerConfig{Store: st, Sagas: []saga.Definition{s}})
		return []error{perr, rerr}
	}
	for i, err := range build(store) {
		if !errors.Is(err, postgres.ErrNoMasterKey) || !strings.Contains(err.Error(), `saga "owners"`) {
			t.Fatalf("build %d with personal state and no master key: %v", i, err)
		}
	}
	master, err := postgres.NewMasterKey("k1", testevents.MasterKey("one"))
	if err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]postgres.Config{
		"allowed":           {AllowNoMasterKey: true},
		"with a master key": {MasterKey: master},
	} {
		cfg.Schema, cfg.Registry = store.Schema(), types.Registry
		st, err := postgres.New(ctx, store.Pool(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, err := range build(st) {
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
	}
}
