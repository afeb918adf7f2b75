package projection_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// Issue 21's "no partition paused longer than one batch", measured on
// events rather than on committed batches (split_pause_test.go counts the
// gap between a partition's batches, which takes a caught-up half's wait
// for the writers' next commit for a pause).
//
// Writers append at a steady pace; for every event the test records when
// its transaction committed (Go time, once Commit returned: the moment the
// writer knows the event is durable and visible, and the first moment an
// application could expect it applied) and when it was applied (Go time in
// the projection's AfterCommit, right after the batch's transaction
// committed: the moment the read model shows it). Both are the same
// process's clock. An event's latency is the difference. The run goes
// through five phases: steady state on 4 partitions, a split 4 → 8 (from
// the command's start to the first batch of every half), steady state on
// 8, a merge 8 → 4 (from the command's start to the first batch of every
// merged partition), steady state on 4 again. An event belongs to a change
// when its wait (commit to apply) overlaps the change's window, to a steady
// phase when its wait lies wholly inside it.

// latencyConfig is one run's shape.
type latencyConfig struct {
	dispatchers int           // dispatchers, each with a pool of its own
	writers     int           // writers, one transaction per pace each
	pace        time.Duration // between a writer's transactions
	streams     int           // streams, several per partition
	window      int           // batches per partition in each steady phase
}

// measureWindow is the steady phases' length in batches per partition for
// a measurement: the benchmark's, the soak run's and the figures'
// (docs/performance.md), about a second each on a quiet machine.
const measureWindow = 40

// ciWindow is the steady phases' length in the default test run, which
// asserts exactly once and order across the split and the merge, not
// timings: the changes and the writers around them are the same, the
// steady phases only measure. At 40 batches they took three quarters of
// the test's time, and the test was the longest of the suite (167 s of a
// loaded CI run, a batch being 160-200 ms there instead of 22 ms). At 10
// they were still half of it; at 5 (about a second each at a loaded
// batch's length, and each still lasting until an event committed in it
// was applied) a split whose halves replay their parent's events still
// fails it: "60 events applied out of order or twice".
const ciWindow = 5

// defaultLatencyConfig is a run's shape, with steady phases of window
// batches per partition; PROJECTOR_TEST_LATENCY_WINDOW sets another.
func defaultLatencyConfig(dispatchers, window int) latencyConfig {
	cfg := latencyConfig{dispatchers: dispatchers, writers: 4, pace: 20 * time.Millisecond, streams: 64, window: window}
	if n, err := strconv.Atoi(os.Getenv("PROJECTOR_TEST_LATENCY_WINDOW")); err == nil && n > 0 {
		cfg.window = n
	}
	return cfg
}

// evKey names one event: its stream and version.
type evKey struct {
	stream  string
	version int64
}

// applyCall is one AfterCommit call: one committed batch of one shard.
type applyCall struct {
	at     time.Time
	seg4   uint32 // the 4-partition segment of its events (all of one shard)
	events []evKey
}

// latencyRecorder collects commit and apply times.
type latencyRecorder struct {
	mu      sync.Mutex
	commits map[evKey]time.Time
	calls   []applyCall
}

// streamHash is the partition hash of the test's stream id (type ticket,
// no tenant).
func streamHash(id string) uint32 {
	return postgres.StreamHash(projector.SystemTenant, "ticket", id)
}

// streamSeg4 is the partition of 4 stream id belongs to.
func streamSeg4(id string) uint32 { return streamHash(id) >> 30 }

// afterCommit is the projection's AfterCommit.
func (r *latencyRecorder) afterCommit(events []projector.Event) {
	now := time.Now()
	c := applyCall{at: now, events: make([]evKey, len(events))}
	for i, ev := range events {
		c.events[i] = evKey{ev.Stream.ID, ev.Version}
	}
	c.seg4 = postgres.StreamHash(events[0].Stream.Tenant, events[0].Stream.Type, events[0].Stream.ID) >> 30
	r.mu.Lock()
	r.calls = append(r.calls, c)
	r.mu.Unlock()
}

