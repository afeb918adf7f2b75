package projection_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/benchmark"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// quiet discards the log lines of dispatchers in benchmarks and examples.
var quiet = slog.New(slog.DiscardHandler)

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
// the horizon, upserts and moves the cursor. That loop reads only the column
// the upsert needs (the floor, %-of-raw); a second one reads the columns a
// typical handler uses and decodes each payload into its Go type as the
// dispatcher does (%-of-decoding), so the cost of what a handler asks for is
// told apart from Projector's own. Per-event handlers are compared
// with a loop issuing the same per-event statements; the batch form with a
// set-based (unnest) loop, with payloads decoded and without
// (AsyncConfig.RawPayloads). Peak Go heap during the run is reported too: the
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
			var t, dec benchmark.Throughput
			var peak uint64
			for b.Loop() {
				r, err := c.Measure(ctx, form)
				if err != nil {
					b.Fatal(err)
				}
				t.Add(r.Throughput)
				dec.Add(r.Decoding)
				peak = max(peak, r.PeakHeap)
			}
			t.Report(b)
			b.ReportMetric(dec.RawRate(), "decoding-raw-events/s")
			b.ReportMetric(100*dec.Ratio(), "%-of-decoding")
			b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
		})
	}
}

// BenchmarkLatency measures the time from an append's commit to the commit
// of the handler's batch, at 500 events/s arriving at random (Poisson) for
// five seconds, beside
// the raw floor of the same run: LISTEN/NOTIFY, the fastest push PostgreSQL
// has, from the commit of an append that notifies to the notification's
// arrival. Two dispatcher sides: "projector" runs on the appenders' Store
// (hinted of each append in memory), "projector-polled" on a Store of its
// own, as a dispatcher in another process that only polls; each reports the
// batches it committed per second. The work itself is
// benchmark.MeasureLatencyRun, shared with `projector bench`.
func BenchmarkLatency(b *testing.B) {
	cfg := benchmark.LatencyConfig{Rate: 500, Duration: 5 * time.Second}
	for _, side := range []benchmark.Side{benchmark.ListenNotify, benchmark.Dispatcher, benchmark.PolledDispatcher} {
		b.Run(string(side), func(b *testing.B) {
			ctx := context.Background()
			store := pgtest.Store(b, benchmark.NewRegistry())
			var p benchmark.Percentiles
			var batches float64
			for b.Loop() {
				t0 := time.Now()
				run, err := benchmark.MeasureLatencyRun(ctx, store, side, cfg)
				if err != nil {
					b.Fatal(err)
				}
				batches += float64(run.Batches) / time.Since(t0).Seconds()
				p = benchmark.Summarize(run.Samples)
			}
			p.Report(b)
			if side != benchmark.ListenNotify {
				b.ReportMetric(batches/float64(b.N), "batches/s")
			}
		})
	}
}

// BenchmarkLatencyPollMin measures the polled dispatcher's latency (the
// "projector-polled" side of BenchmarkLatency: a dispatcher that learns of
// appends only by probing the log, as one in another process does) at
// several Config.PollMin values, the probe interval while events keep
// arriving, at 500 events/s. cpu-ms/s is this process's CPU time per
// second of the run (appenders and dispatcher together, the same appends
// at every interval: the difference between intervals is the probes' and
// the passes' client side); batches/s the dispatcher's committed batches,
// each a transaction with a cursor write: a shorter poll hands on smaller
// batches, more of them.
func BenchmarkLatencyPollMin(b *testing.B) {
	for _, poll := range []time.Duration{time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond} {
		b.Run(fmt.Sprintf("poll-min=%v", poll), func(b *testing.B) {
			ctx := context.Background()
			store := pgtest.Store(b, benchmark.NewRegistry())
			cfg := benchmark.LatencyConfig{Rate: 500, Duration: 5 * time.Second, PollMin: poll}
			var p benchmark.Percentiles
			var cpu, batches float64
			for b.Loop() {
				c0, t0 := cpuTime(b), time.Now()
				run, err := benchmark.MeasureLatencyRun(ctx, store, benchmark.PolledDispatcher, cfg)
				if err != nil {
					b.Fatal(err)
				}
				secs := time.Since(t0).Seconds()
				cpu += float64(cpuTime(b)-c0) / float64(time.Millisecond) / secs
				batches += float64(run.Batches) / secs
				p = benchmark.Summarize(run.Samples)
			}
			p.Report(b)
			b.ReportMetric(cpu/float64(b.N), "cpu-ms/s")
			b.ReportMetric(batches/float64(b.N), "batches/s")
		})
	}
}

