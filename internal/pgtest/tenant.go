package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector/stores/postgres"
)

// TenantRole creates a role of the test's own (roles are cluster-wide, so
// it is named after the schema) without BYPASSRLS, a "notes" table in
// schema with a row-level-security policy for it keyed on the tenant
// setting, and the grants a tenant-scoped handler needs; all dropped when
// the test ends. It returns the role and the quoted table name.
func TenantRole(t testing.TB, schema string) (role, table string) {
	t.Helper()
	ctx := context.Background()
	pool := Pool(t)
	role = schema + "_tenant"
	table = pgx.Identifier{schema, "notes"}.Sanitize()
	q := pgx.Identifier{role}.Sanitize()
	for _, sql := range []string{
		`CREATE ROLE ` + q + ` NOLOGIN`,
		`CREATE TABLE ` + table + ` (tenant_id text NOT NULL, body text NOT NULL)`,
		`ALTER TABLE ` + table + ` ENABLE ROW LEVEL SECURITY`,
		`CREATE POLICY tenant_isolation ON ` + table + ` TO ` + q + `
			USING (tenant_id = current_setting('` + postgres.TenantSetting + `', true))
			WITH CHECK (tenant_id = current_setting('` + postgres.TenantSetting + `', true))`,
		`GRANT SELECT, INSERT ON ` + table + ` TO ` + q,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if err := postgres.GrantTenantRole(ctx, pool, schema, role); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(ctx, `DROP OWNED BY `+q+`; DROP ROLE `+q)
	})
	return role, table
}

// AppRole creates a role of the test's own that an application would drop
// to from a superuser login (through the role run-time parameter or SET
// ROLE after connecting): not a superuser, no BYPASSRLS, with the
// privileges docs/operations.md ("Roles and privileges") lists for an
// application role on the tables and sequences schema holds when it is
// called (SELECT, INSERT, UPDATE, DELETE; USAGE, SELECT, UPDATE), no more,
// plus an "app_notes" table whose row-level-security policy applies to the
// role itself, keyed on the tenant setting. Both are dropped when the test
// ends. It returns the role and the quoted table name.
func AppRole(t testing.TB, schema string) (role, table string) {
	t.Helper()
	ctx := context.Background()
	pool := Pool(t)
	role = schema + "_app"
	table = pgx.Identifier{schema, "app_notes"}.Sanitize()
	q, s := pgx.Identifier{role}.Sanitize(), pgx.Identifier{schema}.Sanitize()
	for _, sql := range []string{
		`CREATE ROLE ` + q + ` NOLOGIN NOSUPERUSER NOBYPASSRLS`,
		`CREATE TABLE ` + table + ` (tenant_id text NOT NULL, body text NOT NULL)`,
		`ALTER TABLE ` + table + ` ENABLE ROW LEVEL SECURITY`,
		`CREATE POLICY tenant_isolation ON ` + table + ` TO ` + q + `
			USING (tenant_id = current_setting('` + postgres.TenantSetting + `', true))
			WITH CHECK (tenant_id = current_setting('` + postgres.TenantSetting + `', true))`,
		`GRANT USAGE ON SCHEMA ` + s + ` TO ` + q,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA ` + s + ` TO ` + q,
		`GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA ` + s + ` TO ` + q,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(ctx, `DROP OWNED BY `+q+`; DROP ROLE `+q)
	})
	return role, table
}

// PoolAs opens a pool (closed when the test ends) that logs in as the test
// database's user, a superuser, and drops to role on every connection: with
// the role run-time parameter, or with SET ROLE in AfterConnect when
// afterConnect is true. These are the two ways an application narrows a
// privileged login, and tenant scoping must keep either in force.
func PoolAs(t testing.TB, role string, afterConnect bool, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg := PoolConfig(t)
	cfg.MaxConns = maxConns
	if afterConnect {
		set := `SET ROLE ` + pgx.Identifier{role}.Sanitize()
		cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
			_, err := c.Exec(ctx, set)
			return err
		}
	} else {
		cfg.ConnConfig.RuntimeParams["role"] = role
	}
	return PoolFromConfig(t, cfg)
}

// ReaderRole creates a role of the test's own with what docs/operations.md
// ("Roles and privileges") gives a read-only operator: usage of schema and
// SELECT on the tables it holds when it is called. It is dropped when the
// test ends; use it through PoolAs, or a URL's role parameter.
func ReaderRole(t testing.TB, schema string) string {
	t.Helper()
	ctx := context.Background()
	pool := Pool(t)
	role := schema + "_reader"
	q, s := pgx.Identifier{role}.Sanitize(), pgx.Identifier{schema}.Sanitize()
	for _, sql := range []string{`CREATE ROLE ` + q + ` NOLOGIN`, `GRANT USAGE ON SCHEMA ` + s + ` TO ` + q,
		`GRANT SELECT ON ALL TABLES IN SCHEMA ` + s + ` TO ` + q} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(ctx, `DROP OWNED BY `+q+`; DROP ROLE `+q)
	})
	return role
}
