package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
)

// InTenantTx runs fn in a new transaction scoped to tenant (see
// [Store.ScopeTx]) and commits it when fn returns nil. fn's error, or a
// panic, rolls back.
func (s *Store) InTenantTx(ctx context.Context, tenant string, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := s.ScopeTx(ctx, tx, tenant); err != nil {
			return err
		}
		return fn(ctx, tx)
	})
}

// ScopeTx scopes the rest of tx to tenant: it sets the transaction-local
// [TenantSetting] and, when a TenantRole is configured, switches to that role
// with SET LOCAL ROLE, so PostgreSQL's row-level-security policies hold even
// for an application that connects as a superuser or as the tables' owner.
// [projector.SystemTenant] clears the setting and, with a TenantRole, puts
// back the role the session had before the transaction was first scoped: the
// role a pool drops to after logging in (the role run-time parameter, SET
// ROLE after connecting) stays in force, because scoping may only ever narrow
// privileges, never return to the login role. Without a TenantRole the role
// is never touched. It may be called again on the same transaction to move to
// another tenant; the settings end with the transaction.
//
// The role switch guards against mistakes, not against hostile handler code:
// code running in the transaction could RESET ROLE. Read docs/tenancy.md for
// the policies and grants to write.
func (s *Store) ScopeTx(ctx context.Context, tx pgx.Tx, tenant string) error {
	if tenant == "" {
		return fmt.Errorf("scope transaction: %w: empty tenant (use projector.SystemTenant for unscoped work)", projector.ErrInvalidStream)
	}
	setting := tenant
	if tenant == projector.SystemTenant {
		setting = ""
	}
	var err error
	switch {
	case s.role == "":
		_, err = tx.Exec(ctx, scopeSQL, TenantSetting, setting)
	case tenant == projector.SystemTenant:
		_, err = tx.Exec(ctx, scopeRoleSQL, TenantSetting, setting, nil)
	default:
		_, err = tx.Exec(ctx, scopeRoleSQL, TenantSetting, setting, s.role)
	}
	if err != nil {
		return fmt.Errorf("scope transaction to tenant %q: %w", tenant, err)
	}
	return nil
}

// outerRoleSetting holds, for the rest of a transaction, the role its session
// had before the transaction was first scoped to a tenant: the role that
// scoping back to the system tenant restores.
const outerRoleSetting = "projector.outer_role"

// scopeSQL sets the tenant and leaves the role alone: with no tenant role
// configured, isolation rests on policies that apply to the session's own
// role, which scoping must not change.
const scopeSQL = `SELECT set_config($1, $2, true)`

// scopeRoleSQL sets the tenant and switches the role ($3), or, with $3 NULL,
// restores the role the session had before the transaction was first scoped.
// The first call of a transaction records current_setting('role') (the
// session's SET ROLE or role parameter, 'none' for the login role) in
// outerRoleSetting; later calls keep that record, so moving between tenants
// never mistakes the tenant role for the session's. set_config('role', …) is
// SET LOCAL ROLE as a function: both changes take one round trip with bound
// parameters, and both are undone together by a rollback to a savepoint. The
// CTE is evaluated before the outer SELECT changes the role (a CTE calling a
// volatile function is never inlined).
const scopeRoleSQL = `
WITH outer_role AS (
	SELECT set_config('` + outerRoleSetting + `',
		coalesce(nullif(current_setting('` + outerRoleSetting + `', true), ''), current_setting('role')), true) AS name
)
SELECT set_config($1, $2, true), set_config('role', coalesce($3::text, outer_role.name), true)
FROM outer_role`

// GrantTenantRole grants role what it needs on Projector's own tables for
// handlers that append events while scoped to a tenant: usage of the schema,
// reading and writing the log and the stream heads, and reading, writing and
// pruning aggregate snapshots. Grants on the application's own read-model
// tables remain the application's to make.
func GrantTenantRole(ctx context.Context, db DBTX, schema, role string) error {
	schema = schemaOrDefault(schema)
	if err := ValidateSchema(schema); err != nil {
		return err
	}
	q, r := quoteIdent(schema), quoteIdent(role)
	sql := `GRANT USAGE ON SCHEMA ` + q + ` TO ` + r + `;
GRANT SELECT, INSERT, UPDATE ON ` + q + `.projector_events, ` + q + `.projector_streams TO ` + r + `;
GRANT SELECT, INSERT, DELETE ON ` + q + `.projector_snapshots TO ` + r + `;`
	if _, err := db.Exec(ctx, sql); err != nil {
		return fmt.Errorf("grant tenant role %s on schema %s: %w", r, q, err)
	}
	return nil
}
