package projection_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector/internal/pgtest"
)

// The partition benchmarks' probes: where a catch-up's time goes, measured
// in the same run as its rate. A per-event handler on a machine whose
// client and server share the cores is bound either by round trips (then
// partitions overlap them) or by CPU (then they cannot), and these say
// which: the CPU the bench's PostgreSQL backends and this process used per
// second of the run, the round trips per event, and, opt-in
// (PROJECTOR_BENCH_SAMPLE_WAITS=1, since the sampling costs the server a
// little), what the bench's sessions were doing.

// roundTrips counts what a pool sends: each traced query, and each batch
// (pipelined statements, one round trip), is one round trip.
type roundTrips struct {
	n atomic.Int64
	// bySQL counts round trips by their first statement's text, when
	// PROJECTOR_BENCH_TRACE_SQL is set: what the round trips beyond the
	// handlers' are.
	mu    sync.Mutex
	bySQL map[string]int
}

func (r *roundTrips) note(sql string) {
	r.n.Add(1)
	if r.bySQL == nil {
		return
	}
	sql = strings.Join(strings.Fields(sql), " ")
	if len(sql) > 90 {
		sql = sql[:90]
	}
	r.mu.Lock()
	r.bySQL[sql]++
	r.mu.Unlock()
}

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	r.note(data.SQL)
	return ctx
}

func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	sql := "(empty batch)"
	if data.Batch != nil && len(data.Batch.QueuedQueries) > 0 {
		sql = "batch: " + data.Batch.QueuedQueries[0].SQL
	}
	r.note(sql)
	return ctx
}

func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// benchPool is the pool a partition benchmark runs on: its sessions carry
// an application_name of their own, so that their backends' CPU and states
// can be told from other sessions' on a shared server, and its round trips
// are counted.
type benchPool struct {
	*pgxpool.Pool
	app   string
	trips *roundTrips
	admin *pgxpool.Pool // reads pg_stat_activity, outside what is measured
}

func newBenchPool(b *testing.B, admin *pgxpool.Pool, conns int32) *benchPool {
	b.Helper()
	cfg := pgtest.PoolConfig(b)
	cfg.MaxConns = conns
	app := fmt.Sprintf("projector-bench-%d-%d", os.Getpid(), time.Now().UnixNano())
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	if ms := os.Getenv("PROJECTOR_BENCH_AUTO_EXPLAIN_MS"); ms != "" {
		// Diagnosis: the server logs the plans of the bench's slow
		// statements (its reads), as they ran (superuser only).
		cfg.ConnConfig.RuntimeParams["session_preload_libraries"] = "auto_explain"
		cfg.ConnConfig.RuntimeParams["auto_explain.log_min_duration"] = ms
		cfg.ConnConfig.RuntimeParams["auto_explain.log_analyze"] = "on"
	}
	trips := &roundTrips{}
	if os.Getenv("PROJECTOR_BENCH_TRACE_SQL") != "" {
		trips.bySQL = map[string]int{}
		b.Cleanup(func() {
			for sql, n := range trips.bySQL {
				if n >= 10 {
					b.Logf("%6d  %s", n, sql)
				}
			}
		})
	}
	cfg.ConnConfig.Tracer = trips
	return &benchPool{Pool: pgtest.PoolFromConfig(b, cfg), app: app, trips: trips, admin: admin}
}

// window is what one measured stretch of a benchmark cost.
type window struct {
	wall, goCPU, pgCPU time.Duration
	trips              int64
	// Mean number of the bench's sessions in each state over the samples
	// (only with PROJECTOR_BENCH_SAMPLE_WAITS): on CPU in the server,
	// waiting in the server (lock, LWLock, I/O), idle in a transaction
	// (waiting for this process: the round trip and the handler).
	onCPU, waiting, client float64
	waits                  map[string]int
	samples                int
}

// add sums two windows (the iterations of one benchmark); the session
// means are weighted by their samples.
func (w window) add(o window) window {
	if n := w.samples + o.samples; n > 0 {
		mean := func(a, b float64) float64 { return (a*float64(w.samples) + b*float64(o.samples)) / float64(n) }
		w.onCPU, w.waiting, w.client = mean(w.onCPU, o.onCPU), mean(w.waiting, o.waiting), mean(w.client, o.client)
		if w.waits == nil {
			w.waits = map[string]int{}
		}
		for k, v := range o.waits {
			w.waits[k] += v
		}
	}
	w.wall, w.goCPU, w.pgCPU, w.trips, w.samples = w.wall+o.wall, w.goCPU+o.goCPU, w.pgCPU+o.pgCPU, w.trips+o.trips, w.samples+o.samples
	return w
}

