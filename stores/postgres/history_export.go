package postgres

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
)

// ExportOptions selects what [Store.Export] writes. The zero value exports
// the whole log.
type ExportOptions struct {
	// StreamTypes, when non-empty, keeps only events of these stream types.
	StreamTypes []string
	// Tenant, when set, keeps only this tenant's events.
	Tenant string
	// From and To, when set, keep events recorded at or after From and
	// before To.
	From, To time.Time
	// After, when set, starts after this log position: the Horizon of an
	// earlier export, so a series of exports holds every event once.
	After projector.Position
	// Redact, when set, rewrites each event before it is written: the
	// anonymisation hook ([RedactFields] builds one from field paths).
	Redact Redactor
	// IncludeArchived also exports the events of archived streams
	// (`projector streams archive`), each at its place in log order, read
	// from the archive through its position index (migration 23).
	IncludeArchived bool
	// PageSize is the number of events read per query; default
	// [DefaultExportPageSize]. Memory stays within one page whatever the
	// size of the log.
	PageSize int
}

// DefaultExportPageSize is the number of events an export reads per query.
const DefaultExportPageSize = 2000

// ExportResult is what an export wrote.
type ExportResult struct {
	// Events counts the events written.
	Events int64
	// Horizon is where the export stopped: every event of a transaction
	// that finished before the export began is in it (if selected), nothing
	// later is. A later export of what came after starts here.
	Horizon projector.Position
}

// exportSQL reads one page of the log in log order below the horizon taken
// when the export began ($3): rows of transactions that had not finished
// then are left out entirely, so an export never holds half of a
// transaction nor misses an event that commits later below a position it
// already passed (promise 3's rule, applied to a file).
const exportSQL = `
SELECT e.tx_id, e.seq, e.id, e.tenant_id, e.stream_type, e.stream_id, e.version, e.type,
	e.schema_version, e.data, e.correlation_id, e.causation_id, e.actor, e.headers, e.recorded_at, e.envelope
FROM {{e}} e
WHERE (e.tx_id, e.seq) > ($1::xid8, $2::bigint) AND e.tx_id < $3::xid8
  AND ($5::text[] IS NULL OR e.stream_type = ANY($5::text[]))
  AND ($6::text IS NULL OR e.tenant_id = $6::text)
  AND ($7::timestamptz IS NULL OR e.recorded_at >= $7::timestamptz)
  AND ($8::timestamptz IS NULL OR e.recorded_at < $8::timestamptz)
ORDER BY e.tx_id, e.seq
LIMIT $4`

// exportArchivedSQL is exportSQL over the hot log and the archive: each
// table read in log order through its position index, up to a page, and
// the two merged (archived streams are whole streams, so no stream is in
// both).
var exportArchivedSQL = `SELECT * FROM ((` + strings.ReplaceAll(exportSQL, "{{e}}", "{{s}}.projector_events") + `)
UNION ALL (` + strings.ReplaceAll(exportSQL, "{{e}}", "{{s}}.projector_events_archive") + `)) u
ORDER BY u.tx_id, u.seq
LIMIT $4`

