package projectiontest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// Config is one spec's set-up. Store and exactly one of Async and Inline
// are required.
type Config struct {
	// Store is the database the spec runs in, in a transaction of its own
	// that is rolled back when the test ends. The read-model tables must
	// exist (created, committed, once per test binary); nothing the spec
	// writes is ever committed.
	Store *postgres.Store
	// Async is the projection under test: an async projection, or a
	// search projection through its Async method. It is applied as a live
	// dispatcher pass applies a batch (see [projection.ApplyTx]).
	Async *projection.Async
	// Inline is the projection under test when it is an inline one: it is
	// applied as an append applies it, one stream's events at a time in
	// the transaction, scoped to their tenant.
	Inline *projection.Inline
	// Tenant, when set, is the tenant of every event given on a stream of
	// the system tenant (one made with [projector.Stream]), so a spec
	// written without tenants runs as one tenant's, scoped as a dispatcher
	// scopes it. Row-level security applies as in production: only with
	// the store's TenantRole, or a login role that bypasses none. Empty
	// leaves streams as given.
	Tenant string
	// Deterministic gives events ids derived from the test's name and the
	// event's number in the spec, the same on every run and different
	// from every other spec's, instead of random ones.
	Deterministic bool
	// Clock stamps the events' RecordedAt. Nil means a new clock at
	// [Start] when Deterministic is set, else at the time the spec starts.
	Clock *Clock
	// Logger receives the panics of handlers; nil means slog.Default().
	Logger *slog.Logger
}

// Spec is one Given/When/Then specification of a projection on a real
// database: events given, then the rows expected. Build it with [New].
type Spec struct {
	t     testing.TB
	cfg   Config
	ctx   context.Context
	tx    pgx.Tx
	clock *Clock
	ev    events
	// eventLog is what became of the events given, for failure messages
	// and the check at the end of the test.
	eventLog
}

// New starts a spec: it begins the spec's transaction on cfg.Store and
// rolls it back when the test ends. A bad Config fails the test, and so
// does a spec that ends with events given and never applied (a Given or
// When with no check after it): they would pass whatever the projection
// did with them.
func New(t testing.TB, cfg Config) *Spec {
	t.Helper()
	if cfg.Store == nil {
		t.Fatalf("projectiontest: Config.Store is required (use NewMemory for specs without a database)")
	}
	if (cfg.Async == nil) == (cfg.Inline == nil) {
		t.Fatalf("projectiontest: set exactly one of Config.Async and Config.Inline")
	}
	reg := cfg.Store.Registry()
	var err error
	if cfg.Async != nil {
		err = cfg.Async.Validate(reg)
	} else {
		err = cfg.Inline.Validate(reg)
	}
	if err != nil {
		t.Fatalf("projectiontest: %v", err)
	}
	s := &Spec{t: t, cfg: cfg, ctx: context.Background()}
	s.clock = clockFor(cfg.Clock, cfg.Deterministic)
	s.ev = newEvents(t, reg, cfg.Tenant, cfg.Deterministic, s.clock)
	tx, err := cfg.Store.Pool().Begin(s.ctx)
	if err != nil {
		t.Fatalf("projectiontest: begin the spec's transaction: %v", err)
	}
	s.tx = tx
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("projectiontest: roll back the spec's transaction: %v", err)
		}
	})
	t.Cleanup(func() { s.checkApplied(t, "Then, ThenRows, ThenRowsArgs, ThenFails") })
	return s
}

func clockFor(c *Clock, deterministic bool) *Clock {
	switch {
	case c != nil:
		return c
	case deterministic:
		return NewClock(Start)
	default:
		return NewClock(time.Now().UTC().Truncate(time.Microsecond))
	}
}

// Clock returns the spec's clock, to move time between events
// ([Clock.Advance]) or hand to the code under test.
func (s *Spec) Clock() *Clock { return s.clock }

// Tx returns the spec's transaction, for set-up the projection expects
// (rows of another table) and for checks of one's own. It is rolled back
// when the test ends; do not commit it.
func (s *Spec) Tx() pgx.Tx { return s.tx }

// Given adds events: each payload appended to stream as its next version,
// stamped with the clock's time. Events given before a check are applied
// together as one batch, as a dispatcher pass would receive them.
func (s *Spec) Given(stream projector.StreamRef, payloads ...any) *Spec {
	s.t.Helper()
	s.add(s.ev.fromPayloads(stream, payloads))
	return s
}

