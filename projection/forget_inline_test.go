package projection_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// TestInlineAppendRacingForget: a forget of a subject runs while an append
// for it is open — the append has sealed its event under the subject's key
// (read from the table, or taken from the process's cache and guarded) and
// its inline projection has copied the name into a read model, not yet
// committed. The forget must not commit in that gap: its own inline
// OnForgotten would delete the rows it can see, and the append's row would
// then commit after it, leaving the forgotten subject's name in the read
// model (promise 19). The forget waits for the append instead, and deletes
// its row too.
func TestInlineAppendRacingForget(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		// cache is the appending store's key cache size (negative: none,
		// the key is read in the append's transaction).
		cache int
	}{
		{"key read in the append", -1},
		{"key from the cache", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newCustomersInline(t, c.cache)
			ctx, ty, schema, pool, customers, p, master, store := f.ctx, f.ty, f.schema, f.pool, f.customers, f.p, f.master, f.store
			// The operator's process: a store of its own.
			operator, err := postgres.New(ctx, pgtest.Pool(t), postgres.Config{Schema: schema, Registry: ty.Registry, MasterKey: master,
				Inline: []postgres.InlineProjection{p}})
			if err != nil {
				t.Fatal(err)
			}
			stream := projector.TenantStream("acme", "customer", "c-1")
			ada := testevents.CustomerRegistered{Customer: "c-1", Name: "Ada Lovelace", Email: "ada@example.com", Plan: "pro"}
			// The subject's key exists (and, with a cache, is cached).
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := store.Append(ctx, tx, stream, projector.AnyVersion, ada)
				return err
			}); err != nil {
				t.Fatal(err)
			}

			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if _, err := store.Append(ctx, tx, stream, projector.AnyVersion, ada); err != nil {
				t.Fatal(err)
			}
			appender := tx.Conn().PgConn().PID()
			forgot := make(chan error, 1)
			go func() {
				_, err := operator.Forget(ctx, postgres.SubjectRef{Tenant: "acme", ID: "c-1"})
				forgot <- err
			}()
			// The forget either commits in the gap (what must not happen)
			// or waits for the open append.
			var done bool
			pgtest.Eventually(t, 30*time.Second, "the forget to finish or wait for the append", func() bool {
				select {
				case err := <-forgot:
					forgot <- err
					done = true
					return true
				default:
				}
				return pgtest.BlockedBy(t, pool, int32(appender))
			})
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-forgot; err != nil {
				t.Fatal(err)
			}
			var left int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+customers+` WHERE customer_id = 'c-1'`).Scan(&left); err != nil {
				t.Fatal(err)
			}
			if left != 0 {
				t.Fatalf("after the forget committed (before the append: %v), the read model holds %d rows of the forgotten subject, want 0", done, left)
			}
		})
	}
}

// TestInlineAppendAfterForget: an append for a subject forgotten before it
// writes the personal fields to the log as null, and its inline projection
// is handed the event as every read returns it — fields zero, marked
// Forgotten — not the caller's values in the clear, which would put the
// forgotten subject's name back in the read model (promise 19).
func TestInlineAppendAfterForget(t *testing.T) {
	t.Parallel()
	f := newCustomersInline(t, 0)
	ctx, pool, customers, store := f.ctx, f.pool, f.customers, f.store
	stream := projector.TenantStream("acme", "customer", "c-1")
	ada := testevents.CustomerRegistered{Customer: "c-1", Name: "Ada Lovelace", Email: "ada@example.com", Plan: "pro"}
	appendOne := func() projector.Event {
		var res postgres.AppendResult
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			res, err = store.Append(ctx, tx, stream, projector.AnyVersion, ada)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return res.Events[0]
	}
	appendOne()
	if _, err := store.Forget(ctx, postgres.SubjectRef{Tenant: "acme", ID: "c-1"}); err != nil {
		t.Fatal(err)
	}
	ev := appendOne()
	var name string
	var forgotten bool
	if err := pool.QueryRow(ctx, `SELECT coalesce(name, ''), forgotten FROM `+customers+` WHERE customer_id = 'c-1'`).Scan(&name, &forgotten); err != nil {
		t.Fatal(err)
	}
	if name != "" || !forgotten {
		t.Fatalf("the inline projection of an append after the forget wrote name %q (forgotten %v), want none, forgotten", name, forgotten)
	}
	if got, ok := ev.Payload.(testevents.CustomerRegistered); !ok || got.Name != "" || got.Email != "" || got.Plan != "pro" || !ev.Forgotten {
		t.Fatalf("the append returned %+v (forgotten %v), want the personal fields zero, the rest kept, forgotten", ev.Payload, ev.Forgotten)
	}
}

// customersInline is a schema whose store keeps an inline read model of
// customers (tenant, id, name, whether the event came forgotten) that
// forgets a subject's rows (OnForgotten).
type customersInline struct {
	ctx       context.Context
	ty        testevents.PersonalTypes
	schema    string
	pool      *pgxpool.Pool
	customers string
	p         *projection.Inline
	master    *postgres.MasterKey
	store     *postgres.Store
}

// newCustomersInline makes it, its store's key cache of cache entries
// (negative: none).
func newCustomersInline(t *testing.T, cache int) customersInline {
	t.Helper()
	f := customersInline{ctx: context.Background(), ty: testevents.NewPersonal(), schema: pgtest.Schema(t), pool: pgtest.Pool(t)}
	f.customers = pgx.Identifier{f.schema, "customers"}.Sanitize()
	if _, err := f.pool.Exec(f.ctx, `CREATE TABLE `+f.customers+` (tenant_id text, customer_id text, name text, forgotten bool)`); err != nil {
		t.Fatal(err)
	}
	f.p = projection.NewInline("customers")
	must(projection.On(f.p, f.ty.Registered, func(ctx context.Context, tx pgx.Tx, ev projector.Event, e testevents.CustomerRegistered) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+f.customers+` VALUES ($1, $2, $3, $4)`, ev.Stream.Tenant, e.Customer, e.Name, ev.Forgotten)
		return err
	}))
	must(projection.OnForgotten(f.p, projection.ForgetRows{Table: f.schema + ".customers", SubjectColumn: "customer_id", TenantColumn: "tenant_id"}))
	var err error
	if f.master, err = postgres.NewMasterKey("k1", testevents.MasterKey("one")); err != nil {
		t.Fatal(err)
	}
	if f.store, err = postgres.New(f.ctx, f.pool, postgres.Config{Schema: f.schema, Registry: f.ty.Registry, MasterKey: f.master,
		Inline: []postgres.InlineProjection{f.p}, KeyCacheSize: cache}); err != nil {
		t.Fatal(err)
	}
	return f
}
