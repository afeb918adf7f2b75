package postgres_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// Promise 8 at the store: a transaction scoped to tenant A can neither read
// nor write tenant B's rows, although the test connects as a superuser.
func TestPromise8_TenantScopedTransaction(t *testing.T) {
	t.Parallel()
	types := testevents.New()
	schema := pgtest.Schema(t)
	role, table := pgtest.TenantRole(t, schema)
	ctx := context.Background()
	store, err := postgres.New(ctx, pgtest.Pool(t), postgres.Config{Schema: schema, Registry: types.Registry, TenantRole: role})
	if err != nil {
		t.Fatal(err)
	}
	var super bool
	if err := store.Pool().QueryRow(ctx, `SELECT rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&super); err != nil || !super {
		t.Logf("test connection is not a superuser (%v); the policy is still enforced through the role", err)
	}
	// System work is unscoped: it may write both tenants' rows.
	if err := store.InTenantTx(ctx, projector.SystemTenant, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ('a', 'a1'), ('b', 'b1')`)
		return err
	}); err != nil {
		t.Fatalf("system tenant insert: %v", err)
	}

	var seen []string
	err = store.InTenantTx(ctx, "a", func(ctx context.Context, tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT body FROM `+table+` ORDER BY body`)
		if err != nil {
			return err
		}
		seen, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 1 || seen[0] != "a1" {
		t.Fatalf("tenant a sees %v, want [a1]", seen)
	}

	err = store.InTenantTx(ctx, "a", func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ('b', 'forged')`)
		return err
	})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Fatalf("tenant a writing tenant b's row: %v, want a row-level-security violation", err)
	}

	// Scoped handlers can still append events, with the grants given.
	err = store.InTenantTx(ctx, "a", func(ctx context.Context, tx pgx.Tx) error {
		_, err := store.Append(ctx, tx, projector.TenantStream("a", "ticket", "t"), projector.NoStream, testevents.TicketOpened{Title: "scoped"})
		return err
	})
	if err != nil {
		t.Fatalf("append inside a tenant-scoped transaction: %v", err)
	}

	// Re-scoping one transaction to the system tenant restores full access.
	err = store.InTenantTx(ctx, "b", func(ctx context.Context, tx pgx.Tx) error {
		if err := store.ScopeTx(ctx, tx, projector.SystemTenant); err != nil {
			return err
		}
		n := countRows(t, tx, `SELECT count(*) FROM `+table)
		if n != 2 {
			t.Errorf("system scope after tenant b sees %d rows, want 2", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestTenantRoleChecks(t *testing.T) {
	t.Parallel()
	types := testevents.New()
	schema := pgtest.Schema(t)
	ctx := context.Background()
	_, err := postgres.New(ctx, pgtest.Pool(t), postgres.Config{Schema: schema, Registry: types.Registry, TenantRole: schema + "_missing"})
	if err == nil {
		t.Fatal("New accepted a tenant role that does not exist")
	}
	_, err = postgres.New(ctx, pgtest.Pool(t), postgres.Config{Schema: schema, Registry: types.Registry, TenantRole: "postgres"})
	if err == nil {
		t.Fatal("New accepted a superuser as the tenant role")
	}
}
