package projection_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// Promise 8 on a pool that logs in as a superuser and drops to an
// application role: the dispatcher's tenant scopes, and its return to the
// system tenant between events, keep that role (or narrow it to the tenant
// role) and never make a handler the superuser again.
func TestPromise8_DispatcherKeepsSessionRole(t *testing.T) {
	t.Parallel()
	for _, withRole := range []bool{false, true} {
		name := "no tenant role"
		if withRole {
			name = "tenant role"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			types := testevents.New()
			schema := pgtest.Schema(t)
			tenantRole, notes := pgtest.TenantRole(t, schema)
			app, appNotes := pgtest.AppRole(t, schema)
			if _, err := pgtest.Pool(t).Exec(ctx, `INSERT INTO `+notes+` VALUES ('a', 'a1'), ('b', 'b1');
				INSERT INTO `+appNotes+` VALUES ('a', 'a1'), ('b', 'b1')`); err != nil {
				t.Fatal(err)
			}
			cfg := postgres.Config{Schema: schema, Registry: types.Registry}
			scopedUser, table := app, appNotes
			if withRole {
				cfg.TenantRole, scopedUser, table = tenantRole, tenantRole, notes
			}
			store, err := postgres.New(ctx, pgtest.PoolAs(t, app, false, 4), cfg)
			if err != nil {
				t.Fatal(err)
			}

			type seen struct {
				user, tenant string
				visible      int
			}
			var mu sync.Mutex
			var got []seen
			p := projection.NewAsync("roles", projection.AsyncConfig{})
			must(projection.On(p, types.Opened, func(ctx context.Context, tx pgx.Tx, ev projector.Event, _ testevents.TicketOpened) error {
				s := seen{tenant: ev.Stream.Tenant}
				if err := tx.QueryRow(ctx, `SELECT current_user, (SELECT count(*) FROM `+table+`)`).Scan(&s.user, &s.visible); err != nil {
					return err
				}
				mu.Lock()
				got = append(got, s)
				mu.Unlock()
				return nil
			}))
			// One transaction: tenant a's event and then a system event, so
			// one batch scopes to a and back to the system tenant.
			err = pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
				for _, ref := range []projector.StreamRef{projector.TenantStream("a", "ticket", "1"), projector.Stream("ticket", "sys")} {
					if _, err := store.Append(ctx, tx, ref, projector.NoStream, testevents.TicketOpened{Title: "t"}); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			e := &env{t: t, ctx: ctx, types: types, schema: schema, store: store}
			d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
			cctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			if err := d.CatchUp(cctx); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(got) != 2 {
				t.Fatalf("handled %+v, want two events", got)
			}
			for _, s := range got {
				want := app
				if s.tenant != projector.SystemTenant {
					want = scopedUser
					if s.visible != 1 {
						t.Errorf("tenant %s handler sees %d rows of %s, want its own 1", s.tenant, s.visible, table)
					}
				}
				if s.user != want {
					t.Errorf("tenant %s handler runs as %s, want %s", s.tenant, s.user, want)
				}
			}
		})
	}
}