func (r *latencyRecorder) committed(stream string, from, to int64, at time.Time) {
	r.mu.Lock()
	for v := from; v <= to; v++ {
		r.commits[evKey{stream, v}] = at
	}
	r.mu.Unlock()
}

// appliedSince reports whether an event committed at or after from has
// passed AfterCommit.
func (r *latencyRecorder) appliedSince(from time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.calls) - 1; i >= 0 && !r.calls[i].at.Before(from); i-- {
		for _, k := range r.calls[i].events {
			if c, ok := r.commits[k]; ok && !c.Before(from) {
				return true
			}
		}
	}
	return false
}

func (r *latencyRecorder) appliedCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.calls {
		n += len(c.events)
	}
	return n
}

// latencyPhase is a phase's figures.
type latencyPhase struct {
	name          string
	events        int
	p50, p99, max time.Duration
	perPartition  [4]time.Duration // the longest latency of each 4-partition's events
	// baseline, for a change, is the longest latency of a steady window
	// of the change's length just before it: the median, over the
	// preceding steady phase cut into such windows, of each window's
	// longest latency (an event counted in a window its wait overlaps).
	baseline time.Duration
	windows  int // how many windows the baseline is the median of
	// oldestTx is the age, since its BEGIN, of the oldest transaction
	// with an xid on the server seen during the phase (sampled every
	// 10 ms). It overstates what held the horizon back: a pass begins
	// with its lock and reads and takes its id only at its first write.
	oldestTx time.Duration
	// oldestXID is the longest the oldest transaction id was seen held
	// (since the sample that first saw it): how long the horizon stood
	// behind one transaction, within 10 ms.
	oldestXID time.Duration
	// worstCommit and worstApply place the event of the longest wait
	// against the phase's start.
	worstCommit, worstApply time.Duration
}

// latencyResult is one run's figures.
type latencyResult struct {
	batch                time.Duration // steady-state batch time (before the split)
	phases               []latencyPhase
	splitTook, mergeTook time.Duration // command start to every successor's first batch
	splitCmd, mergeCmd   time.Duration // the commands' own time
	events               int
	inversions           int // AfterCommit calls seen out of a stream's order (not a defect: see check)
}

// multiLog is one batchLog per dispatcher's registry.
type multiLog struct {
	regs []*prometheus.Registry
	logs []*batchLog
}

func (m *multiLog) sample(t testing.TB, consumer string) {
	for i, reg := range m.regs {
		m.logs[i].sample(t, reg, consumer)
	}
}

func (m *multiLog) count(id string, from, to time.Time) int {
	n := 0
	for _, l := range m.logs {
		n += l.count(id, from, to)
	}
	return n
}

func (m *multiLog) firstAfter(id string, at time.Time) time.Time {
	var first time.Time
	for _, l := range m.logs {
		if f := l.firstAfter(id, at); !f.IsZero() && (first.IsZero() || f.Before(first)) {
			first = f
		}
	}
	return first
}

