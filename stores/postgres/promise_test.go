package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// countInline is an inline projection that counts events per stream in a
// table of the test's schema, and fails when told to.
type countInline struct {
	table string
	fail  atomic.Bool
}

func (c *countInline) Name() string { return "count" }

func (c *countInline) Validate(*projector.Registry) error { return nil }

func (c *countInline) ApplyInline(ctx context.Context, tx pgx.Tx, events []projector.Event) error {
	for _, ev := range events {
		if _, err := tx.Exec(ctx, `INSERT INTO `+c.table+` (stream_id, n) VALUES ($1, 1)
			ON CONFLICT (stream_id) DO UPDATE SET n = `+c.table+`.n + 1`, ev.Stream.ID); err != nil {
			return err
		}
	}
	if c.fail.Load() {
		return errors.New("inline projection refuses")
	}
	return nil
}

func countRows(t *testing.T, db postgres.DBTX, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// Promise 1: events, inline projections and the caller's own writes commit
// in one transaction or not at all.
func TestPromise1_AtomicAppend(t *testing.T) {
	t.Parallel()
	types := testevents.New()
	schema := pgtest.Schema(t)
	pool := pgtest.Pool(t)
	ctx := context.Background()
	q := pgx.Identifier{schema}.Sanitize()
	for _, sql := range []string{
		`CREATE TABLE ` + q + `.counts (stream_id text PRIMARY KEY, n int NOT NULL)`,
		`CREATE TABLE ` + q + `.orders (id text PRIMARY KEY)`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	inline := &countInline{table: q + ".counts"}
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: types.Registry, Inline: []postgres.InlineProjection{inline}})
	if err != nil {
		t.Fatal(err)
	}
	events := q + ".projector_events"
	streams := q + ".projector_streams"

	t.Run("caller rolls back", func(t *testing.T) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+q+`.orders VALUES ('o-1')`); err != nil {
			t.Fatal(err)
		}
		if _, err := store.Append(ctx, tx, projector.Stream("ticket", "rb"), projector.NoStream, testevents.TicketOpened{Title: "a"}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if n := countRows(t, pool, `SELECT count(*) FROM `+events); n != 0 {
			t.Errorf("%d events after rollback", n)
		}
		if n := countRows(t, pool, `SELECT count(*) FROM `+streams); n != 0 {
			t.Errorf("%d stream heads after rollback", n)
		}
		if n := countRows(t, pool, `SELECT count(*) FROM `+q+`.counts`); n != 0 {
			t.Errorf("%d inline rows after rollback", n)
		}
		if n := countRows(t, pool, `SELECT count(*) FROM `+q+`.orders`); n != 0 {
			t.Errorf("%d caller rows after rollback", n)
		}
	})

	t.Run("inline projection fails and caller still commits", func(t *testing.T) {
		inline.fail.Store(true)
		defer inline.fail.Store(false)
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if _, err := tx.Exec(ctx, `INSERT INTO `+q+`.orders VALUES ('o-2')`); err != nil {
			t.Fatal(err)
		}
		_, err = store.Append(ctx, tx, projector.Stream("ticket", "inl"), projector.NoStream, testevents.TicketOpened{Title: "a"})
		if err == nil || !strings.Contains(err.Error(), "inline projection \"count\"") {
			t.Fatalf("append with failing inline projection: %v", err)
		}
		// A careless caller commits anyway: nothing may land.
		if err := tx.Commit(ctx); err == nil {
			t.Fatal("commit after a failed append succeeded")
		}
		for _, table := range []string{events, streams, q + ".counts", q + ".orders"} {
			if n := countRows(t, pool, `SELECT count(*) FROM `+table); n != 0 {
				t.Errorf("%s has %d rows after a failed inline projection", table, n)
			}
		}
	})

	t.Run("success commits everything together", func(t *testing.T) {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO `+q+`.orders VALUES ('o-3')`); err != nil {
				return err
			}
			_, err := store.Append(ctx, tx, projector.Stream("ticket", "ok"), projector.NoStream,
				testevents.TicketOpened{Title: "a"}, testevents.TicketCommented{Body: "b"})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if n := countRows(t, pool, `SELECT n FROM `+q+`.counts WHERE stream_id = 'ok'`); n != 2 {
			t.Errorf("inline count %d, want 2", n)
		}
		if n := countRows(t, pool, `SELECT count(*) FROM `+events); n != 2 {
			t.Errorf("%d events, want 2", n)
		}
		if n := countRows(t, pool, `SELECT count(*) FROM `+q+`.orders`); n != 1 {
			t.Errorf("%d caller rows, want 1", n)
		}
	})
}

type undefinedEvent struct{ X int }

// Promise 2: an undefined type or an invalid payload is an error at the call
// site and nothing is written, even when other events of the same append
// were fine.
func TestPromise2_StrictDefinitions(t *testing.T) {
	t.Parallel()
	f := setup(t)
	s := projector.Stream("ticket", "strict")
	cases := []struct {
		name     string
		payloads []any
		wantErr  error
	}{
		{"undefined type", []any{undefinedEvent{X: 1}}, projector.ErrUnknownEventType},
		{"undefined after a good one", []any{testevents.TicketOpened{Title: "ok"}, undefinedEvent{}}, projector.ErrUnknownEventType},
		{"invalid payload", []any{testevents.TicketOpened{}}, projector.ErrInvalidPayload},
		{"invalid after a good one", []any{testevents.TicketCommented{Body: "x"}, &testevents.TicketOpened{}}, projector.ErrInvalidPayload},
		{"nil payload", []any{nil}, projector.ErrInvalidPayload},
		{"no payloads", nil, projector.ErrInvalidPayload},
		{"unnamed tenant", nil, projector.ErrInvalidStream},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			stream := s
			if tc.wantErr == projector.ErrInvalidStream {
				stream = projector.StreamRef{Type: "ticket", ID: "x"}
				tc.payloads = []any{testevents.TicketOpened{Title: "ok"}}
			}
			tx, err := f.store.Pool().Begin(f.ctx)
			if err != nil {
				t.Fatal(err)
			}
			_, err = f.store.Append(f.ctx, tx, stream, projector.AnyVersion, tc.payloads...)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("append: %v, want %v", err, tc.wantErr)
			}
			// The transaction is still usable and commits nothing of ours.
			if err := tx.Commit(f.ctx); err != nil {
				t.Fatalf("commit after refused append: %v", err)
			}
			if n := countRows(t, f.store.Pool(), `SELECT count(*) FROM `+f.store.Table("projector_events")); n != 0 {
				t.Fatalf("%d events written", n)
			}
			if n := countRows(t, f.store.Pool(), `SELECT count(*) FROM `+f.store.Table("projector_streams")); n != 0 {
				t.Fatalf("%d stream heads written", n)
			}
		})
	}
}

// writerLog records, from the writers' side, which events committed and
// which were rolled back.
type writerLog struct {
	mu         sync.Mutex
	committed  map[uuid.UUID]projector.Event
	rolledBack map[uuid.UUID]bool
	conflicts  int
}

// runWriters has writers append total events over streams, each transaction
// holding itself open a random few milliseconds after writing, a tenth of
// them rolling back. Promise-4 refusals are retried in a new transaction.
func runWriters(ctx context.Context, t *testing.T, store *postgres.Store, writers, total, streams int) *writerLog {
	t.Helper()
	wl := &writerLog{committed: map[uuid.UUID]projector.Event{}, rolledBack: map[uuid.UUID]bool{}}
	var remaining atomic.Int64
	remaining.Store(int64(total))
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			for remaining.Load() > 0 {
				n := 1 + rng.IntN(8)
				stream := projector.Stream("ticket", fmt.Sprintf("s-%d", rng.IntN(streams)))
				payloads := make([]any, n)
				for i := range payloads {
					payloads[i] = testevents.TicketCommented{Body: "c", N: i}
				}
				rollback := rng.IntN(10) == 0
				hold := time.Duration(rng.IntN(4000)) * time.Microsecond
				tx, err := store.Pool().Begin(ctx)
				if err != nil {
					errs <- err
					return
				}
				if rng.IntN(3) == 0 {
					// Take a transaction id early and dawdle, as a request
					// that writes elsewhere first would: younger transactions
					// may append to the stream meanwhile (promise 4's case).
					if _, err := tx.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
						errs <- err
						return
					}
					time.Sleep(hold / 2)
				}
				res, err := store.Append(ctx, tx, stream, projector.AnyVersion, payloads...)
				if errors.Is(err, projector.ErrConcurrency) {
					_ = tx.Rollback(ctx)
					wl.mu.Lock()
					wl.conflicts++
					wl.mu.Unlock()
					continue
				}
				if err != nil {
					_ = tx.Rollback(ctx)
					errs <- err
					return
				}
				// Holding the transaction open after its sequence values
				// were taken is what lets later sequence numbers commit first.
				time.Sleep(hold)
				if rollback {
					_ = tx.Rollback(ctx)
					wl.mu.Lock()
					for _, ev := range res.Events {
						wl.rolledBack[ev.ID] = true
					}
					wl.mu.Unlock()
					continue
				}
				if err := tx.Commit(ctx); err != nil {
					errs <- err
					return
				}
				remaining.Add(-int64(n))
				wl.mu.Lock()
				for _, ev := range res.Events {
					wl.committed[ev.ID] = ev
				}
				wl.mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("writer: %v", err)
	}
	return wl
}

// Promise 3: a reader following the log with the (tx_id, seq) cursor sees
// every committed event exactly once and none that rolled back, while 16
// writers commit out of order; a plain `seq > last` reader under the same
// schedule loses events, which shows the test has teeth. Promise 4 is
// checked on the same run: within each stream, log order is version order.
func TestPromise3_NoEventSkipped(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx, cancel := context.WithTimeout(f.ctx, 2*time.Minute)
	defer cancel()
	const writers, total, streams = 16, 20000, 300
	readerPool := pgtest.NewPool(t, 2)

	var writersDone atomic.Bool
	var doneAt atomic.Uint64 // the newest committed writer transaction, once all are done
	type seen struct {
		order []projector.Event
		ids   map[uuid.UUID]int
	}
	cursorSeen := seen{ids: map[uuid.UUID]int{}}
	filteredSeen := seen{ids: map[uuid.UUID]int{}}
	naiveSeen := map[uuid.UUID]bool{}
	var readers sync.WaitGroup
	readerErr := make(chan error, 3)

	readers.Go(func() { // the gap-safe cursor reader
		after := projector.Start
		for {
			b, err := f.store.ReadLogTx(ctx, readerPool, postgres.LogQuery{After: after, Limit: 700})
			if err != nil {
				readerErr <- err
				return
			}
			for _, ev := range b.Events {
				cursorSeen.ids[ev.ID]++
				cursorSeen.order = append(cursorSeen.order, ev)
			}
			after = b.Next(after)
			if t := doneAt.Load(); t != 0 && len(b.Events) == 0 && b.Horizon > t {
				// Every writer transaction is below the horizon, and read.
				return
			}
		}
	})
	readers.Go(func() { // the same through the per-type merge of a filtered read
		after := projector.Start
		types := []string{"ticket.opened", "ticket.commented", "ticket.closed"}
		for {
			b, err := f.store.ReadLogTx(ctx, readerPool, postgres.LogQuery{After: after, Limit: 300, EventTypes: types, Raw: true})
			if err != nil {
				readerErr <- err
				return
			}
			for _, ev := range b.Events {
				filteredSeen.ids[ev.ID]++
				filteredSeen.order = append(filteredSeen.order, ev)
			}
			after = b.Next(after)
			if t := doneAt.Load(); t != 0 && len(b.Events) == 0 && b.Horizon > t {
				return
			}
		}
	})
	readers.Go(func() { // the naive reader: WHERE seq > last
		var last int64
		tbl := f.store.Table("projector_events")
		for {
			rows, err := readerPool.Query(ctx, `SELECT id, seq FROM `+tbl+` WHERE seq > $1 ORDER BY seq LIMIT 700`, last)
			if err != nil {
				readerErr <- err
				return
			}
			var id uuid.UUID
			var seq int64
			n := 0
			_, err = pgx.ForEachRow(rows, []any{&id, &seq}, func() error {
				naiveSeen[id] = true
				last, n = seq, n+1
				return nil
			})
			if err != nil {
				readerErr <- err
				return
			}
			if writersDone.Load() && n == 0 {
				return
			}
		}
	})

	wl := runWriters(ctx, t, f.store, writers, total, streams)
	var maxTx uint64
	for _, ev := range wl.committed {
		maxTx = max(maxTx, ev.Position.TxID)
	}
	doneAt.Store(maxTx)
	writersDone.Store(true)
	readers.Wait()
	close(readerErr)
	for err := range readerErr {
		t.Fatalf("reader: %v", err)
	}
	if len(wl.committed) < total {
		t.Fatalf("writers committed %d events, want at least %d", len(wl.committed), total)
	}

	for id, n := range cursorSeen.ids {
		if n != 1 {
			t.Errorf("event %s delivered %d times", id, n)
		}
		if wl.rolledBack[id] {
			t.Errorf("event %s of a rolled-back transaction delivered", id)
		}
	}
	missing := 0
	for id := range wl.committed {
		if cursorSeen.ids[id] == 0 {
			missing++
		}
	}
	if missing > 0 || len(cursorSeen.ids) != len(wl.committed) {
		t.Fatalf("cursor reader: %d committed events missing, %d seen, %d committed", missing, len(cursorSeen.ids), len(wl.committed))
	}

	// A consumer's filtered read (per-type index reads, merged) keeps the
	// promise too: every committed event once, none of a rolled-back one.
	for id, n := range filteredSeen.ids {
		if _, ok := wl.committed[id]; n != 1 || wl.rolledBack[id] || !ok {
			t.Errorf("filtered reader: event %s delivered %d times (rolled back %v)", id, n, wl.rolledBack[id])
		}
	}
	if len(filteredSeen.ids) != len(wl.committed) {
		t.Fatalf("filtered reader: %d events seen, %d committed", len(filteredSeen.ids), len(wl.committed))
	}

	// Promise 4 on the same run: per stream, log order is version order.
	for _, order := range [][]projector.Event{cursorSeen.order, filteredSeen.order} {
		next := map[string]int64{}
		for _, ev := range order {
			want := next[ev.Stream.ID] + 1
			if ev.Version != want {
				t.Fatalf("stream %s: version %d delivered where %d was next", ev.Stream.ID, ev.Version, want)
			}
			next[ev.Stream.ID] = want
		}
	}

	naiveLost := 0
	for id := range wl.committed {
		if !naiveSeen[id] {
			naiveLost++
		}
	}
	t.Logf("%d events committed, %d rolled back, %d promise-4 retries; the naive seq reader lost %d",
		len(wl.committed), len(wl.rolledBack), wl.conflicts, naiveLost)
	if naiveLost == 0 {
		t.Fatal("the naive `seq > last` reader lost nothing: the schedule does not exercise out-of-order commits, so this test proves nothing")
	}
}

// Promise 3, deterministically: an event whose transaction is still open
// holds back every later event, and is delivered once it commits.
func TestPromise3_LateCommitNotSkipped(t *testing.T) {
	t.Parallel()
	f := setup(t)
	early, err := f.store.Pool().Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = early.Rollback(f.ctx) }()
	lateRes, err := f.store.Append(f.ctx, early, projector.Stream("ticket", "early"), projector.NoStream, testevents.TicketOpened{Title: "early"})
	if err != nil {
		t.Fatal(err)
	}
	quick := f.appendTx(t, projector.Stream("ticket", "quick"), projector.NoStream, testevents.TicketOpened{Title: "quick"})
	if !lateRes.Events[0].Position.Less(quick.Events[0].Position) {
		t.Fatalf("test premise: the early transaction's event should sort first")
	}

	b, err := f.store.ReadLog(f.ctx, postgres.LogQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Events) != 0 {
		t.Fatalf("read %d events while an older transaction is open; the committed one must wait", len(b.Events))
	}
	after := b.Next(projector.Start)
	if !after.Less(lateRes.Events[0].Position) {
		t.Fatalf("cursor moved to %v, past the open transaction's event at %v", after, lateRes.Events[0].Position)
	}
	if err := early.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	var got []uuid.UUID
	deadline := time.Now().Add(30 * time.Second)
	for len(got) < 2 && time.Now().Before(deadline) {
		// Other tests' transactions elsewhere in the cluster may hold the
		// horizon for a moment; poll until both events arrive.
		b, err := f.store.ReadLog(f.ctx, postgres.LogQuery{After: after})
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range b.Events {
			got = append(got, ev.ID)
		}
		after = b.Next(after)
	}
	if len(got) != 2 || got[0] != lateRes.Events[0].ID || got[1] != quick.Events[0].ID {
		t.Fatalf("after commit read %v, want [%s %s]", got, lateRes.Events[0].ID, quick.Events[0].ID)
	}
}

// Promise 4: a transaction that took its id early and appends to a stream
// after a younger transaction did is refused with the retryable concurrency
// error, even when it expects the right version.
func TestPromise4_OlderTransactionRefused(t *testing.T) {
	t.Parallel()
	f := setup(t)
	s := projector.Stream("ticket", "p4")
	f.appendTx(t, s, projector.NoStream, testevents.TicketOpened{Title: "a"})

	older, err := f.store.Pool().Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = older.Rollback(f.ctx) }()
	var olderID uint64
	if err := older.QueryRow(f.ctx, `SELECT pg_current_xact_id()`).Scan(&olderID); err != nil {
		t.Fatal(err)
	}
	f.appendTx(t, s, projector.ExactVersion(1), testevents.TicketCommented{Body: "younger"})

	for _, exp := range []projector.ExpectedVersion{projector.ExactVersion(2), projector.AnyVersion} {
		_, err = f.store.Append(f.ctx, older, s, exp, testevents.TicketCommented{Body: "older"})
		var ce *projector.ConcurrencyError
		if !errors.Is(err, projector.ErrConcurrency) || !errors.As(err, &ce) || ce.Reason == "" {
			t.Fatalf("expected %v: older transaction's append: %v, want a concurrency error with a reason", exp, err)
		}
	}
	if err := older.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	v, err := f.store.StreamVersion(f.ctx, f.store.Pool(), s)
	if err != nil || v != 2 {
		t.Fatalf("stream version %d (%v), want 2", v, err)
	}
	// Retried in a new transaction, the same append succeeds.
	f.appendTx(t, s, projector.ExactVersion(2), testevents.TicketCommented{Body: "retry"})
}

// Two writers with the same expected version: exactly one wins, every round,
// with both transactions really open at once.
func TestAppendConcurrentSameVersion(t *testing.T) {
	t.Parallel()
	f := setup(t)
	s := projector.Stream("ticket", "race")
	f.appendTx(t, s, projector.NoStream, testevents.TicketOpened{Title: "a"})
	for round := int64(1); round <= 20; round++ {
		var wins, losses atomic.Int32
		var appended sync.WaitGroup
		appended.Add(2)
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				tx, err := f.store.Pool().Begin(f.ctx)
				if err != nil {
					t.Error(err)
					appended.Done()
					return
				}
				defer func() { _ = tx.Rollback(f.ctx) }()
				// Both take their transaction ids before either appends.
				if _, err := tx.Exec(f.ctx, `SELECT pg_current_xact_id()`); err != nil {
					t.Error(err)
				}
				appended.Done()
				appended.Wait()
				_, err = f.store.Append(f.ctx, tx, s, projector.ExactVersion(round), testevents.TicketCommented{Body: "x"})
				if err == nil {
					err = tx.Commit(f.ctx)
				}
				switch {
				case err == nil:
					wins.Add(1)
				case errors.Is(err, projector.ErrConcurrency):
					losses.Add(1)
				default:
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if wins.Load() != 1 || losses.Load() != 1 {
			t.Fatalf("round %d: %d wins, %d losses", round, wins.Load(), losses.Load())
		}
	}
	if v, _ := f.store.StreamVersion(f.ctx, f.store.Pool(), s); v != 21 {
		t.Fatalf("final version %d, want 21", v)
	}
}
