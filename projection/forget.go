package projection

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
)

// ForgetRows says what one read-model table does when a data subject is
// forgotten: delete the subject's rows, or keep them with their personal
// columns blanked.
type ForgetRows struct {
	// Table is the table, optionally schema-qualified ("app.tickets"),
	// named as the projection declares it in its Tables: during a
	// blue/green rebuild the rows are forgotten in the shadow table, as
	// [Table] resolves the name.
	Table string
	// SubjectColumn holds the subject's id; rows whose column equals the
	// forgotten subject's id are the subject's.
	SubjectColumn string
	// TenantColumn, when set, restricts the rows to the forgotten event's
	// tenant: subject ids are per tenant. Leave it empty for a table that
	// row-level security already scopes, or one without tenants.
	TenantColumn string
	// Blank lists columns to set to NULL instead of deleting the rows.
	Blank []string
}

var identPattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]{0,62}$`)

// statement checks f's names and returns a builder of its DELETE or UPDATE
// for the table's name as a handler writes it (see [Table]): the live table,
// or the shadow table while a blue/green rebuild builds a new version. The
// name is resolved per event, not at registration: a schema-qualified table
// resolved once would send a rebuild's forgets to the live table and leave
// the subject's data in the shadow one, which the switch would bring back.
func (f ForgetRows) statement() (func(ctx context.Context) string, error) {
	var tbl pgx.Identifier
	for part := range strings.SplitSeq(f.Table, ".") {
		tbl = append(tbl, part)
	}
	names := append(append([]string{}, tbl...), f.SubjectColumn)
	if f.TenantColumn != "" {
		names = append(names, f.TenantColumn)
	}
	names = append(names, f.Blank...)
	if len(tbl) > 2 || f.SubjectColumn == "" {
		return nil, fmt.Errorf("forget rows: want a table (schema.table at most) and a subject column, got %q and %q", f.Table, f.SubjectColumn)
	}
	for _, n := range names {
		if !identPattern.MatchString(n) {
			return nil, fmt.Errorf("forget rows of %s: %s is not a plain identifier", projector.Printable(f.Table), projector.Printable(n))
		}
	}
	where := " WHERE " + pgx.Identifier{f.SubjectColumn}.Sanitize() + " = $1"
	if f.TenantColumn != "" {
		where += " AND " + pgx.Identifier{f.TenantColumn}.Sanitize() + " = $2"
	}
	if len(f.Blank) == 0 {
		return func(ctx context.Context) string { return "DELETE FROM " + Table(ctx, f.Table) + where }, nil
	}
	sets := make([]string, len(f.Blank))
	for i, c := range f.Blank {
		sets[i] = pgx.Identifier{c}.Sanitize() + " = NULL"
	}
	set := " SET " + strings.Join(sets, ", ")
	return func(ctx context.Context) string { return "UPDATE " + Table(ctx, f.Table) + set + where }, nil
}

// OnForgotten makes p forget data subjects: on each
// [projector.SubjectForgotten] event it deletes, or blanks, the subject's
// rows of every table given, in the handler's transaction (so with the
// cursor, or with the forget itself for an inline projection). It is the
// one line a projection over personal data needs for promise 19
// (docs/privacy.md):
//
//	projection.OnForgotten(p, projection.ForgetRows{Table: "tickets", SubjectColumn: "customer_id", TenantColumn: "tenant_id"})
//
// A projection needing more handles projector.SubjectForgottenType itself
// with [On].
func OnForgotten(p Projection, tables ...ForgetRows) error {
	if len(tables) == 0 {
		return p.handlers().fail(p.Name(), errors.New("OnForgotten without tables"))
	}
	type stmt struct {
		sql    func(context.Context) string
		tenant bool
	}
	stmts := make([]stmt, len(tables))
	for i, f := range tables {
		sql, err := f.statement()
		if err != nil {
			return p.handlers().fail(p.Name(), err)
		}
		stmts[i] = stmt{sql, f.TenantColumn != ""}
	}
	return On(p, projector.SubjectForgottenType, func(ctx context.Context, tx pgx.Tx, ev projector.Event, f projector.SubjectForgotten) error {
		for _, s := range stmts {
			args := []any{f.Subject}
			if s.tenant {
				args = append(args, ev.Stream.Tenant)
			}
			if _, err := tx.Exec(ctx, s.sql(ctx), args...); err != nil {
				return fmt.Errorf("forget subject %s: %w", projector.Printable(f.Subject), err)
			}
		}
		return nil
	})
}