// runSplitMergeLatency runs the measurement once and checks promise 16 on
// what it applied: every committed event applied exactly once (in the read
// model and in AfterCommit), each stream in order (the read model).
func runSplitMergeLatency(t testing.TB, cfg latencyConfig) latencyResult {
	e := partitioned(t)
	const consumer = "latency"
	rec := &latencyRecorder{commits: map[evKey]time.Time{}}
	ml := &multiLog{}
	var ds []*projection.Dispatcher
	for i := range cfg.dispatchers {
		reg := prometheus.NewRegistry()
		ml.regs = append(ml.regs, reg)
		ml.logs = append(ml.logs, &batchLog{last: map[string]uint64{}, commits: map[string][]time.Time{}})
		p := counting(e.schema, e.types, consumer, projection.AsyncConfig{Partitions: 4, BatchSize: 10, AfterCommit: rec.afterCommit})
		dc := projection.Config{Projections: []*projection.Async{p}, Registerer: reg, Concurrency: 8, Recheck: time.Second}
		if cfg.dispatchers > 1 {
			dc.Store = e.storeOn(pgtest.NewPool(t, 6))
			if horizonSampling() {
				dc.Store = horizonStore(t, e, "latency-dispatcher-"+strconv.Itoa(i), 6)
			}
			dc.InstanceID = "lat-" + strconv.Itoa(i)
		}
		ds = append(ds, e.dispatcher(dc))
	}

	stop := make(chan struct{})
	var bg sync.WaitGroup
	var hs *horizonSampler // what holds the horizon (split_horizon_test.go)
	if horizonSampling() {
		hs = startHorizonSampler(t, e.ctx, e.schema, consumer, stop, &bg)
	}
	versions := make([]map[string]int64, cfg.writers)
	for w := range cfg.writers {
		versions[w] = map[string]int64{}
		bg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 21))
			tick := time.NewTicker(cfg.pace) // the writers' steady pace, not a synchronisation
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				// Writer w owns the streams ≡ w (mod writers).
				id := fmt.Sprintf("l-%d", w+cfg.writers*rng.IntN(max(cfg.streams/cfg.writers, 1)))
				v := versions[w][id]
				n := 1 + rng.IntN(3)
				payloads := make([]any, n)
				for i := range payloads {
					if v == 0 && i == 0 {
						payloads[i] = testevents.TicketOpened{Title: id}
					} else {
						payloads[i] = testevents.TicketCommented{Body: "c", N: i}
					}
				}
				var txID uint64
				err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
					if horizonSampling() { // named for the horizon's sampler, before the append takes an id
						if _, err := tx.Exec(e.ctx, `SELECT set_config('application_name', $1, true)`, appWriter); err != nil {
							return err
						}
					}
					res, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", id), projector.ExactVersion(v), payloads...)
					txID = res.Position().TxID
					return err
				})
				at := time.Now()
				if err != nil {
					t.Errorf("append: %v", err) // the other writers go on; the run fails once measured
					return
				}
				rec.committed(id, v+1, v+int64(n), at)
				if hs != nil {
					hs.committed(id, v+1, v+int64(n), txID)
				}
				versions[w][id] = v + int64(n)
			}
		})
	}
	type oldest struct {
		at       time.Time
		age, xid time.Duration
	}
	var oldestMu sync.Mutex
	var oldests []oldest
	bg.Go(func() {
		// The age of the oldest transaction holding an xid on the whole
		// server, any session's: the horizon every partition reads below
		// waits for it, so a long one (another test's, on a shared
		// server) delays every event, changing layout or not. Two ages:
		// since its BEGIN (xact_start), and since its id was first seen
		// here (a pass begins with its lock and reads, and takes an id
		// only at its first write: the horizon waits from then on).
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		first := map[string]time.Time{} // pid/xid: when first seen
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			var secs float64
			var ids []string // oldest first
			if err := e.store.Pool().QueryRow(e.ctx, `SELECT coalesce(extract(epoch FROM max(clock_timestamp() - xact_start)), 0)::float8,
					coalesce(array_agg(pid::text || '/' || backend_xid::text ORDER BY age(backend_xid) DESC), '{}')
				FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()`).Scan(&secs, &ids); err != nil {
				t.Error(err)
				return
			}
			now := time.Now()
			var xidAge time.Duration
			for i, id := range ids {
				f, ok := first[id]
				if !ok {
					f, first[id] = now, now
				}
				if i == 0 {
					xidAge = now.Sub(f)
				}
			}
			oldestMu.Lock()
			oldests = append(oldests, oldest{now, time.Duration(secs * float64(time.Second)), xidAge})
			oldestMu.Unlock()
		}
	})
	bg.Go(func() { // the sampler of committed batches
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				ml.sample(t, consumer)
			}
		}
	})
	stopBG := sync.OnceFunc(func() { close(stop); bg.Wait() })
	defer stopBG()

	all4 := []string{"0/4", "1/4", "2/4", "3/4"}
	all8 := []string{"0/8", "1/8", "2/8", "3/8", "4/8", "5/8", "6/8", "7/8"}
	// steady waits until every partition of ids committed cfg.window
	// batches after from and an event committed after from was applied:
	// the phase then holds an event's whole wait, however long the
	// horizon makes waits on a loaded server (seconds, against a window
	// of 2 s at 10 batches of 200 ms).
	steady := func(what string, ids []string, from time.Time) time.Time {
		t.Helper()
		eventually(t, 2*time.Minute, what, func() bool {
			for _, id := range ids {
				if ml.count(id, from, time.Now()) < cfg.window {
					return false
				}
			}
			return rec.appliedSince(from)
		})
		return time.Now()
	}
	// successors waits for the first batch after at of every id and
	// returns the latest.
	successors := func(what string, ids []string, at time.Time) time.Time {
		t.Helper()
		var last time.Time
		eventually(t, 2*time.Minute, what, func() bool {
			last = time.Time{}
			for _, id := range ids {
				f := ml.firstAfter(id, at)
				if f.IsZero() {
					return false
				}
				if f.After(last) {
					last = f
				}
			}
			return true
		})
		return last
	}
	warm := steady("every partition commits batches", all4, time.Time{})
	splitAt := steady("steady state on 4 partitions", all4, warm)
	admin := projection.NewAdmin(e.store)
	if hs != nil {
		admin = projection.NewAdmin(horizonStore(t, e, appCommand, 2))
	}
	if _, err := admin.Split(e.ctx, consumer); err != nil {
		t.Fatal(err)
	}
	splitCmd := time.Since(splitAt)
	splitEnd := successors("every half commits", all8, splitAt)
	mergeAt := steady("steady state on 8 partitions", all8, splitEnd)
	if _, err := admin.Merge(e.ctx, consumer, time.Minute); err != nil {
		t.Fatal(err)
	}
	mergeCmd := time.Since(mergeAt)
	mergeEnd := successors("every merged partition commits", all4, mergeAt)
	end := steady("steady state on 4 partitions again", all4, mergeEnd)

	stopBG()
	if t.Failed() {
		t.FailNow()
	}
	want := map[string]int64{}
	for _, vs := range versions {
		for id, v := range vs {
			want[id] = v
		}
	}
	for _, d := range ds {
		e.catchUp(d)
	}
	eventually(t, time.Minute, "every committed event passes AfterCommit", func() bool { return rec.appliedCount() >= int(total(want)) })
	e.checkCounts(consumer, want)

	rec.mu.Lock()
	defer rec.mu.Unlock()
	// Exactly once through AfterCommit too: every committed event once,
	// nothing that was not committed.
	applied := map[evKey]time.Time{}
	for _, c := range rec.calls {
		for _, k := range c.events {
			if s := streamSeg4(k.stream); s != c.seg4 {
				// A batch is one partition's, and a half's streams
				// are its parent's.
				t.Errorf("%s (partition %d/4) applied in one batch with partition %d/4's streams", k.stream, s, c.seg4)
			}
			if _, dup := applied[k]; dup {
				t.Errorf("%s v%d passed AfterCommit twice", k.stream, k.version)
			}
			applied[k] = c.at
		}
	}
	if len(applied) != len(rec.commits) {
		t.Errorf("%d events passed AfterCommit, %d were committed", len(applied), len(rec.commits))
	}
	for k := range rec.commits {
		if _, ok := applied[k]; !ok {
			t.Errorf("%s v%d committed, never passed AfterCommit", k.stream, k.version)
		}
	}
	// Each stream's order is checked by the read model (bad); AfterCommit
	// runs after the commit, on the shard's goroutine, so a half's first
	// call may precede its parent's last by a scheduling hiccup: counted,
	// not failed.
	res := latencyResult{events: len(applied), splitCmd: splitCmd, mergeCmd: mergeCmd,
		splitTook: splitEnd.Sub(splitAt), mergeTook: mergeEnd.Sub(mergeAt)}
	for k, at := range applied {
		if k.version > 1 && applied[evKey{k.stream, k.version - 1}].After(at) {
			res.inversions++
		}
	}

	if os.Getenv("PROJECTOR_TEST_LATENCY_TIMELINE") != "" {
		// Every batch of partition 0/4's streams around each change:
		// when it committed, the halves (of 8) its events belong to, and
		// when its oldest event was committed, against the change's start.
		for _, w := range []struct {
			name     string
			from, to time.Time
		}{{"split", splitAt, splitEnd}, {"merge", mergeAt, mergeEnd}} {
			for _, c := range rec.calls {
				if c.seg4 != 0 || c.at.Before(w.from.Add(-100*time.Millisecond)) || c.at.After(w.to.Add(100*time.Millisecond)) {
					continue
				}
				halves := map[uint32]int{}
				oldest := c.at
				for _, k := range c.events {
					halves[streamHash(k.stream)>>29]++
					if ct := rec.commits[k]; ct.Before(oldest) {
						oldest = ct
					}
				}
				t.Logf("%s timeline: batch at %+6.1f ms, %2d events (by half of 8: %v), oldest committed at %+6.1f ms",
					w.name, float64(c.at.Sub(w.from))/1e6, len(c.events), halves, float64(oldest.Sub(w.from))/1e6)
			}
			t.Logf("%s timeline: ends at %+6.1f ms; first batches: %v", w.name, float64(w.to.Sub(w.from))/1e6, func() (out []string) {
				for _, id := range append(slices.Clone(all4), all8...) {
					if f := ml.firstAfter(id, w.from); !f.IsZero() && f.Before(w.to.Add(time.Millisecond)) {
						out = append(out, fmt.Sprintf("%s %+.1f ms", id, float64(f.Sub(w.from))/1e6))
					}
				}
				return out
			}())
		}
	}

	// One batch: the median time between two batches of a partition before
	// the split (each call before it is one 4-partition's batch).
	var gaps []time.Duration
	var prev [4]time.Time
	for _, c := range rec.calls {
		if c.at.Before(warm) || !c.at.Before(splitAt) {
			continue
		}
		if !prev[c.seg4].IsZero() {
			gaps = append(gaps, c.at.Sub(prev[c.seg4]))
		}
		prev[c.seg4] = c.at
	}
	if len(gaps) == 0 {
		t.Fatal("no batch rhythm measured")
	}
	slices.Sort(gaps)
	res.batch = gaps[len(gaps)/2]

	type window struct{ from, to time.Time }
	overlaps := func(c, a time.Time, w window) bool { return !a.Before(w.from) && !c.After(w.to) }
	within := func(c, a time.Time, w window) bool { return !c.Before(w.from) && !a.After(w.to) }
	phases := []struct {
		name string
		w    window
		in   func(c, a time.Time, w window) bool
	}{
		{"steady, 4 partitions", window{warm, splitAt}, within},
		{"split 4 -> 8", window{splitAt, splitEnd}, overlaps},
		{"steady, 8 partitions", window{splitEnd, mergeAt}, within},
		{"merge 8 -> 4", window{mergeAt, mergeEnd}, overlaps},
		{"steady, 4 partitions again", window{mergeEnd, end}, within},
	}
	lat := make([][]time.Duration, len(phases))
	type wait struct{ c, a time.Time }
	waits := make([][]wait, len(phases))
	res.phases = make([]latencyPhase, len(phases))
	hevs := make([][]horizonEvent, len(phases))
	for k, a := range applied {
		c := rec.commits[k]
		for i, ph := range phases {
			if !ph.in(c, a, ph.w) {
				continue
			}
			d := max(a.Sub(c), 0) // an apply may beat the writer's return from Commit by a hair
			lat[i] = append(lat[i], d)
			if hs != nil {
				hevs[i] = append(hevs[i], horizonEvent{k, c, a})
			}
			waits[i] = append(waits[i], wait{c, a})
			s := streamSeg4(k.stream)
			res.phases[i].perPartition[s] = max(res.phases[i].perPartition[s], d)
			if d >= res.phases[i].max {
				// The longest wait, placed against the phase's start.
				res.phases[i].max = d
				res.phases[i].worstCommit, res.phases[i].worstApply = c.Sub(ph.w.from), a.Sub(ph.w.from)
			}
			break
		}
	}
	for i, ph := range phases {
		l := lat[i]
		slices.Sort(l)
		res.phases[i].name = ph.name
		res.phases[i].events = len(l)
		if len(l) == 0 {
			t.Errorf("phase %s: no event measured", ph.name)
			continue
		}
		res.phases[i].p50 = l[len(l)/2]
		res.phases[i].p99 = l[min(len(l)-1, len(l)*99/100)]
	}
	for _, o := range oldests {
		for i, ph := range phases {
			if !o.at.Before(ph.w.from) && !o.at.After(ph.w.to) {
				res.phases[i].oldestTx = max(res.phases[i].oldestTx, o.age)
				res.phases[i].oldestXID = max(res.phases[i].oldestXID, o.xid)
			}
		}
	}
	if hs != nil {
		var ws []horizonWindow
		for i, ph := range phases {
			ws = append(ws, horizonWindow{ph.name, ph.w.from, ph.w.to, hevs[i]})
		}
		hs.report(t, ws)
	}
	for _, i := range []int{1, 3} {
		steady, length := phases[i-1].w, phases[i].w.to.Sub(phases[i].w.from)
		var maxima []time.Duration
		for from := steady.from; from.Before(steady.to); from = from.Add(length) {
			w := window{from, from.Add(length)}
			if w.to.After(steady.to) {
				w.to = steady.to
			}
			var longest time.Duration
			for _, x := range waits[i-1] {
				if overlaps(x.c, x.a, w) {
					longest = max(longest, x.a.Sub(x.c))
				}
			}
			if longest > 0 {
				maxima = append(maxima, longest)
			}
		}
		if len(maxima) == 0 {
			t.Errorf("%s: no steady window to compare with", phases[i].name)
			continue
		}
		slices.Sort(maxima)
		res.phases[i].baseline, res.phases[i].windows = maxima[len(maxima)/2], len(maxima)
	}
	return res
}

