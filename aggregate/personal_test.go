package aggregate_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/aggregate"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// Customer is an aggregate state that copies personal fields.
type Customer struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	Email   string `json:"email"`
	Plan    string `json:"plan"`
	Signups int    `json:"signups"`
}

func personalRepo(t *testing.T, snaps aggregate.Snapshots) (*aggregate.Repository[Customer], *postgres.Store, testevents.PersonalTypes) {
	t.Helper()
	types := testevents.NewPersonal()
	master, err := postgres.NewMasterKey("k1", testevents.MasterKey("one"))
	if err != nil {
		t.Fatal(err)
	}
	store := pgtest.Store(t, types.Registry, postgres.Config{MasterKey: master})
	r, err := aggregate.New(store, aggregate.Config[Customer]{Name: "customer", Logger: quiet, Snapshots: snaps,
		Folds: []aggregate.Fold[Customer]{aggregate.On(types.Registered, func(c *Customer, e testevents.CustomerRegistered) {
			c.ID, c.Name, c.Email, c.Plan = e.Customer, e.Name, e.Email, e.Plan
			c.Signups++
		})}})
	if err != nil {
		t.Fatal(err)
	}
	return r, store, types
}

// TestSnapshotSealsPersonalFields: an aggregate whose snapshots declare
// personal state fields stores them sealed under the subject's key, never
// in the clear; a load from the snapshot opens them; after the subject is
// forgotten, the snapshot row is unchanged and opens to zero values, as
// folding the forgotten events does.
func TestSnapshotSealsPersonalFields(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r, store, _ := personalRepo(t, aggregate.Snapshots{Every: 2,
		Personal: projector.Personal{Subject: "id", Fields: []string{"name", "email"}}})
	stream := projector.TenantStream("acme", "customer", "c-1")
	ada := testevents.CustomerRegistered{Customer: "c-1", Name: "Ada Lovelace", Email: "ada@example.com", Plan: "pro"}
	for range 2 {
		if err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
			w, err := r.FetchForWriting(ctx, tx, stream)
			if err != nil {
				return err
			}
			_, err = w.Append(ctx, ada)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	raw := func() []string {
		rows, err := store.Pool().Query(ctx, `SELECT state::text FROM `+store.Table("projector_snapshots"))
		if err != nil {
			t.Fatal(err)
		}
		states, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return states
	}
	before := raw()
	if len(before) == 0 {
		t.Fatal("no snapshot written")
	}
	for _, s := range before {
		if strings.Contains(s, "Ada") || strings.Contains(s, "ada@") || !strings.Contains(s, `"plan": "pro"`) || !(strings.Contains(s, "pjx1.") || strings.Contains(s, "pjx2.")) {
			t.Fatalf("snapshot state %s: want name and email sealed, the rest in the clear", s)
		}
	}
	l, err := r.Load(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Customer{ID: "c-1", Name: "Ada Lovelace", Email: "ada@example.com", Plan: "pro", Signups: 2}); l.FromSnapshot == 0 || l.State != want {
		t.Fatalf("load %+v (from snapshot %d), want %+v", l.State, l.FromSnapshot, want)
	}
	if _, err := store.Forget(ctx, postgres.SubjectRef{Tenant: "acme", ID: "c-1"}); err != nil {
		t.Fatal(err)
	}
	if after := raw(); strings.Join(after, "\n") != strings.Join(before, "\n") {
		t.Fatalf("the forget rewrote snapshots: %v → %v", before, after)
	}
	l, err = r.Load(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Customer{ID: "c-1", Plan: "pro", Signups: 2}); l.FromSnapshot == 0 || l.State != want {
		t.Fatalf("load after the forget %+v (from snapshot %d), want %+v", l.State, l.FromSnapshot, want)
	}
}

// TestSnapshotPersonalChecked: a snapshot Personal declaration must name
// fields of the state, as an event type's must name fields of its payload.
func TestSnapshotPersonalChecked(t *testing.T) {
	t.Parallel()
	types := testevents.NewPersonal()
	store := pgtest.Store(t, types.Registry, postgres.Config{AllowNoMasterKey: true})
	for _, p := range []projector.Personal{
		{Subject: "id", Fields: []string{"phone"}},
		{Subject: "signups", Fields: []string{"name"}},
		{Subject: "id"},
	} {
		_, err := aggregate.New(store, aggregate.Config[Customer]{Name: "customer", Snapshots: aggregate.Snapshots{Every: 2, Personal: p},
			Folds: []aggregate.Fold[Customer]{aggregate.On(types.Registered, func(*Customer, testevents.CustomerRegistered) {})}})
		if err == nil {
			t.Errorf("snapshot personal %+v accepted", p)
		}
	}
}

// ticketOwner is an aggregate state whose snapshots declare a personal
// field, in a registry that declares none.
type ticketOwner struct {
	Owner string `json:"owner"`
	Title string `json:"title"`
}

// TestNewRefusesPersonalSnapshotsWithoutMasterKey: snapshots declaring
// personal fields on a store without a master key fail at New, as
// postgres.New fails for event types, rather than at the first snapshot
// write; a store allowed to run without one (AllowNoMasterKey) or with one
// builds the repository.
func TestNewRefusesPersonalSnapshotsWithoutMasterKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.New()
	store := pgtest.Store(t, types.Registry)
	repo := func(s *postgres.Store) error {
		_, err := aggregate.New(s, aggregate.Config[ticketOwner]{Name: "ticket", Logger: quiet,
			Snapshots: aggregate.Snapshots{Every: 1, Personal: projector.Personal{Subject: "owner", Fields: []string{"title"}}},
			Folds:     []aggregate.Fold[ticketOwner]{aggregate.On(types.Opened, func(o *ticketOwner, e testevents.TicketOpened) { o.Title = e.Title })}})
		return err
	}
	if err := repo(store); !errors.Is(err, postgres.ErrNoMasterKey) || !strings.Contains(err.Error(), `aggregate "ticket"`) {
		t.Fatalf("New with personal snapshots and no master key: %v", err)
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
		s, err := postgres.New(ctx, store.Pool(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := repo(s); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}
