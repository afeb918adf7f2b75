package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

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
