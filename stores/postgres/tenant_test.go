package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

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
	// A role name PostgreSQL cannot take as given: refused before anything
	// is sent. With a NUL, the driver's quoting dropped it and
	// GrantTenantRole granted another role (an API audit); 64 bytes would
	// be truncated to another name.
	victim, _ := pgtest.TenantRole(t, schema)
	for _, bad := range []string{"", victim + "\x00", "a\xffb", strings.Repeat("r", 64), strings.Repeat("r", 100_000)} {
		err := postgres.GrantTenantRole(ctx, pgtest.Pool(t), schema, bad)
		if !errors.Is(err, postgres.ErrInvalidConfig) || len(err.Error()) > 500 || strings.ContainsRune(err.Error(), 0) || !utf8.ValidString(err.Error()) {
			t.Errorf("GrantTenantRole(%.40q): %.200v; want ErrInvalidConfig, short and printable", bad, err)
		}
		if bad == "" {
			continue
		}
		if _, err := postgres.New(ctx, pgtest.Pool(t), postgres.Config{Schema: schema, Registry: types.Registry, TenantRole: bad}); !errors.Is(err, postgres.ErrInvalidConfig) {
			t.Errorf("New with TenantRole %.40q: %.200v; want ErrInvalidConfig", bad, err)
		}
	}
	for _, bad := range []string{"", "a\x00", strings.Repeat("t", 100_000)} {
		if _, err := postgres.New(ctx, pgtest.Pool(t), postgres.Config{Schema: schema, Registry: types.Registry, Ephemeral: []string{"ok", bad}}); !errors.Is(err, postgres.ErrInvalidConfig) || len(err.Error()) > 500 {
			t.Errorf("New with Ephemeral %.40q: %.200v; want ErrInvalidConfig", bad, err)
		}
	}
}

