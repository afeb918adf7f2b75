package aggregate_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/aggregate"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

func TestWriterChainsAppends(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tickets := f.repo(t, aggregate.Snapshots{})
	s := projector.Stream("ticket", "chain")
	tx := f.begin(t)
	w, err := tickets.FetchForWriting(f.ctx, tx, s)
	if err != nil {
		t.Fatal(err)
	}
	if w.Version() != 0 || w.Loaded().Exists() || w.Stream() != s || w.Tx() != tx {
		t.Fatalf("writer of a new stream: version %d, exists %v", w.Version(), w.Loaded().Exists())
	}
	if _, err := w.Append(f.ctx, testevents.TicketOpened{Title: "new"}); err != nil {
		t.Fatal(err)
	}
	res, err := w.Append(f.ctx, &testevents.TicketCommented{Body: "one"}, testevents.TicketCommented{Body: "two", N: 2})
	if err != nil {
		t.Fatal(err)
	}
	if w.Version() != 3 || res.Version != 3 || w.State().Comments != 2 || w.State().Title != "new" {
		t.Fatalf("after two appends: version %d, state %+v", w.Version(), w.State())
	}
	if err := tx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	got, err := tickets.Load(f.ctx, s)
	if err != nil || got.State != w.State() || got.Version != 3 {
		t.Fatalf("load after commit: %+v, %v; the writer held %+v", got, err, w.State())
	}
}