// GivenEvents adds events as they are stored, for a payload in an old
// schema version (the projection's upcasters run on it) or metadata that
// matters: each needs Stream, Type, SchemaVersion and Data; a zero ID,
// Version or RecordedAt is filled in as [Spec.Given] would, and Payload is
// ignored (it is decoded from Data, as in production).
func (s *Spec) GivenEvents(evs ...projector.Event) *Spec {
	s.t.Helper()
	s.add(s.ev.fromEvents(evs))
	return s
}

// When applies what was given so far, then adds these events as a batch
// of their own: the events under test after the history they meet.
func (s *Spec) When(stream projector.StreamRef, payloads ...any) *Spec {
	s.t.Helper()
	s.flush()
	s.add(s.ev.fromPayloads(stream, payloads))
	return s
}

// flush applies the pending events; a failure fails the test.
func (s *Spec) flush() {
	s.t.Helper()
	if err := s.applyPending(); err != nil {
		s.t.Fatalf("projectiontest: %s\n%s", err, s.describe())
	}
}

// applyPending applies the pending events as one batch. On a failure the
// events before the failing one stay applied, the failing one's effects
// are rolled back, and the events after it stay pending for the next
// check (see [Spec.ThenFails]).
func (s *Spec) applyPending() error {
	batch := s.pending
	s.pending = nil
	if len(batch) == 0 {
		return nil
	}
	// The apply path decodes (and upcasts) the events it is given in
	// place; events carried over to the next check must be as given.
	done, failed, err := s.apply(slices.Clone(batch))
	s.settle(batch, done, failed)
	return err
}

// apply applies batch and says how far it got: batch[:done] applied,
// batch[done:done+failed] failed and rolled back, the rest not applied.
// Failed is 0 when err is nil.
func (s *Spec) apply(batch []projector.Event) (done, failed int, err error) {
	if s.cfg.Inline != nil {
		return s.applyInline(batch)
	}
	err = projection.ApplyTx(s.ctx, s.tx, s.cfg.Store, s.cfg.Async, batch, s.cfg.Logger)
	if err == nil {
		return len(batch), 0, nil
	}
	var ae *projection.ApplyError
	if errors.As(err, &ae) {
		for i, ev := range batch {
			if ev.ID == ae.Event.ID && ev.Position == ae.Event.Position {
				return i, 1, err
			}
		}
	}
	// A failure of the batch as a whole (a batch timeout, a broken
	// transaction): which events took effect is not known.
	return 0, len(batch), err
}

// applyInline applies an inline projection as appends would: one stream's
// run of events at a time, scoped to its tenant, each under a savepoint so
// a refused append leaves the spec's transaction usable, as the caller's
// rollback would leave the database.
func (s *Spec) applyInline(batch []projector.Event) (done, failed int, err error) {
	reg := s.cfg.Store.Registry()
	for start := 0; start < len(batch); {
		end := start + 1
		for end < len(batch) && batch[end].Stream == batch[start].Stream {
			end++
		}
		if err := s.applyRun(reg, batch[start:end]); err != nil {
			return start, end - start, err
		}
		start = end
	}
	return len(batch), 0, nil
}

// applyRun applies one stream's run of events as one append, all or
// nothing.
func (s *Spec) applyRun(reg *projector.Registry, run []projector.Event) error {
	for i := range run {
		payload, data, err := reg.Decode(run[i].Type, run[i].SchemaVersion, run[i].Data)
		if err != nil {
			return &projection.ApplyError{Event: run[i], Err: err}
		}
		run[i].Payload, run[i].Data = payload, data
	}
	if _, err := s.tx.Exec(s.ctx, "SAVEPOINT projectiontest_append"); err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	err := s.cfg.Store.ScopeTx(s.ctx, s.tx, run[0].Stream.Tenant)
	if err == nil {
		err = s.cfg.Inline.ApplyInline(s.ctx, s.tx, run)
	}
	if err != nil {
		if _, rerr := s.tx.Exec(s.ctx, "ROLLBACK TO SAVEPOINT projectiontest_append"); rerr != nil {
			return fmt.Errorf("%w (and rolling back to the savepoint failed: %v)", err, rerr)
		}
		return &projection.ApplyError{Event: run[0], Err: err}
	}
	return s.cfg.Store.ScopeTx(s.ctx, s.tx, projector.SystemTenant)
}

