package projection_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/projectorhq/projector/internal/benchmark"
	"github.com/projectorhq/projector/internal/pgtest"
)

// benchEvents is the catch-up backlog: 100,000 by default, 1,000,000 with
// PROJECTOR_BENCH_EVENTS=1000000 (docs/performance.md has both).
func benchEvents() int {
	if n, err := strconv.Atoi(os.Getenv("PROJECTOR_BENCH_EVENTS")); err == nil && n > 0 {
		return n
	}
	return 100_000
}

// BenchmarkCatchUp measures one dispatcher catching up a backlog with a
// counting projection that upserts one row per stream, beside a hand-written
// loop doing the same work on raw SQL in the same run: one transaction per
// batch that locks a cursor row, reads the batch in (tx_id, seq) order below
// the horizon, upserts and moves the cursor. Per-event handlers are compared
// with a loop issuing the same per-event statements; the batch form with a
// set-based (unnest) loop. Peak Go heap during the run is reported too: the
// dispatcher streams batches, so it must not grow with the backlog. The work
// itself is benchmark.CatchUp, shared with `projector bench`.
func BenchmarkCatchUp(b *testing.B) {
	n := benchEvents()
	ctx := context.Background()
	c, err := benchmark.NewCatchUp(ctx, pgtest.Store(b, benchmark.NewRegistry()), benchmark.CatchUpConfig{Events: n})
	if err != nil {
		b.Fatal(err)
	}
	// Each iteration runs the raw loop and then Projector on the same
	// backlog, so drift on a shared machine hits both alike; -benchtime 3x
	// interleaves three pairs.
	for _, form := range benchmark.Forms() {
		b.Run(fmt.Sprintf("events=%d/%s", n, form), func(b *testing.B) {
			var t benchmark.Throughput
			var peak uint64
			for b.Loop() {
				r, err := c.Measure(ctx, form)
				if err != nil {
					b.Fatal(err)
				}
				t.Add(r.Throughput)
				peak = max(peak, r.PeakHeap)
			}
			t.Report(b)
			b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
		})
	}
}

// BenchmarkLatency measures the time from an append's commit to the commit
// of the handler's batch, at a steady 500 events/s for five seconds, beside
// the raw floor of the same run: LISTEN/NOTIFY, the fastest push PostgreSQL
// has, from the commit of an append that notifies to the notification's
// arrival. The work itself is benchmark.LatencySamples, shared with
// `projector bench`.
func BenchmarkLatency(b *testing.B) {
	cfg := benchmark.LatencyConfig{Rate: 500, Duration: 5 * time.Second}
	for _, side := range []benchmark.Side{benchmark.ListenNotify, benchmark.Dispatcher} {
		b.Run(string(side), func(b *testing.B) {
			ctx := context.Background()
			store := pgtest.Store(b, benchmark.NewRegistry())
			var p benchmark.Percentiles
			for b.Loop() {
				lat, err := benchmark.LatencySamples(ctx, store, side, cfg)
				if err != nil {
					b.Fatal(err)
				}
				p = benchmark.Summarize(lat)
			}
			p.Report(b)
		})
	}
}
