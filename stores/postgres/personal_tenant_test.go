package postgres_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// A handler scoped to a tenant, running as the TenantRole, appends events
// with personal fields: the key it creates, the key it reads in the
// transaction and the cached key the append guards all lock the subject's
// key row (so a forget waits for the append), which GrantTenantRole
// allows; the events read back in the clear, and a forget still works.
func TestTenantRoleAppendsPersonalFields(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ty := testevents.NewPersonal()
	schema := pgtest.Schema(t)
	role, _ := pgtest.TenantRole(t, schema)
	master, err := postgres.NewMasterKey("k1", testevents.MasterKey("one"))
	if err != nil {
		t.Fatal(err)
	}
	for _, cache := range []int{0, -1} {
		store, err := postgres.New(ctx, pgtest.Pool(t), postgres.Config{Schema: schema, Registry: ty.Registry, TenantRole: role,
			MasterKey: master, KeyCacheSize: cache})
		if err != nil {
			t.Fatal(err)
		}
		stream := projector.TenantStream("acme", "customer", "c-1")
		for range 2 { // the first creates (or reads) the key, the second reads or guards it
			err := store.InTenantTx(ctx, "acme", func(ctx context.Context, tx pgx.Tx) error {
				_, err := store.Append(ctx, tx, stream, projector.AnyVersion,
					testevents.CustomerRegistered{Customer: "c-1", Name: "Ada", Email: "ada@x", Plan: "pro"})
				return err
			})
			if err != nil {
				t.Fatalf("cache %d: tenant-scoped append of personal fields: %v", cache, err)
			}
		}
		evs, err := store.ReadStream(ctx, stream, postgres.StreamQuery{})
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if p, ok := ev.Payload.(testevents.CustomerRegistered); !ok || p.Name != "Ada" || ev.Forgotten {
				t.Fatalf("cache %d: read %+v (forgotten %v)", cache, ev.Payload, ev.Forgotten)
			}
		}
	}
	store, err := postgres.New(ctx, pgtest.Pool(t), postgres.Config{Schema: schema, Registry: ty.Registry, TenantRole: role, MasterKey: master})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Forget(ctx, postgres.SubjectRef{Tenant: "acme", ID: "c-1"}); err != nil {
		t.Fatal(err)
	}
}

// A tenant role granted before appends locked key rows (no UPDATE on the
// key table) would fail every tenant-scoped append of personal fields: New
// says so at start, and GrantTenantRole run again puts it right.
func TestTenantRoleWithoutKeyLockRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ty := testevents.NewPersonal()
	schema := pgtest.Schema(t)
	role, _ := pgtest.TenantRole(t, schema)
	pool := pgtest.Pool(t)
	if _, err := pool.Exec(ctx, `REVOKE UPDATE (tenant_id) ON `+pgx.Identifier{schema, "projector_subject_keys"}.Sanitize()+
		` FROM `+pgx.Identifier{role}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	master, err := postgres.NewMasterKey("k1", testevents.MasterKey("one"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := postgres.Config{Schema: schema, Registry: ty.Registry, TenantRole: role, MasterKey: master}
	if _, err := postgres.New(ctx, pool, cfg); err == nil || !strings.Contains(err.Error(), "GrantTenantRole") {
		t.Fatalf("New with a tenant role that may not lock keys: %v, want an error naming GrantTenantRole", err)
	}
	// A registry without personal fields never locks a key.
	if _, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: testevents.New().Registry, TenantRole: role}); err != nil {
		t.Fatal(err)
	}
	if err := postgres.GrantTenantRole(ctx, pool, schema, role); err != nil {
		t.Fatal(err)
	}
	if _, err := postgres.New(ctx, pool, cfg); err != nil {
		t.Fatal(err)
	}
}
