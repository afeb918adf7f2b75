package saga_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/postgres"
)

// With a TenantRole, steps run under the tenant role (promise 8) and
// saga.GrantTenantRole gives it the saga tables under row-level security:
// one key in two tenants is two instances, each step appends to its own
// tenant's streams, timeouts fire in their instance's tenant, and a
// transaction scoped to one tenant sees only that tenant's instances,
// steps and timeouts.
func TestSagaTenantScoped(t *testing.T) {
	t.Parallel()
	ty := newTypes()
	schema := pgtest.Schema(t)
	ctx := context.Background()
	pool := pgtest.Pool(t)
	role, _ := pgtest.TenantRole(t, schema)
	if err := saga.GrantTenantRole(ctx, pool, schema, role); err != nil {
		t.Fatal(err)
	}
	if err := saga.GrantTenantRole(ctx, pool, schema, role); err != nil {
		t.Fatalf("granting twice: %v", err)
	}
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: ty.Registry, TenantRole: role})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ctx: ctx, types: ty, store: store}
	clk := newClock()
	s := newSLA(ty, slaOptions{now: clk.Now, remindAfter: time.Hour})
	d := e.dispatcher(s, projection.Config{})
	r := e.runner(s)
	for _, tenant := range []string{"a", "b"} {
		e.append(projector.TenantStream(tenant, "ticket", "t-1"), testevents.TicketOpened{Title: tenant},
			testevents.TicketCommented{Body: "c"})
	}
	e.append(projector.TenantStream("b", "ticket", "t-2"), testevents.TicketOpened{Title: "b2"})
	e.catchUp(d)
	clk.Advance(time.Hour)
	if n := e.fire(r); n != 3 {
		t.Fatalf("fired %d timeouts, want 3", n)
	}
	for _, tenant := range []string{"a", "b"} {
		in, err := saga.Show(ctx, store, "sla", tenant, "t-1")
		if err != nil {
			t.Fatal(err)
		}
		if in.Tenant != tenant || in.Version != 3 || len(in.Appended) != 2 {
			t.Fatalf("tenant %s: %+v", tenant, in)
		}
		for _, a := range in.Appended {
			evs, err := store.ReadStream(ctx, projector.TenantStream(tenant, "sla", "t-1"), postgres.StreamQuery{})
			if err != nil || len(evs) != 2 {
				t.Fatalf("tenant %s: its sla stream has %d events (%v); appended %+v", tenant, len(evs), err, a)
			}
		}
	}
	err = store.InTenantTx(ctx, "a", func(ctx context.Context, tx pgx.Tx) error {
		var instances, steps int
		if err := tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+store.Table("projector_saga_instances")+`),
			(SELECT count(*) FROM `+store.Table("projector_saga_steps")+`)`).Scan(&instances, &steps); err != nil {
			return err
		}
		if instances != 1 || steps != 3 {
			t.Errorf("tenant a sees %d instances and %d steps; want its own 1 and 3", instances, steps)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := e.instances(); got != 3 {
		t.Fatalf("the session role sees %d instances, want all 3", got)
	}
}

// Under a TenantRole, parking runs in the step's tenant-scoped
// transaction: the instance of one tenant is parked (the park written
// unscoped, in the dispatcher's table), the same key in another tenant goes
// on, and the retry, scoped back to the tenant, applies the sequence.
func TestSagaTenantScopedParking(t *testing.T) {
	t.Parallel()
	ty := newTypes()
	schema := pgtest.Schema(t)
	ctx := context.Background()
	pool := pgtest.Pool(t)
	role, _ := pgtest.TenantRole(t, schema)
	if err := saga.GrantTenantRole(ctx, pool, schema, role); err != nil {
		t.Fatal(err)
	}
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: ty.Registry, TenantRole: role})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ctx: ctx, types: ty, store: store}
	s, poison := newSeen(ty, newClock().Now, projection.AsyncConfig{ErrorMode: projection.ParkStream, MaxAttempts: 1})
	e.append(projector.TenantStream("a", "ticket", "t"), testevents.TicketOpened{Title: "a"}, testevents.TicketCommented{Body: "poison"},
		testevents.TicketCommented{Body: "after"})
	e.append(projector.TenantStream("b", "ticket", "t"), testevents.TicketOpened{Title: "b"}, testevents.TicketCommented{Body: "fine"})
	d := e.dispatcher(s, projection.Config{})
	e.catchUp(d)
	id, err := saga.InstancePark(ctx, store, "sla", "a", "t")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := saga.Show(ctx, store, "sla", "b", "t"); err != nil || b.Status != saga.Active || b.Version != 2 {
		t.Fatalf("tenant b's instance: %+v, %v; want active after 2 steps", b, err)
	}
	poison.Store(false)
	p, err := s.Projection(store)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := projection.RetryPark(ctx, store, p, id, "op", nil); err != nil || !r.Resolved || r.Events != 2 {
		t.Fatalf("retry: %+v, %v", r, err)
	}
	if a, err := saga.Show(ctx, store, "sla", "a", "t"); err != nil || a.Status != saga.Active || a.Version != 3 {
		t.Fatalf("tenant a's instance after the retry: %+v, %v; want active after 3 steps", a, err)
	}
}