// measure runs fn and returns what it cost.
func (p *benchPool) measure(b *testing.B, ctx context.Context, fn func()) window {
	b.Helper()
	pg0 := p.backendCPU(b, ctx)
	go0 := processCPU()
	trips0 := p.trips.n.Load()
	var w window
	stop := make(chan struct{})
	var wg sync.WaitGroup
	if os.Getenv("PROJECTOR_BENCH_SAMPLE_WAITS") != "" {
		w.waits = map[string]int{}
		wg.Go(func() { p.sample(ctx, &w, stop) })
	}
	began := time.Now()
	fn()
	w.wall = time.Since(began)
	close(stop)
	wg.Wait()
	w.goCPU = processCPU() - go0
	w.trips = p.trips.n.Load() - trips0
	pg1 := p.backendCPU(b, ctx)
	for pid, t := range pg1 {
		w.pgCPU += t - pg0[pid] // a backend started in the window started at 0
	}
	return w
}

// sample notes the bench's sessions' states every 10 ms until stop.
func (p *benchPool) sample(ctx context.Context, w *window, stop <-chan struct{}) {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var onCPU, waiting, client int
	for {
		select {
		case <-stop:
			if w.samples > 0 {
				w.onCPU, w.waiting, w.client = float64(onCPU)/float64(w.samples), float64(waiting)/float64(w.samples), float64(client)/float64(w.samples)
			}
			return
		case <-tick.C:
		}
		rows, err := p.admin.Query(ctx, `SELECT state, coalesce(wait_event_type, ''), coalesce(wait_event, '') FROM pg_stat_activity
			WHERE application_name = $1 AND state IN ('active', 'idle in transaction')`, p.app)
		if err != nil {
			continue
		}
		var state, typ, event string
		_, _ = pgx.ForEachRow(rows, []any{&state, &typ, &event}, func() error {
			switch {
			case state == "idle in transaction":
				client++
			case typ == "" || typ == "CPU":
				onCPU++
			default:
				waiting++
				w.waits[typ+":"+event]++
			}
			return nil
		})
		w.samples++
	}
}

// backendCPU returns the CPU time each of the bench's backends has used,
// by process id, from /proc (the server runs on this machine); nil when it
// cannot be read.
func (p *benchPool) backendCPU(b *testing.B, ctx context.Context) map[int]time.Duration {
	b.Helper()
	rows, err := p.admin.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, p.app)
	if err != nil {
		b.Fatal(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		b.Fatal(err)
	}
	cpu := map[int]time.Duration{}
	for _, pid := range pids {
		if t, ok := procCPU(int(pid)); ok {
			cpu[int(pid)] = t
		}
	}
	return cpu
}

// procCPU reads a process's user and system time from /proc/PID/stat.
func procCPU(pid int) (time.Duration, bool) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	s := string(raw)
	i := strings.LastIndexByte(s, ')') // the command name may hold spaces
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state): utime is 14, stime 15
	if len(f) < 13 {
		return 0, false
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	const tick = 10 * time.Millisecond // USER_HZ is 100 on Linux
	return time.Duration(u+st) * tick, true
}

// processCPU is this process's user and system time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// report adds w's figures per event to b: the cores the server's backends
// and this process used while it ran, and round trips per event.
func (w window) report(b *testing.B, events float64, prefix string) {
	secs := w.wall.Seconds()
	b.ReportMetric(w.pgCPU.Seconds()/secs, prefix+"pg-cores")
	b.ReportMetric(w.goCPU.Seconds()/secs, prefix+"go-cores")
	b.ReportMetric(float64(w.pgCPU.Microseconds())/events, prefix+"pg-µs/event")
	b.ReportMetric(float64(w.goCPU.Microseconds())/events, prefix+"go-µs/event")
	b.ReportMetric(float64(w.trips)/events, prefix+"round-trips/event")
	if w.samples > 0 {
		b.ReportMetric(w.onCPU, prefix+"sessions-on-cpu")
		b.ReportMetric(w.waiting, prefix+"sessions-waiting")
		b.ReportMetric(w.client, prefix+"sessions-idle-in-tx")
		var top []string
		for k, n := range w.waits {
			top = append(top, fmt.Sprintf("%s=%d", k, n))
		}
		b.Logf("%swaits over %d samples: %s", prefix, w.samples, strings.Join(top, " "))
	}
}
