package projection_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// benchEvents is the catch-up backlog: 100,000 by default, 1,000,000 with
// PROJECTOR_BENCH_EVENTS=1000000 (docs/performance.md has both).
func benchEvents() int {
	if n, err := strconv.Atoi(os.Getenv("PROJECTOR_BENCH_EVENTS")); err == nil && n > 0 {
		return n
	}
	return 100_000
}

const benchStreams = 1000

var quiet = slog.New(slog.DiscardHandler)

// backlog fills the log with n ticket.commented events over benchStreams
// streams, 100,000 per transaction, straight in SQL (the append path has its
// own benchmark).
func backlog(b *testing.B, e *env, n int) {
	b.Helper()
	for from := 0; from < n; from += 100_000 {
		to := min(from+100_000, n)
		e.exec(`INSERT INTO `+e.store.Table("projector_events")+` (id, tenant_id, stream_type, stream_id, version, type, schema_version, data, correlation_id)
			SELECT gen_random_uuid(), $1, 'ticket', 's-' || (g % $2), g / $2 + 1, 'ticket.commented', 1, '{"body":"the printer is on fire","n":1}', gen_random_uuid()
			FROM generate_series($3::int, $4::int - 1) g`, projector.SystemTenant, benchStreams, from, to)
	}
	e.exec(`ANALYZE ` + e.store.Table("projector_events"))
}

func (e *env) benchTables() {
	e.exec(`CREATE TABLE ` + e.table("bench_counts") + ` (stream_id text PRIMARY KEY, n bigint NOT NULL)`)
	e.exec(`CREATE TABLE ` + e.table("bench_cursor") + ` (name text PRIMARY KEY, tx_id xid8 NOT NULL, seq bigint NOT NULL)`)
}

// BenchmarkCatchUp measures one dispatcher catching up a backlog with a
// counting projection that upserts one row per stream, beside a hand-written
// loop doing the same work on raw SQL in the same run: one transaction per
// batch that locks a cursor row, reads the batch in (tx_id, seq) order below
// the horizon, upserts and moves the cursor. Per-event handlers are compared
// with a loop issuing the same per-event statements; the batch form with a
// set-based (unnest) loop. Peak Go heap during the run is reported too: the
// dispatcher streams batches, so it must not grow with the backlog.
func BenchmarkCatchUp(b *testing.B) {
	n := benchEvents()
	e := newEnv(b)
	e.benchTables()
	backlog(b, e, n)
	upsert := `INSERT INTO ` + e.table("bench_counts") + ` AS c (stream_id, n) VALUES ($1, 1) ON CONFLICT (stream_id) DO UPDATE SET n = c.n + 1`
	setUpsert := `INSERT INTO ` + e.table("bench_counts") + ` AS c (stream_id, n) SELECT * FROM unnest($1::text[], $2::bigint[])
		ON CONFLICT (stream_id) DO UPDATE SET n = c.n + excluded.n`

	perEvent := func() *projection.Async {
		p := projection.NewAsync("bench", projection.AsyncConfig{BatchSize: 500})
		must(projection.OnEvent(p, e.types.Commented, func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
			_, err := tx.Exec(ctx, upsert, ev.Stream.ID)
			return err
		}))
		return p
	}
	batched := func(raw bool) *projection.Async {
		p := projection.NewAsync("bench", projection.AsyncConfig{BatchSize: 500, RawPayloads: raw})
		must(projection.OnBatch(p, func(ctx context.Context, tx pgx.Tx, batch projection.Batch) error {
			ids := make([]string, len(batch.Streams))
			counts := make([]int64, len(batch.Streams))
			for i, s := range batch.Streams {
				ids[i], counts[i] = s.Stream.ID, int64(len(s.Events))
			}
			_, err := tx.Exec(ctx, setUpsert, ids, counts)
			return err
		}, e.types.Commented))
		return p
	}
	pairs := []struct {
		name      string
		raw, proj func(b *testing.B) int64
	}{
		{"per-event", func(b *testing.B) int64 { return e.rawLoop(b, upsert, false) }, func(b *testing.B) int64 { return e.runDispatcher(b, perEvent()) }},
		{"batch", func(b *testing.B) int64 { return e.rawLoop(b, setUpsert, true) }, func(b *testing.B) int64 { return e.runDispatcher(b, batched(false)) }},
		{"batch-raw-payloads", func(b *testing.B) int64 { return e.rawLoop(b, setUpsert, true) }, func(b *testing.B) int64 { return e.runDispatcher(b, batched(true)) }},
	}
	// Each iteration runs the raw loop and then Projector on the same
	// backlog, so drift on a shared machine hits both alike; -benchtime 3x
	// interleaves three pairs.
	for _, pair := range pairs {
		b.Run(fmt.Sprintf("events=%d/%s", n, pair.name), func(b *testing.B) {
			var rawTime, projTime time.Duration
			var peak uint64
			for b.Loop() {
				for i, run := range []func(*testing.B) int64{pair.raw, pair.proj} {
					e.exec(`TRUNCATE ` + e.table("bench_counts") + `, ` + e.table("bench_cursor") + `, ` + e.store.Table("projector_consumers"))
					runtime.GC()
					stop := func() {}
					if i == 1 {
						stop = sampleHeap(&peak)
					}
					start := time.Now()
					applied := run(b)
					took := time.Since(start)
					stop()
					if applied != int64(n) {
						b.Fatalf("applied %d of %d events", applied, n)
					}
					if i == 0 {
						rawTime += took
					} else {
						projTime += took
					}
				}
			}
			events := float64(n) * float64(b.N)
			b.ReportMetric(events/rawTime.Seconds(), "raw-events/s")
			b.ReportMetric(events/projTime.Seconds(), "projector-events/s")
			b.ReportMetric(100*rawTime.Seconds()/projTime.Seconds(), "%-of-raw")
			b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
		})
	}
}