// BenchmarkAppendInline measures an append with one inline projection (an
// upsert per event, in the append's transaction) beside the same append
// without it, interleaved op by op in the same run: the cost of keeping a
// read model exactly as fresh as the events.
func BenchmarkAppendInline(b *testing.B) {
	for _, n := range []int{1, 100} {
		for _, form := range []string{"per-event", "batch"} {
			b.Run(fmt.Sprintf("events=%d/%s", n, form), func(b *testing.B) { benchAppendInline(b, n, form == "batch") })
		}
	}
}

func benchAppendInline(b *testing.B, n int, batch bool) {
	e := newEnv(b)
	e.exec(`CREATE TABLE ` + e.table("bench_counts") + ` (stream_id text PRIMARY KEY, n bigint NOT NULL)`)
	upsert := `INSERT INTO ` + e.table("bench_counts") + ` AS c (stream_id, n) VALUES ($1, 1) ON CONFLICT (stream_id) DO UPDATE SET n = c.n + 1`
	setUpsert := `INSERT INTO ` + e.table("bench_counts") + ` AS c (stream_id, n) VALUES ($1, $2) ON CONFLICT (stream_id) DO UPDATE SET n = c.n + excluded.n`
	inline := projection.NewInline("counts")
	if batch {
		must(projection.OnBatch(inline, func(ctx context.Context, tx pgx.Tx, b projection.Batch) error {
			for _, s := range b.Streams { // one stream per append: one statement
				if _, err := tx.Exec(ctx, setUpsert, s.Stream.ID, len(s.Events)); err != nil {
					return err
				}
			}
			return nil
		}, e.types.Commented))
	} else {
		must(projection.OnEvent(inline, e.types.Commented, func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
			_, err := tx.Exec(ctx, upsert, ev.Stream.ID)
			return err
		}))
	}
	with, err := postgres.New(e.ctx, e.store.Pool(), postgres.Config{Schema: e.schema, Registry: e.types.Registry, Inline: []postgres.InlineProjection{inline}})
	if err != nil {
		b.Fatal(err)
	}
	// The plain store appends on a schema of its own: on the inline one,
	// the recorded projection would (rightly) refuse it ticket.commented.
	plain := pgtest.Store(b, e.types.Registry)
	payloads := make([]any, n)
	for i := range payloads {
		payloads[i] = testevents.TicketCommented{Body: "the printer is on fire again", N: i}
	}
	var plainTime, inlineTime time.Duration
	for i := 0; b.Loop(); i++ {
		for j, store := range []*postgres.Store{plain, with} {
			stream := projector.Stream("ticket", fmt.Sprintf("%d-%d", j, i-i%10))
			start := time.Now()
			err := pgx.BeginFunc(e.ctx, store.Pool(), func(tx pgx.Tx) error {
				_, err := store.Append(e.ctx, tx, stream, projector.AnyVersion, payloads...)
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
			if j == 0 {
				plainTime += time.Since(start)
			} else {
				inlineTime += time.Since(start)
			}
		}
	}
	events := float64(b.N * n)
	b.ReportMetric(events/plainTime.Seconds(), "plain-events/s")
	b.ReportMetric(events/inlineTime.Seconds(), "inline-events/s")
	b.ReportMetric(100*plainTime.Seconds()/inlineTime.Seconds(), "%-of-plain")
}

// BenchmarkManyConsumers catches 1, 5 and 20 batch-form consumers up on the
// same 200,000-event backlog (PROJECTOR_BENCH_EVENTS overrides it) in one
// dispatcher, in one process, shards at the same position sharing each full
// batch read (the default). Beside the total, in the same iteration: the
// same consumers with every shard reading every batch itself
// (Config.SeparateReads), with no-op handlers (the dispatcher's own work),
// and the log read alone, n times, whose share of the separate-reads total
// is what sharing could save at most. The work itself is
// benchmark.CatchUp.MeasureConsumers.
func BenchmarkManyConsumers(b *testing.B) {
	n := 200_000
	if v, err := strconv.Atoi(os.Getenv("PROJECTOR_BENCH_EVENTS")); err == nil && v > 0 {
		n = v
	}
	ctx := context.Background()
	c, err := benchmark.NewCatchUp(ctx, pgtest.Store(b, benchmark.NewRegistry()), benchmark.CatchUpConfig{Events: n})
	if err != nil {
		b.Fatal(err)
	}
	for _, consumers := range []int{1, 5, 20} {
		b.Run(fmt.Sprintf("events=%d/consumers=%d", n, consumers), func(b *testing.B) {
			var counting, separate, noop, read time.Duration
			for b.Loop() {
				r, err := c.MeasureConsumers(ctx, consumers)
				if err != nil {
					b.Fatal(err)
				}
				counting, separate, noop, read = counting+r.Counting, separate+r.Separate, noop+r.NoOp, read+r.ReadOnly
			}
			delivered := float64(b.N * consumers * n)
			b.ReportMetric(counting.Seconds()/float64(b.N), "catch-up-s")
			b.ReportMetric(separate.Seconds()/float64(b.N), "separate-reads-catch-up-s")
			b.ReportMetric(delivered/counting.Seconds(), "delivered-events/s")
			b.ReportMetric(delivered/separate.Seconds(), "separate-reads-delivered-events/s")
			b.ReportMetric(delivered/noop.Seconds(), "noop-delivered-events/s")
			b.ReportMetric(100*read.Seconds()/separate.Seconds(), "%-log-read")
			b.ReportMetric(100*noop.Seconds()/counting.Seconds(), "%-noop")
		})
	}
}

// BenchmarkHorizonHeld measures what a long transaction costs delivery: at
// 500 events/s for four seconds, a transaction elsewhere in the cluster
// takes a transaction id one second in and holds it for hold (none, then
// one second) before it commits. No reader may pass it (promise 3), so every
// event committed meanwhile waits for it: the percentiles and the maximum
// of commit-to-handler latency show the wait, and how fast the dispatcher
// drains what piled up. Note that it holds back every reader of the
// cluster for that second, other tests' included.
func BenchmarkHorizonHeld(b *testing.B) {
	cfg := benchmark.LatencyConfig{Rate: 500, Duration: 4 * time.Second}
	for _, hold := range []time.Duration{0, time.Second} {
		b.Run(fmt.Sprintf("hold=%v", hold), func(b *testing.B) {
			ctx := context.Background()
			store := pgtest.Store(b, benchmark.NewRegistry())
			var p benchmark.Percentiles
			var worst time.Duration
			for b.Loop() {
				held := make(chan error, 1)
				go func() {
					if hold == 0 {
						held <- nil
						return
					}
					time.Sleep(time.Second) // one second into the run
					held <- pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
						if _, err := tx.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
							return err
						}
						time.Sleep(hold)
						return nil
					})
				}()
				lat, err := benchmark.LatencySamples(ctx, store, benchmark.Dispatcher, cfg)
				if err != nil {
					b.Fatal(err)
				}
				if err := <-held; err != nil {
					b.Fatal(err)
				}
				p = benchmark.Summarize(lat)
				for _, l := range lat {
					worst = max(worst, l)
				}
			}
			p.Report(b)
			b.ReportMetric(float64(worst.Microseconds())/1000, "max-ms")
		})
	}
}