// Many transactions fetch the same stream at the same version and then all
// append: exactly one wins each round, the others get the retryable
// concurrency error, for a new stream (round 0) and an existing one.
func TestFetchForWritingOneWinnerPerVersion(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tickets := f.repo(t, aggregate.Snapshots{})
	s := projector.Stream("ticket", "race")
	const writers, rounds = 8, 5
	for round := range rounds {
		var fetched sync.WaitGroup
		fetched.Add(writers)
		start := make(chan struct{})
		errs := make([]error, writers)
		var wg sync.WaitGroup
		for i := range writers {
			wg.Go(func() {
				tx, err := f.store.Pool().Begin(f.ctx)
				if err != nil {
					errs[i] = err
					fetched.Done()
					return
				}
				defer func() { _ = tx.Rollback(f.ctx) }()
				w, err := tickets.FetchForWriting(f.ctx, tx, s)
				fetched.Done()
				if err != nil {
					errs[i] = err
					return
				}
				if w.Version() != int64(round) {
					errs[i] = fmt.Errorf("fetched version %d in round %d", w.Version(), round)
					return
				}
				<-start
				payload := any(testevents.TicketCommented{Body: fmt.Sprintf("writer %d", i)})
				if round == 0 {
					payload = testevents.TicketOpened{Title: fmt.Sprintf("writer %d", i)}
				}
				if _, errs[i] = w.Append(f.ctx, payload); errs[i] == nil {
					errs[i] = tx.Commit(f.ctx)
				}
			})
		}
		fetched.Wait() // every writer read the same version before any appends
		close(start)
		wg.Wait()
		won := 0
		for i, err := range errs {
			var ce *projector.ConcurrencyError
			switch {
			case err == nil:
				won++
			case errors.As(err, &ce) && errors.Is(err, projector.ErrConcurrency):
				if ce.Expected != projector.ExactVersion(int64(round)) || ce.Actual != int64(round+1) {
					t.Errorf("round %d writer %d: %v (expected %s, actual %d)", round, i, err, ce.Expected, ce.Actual)
				}
			default:
				t.Fatalf("round %d writer %d: %v", round, i, err)
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d writers succeeded, want exactly 1", round, won)
		}
	}
	got, err := tickets.Load(f.ctx, s)
	if err != nil || got.Version != rounds || got.State.Comments != rounds-1 {
		t.Fatalf("after %d rounds: %+v, %v", rounds, got, err)
	}
}

// An exclusive writer makes a second exclusive writer (and a plain append)
// wait until it commits; the second then works on what the first wrote.
// Waiting is proven through pg_stat_activity, ordering through the state
// the second one reads.
func TestFetchExclusiveWaits(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tickets := f.repo(t, aggregate.Snapshots{})
	for _, exists := range []bool{true, false} {
		t.Run(fmt.Sprintf("exists=%v", exists), func(t *testing.T) {
			s := projector.Stream("ticket", fmt.Sprintf("excl-%v", exists))
			if exists {
				f.appendTx(t, s, projector.NoStream, testevents.TicketOpened{Title: "before"})
			}
			first := f.begin(t)
			w1, err := tickets.FetchExclusive(f.ctx, first, s)
			if err != nil {
				t.Fatal(err)
			}

			second := f.begin(t)
			pid := backendPID(t, second)
			type fetched struct {
				w   *aggregate.Writer[Ticket]
				err error
			}
			done := make(chan fetched, 1)
			go func() {
				w, err := tickets.FetchExclusive(f.ctx, second, s)
				done <- fetched{w, err}
			}()
			pgtest.WaitUntilBlocked(t, f.store.Pool(), pid)
			select {
			case r := <-done:
				t.Fatalf("second exclusive fetch returned while the first held the stream: %+v", r)
			default:
			}

			payload := any(testevents.TicketCommented{Body: "by the first"})
			if !exists {
				payload = testevents.TicketOpened{Title: "by the first"}
			}
			if _, err := w1.Append(f.ctx, payload); err != nil {
				t.Fatal(err)
			}
			if err := first.Commit(f.ctx); err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.w.Version() != w1.Version() || r.w.State() != w1.State() {
				t.Fatalf("second writer read version %d %+v; the first committed version %d %+v", r.w.Version(), r.w.State(), w1.Version(), w1.State())
			}
			// Its append expects the version it read: no conflict.
			if _, err := r.w.Append(f.ctx, testevents.TicketCommented{Body: "by the second"}); err != nil {
				t.Fatalf("second writer's append: %v", err)
			}
			if err := second.Commit(f.ctx); err != nil {
				t.Fatal(err)
			}
		})
	}

	t.Run("plain append waits", func(t *testing.T) {
		s := projector.Stream("ticket", "excl-plain")
		f.appendTx(t, s, projector.NoStream, testevents.TicketOpened{Title: "x"})
		holder := f.begin(t)
		if _, err := tickets.FetchExclusive(f.ctx, holder, s); err != nil {
			t.Fatal(err)
		}
		appender := f.begin(t)
		pid := backendPID(t, appender)
		done := make(chan error, 1)
		go func() {
			_, err := f.store.Append(f.ctx, appender, s, projector.AnyVersion, testevents.TicketCommented{Body: "plain"})
			done <- err
		}()
		pgtest.WaitUntilBlocked(t, f.store.Pool(), pid)
		select {
		case err := <-done:
			t.Fatalf("plain append returned while an exclusive writer held the stream: %v", err)
		default:
		}
		if err := holder.Rollback(f.ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("plain append after the holder ended: %v", err)
		}
	})
}

func TestFetchExclusiveNoWait(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tickets := f.repo(t, aggregate.Snapshots{})
	ctx, cancel := context.WithTimeout(f.ctx, 20*time.Second) // a guard: NOWAIT must not wait at all
	defer cancel()
	for _, exists := range []bool{true, false} {
		s := projector.Stream("ticket", fmt.Sprintf("nowait-%v", exists))
		if exists {
			f.appendTx(t, s, projector.NoStream, testevents.TicketOpened{Title: "x"})
		}
		holder := f.begin(t)
		if _, err := tickets.FetchExclusive(ctx, holder, s); err != nil {
			t.Fatal(err)
		}
		tx := f.begin(t)
		_, err := tickets.FetchExclusive(ctx, tx, s, aggregate.ExclusiveOptions{NoWait: true})
		if !errors.Is(err, aggregate.ErrLocked) || !errors.Is(err, postgres.ErrLocked) || errors.Is(err, projector.ErrConcurrency) {
			t.Fatalf("exists=%v: NOWAIT fetch of a held stream: %v, want ErrLocked (and not ErrConcurrency)", exists, err)
		}
		_ = tx.Rollback(ctx)
		if err := holder.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		// Free again, NOWAIT gets it.
		tx = f.begin(t)
		if _, err := tickets.FetchExclusive(ctx, tx, s, aggregate.ExclusiveOptions{NoWait: true}); err != nil {
			t.Fatalf("exists=%v: NOWAIT fetch of a free stream: %v", exists, err)
		}
		_ = tx.Rollback(ctx)
	}
}

// AssertVersion detects an append that happened since the fetch, holds the
// version against appends until commit, and without it the same append
// would have gone through at once.
func TestAssertVersion(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tickets := f.repo(t, aggregate.Snapshots{})
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	side := f.store.Table("side_effects")
	if _, err := f.store.Pool().Exec(ctx, `CREATE TABLE `+side+` (decided_at_version bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	stream := func(t *testing.T) projector.StreamRef {
		s := projector.Stream("ticket", t.Name())
		f.appendTx(t, s, projector.NoStream, testevents.TicketOpened{Title: "x"})
		return s
	}

	t.Run("detects an append since the fetch", func(t *testing.T) {
		s := stream(t)
		tx := f.begin(t)
		w, err := tickets.FetchForWriting(ctx, tx, s)
		if err != nil {
			t.Fatal(err)
		}
		f.appendTx(t, s, projector.ExactVersion(1), testevents.TicketCommented{Body: "sneaked in"})
		err = w.AssertVersion(ctx)
		var ce *projector.ConcurrencyError
		if !errors.As(err, &ce) || !errors.Is(err, projector.ErrConcurrency) || ce.Expected != 1 || ce.Actual != 2 {
			t.Fatalf("assert after a concurrent append: %v, want a concurrency error expecting 1, actual 2", err)
		}
	})

	t.Run("holds the version until commit", func(t *testing.T) {
		s := stream(t)
		tx := f.begin(t)
		w, err := tickets.FetchForWriting(ctx, tx, s)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.AssertVersion(ctx); err != nil {
			t.Fatal(err)
		}
		other := f.begin(t)
		pid := backendPID(t, other)
		done := make(chan error, 1)
		go func() {
			_, err := f.store.Append(ctx, other, s, projector.ExactVersion(1), testevents.TicketCommented{Body: "must wait"})
			done <- err
		}()
		pgtest.WaitUntilBlocked(t, f.store.Pool(), pid)
		select {
		case err := <-done:
			t.Fatalf("append returned while the version was asserted: %v", err)
		default:
		}
		// The decision commits while the stream is provably still at 1.
		if _, err := tx.Exec(ctx, `INSERT INTO `+side+` SELECT version FROM `+f.store.Table("projector_streams")+
			` WHERE tenant_id = $1 AND stream_type = $2 AND stream_id = $3`, s.Tenant, s.Type, s.ID); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("the held-back append after commit: %v", err)
		}
		if err := other.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if n := countRows(t, f.store.Pool(), `SELECT decided_at_version FROM `+side); n != 1 {
			t.Fatalf("decision recorded at version %d, want 1", n)
		}
	})

	t.Run("without it the append does not wait", func(t *testing.T) {
		s := stream(t)
		tx := f.begin(t)
		if _, err := tickets.FetchForWriting(ctx, tx, s); err != nil {
			t.Fatal(err)
		}
		// Would block until ctx's deadline if fetching alone locked anything.
		err := pgx.BeginFunc(ctx, f.store.Pool(), func(other pgx.Tx) error {
			_, err := f.store.Append(ctx, other, s, projector.ExactVersion(1), testevents.TicketCommented{Body: "goes through"})
			return err
		})
		if err != nil {
			t.Fatalf("append while another transaction merely fetched: %v", err)
		}
	})

	t.Run("after own exclusive fetch and append", func(t *testing.T) {
		s := stream(t)
		tx := f.begin(t)
		w, err := tickets.FetchExclusive(ctx, tx, s)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.AssertVersion(ctx); err != nil {
			t.Fatalf("assert under the transaction's own exclusive lock: %v", err)
		}
		if _, err := w.Append(ctx, testevents.TicketCommented{Body: "mine"}); err != nil {
			t.Fatal(err)
		}
		if err := w.AssertVersion(ctx); err != nil {
			t.Fatalf("assert after the transaction's own append: %v", err)
		}
	})

	t.Run("new stream", func(t *testing.T) {
		s := projector.Stream("ticket", "assert-new")
		tx := f.begin(t)
		w, err := tickets.FetchForWriting(ctx, tx, s)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.AssertVersion(ctx); err != nil {
			t.Fatalf("assert that a new stream is still new: %v", err)
		}
		// An exclusive writer of the stream waits for the assertion.
		blocked := f.begin(t)
		if _, err := tickets.FetchExclusive(ctx, blocked, s, aggregate.ExclusiveOptions{NoWait: true}); !errors.Is(err, aggregate.ErrLocked) {
			t.Fatalf("exclusive fetch of an asserted new stream: %v, want ErrLocked", err)
		}
		tx2 := f.begin(t)
		w2, err := tickets.FetchForWriting(ctx, tx2, s)
		if err != nil {
			t.Fatal(err)
		}
		_ = tx.Rollback(ctx)
		f.appendTx(t, s, projector.NoStream, testevents.TicketOpened{Title: "created"})
		if err := w2.AssertVersion(ctx); !errors.Is(err, projector.ErrConcurrency) {
			t.Fatalf("assert after someone created the stream: %v, want ErrConcurrency", err)
		}
	})

	// Two transactions that assert and then both append deadlock; PostgreSQL
	// refuses one, which surfaces as the retryable concurrency error, and
	// the other goes through.
	t.Run("two asserters appending", func(t *testing.T) {
		s := stream(t)
		var super bool
		if err := f.store.Pool().QueryRow(ctx, `SELECT rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&super); err != nil {
			t.Fatal(err)
		}
		writers := make([]*aggregate.Writer[Ticket], 2)
		txs := make([]pgx.Tx, 2)
		for i := range txs {
			txs[i] = f.begin(t)
			if super { // detect the deadlock in 50 ms instead of the default second
				if _, err := txs[i].Exec(ctx, `SET LOCAL deadlock_timeout = '50ms'`); err != nil {
					t.Fatal(err)
				}
			}
			w, err := tickets.FetchForWriting(ctx, txs[i], s)
			if err != nil {
				t.Fatal(err)
			}
			if err := w.AssertVersion(ctx); err != nil {
				t.Fatal(err)
			}
			writers[i] = w
		}
		pid := backendPID(t, txs[0])
		errs := make([]error, 2)
		appendOrRollback := func(i int) {
			_, errs[i] = writers[i].Append(ctx, testevents.TicketCommented{Body: fmt.Sprint(i)})
			if errs[i] != nil {
				_ = txs[i].Rollback(ctx) // lets the other one through
			}
		}
		var wg sync.WaitGroup
		wg.Go(func() { appendOrRollback(0) })
		pgtest.WaitUntilBlocked(t, f.store.Pool(), pid)
		appendOrRollback(1)
		wg.Wait()
		failed := 0
		for i, err := range errs {
			if err != nil {
				failed++
				if !errors.Is(err, projector.ErrConcurrency) {
					t.Errorf("writer %d: %v, want ErrConcurrency", i, err)
				}
				continue
			}
			if err := txs[i].Commit(ctx); err != nil {
				t.Errorf("writer %d commit: %v", i, err)
			}
		}
		if failed != 1 {
			t.Fatalf("%d of 2 asserting writers failed, want exactly 1: %v", failed, errs)
		}
	})
}
