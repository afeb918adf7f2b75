package projection

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// ErrScopeUnsupported: the projection declares no way to clear the kind of
// scope asked for (no [AsyncConfig.ScopeColumns] that cover it and no
// [AsyncConfig.ResetScope]), or its ResetScope refused it. A ResetScope
// returns it (wrapped) for a scope it cannot clear exactly.
var ErrScopeUnsupported = errors.New("projection: the projection cannot clear this scope")

// Scope is a part of a projection's model: what one tenant, or one stream,
// contributed. A partial rebuild clears a scope and replays its events, for
// the "one customer's read model is wrong" case, leaving everything else
// alone.
type Scope struct {
	// Tenant is required: [projector.SystemTenant] for streams of no tenant.
	Tenant string
	// StreamType and StreamID, both set, narrow the scope to one stream of
	// Tenant.
	StreamType, StreamID string
}

// TenantScope is the scope of everything tenant contributed.
func TenantScope(tenant string) Scope { return Scope{Tenant: tenant} }

// StreamScope is the scope of one stream.
func StreamScope(stream projector.StreamRef) Scope {
	return Scope{Tenant: stream.Tenant, StreamType: stream.Type, StreamID: stream.ID}
}

// Stream returns the scope's stream, and false for a tenant scope.
func (s Scope) Stream() (projector.StreamRef, bool) {
	return projector.StreamRef{Tenant: s.Tenant, Type: s.StreamType, ID: s.StreamID}, s.StreamType != ""
}

// Validate reports a scope no event could belong to: no tenant, a stream
// type without an id (or the reverse), names PostgreSQL cannot store. It
// wraps [projector.ErrInvalidStream].
func (s Scope) Validate() error {
	return s.query().Validate()
}

func (s Scope) query() postgres.ScopeQuery {
	return postgres.ScopeQuery{Tenant: s.Tenant, StreamType: s.StreamType, StreamID: s.StreamID}
}

// String names the scope in messages: "tenant acme" or "acme/ticket/42".
func (s Scope) String() string { return s.query().String() }

// ScopeColumns name the columns that every table in [AsyncConfig.Tables]
// keeps the origin of its rows in, so a partial rebuild can clear a scope by
// itself: a tenant scope deletes the rows whose Tenant column holds the
// tenant, a stream scope those whose Tenant, StreamType and StreamID columns
// hold the stream. They must be exact: a row matching a scope must be built
// only from that scope's events (a per-ticket row, not a per-agent count
// across tickets), or the replay, which reads only the scope's events,
// cannot rebuild it. Lower-case identifiers; a stream scope needs all three.
type ScopeColumns struct {
	Tenant     string
	StreamType string
	StreamID   string
}

// ResetScopeFunc clears what scope contributed to a projection's tables, in
// tx, which is scoped to scope's tenant (see [postgres.Store.ScopeTx]): a
// tenant role's row-level-security policies keep it from touching another
// tenant's rows. It returns an error wrapping [ErrScopeUnsupported] for a
// scope it cannot clear exactly.
type ResetScopeFunc func(ctx context.Context, tx pgx.Tx, scope Scope) error

var columnPattern = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

func (c ScopeColumns) validate(tables []string) error {
	if c == (ScopeColumns{}) {
		return nil
	}
	if len(tables) == 0 {
		return errors.New("scope columns without declared tables")
	}
	for _, col := range []string{c.Tenant, c.StreamType, c.StreamID} {
		if col != "" && !columnPattern.MatchString(col) {
			return fmt.Errorf("scope column %q: want a lower-case identifier", col)
		}
	}
	if (c.StreamType == "") != (c.StreamID == "") {
		return errors.New("scope columns: a stream type column needs a stream id column, and the reverse")
	}
	if c.StreamType != "" && c.Tenant == "" {
		return errors.New("scope columns: stream columns need a tenant column (a stream is only unique within its tenant)")
	}
	return nil
}

// covers reports whether the columns alone can clear scope.
func (c ScopeColumns) covers(s Scope) bool {
	if _, stream := s.Stream(); stream {
		return c.StreamType != ""
	}
	return c.Tenant != ""
}

// CheckScope reports, before anything is locked or written, whether p
// declares a way to clear scope: [ErrScopeUnsupported] when neither its
// ScopeColumns cover it nor a ResetScope is set (a ResetScope may still
// refuse the scope when called).
func (p *Async) CheckScope(scope Scope) error {
	if err := scope.Validate(); err != nil {
		return err
	}
	if p.cfg.ScopeColumns.covers(scope) || p.cfg.ResetScope != nil {
		return nil
	}
	what := "a tenant column"
	if _, stream := scope.Stream(); stream {
		what = "tenant, stream type and stream id columns"
	}
	return fmt.Errorf("%w: %s declares neither %s (AsyncConfig.ScopeColumns) nor a ResetScope, so it cannot clear %s",
		ErrScopeUnsupported, p.name, what, scope)
}

// ClearScopeTx clears what scope contributed to p's tables, in tx: it
// scopes tx to the scope's tenant (so a tenant role's policies confine the
// deletes), deletes the rows its ScopeColumns match in every declared table,
// then calls its ResetScope, if any, for whatever else there is, and returns
// tx to the system tenant. The caller holds the consumer's shard lock (see
// [LockShard]) and replays the scope's events next, in the same transaction
// (see [ReplayTx]).
func ClearScopeTx(ctx context.Context, tx pgx.Tx, store *postgres.Store, p *Async, scope Scope) error {
	if err := p.CheckScope(scope); err != nil {
		return err
	}
	if err := store.ScopeTx(ctx, tx, scope.Tenant); err != nil {
		return fmt.Errorf("clear %s of %s: %w", scope, p.name, err)
	}
	cols := p.cfg.ScopeColumns
	if cols.covers(scope) {
		for _, t := range p.cfg.Tables {
			q := `DELETE FROM ` + quoteQualified(t) + ` WHERE ` + pgx.Identifier{cols.Tenant}.Sanitize() + ` = $1`
			args := []any{scope.Tenant}
			if _, stream := scope.Stream(); stream {
				q += ` AND ` + pgx.Identifier{cols.StreamType}.Sanitize() + ` = $2 AND ` + pgx.Identifier{cols.StreamID}.Sanitize() + ` = $3`
				args = append(args, scope.StreamType, scope.StreamID)
			}
			if _, err := tx.Exec(ctx, q, args...); err != nil {
				return fmt.Errorf("clear %s of %s from %s: %w", scope, p.name, t, err)
			}
		}
	}
	if p.cfg.ResetScope != nil {
		if err := p.cfg.ResetScope(ctx, &handlerTx{Tx: tx}, scope); err != nil {
			return fmt.Errorf("clear %s of %s: ResetScope: %w", scope, p.name, err)
		}
	}
	if err := store.ScopeTx(ctx, tx, projector.SystemTenant); err != nil {
		return fmt.Errorf("clear %s of %s: leave tenant scope: %w", scope, p.name, err)
	}
	return nil
}