// countingTracer counts the statements a pool sends.
type countingTracer struct{ n atomic.Int64 }

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

type named string

func (n named) Name() string { return string(n) }

// BenchmarkDispatcherIdle measures what a caught-up dispatcher costs while
// nothing is appended: the statements it sends per second (counted by a
// pgx tracer on its own pool: probes, heartbeats, rechecks) and the CPU
// time of this process per second, over PROJECTOR_BENCH_IDLE_SECONDS
// (default 10) after the poll has backed off to PollMax. One consumer,
// default configuration. The figure in docs/performance.md's wake-up
// section; the in-process append hint must not move it.
func BenchmarkDispatcherIdle(b *testing.B) {
	secs := 10
	if s, err := strconv.Atoi(os.Getenv("PROJECTOR_BENCH_IDLE_SECONDS")); err == nil && s > 0 {
		secs = s
	}
	ctx := context.Background()
	tr := &countingTracer{}
	pcfg := pgtest.PoolConfig(b)
	pcfg.ConnConfig.Tracer = tr
	pool := pgtest.PoolFromConfig(b, pcfg)
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: pgtest.Schema(b), Registry: benchmark.NewRegistry(), Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	p := projection.NewAsync("idle", projection.AsyncConfig{})
	must(projection.OnEvent(p, named(benchmark.TimedType), func(context.Context, pgx.Tx, projector.Event) error { return nil }))
	d, err := projection.New(projection.Config{Store: store, Projections: []*projection.Async{p}, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	if err := d.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = d.Stop(ctx) }()
	if err := d.CatchUp(ctx); err != nil {
		b.Fatal(err)
	}
	var stmts, cpu float64
	for b.Loop() {
		// Let the poll back off to PollMax (2ms doubling to 250ms: under a
		// second), then measure.
		time.Sleep(time.Second)
		n0, c0 := tr.n.Load(), cpuTime(b)
		time.Sleep(time.Duration(secs) * time.Second)
		stmts += float64(tr.n.Load()-n0) / float64(secs)
		cpu += float64(cpuTime(b)-c0) / float64(time.Millisecond) / float64(secs)
	}
	b.ReportMetric(stmts/float64(b.N), "statements/s")
	b.ReportMetric(cpu/float64(b.N), "cpu-ms/s")
}

// cpuTime is this process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
