package projection_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/benchmark"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// BenchmarkWaitFor measures read-your-writes as a request sees it: append
// one event, commit, then WaitFor the dispatcher to pass it; each op is one
// such request, one at a time. Reported beside it, from the same events,
// is the dispatcher's own commit-to-applied latency (from the append's
// COMMIT returning to the AfterCommit of the batch that applied it):
// WaitFor's figure minus that one is what waiting costs on top, its polls
// (1 ms after the first look, doubling to 50 ms) and its reads.
// "hinted" runs the dispatcher on the appending Store (in-process append
// hints), "polled" on a Store of its own, as a dispatcher in another
// process; WaitFor only ever reads the consumer's rows, wherever the
// dispatcher runs.
func BenchmarkWaitFor(b *testing.B) {
	for _, side := range []string{"hinted", "polled"} {
		b.Run("dispatcher="+side, func(b *testing.B) { benchWaitFor(b, side == "polled") })
	}
}

func benchWaitFor(b *testing.B, polled bool) {
	ctx := context.Background()
	ty := testevents.New()
	store := pgtest.Store(b, ty.Registry)
	var mu sync.Mutex
	applied := map[uuid.UUID]time.Time{}
	p := projection.NewAsync("bench_waitfor", projection.AsyncConfig{AfterCommit: func(evs []projector.Event) {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		for _, ev := range evs {
			applied[ev.ID] = now
		}
	}})
	if err := projection.On(p, ty.Opened, func(context.Context, pgx.Tx, projector.Event, testevents.TicketOpened) error { return nil }); err != nil {
		b.Fatal(err)
	}
	dstore := store
	if polled {
		var err error
		if dstore, err = postgres.New(ctx, store.Pool(), postgres.Config{Schema: store.Schema(), Registry: ty.Registry, Logger: quiet}); err != nil {
			b.Fatal(err)
		}
	}
	d, err := projection.New(projection.Config{Store: dstore, Projections: []*projection.Async{p}, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	if err := d.Start(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = d.Stop(sctx)
	})
	// The consumer's shard exists once the dispatcher registered it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := projection.WaitFor(ctx, store, p.Name(), projector.Position{TxID: 1})
		if !errors.Is(err, projector.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("the dispatcher did not register its consumer: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline, not synchronisation
	}

	committed := map[uuid.UUID]time.Time{}
	var waits []time.Duration
	i := 0
	for b.Loop() {
		i++
		var res postgres.AppendResult
		err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
			var err error
			res, err = store.Append(ctx, tx, projector.Stream("ticket", fmt.Sprintf("w-%d", i)), projector.NoStream, testevents.TicketOpened{Title: "t"})
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		at := time.Now()
		committed[res.Events[0].ID] = at
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = projection.WaitFor(wctx, store, p.Name(), res.Position())
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		waits = append(waits, time.Since(at))
	}
	// AfterCommit runs after the batch's commit, possibly just after
	// WaitFor saw the cursor: wait for the last ones.
	var dispatch []time.Duration
	for deadline := time.Now().Add(10 * time.Second); ; {
		mu.Lock()
		n := len(applied)
		mu.Unlock()
		if n >= len(committed) || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond) // polling with a deadline
	}
	mu.Lock()
	for id, at := range committed {
		if got, ok := applied[id]; ok {
			dispatch = append(dispatch, max(got.Sub(at), 0))
		}
	}
	mu.Unlock()
	w, disp := benchmark.Summarize(waits), benchmark.Summarize(dispatch)
	b.ReportMetric(float64(w.P50.Microseconds())/1000, "waitfor-p50-ms")
	b.ReportMetric(float64(w.P99.Microseconds())/1000, "waitfor-p99-ms")
	b.ReportMetric(float64(disp.P50.Microseconds())/1000, "applied-p50-ms")
	b.ReportMetric(float64(disp.P99.Microseconds())/1000, "applied-p99-ms")
}
