package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
)

// DefaultInlineRefresh is how often a store re-reads the inline projections
// recorded in its schema unless [Config.InlineRefresh] says otherwise.
const DefaultInlineRefresh = time.Second

// refusalRefresh is how old a reading must be before a refusal based on it
// starts a refresh of its own.
const refusalRefresh = 100 * time.Millisecond

// ErrInlineProjectionRequired means an append was refused because an inline
// projection recorded in the schema covers one of its event types and this
// store does not run that projection, or runs an older version of it.
// Appending would leave that projection's read model wrong with no warning,
// so nothing is written and the transaction stays usable. The error is an
// [*InlineProjectionError], which says which projection and event type, and
// what to do.
var ErrInlineProjectionRequired = errors.New("projector: append needs an inline projection this store does not run")

// RecordedInline is an [InlineProjection] the store can record in the
// database, so that other processes appending to the same schema without it
// (or with an older version) are refused instead of silently bypassing it.
// projection.Inline implements it. An inline projection that does not is
// still applied by this store but not recorded, so it fences nobody.
type RecordedInline interface {
	InlineProjection
	// EventTypes lists the event types the projection handles.
	EventTypes() []string
	// Version is the projection's definition version, at least 1. Raise it
	// when a change must stop older binaries from writing its types.
	Version() int
}

// InlineProjectionError is the detail of [ErrInlineProjectionRequired]: the
// recorded projection that covers EventType, and what this store has of it.
type InlineProjectionError struct {
	// Projection is the recorded inline projection's name.
	Projection string
	// EventType is the covered type the append carried.
	EventType string
	// Recorded is the version recorded in the schema.
	Recorded int
	// Have is this store's version of the projection; 0 when it does not run
	// it at all.
	Have int
}

// Error implements error.
func (e *InlineProjectionError) Error() string {
	switch {
	case e.Have == 0:
		return fmt.Sprintf("%s: event type %q is covered by inline projection %q (version %d, recorded by a process writing to this schema), "+
			"which this store was not given; add it to postgres.Config.Inline, or, if it is gone for good, retire it with postgres.RetireInlineProjection",
			ErrInlineProjectionRequired, e.EventType, e.Projection, e.Recorded)
	case e.Have < e.Recorded:
		return fmt.Sprintf("%s: event type %q is covered by inline projection %q version %d, and this store runs version %d; "+
			"an older binary may not write it: finish deploying the new version (to roll back, stop the new version and retire the projection with postgres.RetireInlineProjection)",
			ErrInlineProjectionRequired, e.EventType, e.Projection, e.Recorded, e.Have)
	default:
		return fmt.Sprintf("%s: event type %q is covered by inline projection %q version %d, but this store's version %d does not handle it; "+
			"two definitions share one version: raise the version of the one that is meant to win",
			ErrInlineProjectionRequired, e.EventType, e.Projection, e.Recorded, e.Have)
	}
}

// Is makes the error match [ErrInlineProjectionRequired].
func (e *InlineProjectionError) Is(target error) bool { return target == ErrInlineProjectionRequired }

// inlineFence is one reading of the recorded inline projections, reduced to
// what an append needs: for each event type this store may not append, why.
// It is immutable once built; refreshes swap in a new one.
type inlineFence struct {
	blocked map[string]*InlineProjectionError
	loaded  time.Time
	seq     uint64 // order of the reading; see publish
}

// inlineState is the store's part of the inline-projection record: its own
// versions and handled types, and the latest fence.
type inlineState struct {
	mine       map[string]ownInline // by projection name; recorded ones only
	refresh    time.Duration
	recordSQL  string
	readSQL    string
	fence      atomic.Pointer[inlineFence]
	reads      atomic.Uint64 // numbers readings, so an older one never replaces a newer
	refreshing atomic.Bool
}

type ownInline struct {
	version  int
	typeList []string // sorted, as recorded
	types    map[string]bool
}

// recordedInline is one row of projector_inline_projections.
type recordedInline struct {
	name    string
	version int
	types   []string
}

const recordInlineSQL = `
INSERT INTO {{s}}.projector_inline_projections AS p (name, version, event_types)
VALUES ($1, $2, $3)
ON CONFLICT (name) DO UPDATE SET
	event_types = CASE WHEN excluded.version > p.version THEN excluded.event_types
		ELSE ARRAY(SELECT DISTINCT t FROM unnest(p.event_types || excluded.event_types) AS t ORDER BY t) END,
	version = GREATEST(p.version, excluded.version),
	updated_at = now()
WHERE excluded.version > p.version
   OR (excluded.version = p.version AND NOT excluded.event_types <@ p.event_types)`

const readInlineSQL = `SELECT name, version, event_types FROM {{s}}.projector_inline_projections ORDER BY name`