// Row is one row a check expects, its cells in the query's column order.
// Cells compare by their printed form (see [Spec.ThenRows]).
type Row []any

// ThenRows applies what was given and checks that query returns exactly
// want, in order (give the query an ORDER BY). Cells compare by their
// printed form, so 3 matches an int4, an int8 or a numeric 3, and a time
// compares in RFC 3339 in UTC; values that differ never print alike: nil
// (or a nil pointer or slice) matches NULL and only NULL, so not the text
// 'NULL', and an array matches a Go slice element by element, so
// []string{"a", "b"} matches {a,b} but not {"a b"} or the text '[a b]'. A
// difference fails the test with the events applied, the rows wanted and
// the rows found.
func (s *Spec) ThenRows(query string, want ...Row) *Spec {
	s.t.Helper()
	return s.thenRows(query, nil, want)
}

// ThenRowsArgs is [Spec.ThenRows] for a query with parameters: args are
// its $1, $2…, as pgx takes them, so a value a test computes (an id, a
// time) needs no quoting into the query text.
func (s *Spec) ThenRowsArgs(query string, args []any, want ...Row) *Spec {
	s.t.Helper()
	return s.thenRows(query, args, want)
}

func (s *Spec) thenRows(query string, args []any, want []Row) *Spec {
	s.t.Helper()
	s.flush()
	found, err := s.query(query, args)
	if err != nil {
		s.t.Errorf("projectiontest: %s: %v\n%s", oneLine(query), err, s.describe())
		return s
	}
	wantText := make([][]string, len(want))
	for i, r := range want {
		wantText[i] = cells(r)
	}
	if diff := firstDiff(wantText, found); diff != "" {
		s.t.Errorf("projectiontest: %s: %s\n%s\nwant %s\nfound %s", oneLine(query), diff, s.describe(),
			describeRows(wantText), describeRows(found))
	}
	return s
}

// Then applies what was given and runs check in the spec's transaction; an
// error it returns fails the test, with the events applied.
func (s *Spec) Then(check func(ctx context.Context, tx pgx.Tx) error) *Spec {
	s.t.Helper()
	s.flush()
	if err := check(s.ctx, s.tx); err != nil {
		s.t.Errorf("projectiontest: check failed: %v\n%s", err, s.describe())
	}
	return s
}

// ThenFails applies what was given and expects it to fail: an event's
// handler (or its decoding, or a queued write) returns an error whose
// message contains want. The failing event's effects are rolled back (an
// inline projection's: its whole append, the stream's run of events in
// the batch), the events before it stay applied, and the events after it
// are not applied yet: they stay given, and the next check (or When)
// applies them, as a dispatcher goes on past an event it dead-letters. So
// the spec goes on from the failure, and nothing given is passed over.
func (s *Spec) ThenFails(want string) *Spec {
	s.t.Helper()
	err := s.applyPending()
	switch {
	case err == nil:
		s.t.Errorf("projectiontest: the events applied, want a failure containing %q\n%s", want, s.describe())
	case !strings.Contains(err.Error(), want):
		s.t.Errorf("projectiontest: failed with %v, want a failure containing %q\n%s", err, want, s.describe())
	}
	return s
}

func (s *Spec) query(query string, args []any) ([][]string, error) {
	rows, err := s.tx.Query(s.ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) ([]string, error) {
		v, err := row.Values()
		return cells(v), err
	})
}

func describeRows(rows [][]string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d rows:", len(rows))
	for _, r := range rows {
		b.WriteString("\n  (" + strings.Join(r, ", ") + ")")
	}
	return b.String()
}

// firstDiff names the first row where want and found part, "" if none.
func firstDiff(want, found [][]string) string {
	for i := range max(len(want), len(found)) {
		switch {
		case i >= len(found):
			return fmt.Sprintf("row %d missing: want (%s)", i+1, strings.Join(want[i], ", "))
		case i >= len(want):
			return fmt.Sprintf("row %d unexpected: found (%s)", i+1, strings.Join(found[i], ", "))
		case strings.Join(want[i], "\x00") != strings.Join(found[i], "\x00") || len(want[i]) != len(found[i]):
			return fmt.Sprintf("row %d differs: want (%s), found (%s)", i+1, strings.Join(want[i], ", "), strings.Join(found[i], ", "))
		}
	}
	return ""
}

func oneLine(q string) string { return strings.Join(strings.Fields(q), " ") }
