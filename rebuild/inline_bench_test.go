package rebuild_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/rebuild"
)

// BenchmarkInlineRebuild measures what an inline rebuild costs the writers:
// how long the switch holds the live table (lock-held-ms) and waited for it
// (lock-wait-ms), with 8 writers appending throughout, on a log of 20,000
// events by default (PROJECTOR_BENCH_INLINE_EVENTS to change it), and the
// replay rate of the batches beside the same events' live append rate.
// The lock is held for the last catch-up (the events committed since the
// last batch) and the swap's catalogue updates: it should not grow with the
// log.
func BenchmarkInlineRebuild(b *testing.B) {
	n := 20_000
	if v, err := strconv.Atoi(os.Getenv("PROJECTOR_BENCH_INLINE_EVENTS")); err == nil && v > 0 {
		n = v
	}
	e := newInlineEnv(b)
	ctx := e.ctx
	const streams, per = 200, 50
	fillStart := time.Now()
	for i := 0; i < n; i += per {
		stream := projector.StreamRef{Tenant: "t", Type: "ticket", ID: fmt.Sprintf("f%d", (i/per)%streams)}
		payloads := make([]any, per)
		for k := range payloads {
			payloads[k] = testevents.TicketCommented{Body: "x"}
		}
		if i/per < streams {
			payloads[0] = testevents.TicketOpened{Title: stream.ID}
		}
		if err := pgx.BeginFunc(ctx, e.store.Pool(), func(tx pgx.Tx) error {
			_, err := e.store.Append(ctx, tx, stream, projector.AnyVersion, payloads...)
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}
	liveRate := float64(n) / time.Since(fillStart).Seconds()
	e.settle()
	b.ResetTimer()
	var held, wait, catchUp time.Duration
	var caughtUp int
	var replayed int
	var replayTime time.Duration
	for range b.N {
		wctx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(w), 2))
				for wctx.Err() == nil {
					if err := e.append(wctx, r.IntN(60), w%2 == 0); err != nil && wctx.Err() == nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		start := time.Now()
		res, err := rebuild.Inline(ctx, e.store, e.p, rebuild.InlineOptions{Tables: []string{e.schema + ".tickets"}})
		took := time.Since(start)
		stop()
		wg.Wait()
		if err != nil {
			b.Fatal(err)
		}
		if _, err := e.store.Pool().Exec(ctx, `DROP SCHEMA `+pgx.Identifier{res.OldSchema}.Sanitize()+` CASCADE`); err != nil {
			b.Fatal(err)
		}
		held += res.LockHeld
		catchUp += res.LockCatchUp
		caughtUp += res.CaughtUp
		wait += res.LockWait
		replayed += res.Replayed
		replayTime += took
	}
	b.ReportMetric(float64(held.Microseconds())/1000/float64(b.N), "lock-held-ms")
	b.ReportMetric(float64(wait.Microseconds())/1000/float64(b.N), "lock-wait-ms")
	b.ReportMetric(float64(catchUp.Microseconds())/1000/float64(b.N), "lock-catch-up-ms")
	b.ReportMetric(float64(caughtUp)/float64(b.N), "events-under-lock")
	b.ReportMetric(float64(replayed)/replayTime.Seconds(), "replayed-events/s")
	b.ReportMetric(liveRate, "live-append-events/s")
}