// setupInline records the store's inline projections and loads the fence.
// It runs once, in New.
func (s *Store) setupInline(ctx context.Context, projections []InlineProjection, refresh time.Duration, quiet bool) error {
	if refresh < 0 {
		return fmt.Errorf("postgres store: Config.InlineRefresh is %v; want 0 (default %v) or more", refresh, DefaultInlineRefresh)
	}
	r := strings.NewReplacer("{{s}}", quoteIdent(s.schema))
	s.inlineRec = &inlineState{
		mine:      map[string]ownInline{},
		refresh:   cmp.Or(refresh, DefaultInlineRefresh),
		recordSQL: r.Replace(recordInlineSQL),
		readSQL:   r.Replace(readInlineSQL),
	}
	for _, p := range projections {
		rp, ok := p.(RecordedInline)
		if !ok {
			continue
		}
		if rp.Version() < 1 {
			return fmt.Errorf("postgres store: inline projection %q has version %d; want 1 or more", rp.Name(), rp.Version())
		}
		types := slices.Sorted(slices.Values(rp.EventTypes()))
		own := ownInline{version: rp.Version(), typeList: types, types: make(map[string]bool, len(types))}
		for _, t := range types {
			own.types[t] = true
		}
		s.inlineRec.mine[rp.Name()] = own
	}
	// The first refresh records what the schema lacks.
	if err := s.RefreshInline(ctx); err != nil {
		return fmt.Errorf("postgres store: %w", err)
	}
	// An older version is a deploy in progress or a binary left behind:
	// worth a warning. A missing projection is normal for a process that
	// only reads (the CLI, a dashboard), so it is only noted, once per
	// process (a process may open a store per request), and not at all
	// when the store is told it only reads.
	for name, b := range s.inlineRec.fence.Load().byProjection() {
		if b.Have == 0 {
			if quiet || !noteOnce(s.schema, name, b.Recorded) {
				continue
			}
			s.logger.InfoContext(ctx, "postgres store: an inline projection recorded in the schema is not in Config.Inline; appends of the event types it covers will be refused",
				slog.String("schema", s.schema), slog.String("projection", name), slog.Int("recorded_version", b.Recorded))
			continue
		}
		s.logger.WarnContext(ctx, "postgres store: an inline projection recorded in the schema is newer than this store's; appends of the event types it covers will be refused",
			slog.String("schema", s.schema), slog.String("projection", name),
			slog.Int("recorded_version", b.Recorded), slog.Int("version", b.Have))
	}
	return nil
}

// InlineNames returns the names of the recorded inline projections this
// store runs (those of Config.Inline that implement [RecordedInline]),
// sorted: a dispatcher sharing the store publishes the progress of their
// rebuilds, which run in this process's code.
func (s *Store) InlineNames() []string {
	if s.inlineRec == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(s.inlineRec.mine))
}

// byProjection picks one refusal per projection, for the start-up warning.
func (f *inlineFence) byProjection() map[string]*InlineProjectionError {
	out := map[string]*InlineProjectionError{}
	for _, b := range f.blocked {
		if b.Have == 0 || b.Have < b.Recorded {
			out[b.Projection] = b
		}
	}
	return out
}

// RefreshInline re-reads the inline projections recorded in the schema now,
// and records again any of this store's own that the record lacks (or has at
// an older version, or without all of its types), so a projection retired
// while a process still runs it comes back, and the fence holds while anyone
// applies it. A store does this by itself at most every
// [Config.InlineRefresh], in the background and never inside an append, so
// calling it is only needed where a change must take effect at once: in
// tests, or after [RetireInlineProjection] in the same process.
func (s *Store) RefreshInline(ctx context.Context) error {
	st := s.inlineRec
	seq := st.reads.Add(1)
	recorded, err := s.readInline(ctx)
	if err != nil {
		return err
	}
	if missing := st.unrecorded(recorded); len(missing) > 0 {
		if err := s.recordInline(ctx, missing); err != nil {
			return err
		}
		if recorded, err = s.readInline(ctx); err != nil {
			return err
		}
	}
	f := st.buildFence(recorded, time.Now())
	f.seq = seq
	st.publish(f)
	return nil
}

// publish installs f unless a reading that started later is already in
// place: a slow background refresh must not bring back a fence that a
// RefreshInline after a retire has lifted.
func (st *inlineState) publish(f *inlineFence) {
	for {
		cur := st.fence.Load()
		if cur != nil && cur.seq > f.seq {
			return
		}
		if st.fence.CompareAndSwap(cur, f) {
			return
		}
	}
}

func (s *Store) readInline(ctx context.Context) ([]recordedInline, error) {
	rows, err := s.pool.Query(ctx, s.inlineRec.readSQL)
	if err != nil {
		return nil, fmt.Errorf("read inline projections: %w", err)
	}
	var recorded []recordedInline
	var r recordedInline
	_, err = pgx.ForEachRow(rows, []any{&r.name, &r.version, &r.types}, func() error {
		recorded = append(recorded, r)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read inline projections: %w", err)
	}
	return recorded, nil
}

// recordInline upserts names (this store's own projections) in one
// transaction; the statement keeps the newest version.
func (s *Store) recordInline(ctx context.Context, names []string) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		for _, name := range names {
			own := s.inlineRec.mine[name]
			if _, err := tx.Exec(ctx, s.inlineRec.recordSQL, name, own.version, own.typeList); err != nil {
				return fmt.Errorf("record inline projection %q: %w", name, err)
			}
		}
		return nil
	})
}

