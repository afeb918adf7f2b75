package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
)

// ScopeQuery selects the events one tenant, or one stream, contributed to
// the log up to a position: what a partial rebuild replays.
type ScopeQuery struct {
	// Tenant is the scope's tenant; required ([projector.SystemTenant] for
	// streams that belong to no tenant).
	Tenant string
	// StreamType and StreamID, both set, narrow the scope to one stream of
	// Tenant; both empty, the scope is the whole tenant.
	StreamType, StreamID string
	// EventTypes are the types read; at least one.
	EventTypes []string
	// Until is the last position read (inclusive). Every event at or before
	// a consumer's cursor belongs to a finished transaction, so a read up to
	// a cursor is final.
	Until projector.Position
	// Raw is as in [LogQuery].
	Raw bool
}

// ErrScopeCursorClosed: the scope cursor was used after Close, or after
// its transaction ended.
var ErrScopeCursorClosed = errors.New("scope cursor is closed")

// ScopeCursor reads a scope's events in log order, a batch at a time, from a
// server-side cursor in the caller's transaction. One query and one sort
// serve the whole scope, so reading a large tenant costs what reading it once
// costs, not a scan per batch; the caller's other statements run in the same
// transaction between batches.
type ScopeCursor struct {
	s      *Store
	tx     pgx.Tx
	name   string
	raw    bool
	closed bool
}

// scopeCursorName is the cursor's name within its transaction; one scope is
// read at a time per transaction.
const scopeCursorName = "projector_scope"

// scopeReadSQL reads a scope through the events' UNIQUE (tenant_id, stream_type,
// stream_id, version) index: a tenant is a prefix of it, a stream all of it,
// so the read visits the scope's rows only, never the whole log, then sorts
// them into log order (which, by promise 4, is each stream's version order).
// cursor_tuple_fraction = 1 (set before the DECLARE) makes the planner cost
// the whole read, as it does for a plain query, rather than a cursor's
// first tenth: a plan costed for its first rows favours walking the primary
// key in log order (no sort) and filtering out every other tenant's events,
// the full-log read this exists to avoid. A tenant holding most of the log
// may still be read by a sequential scan, which is then the cheaper plan.
//
// The archive (`streams archive`) is read the same way, through its
// primary key (tenant_id, stream_type, stream_id, version), in the same
// statement: archived events are replayed at their places in log order,
// and a stream archived or unarchived meanwhile is read once, from one
// table or the other, as the cursor's snapshot has it.
const scopeReadSQL = `
SELECT e.* FROM (
SELECT ` + eventColumns + `
FROM {{s}}.projector_events e
WHERE e.tenant_id = $1 {{stream}}
  AND e.type = ANY($2)
  AND (e.tx_id, e.seq) <= ($3::xid8, $4::bigint)
UNION ALL
SELECT ` + eventColumns + `
FROM {{s}}.projector_events_archive e
WHERE e.tenant_id = $1 {{stream}}
  AND e.type = ANY($2)
  AND (e.tx_id, e.seq) <= ($3::xid8, $4::bigint)
) e
ORDER BY e.tx_id, e.seq`

// scopeStreamClause narrows the read to one stream. It is spliced in rather
// than made optional with "$5 IS NULL OR …", which a generic plan could not
// use the index for.
const scopeStreamClause = `AND e.stream_type = $5 AND e.stream_id = $6`

// ScopeSQL returns the scope read's query with the store's schema filled
// in, for EXPLAIN in tests and operators' checks. Its parameters are the
// tenant, the event types, the last position (transaction id, sequence)
// and, for a stream scope, the stream type and id.
func (s *Store) ScopeSQL(stream bool) string {
	clause := ""
	if stream {
		clause = scopeStreamClause
	}
	return strings.NewReplacer("{{s}}", quoteIdent(s.schema), "{{stream}}", clause).Replace(scopeReadSQL)
}

// OpenScopeTx declares a cursor over q's events in tx. Close it (or end the
// transaction) when done; a transaction reads one scope at a time.
func (s *Store) OpenScopeTx(ctx context.Context, tx pgx.Tx, q ScopeQuery) (*ScopeCursor, error) {
	if err := q.Validate(); err != nil {
		return nil, fmt.Errorf("read scope: %w", err)
	}
	if err := checkFilter(q.EventTypes, "event type", projector.ErrInvalidEventType); err != nil {
		return nil, fmt.Errorf("read scope: %w", err)
	}
	if len(q.EventTypes) == 0 {
		return nil, fmt.Errorf("read scope: %w: no event types", projector.ErrInvalidEventType)
	}
	args := []any{q.Tenant, q.EventTypes, q.Until.TxID, q.Until.Seq}
	if q.StreamType != "" {
		args = append(args, q.StreamType, q.StreamID)
	}
	if _, err := tx.Exec(ctx, `SET LOCAL cursor_tuple_fraction = 1`); err != nil {
		return nil, fmt.Errorf("read scope: %w", err)
	}
	if _, err := tx.Exec(ctx, `DECLARE `+scopeCursorName+` NO SCROLL CURSOR FOR `+s.ScopeSQL(q.StreamType != ""), args...); err != nil {
		return nil, fmt.Errorf("read scope of %s: %w", q, err)
	}
	return &ScopeCursor{s: s, tx: tx, name: scopeCursorName, raw: q.Raw}, nil
}

// Next returns up to n more events of the scope, in log order; an empty
// result means the scope is read to its end.
func (c *ScopeCursor) Next(ctx context.Context, n int) ([]projector.Event, error) {
	if c.closed {
		return nil, ErrScopeCursorClosed
	}
	if n < 1 {
		return nil, fmt.Errorf("read scope: batch of %d events", n)
	}
	rows, err := c.tx.Query(ctx, fmt.Sprintf(`FETCH FORWARD %d FROM %s`, n, c.name))
	if err != nil {
		return nil, fmt.Errorf("read scope: %w", err)
	}
	events, err := c.s.collect(ctx, c.tx, rows, c.raw)
	if err != nil {
		return nil, fmt.Errorf("read scope: %w", err)
	}
	return events, nil
}

// Close closes the cursor; closing it twice is harmless.
func (c *ScopeCursor) Close(ctx context.Context) error {
	if c.closed {
		return nil
	}
	c.closed = true
	if _, err := c.tx.Exec(ctx, `CLOSE `+c.name); err != nil {
		return fmt.Errorf("read scope: close: %w", err)
	}
	return nil
}

// Validate reports a scope no event could belong to (wrapping
// [projector.ErrInvalidStream]): no tenant, a stream type without an id or
// the reverse, names PostgreSQL cannot store.
func (q ScopeQuery) Validate() error {
	if (q.StreamType == "") != (q.StreamID == "") {
		return fmt.Errorf("%w: a stream scope needs both a stream type and a stream id", projector.ErrInvalidStream)
	}
	ref := projector.StreamRef{Tenant: q.Tenant, Type: q.StreamType, ID: q.StreamID}
	if q.StreamType == "" {
		ref.Type, ref.ID = "scope", "scope" // only the tenant is checked
	}
	return ref.Validate()
}

// String names the scope in errors: "tenant acme" or a stream.
func (q ScopeQuery) String() string {
	if q.StreamType == "" {
		return "tenant " + projector.Printable(q.Tenant)
	}
	return projector.StreamRef{Tenant: q.Tenant, Type: q.StreamType, ID: q.StreamID}.String()
}