// inBatches renders d in batches of b.
func inBatches(d, b time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(b)) }

// log reports r's figures.
func (r latencyResult) log(t testing.TB) {
	t.Helper()
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }
	t.Logf("%d events; one batch (median time between two batches of a partition before the split): %s; split took %s (command %s), merge %s (command %s); AfterCommit order inversions: %d",
		r.events, ms(r.batch), ms(r.splitTook), ms(r.splitCmd), ms(r.mergeTook), ms(r.mergeCmd), r.inversions)
	for _, ph := range r.phases {
		parts := make([]string, 4)
		for i, d := range ph.perPartition {
			parts[i] = fmt.Sprintf("%d/4 %s", i, inBatches(d, r.batch))
		}
		t.Logf("%-27s %5d events: p50 %s, p99 %s, max %s (%s batches); per partition max, batches: %s; oldest transaction on the server %s (its id held %s)",
			ph.name, ph.events, ms(ph.p50), ms(ph.p99), ms(ph.max), inBatches(ph.max, r.batch), strings.Join(parts, ", "), ms(ph.oldestTx), ms(ph.oldestXID))
	}
	for _, i := range []int{1, 3} {
		ph := r.phases[i]
		t.Logf("%s: longest latency %s batches (an event committed at %+.0f ms from the change's start, applied at %+.0f ms); a steady window of its length before it: %s batches (median of %d); excess %s batches (target: at most 1)",
			ph.name, inBatches(ph.max, r.batch), float64(ph.worstCommit)/float64(time.Millisecond), float64(ph.worstApply)/float64(time.Millisecond),
			inBatches(ph.baseline, r.batch), ph.windows, inBatches(ph.max-ph.baseline, r.batch))
	}
	sp, mp := r.phases[1], r.phases[3]
	t.Logf("summary: batch %s | steady p50/p99/max %s/%s/%s | split p50/p99/max %s/%s/%s = %s batches, steady window %s, excess %s | merge p50/p99/max %s/%s/%s = %s batches, steady window %s, excess %s | split took %s, merge %s",
		ms(r.batch), ms(r.phases[0].p50), ms(r.phases[0].p99), ms(r.phases[0].max),
		ms(sp.p50), ms(sp.p99), ms(sp.max), inBatches(sp.max, r.batch), inBatches(sp.baseline, r.batch), inBatches(sp.max-sp.baseline, r.batch),
		ms(mp.p50), ms(mp.p99), ms(mp.max), inBatches(mp.max, r.batch), inBatches(mp.baseline, r.batch), inBatches(mp.max-mp.baseline, r.batch),
		ms(r.splitTook), ms(r.mergeTook))
	var oldest, held []string
	for _, ph := range r.phases {
		oldest = append(oldest, ms(ph.oldestTx))
		held = append(held, ms(ph.oldestXID))
	}
	t.Logf("summary: oldest transaction on the server per phase: %s; its id held: %s", strings.Join(oldest, " / "), strings.Join(held, " / "))
}