// sampleHeap records the peak heap in use until the returned stop is called.
func sampleHeap(peak *uint64) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			*peak = max(*peak, ms.HeapInuse)
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

func (e *env) runDispatcher(b *testing.B, p *projection.Async) int64 {
	d, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{p}, Concurrency: 1, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	if err := d.Start(e.ctx); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		b.Fatal(err)
	}
	if err := d.Stop(ctx); err != nil {
		b.Fatal(err)
	}
	return e.benchApplied(b)
}

func (e *env) benchApplied(b *testing.B) int64 {
	var n int64
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT coalesce(sum(n), 0) FROM `+e.table("bench_counts")).Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}

// rawLoop is the baseline: what a careful engineer would write by hand for
// the same job, without Projector.
func (e *env) rawLoop(b *testing.B, upsert string, setBased bool) int64 {
	ctx := e.ctx
	pool := e.store.Pool()
	cursorT := e.table("bench_cursor")
	e.exec(`INSERT INTO ` + cursorT + ` VALUES ('raw', '0', 0)`)
	read := `SELECT e.tx_id, e.seq, e.stream_id FROM ` + e.store.Table("projector_events") + ` e
		WHERE (e.tx_id, e.seq) > ($1::xid8, $2::bigint) AND e.tx_id < pg_snapshot_xmin(pg_current_snapshot())
		  AND e.type = ANY($3::text[])
		ORDER BY e.tx_id, e.seq LIMIT 500`
	types := []string{"ticket.commented"}
	for {
		full := false
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var txID uint64
			var seq int64
			if err := tx.QueryRow(ctx, `SELECT tx_id, seq FROM `+cursorT+` WHERE name = 'raw' FOR UPDATE SKIP LOCKED`).Scan(&txID, &seq); err != nil {
				return err
			}
			rows, err := tx.Query(ctx, read, txID, seq, types)
			if err != nil {
				return err
			}
			var streams []string
			var stream string
			n := 0
			if _, err := pgx.ForEachRow(rows, []any{&txID, &seq, &stream}, func() error {
				streams = append(streams, stream)
				n++
				return nil
			}); err != nil {
				return err
			}
			full = n == 500
			if n == 0 {
				return nil
			}
			if setBased {
				byStream := map[string]int64{}
				var order []string
				for _, s := range streams {
					if byStream[s] == 0 {
						order = append(order, s)
					}
					byStream[s]++
				}
				counts := make([]int64, len(order))
				for i, s := range order {
					counts[i] = byStream[s]
				}
				if _, err := tx.Exec(ctx, upsert, order, counts); err != nil {
					return err
				}
			} else {
				for _, s := range streams {
					if _, err := tx.Exec(ctx, upsert, s); err != nil {
						return err
					}
				}
			}
			_, err = tx.Exec(ctx, `UPDATE `+cursorT+` SET tx_id = $1, seq = $2 WHERE name = 'raw'`, txID, seq)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		if !full {
			return e.benchApplied(b)
		}
	}
}

// BenchmarkLatency measures the time from an append's commit to the commit
// of the handler's batch, at a steady 500 events/s for five seconds, beside
// the raw floor of the same run: LISTEN/NOTIFY, the fastest push PostgreSQL
// has, from the commit of an append that notifies to the notification's
// arrival.
func BenchmarkLatency(b *testing.B) {
	const rate, duration = 500, 5 * time.Second
	for _, mode := range []string{"raw-notify", "projector"} {
		b.Run(mode, func(b *testing.B) {
			e := newEnv(b)
			var p50, p99 time.Duration
			for b.Loop() {
				lat := e.measureLatency(b, mode, rate, duration)
				p50, p99 = percentile(lat, 50), percentile(lat, 99)
			}
			b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
		})
	}
}

func (e *env) measureLatency(b *testing.B, mode string, rate int, duration time.Duration) []time.Duration {
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	var mu sync.Mutex
	committed := map[string]time.Time{}
	var lat []time.Duration
	arrived := func(id string, at time.Time) {
		mu.Lock()
		defer mu.Unlock()
		if c, ok := committed[id]; ok {
			lat = append(lat, at.Sub(c))
			delete(committed, id)
		} else {
			committed[id] = at // arrived before the writer noted its commit
		}
	}
	commit := func(id string, at time.Time) {
		mu.Lock()
		defer mu.Unlock()
		if a, ok := committed[id]; ok {
			lat = append(lat, max(a.Sub(at), 0))
			delete(committed, id)
		} else {
			committed[id] = at
		}
	}
	var stop func()
	switch mode {
	case "projector":
		p := projection.NewAsync("latency", projection.AsyncConfig{AfterCommit: func(evs []projector.Event) {
			now := time.Now()
			for _, ev := range evs {
				arrived(ev.Stream.ID, now)
			}
		}})
		must(projection.OnEvent(p, e.types.Opened, func(context.Context, pgx.Tx, projector.Event) error { return nil }))
		d, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{p}, Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		if err := d.Start(ctx); err != nil {
			b.Fatal(err)
		}
		stop = func() { _ = d.Stop(context.Background()) }
	default:
		conn, err := e.store.Pool().Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := conn.Exec(ctx, `LISTEN projector_latency`); err != nil {
			b.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				n, err := conn.Conn().WaitForNotification(ctx)
				if err != nil {
					return
				}
				arrived(n.Payload, time.Now())
			}
		})
		stop = func() { cancel(); wg.Wait(); conn.Release() }
	}
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	end := time.Now().Add(duration)
	for i := 0; time.Now().Before(end); i++ {
		<-tick.C
		id := "l-" + strconv.Itoa(i)
		err := pgx.BeginFunc(ctx, e.store.Pool(), func(tx pgx.Tx) error {
			if _, err := e.store.Append(ctx, tx, projector.Stream("ticket", id), projector.NoStream, testevents.TicketOpened{Title: "t"}); err != nil {
				return err
			}
			if mode == "raw-notify" {
				_, err := tx.Exec(ctx, `SELECT pg_notify('projector_latency', $1)`, id)
				return err
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		commit(id, time.Now())
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		left := len(committed)
		mu.Unlock()
		if left == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	return lat
}

func percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
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
	e.benchTables()
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
	payloads := make([]any, n)
	for i := range payloads {
		payloads[i] = testevents.TicketCommented{Body: "the printer is on fire again", N: i}
	}
	var plainTime, inlineTime time.Duration
	for i := 0; b.Loop(); i++ {
		for j, store := range []*postgres.Store{e.store, with} {
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
