package saga

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/stores/postgres"
)

// GrantTenantRole gives a store's tenant role (postgres.Config.TenantRole)
// what a saga's steps need, since an event's step runs in the dispatcher's
// transaction scoped to the event's tenant: rights on the saga tables of
// schema, with row-level security so a tenant-scoped step sees and writes
// only its tenant's instances, and their steps and timeouts. Other roles
// (the session's own, which the runner and the CLI use) keep seeing every
// row. Like postgres.GrantTenantRole, which it does not replace, it needs
// the tables' owner, is idempotent, and is run at deploy time after the
// migrations.
func GrantTenantRole(ctx context.Context, db postgres.DBTX, schema, role string) error {
	if err := postgres.ValidateSchema(schema); err != nil {
		return err
	}
	if role == "" {
		return errors.New("saga: grant tenant role: empty role name")
	}
	q, r := pgx.Identifier{schema}.Sanitize(), pgx.Identifier{role}.Sanitize()
	i, s, t := q+".projector_saga_instances", q+".projector_saga_steps", q+".projector_saga_timeouts"
	policy := pgx.Identifier{policyName(role)}.Sanitize()
	ofTenant := `tenant_id = current_setting('` + postgres.TenantSetting + `', true)`
	// Steps and timeouts have no tenant column: they belong to the tenant
	// of their instance, which the instance table's own policy filters.
	ofInstance := `EXISTS (SELECT 1 FROM ` + i + ` si WHERE si.id = instance_id)`
	sql := `GRANT USAGE ON SCHEMA ` + q + ` TO ` + r + `;
GRANT SELECT, INSERT, UPDATE, DELETE ON ` + i + `, ` + s + `, ` + t + ` TO ` + r + `;
`
	for _, p := range []struct{ table, match string }{{i, ofTenant}, {s, ofInstance}, {t, ofInstance}} {
		sql += `ALTER TABLE ` + p.table + ` ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS projector_unscoped ON ` + p.table + `;
CREATE POLICY projector_unscoped ON ` + p.table + ` USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS ` + policy + ` ON ` + p.table + `;
CREATE POLICY ` + policy + ` ON ` + p.table + ` AS RESTRICTIVE TO ` + r + ` USING (` + p.match + `) WITH CHECK (` + p.match + `);
`
	}
	// One simple-protocol query: one transaction, so row-level security is
	// never on without its policies.
	if _, err := db.Exec(ctx, sql); err != nil {
		return fmt.Errorf("saga: grant tenant role %s on schema %s: %w", r, q, err)
	}
	return nil
}

// policyName names the restrictive policy of one tenant role, so granting a
// second role never replaces the first one's; a name PostgreSQL would
// truncate (and two long roles could then share) is replaced by a hash.
func policyName(role string) string {
	const prefix = "projector_saga_tenant_"
	if len(prefix)+len(role) <= 63 {
		return prefix + role
	}
	sum := sha256.Sum256([]byte(role))
	return prefix + hex.EncodeToString(sum[:16])
}