// TestPartitionSplitMergeEventLatency: split 4 → 8 and merge back while
// writers append a few hundred events a second over 64 streams, measured
// on each event's latency (split_latency_test.go's head). Logs the figures
// (docs/performance.md records them, measured with steady phases of
// measureWindow batches: PROJECTOR_SOAK=1 or PROJECTOR_TEST_LATENCY_WINDOW);
// asserts exactly once and per-stream order, not timings. One dispatcher, then two with pools of their own
// (the partitions balanced between them).
func TestPartitionSplitMergeEventLatency(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprintf("dispatchers=%d", n), func(t *testing.T) {
			runSplitMergeLatency(t, defaultLatencyConfig(n, pgtest.Size(ciWindow, measureWindow))).log(t)
		})
	}
}

// BenchmarkPartitionSplitMergeLatency runs the latency measurement of
// TestPartitionSplitMergeEventLatency (one dispatcher) once per iteration
// and reports, as medians over the iterations, the steady-state batch time
// and p99 latency and each change's longest event latency in batches and
// in excess of the steady p99. PROJECTOR_BENCH_LATENCY_DISPATCHERS=2 runs
// two dispatchers; PROJECTOR_TEST_LATENCY_WINDOW lengthens the steady phases.
func BenchmarkPartitionSplitMergeLatency(b *testing.B) {
	n := 1
	if v, err := strconv.Atoi(os.Getenv("PROJECTOR_BENCH_LATENCY_DISPATCHERS")); err == nil && v > 0 {
		n = v
	}
	var batch, p99, split, splitOver, merge, mergeOver []float64 // over: in excess of a steady window's longest
	for b.Loop() {
		r := runSplitMergeLatency(b, defaultLatencyConfig(n, measureWindow))
		r.log(b)
		bt := float64(r.batch)
		batch = append(batch, float64(r.batch)/float64(time.Millisecond))
		p99 = append(p99, float64(r.phases[0].p99)/float64(time.Millisecond))
		split = append(split, float64(r.phases[1].max)/bt)
		splitOver = append(splitOver, float64(r.phases[1].max-r.phases[1].baseline)/bt)
		merge = append(merge, float64(r.phases[3].max)/bt)
		mergeOver = append(mergeOver, float64(r.phases[3].max-r.phases[3].baseline)/bt)
	}
	median := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	b.ReportMetric(median(batch), "batch-ms")
	b.ReportMetric(median(p99), "steady-p99-ms")
	b.ReportMetric(median(split), "split-max-batches")
	b.ReportMetric(median(splitOver), "split-excess-batches")
	b.ReportMetric(median(merge), "merge-max-batches")
	b.ReportMetric(median(mergeOver), "merge-excess-batches")
	b.ReportMetric(0, "ns/op")
}