// unrecorded lists this store's projections the record does not cover as
// well as the store applies them, in name order.
func (st *inlineState) unrecorded(recorded []recordedInline) []string {
	byName := make(map[string]recordedInline, len(recorded))
	for _, r := range recorded {
		byName[r.name] = r
	}
	var out []string
	for name, own := range st.mine {
		r, ok := byName[name]
		switch {
		case !ok, r.version < own.version:
			out = append(out, name)
		case r.version == own.version:
			for _, t := range own.typeList {
				if !slices.Contains(r.types, t) {
					out = append(out, name)
					break
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// buildFence decides, once per reading, which event types this store may
// not append, so an append only looks its types up in a map (usually empty).
func (st *inlineState) buildFence(recorded []recordedInline, now time.Time) *inlineFence {
	f := &inlineFence{loaded: now}
	for _, rec := range recorded {
		own, ok := st.mine[rec.name]
		if ok && own.version > rec.version {
			continue // this store is newer; its own definition decides
		}
		for _, typ := range rec.types {
			if ok && own.version == rec.version && own.types[typ] {
				continue
			}
			if f.blocked == nil {
				f.blocked = map[string]*InlineProjectionError{}
			}
			if _, dup := f.blocked[typ]; dup {
				continue // recorded is in name order: report the first
			}
			f.blocked[typ] = &InlineProjectionError{Projection: rec.name, EventType: typ, Recorded: rec.version, Have: own.version}
		}
	}
	return f
}

// checkInline refuses an append of a type a recorded inline projection
// covers and this store cannot apply. It costs a clock read and, only when
// something is fenced, one map lookup per event; a stale reading starts a
// refresh in the background rather than a round trip here.
func (s *Store) checkInline(ctx context.Context, types []string) error {
	st := s.inlineRec
	if st == nil {
		return nil // a Store not built by New records nothing
	}
	f := st.fence.Load()
	if time.Since(f.loaded) >= st.refresh {
		s.refreshInlineAsync(ctx)
	}
	if len(f.blocked) == 0 {
		return nil
	}
	for _, typ := range types {
		if b := f.blocked[typ]; b != nil {
			// A refusal may rest on a reading up to InlineRefresh old (the
			// projection may have been retired since): refresh now, so a
			// retry sees the current record, but not for every refusal of
			// a writer retrying in a loop.
			if time.Since(f.loaded) >= min(st.refresh, refusalRefresh) {
				s.refreshInlineAsync(ctx)
			}
			e := *b
			return &e
		}
	}
	return nil
}

// refreshInlineAsync starts one background refresh unless one is running.
// It uses the pool, not the caller's transaction: the caller's role (a
// tenant role, say) need not read Projector's tables, and a failed read
// must not abort the caller's work. A failed refresh keeps the previous
// reading and is retried after another interval.
func (s *Store) refreshInlineAsync(ctx context.Context) {
	st := s.inlineRec
	if !st.refreshing.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer st.refreshing.Store(false)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := s.RefreshInline(rctx); err != nil {
			old := st.fence.Load()
			st.publish(&inlineFence{blocked: old.blocked, loaded: time.Now(), seq: old.seq})
			s.logger.WarnContext(rctx, "postgres store: could not re-read the recorded inline projections; keeping the previous reading",
				slog.String("schema", s.schema), slog.Any("error", err))
		}
	}()
}

// RetireInlineProjection removes the record of an inline projection from
// schema, so stores that do not run it may append the event types it
// covered again (each within its InlineRefresh). Retire a projection once
// no binary runs it any more: a store that still has it records it again
// when it starts. It is also the way to roll an inline projection back to an
// older version: stop every process running the newer one, retire it, and
// start the older ones, which record their version. It reports whether a
// record was removed. db needs DELETE on projector_inline_projections.
func RetireInlineProjection(ctx context.Context, db DBTX, schema, name string) (bool, error) {
	schema = schemaOrDefault(schema)
	if err := ValidateSchema(schema); err != nil {
		return false, err
	}
	if err := projector.ValidText(name); err != nil || name == "" || len(name) > projector.MaxNameLength {
		return false, fmt.Errorf("%w: retire inline projection %s: not a projection name", ErrInvalidConfig, projector.Quoted(name))
	}
	tag, err := db.Exec(ctx, `DELETE FROM `+quoteIdent(schema)+`.projector_inline_projections WHERE name = $1`, name)
	if err != nil {
		return false, fmt.Errorf("retire inline projection %q: %w", name, err)
	}
	return tag.RowsAffected() > 0, nil
}

// notedInline holds the (schema, projection, recorded version) keys whose
// "not in Config.Inline" note this process has logged. It is process-wide
// on purpose: the note is about the process's code, not about one store,
// and an application that opens a store per request (or the CLI, a store
// per step) would otherwise repeat it on every open.
var notedInline sync.Map

// noteOnce reports whether the note for key is this process's first.
func noteOnce(schema, projection string, recorded int) bool {
	_, seen := notedInline.LoadOrStore(schema+"\x1f"+projection+"\x1f"+strconv.Itoa(recorded), struct{}{})
	return !seen
}
