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
// [projector.SystemTenant] clears both: system work runs unscoped, as the
// connecting role. It may be called again on the same transaction to move to
// another tenant; the settings end with the transaction.
//
// The role switch guards against mistakes, not against hostile handler code:
// code running in the transaction could RESET ROLE. Read docs/tenancy.md for
// the policies and grants to write.
func (s *Store) ScopeTx(ctx context.Context, tx pgx.Tx, tenant string) error {
	if tenant == "" {
		return fmt.Errorf("scope transaction: %w: empty tenant (use projector.SystemTenant for unscoped work)", projector.ErrInvalidStream)
	}
	setting, role := tenant, s.role
	if tenant == projector.SystemTenant {
		setting, role = "", "none"
	} else if role == "" {
		role = "none"
	}
	// set_config('role', …) is SET LOCAL ROLE as a function, so both changes
	// go out in one round trip with bound parameters.
	if _, err := tx.Exec(ctx, `SELECT set_config($1, $2, true), set_config('role', $3, true)`, TenantSetting, setting, role); err != nil {
		return fmt.Errorf("scope transaction to tenant %q: %w", tenant, err)
	}
	return nil
}

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