// Export writes the log, or the part opts selects, to w as a history file
// (see [HistoryEvent]), in log order. It reads in pages, so memory does not
// grow with the log, and only below a horizon it fixes when it starts: the
// file holds exactly the selected events of the transactions that had
// finished by then, none of a transaction still open, which is what a
// consumer would have seen. When a transaction older than the newest event
// is still open, it first waits, up to ctx, for it to end, so every event
// committed before the export began is in the file.
//
// Payloads are written as stored, at their stored schema version (not
// upcast), so an import writes the same log again.
func (s *Store) Export(ctx context.Context, w io.Writer, opts ExportOptions) (ExportResult, error) {
	page := cmp.Or(opts.PageSize, DefaultExportPageSize)
	if page < 1 {
		return ExportResult{}, fmt.Errorf("%w: export: page size %d: want 1 or more", ErrInvalidConfig, page)
	}
	if err := checkFilter(opts.StreamTypes, "stream type", projector.ErrInvalidStream); err != nil {
		return ExportResult{}, fmt.Errorf("export: %w", err)
	}
	var tenant *string
	if opts.Tenant != "" {
		if err := checkFilter([]string{opts.Tenant}, "tenant", projector.ErrInvalidStream); err != nil {
			return ExportResult{}, fmt.Errorf("export: %w", err)
		}
		tenant = &opts.Tenant
	}
	var from, to *time.Time
	if !opts.From.IsZero() {
		from = &opts.From
	}
	if !opts.To.IsZero() {
		to = &opts.To
	}
	xmin, err := s.exportHorizon(ctx, opts.IncludeArchived)
	if err != nil {
		return ExportResult{}, fmt.Errorf("export: %w", err)
	}
	res := ExportResult{Horizon: projector.Horizon(xmin)}
	enc := NewHistoryEncoder(w)
	sql := strings.ReplaceAll(strings.ReplaceAll(exportSQL, "{{e}}", "{{s}}.projector_events"), "{{s}}", quoteIdent(s.schema))
	if opts.IncludeArchived {
		sql = strings.ReplaceAll(exportArchivedSQL, "{{s}}", quoteIdent(s.schema))
	}
	after := opts.After
	for {
		rows, err := s.pool.Query(ctx, sql, after.TxID, after.Seq, xmin, page, nilIfEmpty(opts.StreamTypes), tenant, from, to)
		if err != nil {
			return res, fmt.Errorf("export after %s: %w", after, err)
		}
		n := 0
		var r row
		var werr error
		_, err = pgx.ForEachRow(rows, r.dest(false), func() error {
			n++
			r.own()
			// The envelope goes back in the payload: the format has
			// one form, whatever the row's (an import keeps it there).
			data, err := r.payload()
			if err != nil {
				return err
			}
			ev, err := DecodeEnvelope(r.txID, r.seq, r.id, projector.StreamRef{Tenant: r.intern(r.tenant), Type: r.intern(r.streamType), ID: r.streamID},
				r.version, r.intern(r.typ), int(r.schemaVersion), data, r.correlation, nil, r.intern(r.actor), r.headers, r.recordedAt)
			if err != nil {
				return err
			}
			if r.causation != nil {
				ev.Metadata.CausationID = *r.causation
			}
			after = ev.Position
			h := HistoryEventOf(ev)
			if opts.Redact != nil {
				if err := opts.Redact(&h); err != nil {
					return fmt.Errorf("redact event %s: %w", ev.ID, err)
				}
			}
			if werr = enc.Encode(h); werr != nil {
				return werr
			}
			res.Events++
			return nil
		})
		if err != nil {
			if werr != nil {
				return res, fmt.Errorf("export: write: %w", werr)
			}
			return res, fmt.Errorf("export after %s: %w", after, err)
		}
		if n < page {
			break
		}
	}
	if err := enc.Flush(); err != nil {
		return res, fmt.Errorf("export: write: %w", err)
	}
	return res, nil
}

