package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

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
	// Checked before anything is sent: a tenant PostgreSQL cannot store
	// (NUL, invalid UTF-8, too long) would abort the caller's transaction.
	if err := projector.TenantStream(tenant, "scope", "scope").Validate(); err != nil {
		return fmt.Errorf("scope transaction to tenant %s: %w", projector.Printable(tenant), err)
	}
	setting := tenant
	if tenant == projector.SystemTenant {
		setting = ""
	} else if s.unisolated != nil {
		s.unisolatedOnce.Do(func() { s.unisolated(ctx) })
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
// handlers that append events while scoped to a tenant — usage of the
// schema, reading and writing the log and the stream heads, reading,
// writing and pruning aggregate snapshots, reading, creating and locking
// data subjects' keys (personal fields: an append locks its subjects' key
// rows FOR SHARE, so a forget waits for it, which PostgreSQL allows only
// with an UPDATE privilege; the one granted is of the tenant_id column,
// which the role's tenant policy lets it set to nothing but the value it
// has), and reading archived events (loads
// with IncludeArchived; archiving itself is an operator's job) — and puts
// row-level security on those five tables so that role only ever reaches
// the rows of the tenant
// its transaction is scoped to: without it, tenant a's handler could read
// tenant b's events and append to b's streams.
//
// The policies change nothing for anyone else. A permissive policy lets
// every role through as before (the table owner and superusers bypass
// row-level security anyway), and a restrictive one, written TO role alone,
// adds the tenant filter for that role. That is why they are made here
// rather than by a migration: an application that does not use a TenantRole
// never has row-level security on Projector's tables. Enabling row-level
// security and creating policies needs the tables' owner (or a superuser);
// the statements take a brief exclusive lock on the tables, so run it at
// deploy time, and again after a migration adds tables. It is idempotent,
// and may be called for several tenant roles. Grants and policies on the
// application's own read-model tables remain the application's to make.
func GrantTenantRole(ctx context.Context, db DBTX, schema, role string) error {
	schema = schemaOrDefault(schema)
	if err := ValidateSchema(schema); err != nil {
		return err
	}
	if err := validRole(role); err != nil {
		return fmt.Errorf("grant tenant role: %w", err)
	}
	q, r := quoteIdent(schema), quoteIdent(role)
	var sql strings.Builder
	sql.WriteString(`GRANT USAGE ON SCHEMA ` + q + ` TO ` + r + `;
GRANT SELECT, INSERT, UPDATE ON ` + q + `.projector_events, ` + q + `.projector_streams TO ` + r + `;
GRANT SELECT, INSERT, DELETE ON ` + q + `.projector_snapshots TO ` + r + `;
GRANT SELECT, INSERT ON ` + q + `.projector_subject_keys TO ` + r + `;
GRANT UPDATE (tenant_id) ON ` + q + `.projector_subject_keys TO ` + r + `;
GRANT SELECT ON ` + q + `.projector_key_epoch TO ` + r + `;
GRANT SELECT ON ` + q + `.projector_events_archive TO ` + r + `;
`)
	tenantPolicy := quoteIdent(tenantPolicyName(role))
	// The filter holds while the session acts as the tenant role itself
	// (current_user, as a scoped transaction's SET LOCAL ROLE makes it). A
	// policy TO a role also applies to every role that inherits it, and the
	// application's own role is often granted the tenant role with
	// inheritance so it may switch to it: without the exemption its
	// unscoped reads (the dispatcher's, the CLI's) would see no tenant's
	// rows, and the dispatcher would move its cursors past events it never
	// saw.
	match := `(current_user <> ` + quoteLiteral(role) + `::name OR tenant_id = current_setting('` + TenantSetting + `', true))`
	for _, table := range tenantTables {
		t := q + "." + quoteIdent(table)
		sql.WriteString(`ALTER TABLE ` + t + ` ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS projector_unscoped ON ` + t + `;
CREATE POLICY projector_unscoped ON ` + t + ` USING (true) WITH CHECK (true);
DROP POLICY IF EXISTS ` + tenantPolicy + ` ON ` + t + `;
CREATE POLICY ` + tenantPolicy + ` ON ` + t + ` AS RESTRICTIVE TO ` + r + ` USING (` + match + `) WITH CHECK (` + match + `);
`)
	}
	// Sent as one simple-protocol query: PostgreSQL runs it as one
	// transaction, so no moment exists with row-level security enabled and
	// a policy missing.
	if _, err := db.Exec(ctx, sql.String()); err != nil {
		return fmt.Errorf("grant tenant role %s on schema %s: %w", r, q, err)
	}
	return nil
}

// quoteLiteral renders s as an SQL string literal (standard conforming
// strings: a quote doubled, a backslash as it is).
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// tenantTables are Projector's tables that hold tenant rows, each keyed by
// a tenant_id column, that a tenant role is granted.
var tenantTables = []string{"projector_events", "projector_streams", "projector_snapshots", "projector_subject_keys",
	"projector_events_archive"}

// tenantPolicyName names the restrictive policy of one tenant role, so
// granting a second role never replaces the first one's filter. A name that
// would not fit PostgreSQL's 63 bytes (it would be truncated, and two long
// role names could then collide) is replaced by a hash of the role.
func tenantPolicyName(role string) string {
	const prefix = "projector_tenant_"
	if len(prefix)+len(role) <= 63 {
		return prefix + role
	}
	sum := sha256.Sum256([]byte(role))
	return prefix + hex.EncodeToString(sum[:16])
}
