package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projectorhq/projector/migrations"
)

// MigrationState is one migration and whether it ran.
type MigrationState struct {
	Version   int
	Name      string
	AppliedAt time.Time // zero when pending
}

// Applied reports whether the migration has run.
func (m MigrationState) Applied() bool { return !m.AppliedAt.IsZero() }

// Migrate creates the schema if needed and applies every pending migration,
// all in one transaction under an advisory lock keyed on the schema, so two
// processes migrating at once are safe: the second waits, then finds nothing
// to do. It returns the versions it applied.
func Migrate(ctx context.Context, db DB, schema string) ([]int, error) {
	schema = schemaOrDefault(schema)
	if err := ValidateSchema(schema); err != nil {
		return nil, err
	}
	all, err := migrations.All()
	if err != nil {
		return nil, err
	}
	q := quoteIdent(schema)
	var applied []int
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('projector.migrate:' || $1::text, 0))`, schema); err != nil {
			return fmt.Errorf("take migration lock: %w", err)
		}
		// Creating the schema needs a privilege an application role may lack
		// even where the schema already exists, so only ask when it is missing.
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, schema).Scan(&exists); err != nil {
			return fmt.Errorf("look up schema: %w", err)
		}
		if !exists {
			if _, err := tx.Exec(ctx, `CREATE SCHEMA `+q); err != nil {
				return fmt.Errorf("create schema %s: %w", q, privilegeHint(err, q))
			}
		}
		// Nor the migrations table: CREATE TABLE IF NOT EXISTS asks for
		// the schema's CREATE privilege even when the table is there, and
		// an application role that runs Migrate at start-up (getting-
		// started.md) against a schema already up to date needs none.
		var hasTable bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, q+`.projector_migrations`).Scan(&hasTable); err != nil {
			return fmt.Errorf("look up the migrations table: %w", err)
		}
		if !hasTable {
			if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+q+`.projector_migrations (
			version    integer     PRIMARY KEY,
			name       text        NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
				return fmt.Errorf("create migrations table: %w", privilegeHint(err, q))
			}
		}
		done, err := appliedVersions(ctx, tx, q)
		if err != nil {
			return err
		}
		for _, m := range all {
			if _, ok := done[m.Version]; ok {
				continue
			}
			sql := strings.ReplaceAll(m.SQL, migrations.SchemaPlaceholder, q)
			if _, err := tx.Exec(ctx, sql); err != nil {
				return fmt.Errorf("apply migration %04d_%s: %w", m.Version, m.Name, privilegeHint(err, q))
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+q+`.projector_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
				return fmt.Errorf("record migration %04d: %w", m.Version, err)
			}
			applied = append(applied, m.Version)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("migrate schema %s: %w", q, err)
	}
	return applied, nil
}

// IsInsufficientPrivilege reports whether err is PostgreSQL's refusal of
// a privilege the connecting role lacks (SQLSTATE 42501), such as a
// read-only operator role's attempt to change a consumer: the CLI and the
// console tell the operator so instead of passing the driver's error on.
func IsInsufficientPrivilege(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501"
}

// privilegeHint adds to a permission error (SQLSTATE 42501) of a migration
// what to do: a role that may not change the schema, an application's
// least-privileged one, cannot migrate it.
func privilegeHint(err error, schema string) error {
	if IsInsufficientPrivilege(err) {
		return fmt.Errorf("%w; this role may not create or change schema %s: run the migrations as the schema's owner, "+
			"a role that owns the schema (CREATE SCHEMA %s AUTHORIZATION owner, as a superuser) or may create it (CREATE on the database) "+
			"(docs/operations.md, \"Roles and privileges\")", err, schema, schema)
	}
	return err
}

// MigrationStatus lists every migration this binary knows with the time it
// was applied, if it was, plus any applied version this binary does not know
// (a newer deployment ran it).
func MigrationStatus(ctx context.Context, db DB, schema string) ([]MigrationState, error) {
	schema = schemaOrDefault(schema)
	if err := ValidateSchema(schema); err != nil {
		return nil, err
	}
	all, err := migrations.All()
	if err != nil {
		return nil, err
	}
	q := quoteIdent(schema)
	var done map[int]appliedMigration
	var exists bool
	if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, q+".projector_migrations").Scan(&exists); err != nil {
		return nil, fmt.Errorf("migration status of %s: %w", q, err)
	}
	if exists {
		if done, err = appliedVersions(ctx, db, q); err != nil {
			return nil, err
		}
	}
	out := make([]MigrationState, 0, len(all))
	for _, m := range all {
		st := MigrationState{Version: m.Version, Name: m.Name}
		if a, ok := done[m.Version]; ok {
			st.AppliedAt = a.at
			delete(done, m.Version)
		}
		out = append(out, st)
	}
	for v, a := range done {
		out = append(out, MigrationState{Version: v, Name: a.name + " (unknown to this binary)", AppliedAt: a.at})
	}
	return out, nil
}

type appliedMigration struct {
	name string
	at   time.Time
}

func appliedVersions(ctx context.Context, q DBTX, schema string) (map[int]appliedMigration, error) {
	rows, err := q.Query(ctx, `SELECT version, name, applied_at FROM `+schema+`.projector_migrations`)
	if err != nil {
		return nil, fmt.Errorf("read applied migrations: %w", err)
	}
	done := map[int]appliedMigration{}
	var v int
	var a appliedMigration
	_, err = pgx.ForEachRow(rows, []any{&v, &a.name, &a.at}, func() error {
		done[v] = a
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read applied migrations: %w", err)
	}
	return done, nil
}