// exportHorizon waits until every event committed before the export began
// is below the gap-safe horizon, and returns that horizon: transactions
// that were still open, anywhere in the cluster, when the newest of those
// events committed hold it back until they end (promise 3), so the export
// waits for them, up to ctx, rather than leave recent events out.
//
// With the archive included, its newest event counts too: archived events
// keep their transaction ids, and a stream archived soon after its last
// append can hold the newest of them. Counting the hot table alone, an
// export of a log whose streams were all archived had no head to wait for
// and, while another transaction was open, read below a horizon that had
// not passed them: it wrote fewer events than the log held and reported
// success.
func (s *Store) exportHorizon(ctx context.Context, archived bool) (uint64, error) {
	q := `SELECT max(tx_id) FROM {{s}}.projector_events`
	if archived {
		q = `SELECT greatest((SELECT max(tx_id) FROM {{s}}.projector_events), (SELECT max(tx_id) FROM {{s}}.projector_events_archive))`
	}
	var head *uint64
	if err := s.pool.QueryRow(ctx, s.sqlFor(q)).Scan(&head); err != nil {
		return 0, fmt.Errorf("read the log's head: %w", err)
	}
	wait := 5 * time.Millisecond
	for {
		var xmin uint64
		if err := s.pool.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())`).Scan(&xmin); err != nil {
			return 0, fmt.Errorf("read the horizon: %w", err)
		}
		if head == nil || xmin > *head {
			return xmin, nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("waiting for transactions older than the log's newest event to end: %w", context.Cause(ctx))
		case <-time.After(wait):
			wait = min(2*wait, 250*time.Millisecond)
		}
	}
}

// Redactor rewrites an event of an export before it is written: the hook
// for anonymising history (personal fields dropped or replaced).
type Redactor func(h *HistoryEvent) error

// RedactFields returns a [Redactor] that replaces the payload fields at the
// given paths, in every event that has them, with the zero value of the
// same JSON kind ("" for a string, 0 for a number, false, {} or []), so the
// payload still decodes into its Go type. A path is dot-separated field
// names from the payload's top level ("email", "customer.email" for the
// email of a customer object), never prefixed by a stream or event type;
// where it meets an array it applies to every element. Paths name fields of
// payloads, not of metadata. This is the hook that declared personal fields
// of event definitions feed: pass it their paths. [NewFieldRedactor] is
// the same with a count of what each path redacted.
func RedactFields(paths []string) (Redactor, error) {
	r, err := NewFieldRedactor(paths)
	if err != nil {
		return nil, err
	}
	return r.Redact, nil
}

// FieldRedactor redacts payload fields as [RedactFields] does and counts,
// per path, the events it found the field in. A path that found none
// redacted nothing: a typo, or a stream type put before the field name,
// leaves the field in clear in every event, and only the count shows it.
// It is safe for concurrent use.
type FieldRedactor struct {
	paths   []string
	split   [][]string
	matched []atomic.Int64
}

// NewFieldRedactor returns a FieldRedactor of paths (see [RedactFields]);
// a path that is not dot-separated field names is refused.
func NewFieldRedactor(paths []string) (*FieldRedactor, error) {
	r := &FieldRedactor{paths: slices.Clone(paths), split: make([][]string, 0, len(paths)), matched: make([]atomic.Int64, len(paths))}
	for _, p := range paths {
		parts := strings.Split(p, ".")
		for _, part := range parts {
			if part == "" || projector.ValidText(part) != nil {
				return nil, fmt.Errorf("redact path %s: want dot-separated field names such as customer.email", projector.Printable(p))
			}
		}
		r.split = append(r.split, parts)
	}
	return r, nil
}

// Redact is the [Redactor]: it empties the fields of h's payload at the
// redactor's paths.
func (r *FieldRedactor) Redact(h *HistoryEvent) error {
	if len(r.split) == 0 {
		return nil
	}
	var v any
	dec := json.NewDecoder(bytes.NewReader(h.Payload))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return err
	}
	changed := false
	for i, path := range r.split {
		if redactPath(v, path) {
			r.matched[i].Add(1)
			changed = true
		}
	}
	if !changed {
		return nil
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	h.Payload = bytes.TrimSpace(buf.Bytes())
	return nil
}

// PathCount is how many events a redact path found its field in.
type PathCount struct {
	Path   string
	Events int64
}

// Matched returns, for each path in the order given, the number of events
// it found the field in so far (an already empty field counts: it was
// there to redact).
func (r *FieldRedactor) Matched() []PathCount {
	out := make([]PathCount, len(r.paths))
	for i, p := range r.paths {
		out[i] = PathCount{Path: p, Events: r.matched[i].Load()}
	}
	return out
}

// redactPath zeroes the value at path under v and reports whether it found
// one.
func redactPath(v any, path []string) bool {
	switch x := v.(type) {
	case []any:
		found := false
		for _, el := range x {
			found = redactPath(el, path) || found
		}
		return found
	case map[string]any:
		child, ok := x[path[0]]
		if !ok {
			return false
		}
		if len(path) > 1 {
			return redactPath(child, path[1:])
		}
		x[path[0]] = zeroOfKind(child)
		return true
	}
	return false
}

func zeroOfKind(v any) any {
	switch v.(type) {
	case string:
		return ""
	case json.Number, float64:
		return 0
	case bool:
		return false
	case map[string]any:
		return map[string]any{}
	case []any:
		return []any{}
	}
	return nil
}