// Scoping only ever narrows privileges: an application that logs in as a
// superuser and drops to an application role (through the role run-time
// parameter, or SET ROLE after connecting) must stay that role, or the
// tenant role, inside tenant-scoped transactions and after scoping back to
// the system tenant — never become the superuser again, which would read
// and write every tenant's rows.
func TestScopeTxKeepsSessionRole(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                   string
		afterConnect, withRole bool
	}{
		{"runtime param, no tenant role", false, false},
		{"set role after connect, no tenant role", true, false},
		{"runtime param, tenant role", false, true},
		{"set role after connect, tenant role", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
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
			// One connection, so the last check sees the session the
			// scoped transactions ran on.
			pool := pgtest.PoolAs(t, app, tc.afterConnect, 1)
			cfg := postgres.Config{Schema: schema, Registry: types.Registry, Logger: discardLogger()}
			scopedUser, table := app, appNotes
			if tc.withRole {
				cfg.TenantRole, scopedUser, table = tenantRole, tenantRole, notes
			}
			store, err := postgres.New(ctx, pool, cfg)
			if err != nil {
				t.Fatal(err)
			}

			err = store.InTenantTx(ctx, "a", func(ctx context.Context, tx pgx.Tx) error {
				if u := currentUser(t, tx); u != scopedUser {
					t.Errorf("scoped to tenant a: current_user %s, want %s", u, scopedUser)
				}
				if seen := bodies(t, tx, table); len(seen) != 1 || seen[0] != "a1" {
					t.Errorf("scoped to tenant a: sees %v, want [a1]", seen)
				}
				for _, tenant := range []string{projector.SystemTenant, "b", projector.SystemTenant} {
					if err := store.ScopeTx(ctx, tx, tenant); err != nil {
						return err
					}
					want := app
					if tenant != projector.SystemTenant {
						want = scopedUser
					}
					if u := currentUser(t, tx); u != want {
						t.Errorf("re-scoped to %s: current_user %s, want %s", tenant, u, want)
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			err = store.InTenantTx(ctx, projector.SystemTenant, func(ctx context.Context, tx pgx.Tx) error {
				if u := currentUser(t, tx); u != app {
					t.Errorf("system tenant: current_user %s, want %s", u, app)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if u := currentUser(t, pool); u != app {
				t.Errorf("after scoped transactions the session is %s, want %s", u, app)
			}
		})
	}
}

func currentUser(t *testing.T, db postgres.DBTX) string {
	t.Helper()
	var u string
	if err := db.QueryRow(context.Background(), `SELECT current_user`).Scan(&u); err != nil {
		t.Fatal(err)
	}
	return u
}

func bodies(t *testing.T, db postgres.DBTX, table string) []string {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT body FROM `+table+` ORDER BY body`)
	if err != nil {
		t.Fatal(err)
	}
	seen, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return seen
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// With a TenantRole, Projector's own tables are tenant-filtered too: a
// transaction scoped to tenant a cannot read tenant b's events, stream heads
// or snapshots, nor append to b's streams, although the test connects as a
// superuser. Unscoped work — on the superuser pool and on a non-owner
// application role — still sees and writes everything.
func TestTenantRoleFiltersProjectorTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.New()
	schema := pgtest.Schema(t)
	role, _ := pgtest.TenantRole(t, schema)
	app, _ := pgtest.AppRole(t, schema)
	// pgtest.TenantRole granted once; a second grant (after a migration,
	// say) must replace the policies, not fail on them.
	if err := postgres.GrantTenantRole(ctx, pgtest.Pool(t), schema, role); err != nil {
		t.Fatalf("second GrantTenantRole: %v", err)
	}
	store, err := postgres.New(ctx, pgtest.Pool(t), postgres.Config{Schema: schema, Registry: types.Registry, TenantRole: role})
	if err != nil {
		t.Fatal(err)
	}
	streamA, streamB := projector.TenantStream("a", "ticket", "t1"), projector.TenantStream("b", "ticket", "t1")
	err = pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		for _, s := range []projector.StreamRef{streamA, streamB} {
			if _, err := store.Append(ctx, tx, s, projector.NoStream, testevents.TicketOpened{Title: s.Tenant}); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+store.Table("projector_snapshots")+`
			(tenant_id, stream_type, stream_id, aggregate, snapshot_version, version, state, event_recorded_at)
			VALUES ('a', 'ticket', 't1', 'ticket', 1, 1, '{}', now()), ('b', 'ticket', 't1', 'ticket', 1, 1, '{}', now())`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	events, streams, snapshots := store.Table("projector_events"), store.Table("projector_streams"), store.Table("projector_snapshots")

	err = store.InTenantTx(ctx, "a", func(ctx context.Context, tx pgx.Tx) error {
		for _, table := range []string{events, streams, snapshots} {
			if n := countRows(t, tx, `SELECT count(*) FROM `+table+` WHERE tenant_id <> 'a'`); n != 0 {
				t.Errorf("scoped to tenant a: %s shows %d rows of other tenants", table, n)
			}
			if n := countRows(t, tx, `SELECT count(*) FROM `+table); n != 1 {
				t.Errorf("scoped to tenant a: %s shows %d rows, want a's 1", table, n)
			}
		}
		got, err := store.ReadStreamTx(ctx, tx, streamB, postgres.StreamQuery{})
		if err != nil {
			return err
		}
		if len(got) != 0 {
			t.Errorf("scoped to tenant a: read %d events of tenant b's stream", len(got))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		stream projector.StreamRef
		exp    projector.ExpectedVersion
	}{
		{streamB, projector.AnyVersion},
		{projector.TenantStream("b", "ticket", "t2"), projector.NoStream},
	} {
		err = store.InTenantTx(ctx, "a", func(ctx context.Context, tx pgx.Tx) error {
			_, err := store.Append(ctx, tx, tc.stream, tc.exp, testevents.TicketOpened{Title: "forged"})
			return err
		})
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("tenant a appending to %s: %v, want a row-level-security violation", tc.stream, err)
		}
	}

	// Unscoped work is unchanged, for the superuser and for a non-owner
	// application role alike: it sees every tenant and may append.
	appStore, err := postgres.New(ctx, pgtest.PoolAs(t, app, false, 2), postgres.Config{Schema: schema, Registry: types.Registry, TenantRole: role})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*postgres.Store{store, appStore} {
		err = s.InTenantTx(ctx, projector.SystemTenant, func(ctx context.Context, tx pgx.Tx) error {
			for table, want := range map[string]int{events: 2, streams: 2, snapshots: 2} {
				if n := countRows(t, tx, `SELECT count(*) FROM `+table); n != want {
					t.Errorf("unscoped as %s: %s shows %d rows, want %d", currentUser(t, tx), table, n, want)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	err = appStore.InTenantTx(ctx, projector.SystemTenant, func(ctx context.Context, tx pgx.Tx) error {
		_, err := appStore.Append(ctx, tx, streamB, projector.AnyVersion, testevents.TicketOpened{Title: "system work"})
		return err
	})
	if err != nil {
		t.Fatalf("unscoped append as the application role: %v", err)
	}
}

// A store whose tenant-scoped transactions would isolate nothing — a
// superuser or BYPASSRLS role and no TenantRole — says so at New with a
// warning, or refuses with ErrNoTenantIsolation under StrictTenancy; a
// TenantRole, or a role that row-level security applies to, is accepted
// quietly.
func TestNewWarnsWithoutTenantIsolation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.New()
	schema := pgtest.Schema(t)
	tenantRole, _ := pgtest.TenantRole(t, schema)
	app, _ := pgtest.AppRole(t, schema)
	bypass := schema + "_bypass"
	q := pgx.Identifier{bypass}.Sanitize()
	if _, err := pgtest.Pool(t).Exec(ctx, `CREATE ROLE `+q+` NOLOGIN BYPASSRLS IN ROLE `+pgx.Identifier{app}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pgtest.Pool(t).Exec(context.Background(), `DROP ROLE `+q) })

	for _, tc := range []struct {
		name       string
		pool       *pgxpool.Pool
		tenantRole string
		unisolated bool
	}{
		{"superuser", pgtest.Pool(t), "", true},
		{"bypassrls role", pgtest.PoolAs(t, bypass, false, 1), "", true},
		{"superuser with tenant role", pgtest.Pool(t), tenantRole, false},
		{"application role", pgtest.PoolAs(t, app, true, 1), "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var log bytes.Buffer
			cfg := postgres.Config{Schema: schema, Registry: types.Registry, TenantRole: tc.tenantRole,
				Logger: slog.New(slog.NewTextHandler(&log, nil))}
			store, err := postgres.New(ctx, tc.pool, cfg)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			if strings.Contains(log.String(), "level=WARN") {
				t.Errorf("New warned before any tenant-scoped transaction: %q", log.String())
			}
			for range 2 { // the warning comes once, with the first
				if err := store.InTenantTx(ctx, "a", func(context.Context, pgx.Tx) error { return nil }); err != nil {
					t.Fatal(err)
				}
			}
			warned := strings.Contains(log.String(), "level=WARN") && strings.Contains(log.String(), "TenantRole")
			if n := strings.Count(log.String(), "level=WARN"); n > 1 {
				t.Errorf("warned %d times, want once", n)
			}
			if warned != tc.unisolated {
				t.Errorf("warned %v, want %v; log: %q", warned, tc.unisolated, log.String())
			}

			cfg.StrictTenancy = true
			_, err = postgres.New(ctx, tc.pool, cfg)
			if tc.unisolated && !errors.Is(err, postgres.ErrNoTenantIsolation) {
				t.Errorf("strict New: %v, want ErrNoTenantIsolation", err)
			}
			if !tc.unisolated && err != nil {
				t.Errorf("strict New: %v", err)
			}
		})
	}
}

// A tenant role that owns Projector's tables (or has their owner's
// privileges) bypasses their row-level security, so the policies
// GrantTenantRole writes would filter nothing: New refuses it.
func TestTenantRoleMustNotOwnTables(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.New()
	schema := pgtest.Schema(t)
	role, _ := pgtest.TenantRole(t, schema)
	if _, err := pgtest.Pool(t).Exec(ctx, `ALTER TABLE `+pgx.Identifier{schema, "projector_events"}.Sanitize()+` OWNER TO `+pgx.Identifier{role}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	_, err := postgres.New(ctx, pgtest.Pool(t), postgres.Config{Schema: schema, Registry: types.Registry, TenantRole: role})
	if err == nil || !strings.Contains(err.Error(), "owns") {
		t.Fatalf("New with a tenant role that owns the events table: %v, want a refusal", err)
	}
}

// A tenant PostgreSQL cannot store is refused before anything is sent: the
// caller's transaction stays usable and the error is typed and quotes no raw
// bytes.
func TestScopeTxRefusesUnstorableTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := pgtest.Store(t, testevents.New().Registry)
	for _, tenant := range []string{"a\x00b", "bad\xff", strings.Repeat("t", projector.MaxNameLength+1)} {
		err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
			err := store.ScopeTx(ctx, tx, tenant)
			if !errors.Is(err, projector.ErrInvalidStream) {
				t.Errorf("tenant %q: %v, want ErrInvalidStream", tenant, err)
			}
			if err != nil && (strings.IndexByte(err.Error(), 0) >= 0 || !utf8.ValidString(err.Error())) {
				t.Errorf("tenant %q: the error carries raw bytes: %q", tenant, err)
			}
			_, err = tx.Exec(ctx, `SELECT 1`)
			return err
		})
		if err != nil {
			t.Errorf("tenant %q: the caller's transaction is unusable after the refusal: %v", tenant, err)
		}
	}
}

// A tenant role reads its own archived events (a load with
// IncludeArchived) and never another tenant's: GrantTenantRole covers the
// archive with the same row-level security as the hot log.
func TestTenantRoleFiltersArchivedEvents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.New()
	schema := pgtest.Schema(t)
	role, _ := pgtest.TenantRole(t, schema)
	store, err := postgres.New(ctx, pgtest.Pool(t), postgres.Config{Schema: schema, Registry: types.Registry, TenantRole: role})
	if err != nil {
		t.Fatal(err)
	}
	streamA, streamB := projector.TenantStream("a", "ticket", "t1"), projector.TenantStream("b", "ticket", "t1")
	err = pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		for _, s := range []projector.StreamRef{streamA, streamB} {
			if _, err := store.Append(ctx, tx, s, projector.NoStream, testevents.TicketOpened{Title: s.Tenant}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	res, err := store.Archive(ctx, postgres.ArchiveOptions{Streams: []projector.StreamRef{streamA, streamB}})
	if err != nil || res.Streams != 2 {
		t.Fatalf("archive: %+v, %v", res, err)
	}
	err = store.InTenantTx(ctx, "a", func(ctx context.Context, tx pgx.Tx) error {
		if n := countRows(t, tx, `SELECT count(*) FROM `+store.Table("projector_events_archive")); n != 1 {
			t.Errorf("scoped to tenant a: the archive shows %d rows, want a's 1", n)
		}
		got, err := store.ReadStreamTx(ctx, tx, streamA, postgres.StreamQuery{IncludeArchived: true})
		if err != nil {
			return fmt.Errorf("read a's archived stream: %w", err)
		}
		if len(got) != 1 {
			t.Errorf("scoped to tenant a: read %d of a's archived events, want 1", len(got))
		}
		got, err = store.ReadStreamTx(ctx, tx, streamB, postgres.StreamQuery{IncludeArchived: true})
		if err != nil {
			return fmt.Errorf("read b's archived stream: %w", err)
		}
		if len(got) != 0 {
			t.Errorf("scoped to tenant a: read %d of tenant b's archived events", len(got))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The key epoch (migration 26) is readable by the roles that read data
// keys — a tenant role through GrantTenantRole — and by no one else:
// privileges only ever narrow, and the migration grants nothing to PUBLIC.
func TestKeyEpochReadableOnlyByKeyReaders(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.Schema(t)
	role, _ := pgtest.TenantRole(t, schema)
	pool := pgtest.Pool(t)
	stranger := "pt_stranger_" + strings.ReplaceAll(schema, "pt_", "")
	if len(stranger) > 63 {
		stranger = stranger[:63]
	}
	if _, err := pool.Exec(ctx, `CREATE ROLE `+pgx.Identifier{stranger}.Sanitize()+` NOLOGIN`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP ROLE IF EXISTS `+pgx.Identifier{stranger}.Sanitize())
	})
	epoch := pgx.Identifier{schema, "projector_key_epoch"}.Sanitize()
	for _, c := range []struct {
		role string
		want bool
	}{{role, true}, {stranger, false}, {"public", false}} {
		var got bool
		if err := pool.QueryRow(ctx, `SELECT has_table_privilege($1, $2, 'SELECT')`, c.role, epoch).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("%s may read the key epoch: %v, want %v", c.role, got, c.want)
		}
	}
}

// An application role granted the tenant role with inheritance (what
// `GRANT app_tenant TO app_user` does before PostgreSQL 16, and what
// tenancy.md once said to run): the tenant role's policies applied to its
// unscoped work too, so the dispatcher, running as it, read no tenant's
// events and moved its cursors past them (a least-privilege deployment
// drill). Projector's own tables now filter only a session acting as the
// tenant role, and New refuses the inheriting role with
// ErrTenantRoleInherited naming the grant to make; without inheritance it
// starts, and scoping still isolates.
func TestTenantRoleInheritedByTheAppRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.New()
	schema := pgtest.Schema(t)
	role, _ := pgtest.TenantRole(t, schema)
	app, _ := pgtest.AppRole(t, schema)
	pool := pgtest.Pool(t)
	if _, err := pool.Exec(ctx, `GRANT `+pgx.Identifier{role}.Sanitize()+` TO `+pgx.Identifier{app}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: types.Registry, TenantRole: role})
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		for _, s := range []projector.StreamRef{projector.TenantStream("a", "ticket", "t1"), projector.TenantStream("b", "ticket", "t1")} {
			if _, err := store.Append(ctx, tx, s, projector.NoStream, testevents.TicketOpened{Title: s.Tenant}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	appPool := pgtest.PoolAs(t, app, false, 2)
	if _, err := postgres.New(ctx, appPool, postgres.Config{Schema: schema, Registry: types.Registry, TenantRole: role}); !errors.Is(err, postgres.ErrTenantRoleInherited) ||
		!strings.Contains(err.Error(), "WITH INHERIT FALSE") {
		t.Fatalf("New as a role inheriting the tenant role: %v, want ErrTenantRoleInherited naming the grant", err)
	}
	// Unscoped, as a store without a TenantRole (the stock CLI's) sees the
	// log: every tenant's events, where it saw none.
	plain, err := postgres.New(ctx, appPool, postgres.Config{Schema: schema, Registry: types.Registry})
	if err != nil {
		t.Fatal(err)
	}
	// (Streams, not the log: a read of the log stops at the horizon, which
	// other tests' transactions may hold below these events.)
	for _, s := range []projector.StreamRef{projector.TenantStream("a", "ticket", "t1"), projector.TenantStream("b", "ticket", "t1")} {
		got, err := plain.ReadStream(ctx, s, postgres.StreamQuery{})
		if err != nil || len(got) != 1 {
			t.Fatalf("stream %s read unscoped by a role inheriting the tenant role: %d events, %v; want 1", s, len(got), err)
		}
	}
	if n := countRows(t, appPool, `SELECT count(*) FROM `+plain.Table("projector_events")); n != 2 {
		t.Fatalf("the events table read unscoped by a role inheriting the tenant role: %d rows, want both tenants' 2", n)
	}

	if _, err := pool.Exec(ctx, `ALTER ROLE `+pgx.Identifier{app}.Sanitize()+` NOINHERIT`); err != nil {
		t.Fatal(err)
	}
	scoped, err := postgres.New(ctx, appPool, postgres.Config{Schema: schema, Registry: types.Registry, TenantRole: role})
	if err != nil {
		t.Fatalf("New as a role granted the tenant role without inheritance: %v", err)
	}
	err = scoped.InTenantTx(ctx, "a", func(ctx context.Context, tx pgx.Tx) error {
		if n := countRows(t, tx, `SELECT count(*) FROM `+scoped.Table("projector_events")); n != 1 {
			t.Errorf("scoped to tenant a: %d events, want a's 1", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
