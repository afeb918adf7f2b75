package projection_test

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
)

var promise16Full = flag.Bool("promise16.full", false, "run TestPromise16 at the issue's full size (50,000 events over 1,000 streams), as PROJECTOR_SOAK=1 does")

// promise16Soak reports whether the promise 16 tests run at the issue's
// full size: -promise16.full or a soak run (pgtest.EnvSoak).
func promise16Soak() bool { return *promise16Full || pgtest.Soak() }

// workers returns how many events each process applied (table workers,
// written in the handlers' transactions, so only committed work counts).
func (e *env) workers() map[string]int64 {
	e.t.Helper()
	rows, err := e.store.Pool().Query(e.ctx, `SELECT instance, n FROM `+e.table("workers"))
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]int64{}
	var id string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = n; return nil }); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// writers append to e's log until told to finish: each owns its streams
// (versions known without reading back); a tenth of the transactions
// commit late (holding their transaction open past others' commits), a
// tenth roll back. They write at least events events over about streams
// streams as fast as they can, and then (outside a soak run) go on at a
// steady pace until finish: commits keep racing the kills, splits and
// merges, without six writers flat out for the whole test (most of a
// CPU-bound suite's work in these tests was appends nobody needed).
type writers struct {
	t        testing.TB
	mu       sync.Mutex
	versions map[string]int64
	left     atomic.Int64
	stop     atomic.Bool
	wg       sync.WaitGroup
	errs     chan error
}

// writersPace is how long each writer waits between transactions once the
// quota is written: six writers then commit about a hundred transactions a
// second.
const writersPace = 50 * time.Millisecond

func startWriters(e *env, events, streams int) *writers {
	const n = 6
	w := &writers{t: e.t, versions: map[string]int64{}, errs: make(chan error, n)}
	w.left.Store(int64(events))
	for i := range n {
		w.wg.Go(func() { w.write(e, i, n, streams) })
	}
	return w
}

func (w *writers) write(e *env, i, n, streams int) {
	rng := rand.New(rand.NewPCG(uint64(i), 16))
	errRollback := errors.New("rolled back on purpose")
	for w.left.Load() > 0 || !w.stop.Load() {
		if w.left.Load() <= 0 && !promise16Soak() {
			time.Sleep(writersPace) // the steady pace after the quota, not a synchronisation
		}
		id := fmt.Sprintf("p-%d", i+n*rng.IntN(max(streams/n, 1)))
		k := 1 + rng.IntN(4)
		w.mu.Lock()
		v := w.versions[id]
		w.mu.Unlock()
		payloads := make([]any, k)
		for j := range payloads {
			if v == 0 && j == 0 {
				payloads[j] = testevents.TicketOpened{Title: id}
			} else {
				payloads[j] = testevents.TicketCommented{Body: "c", N: j}
			}
		}
		roll := rng.IntN(10)
		err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
			if _, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", id), projector.ExactVersion(v), payloads...); err != nil {
				return err
			}
			switch roll {
			case 0: // a late commit: others commit after this one took its id
				time.Sleep(time.Duration(20+rng.IntN(60)) * time.Millisecond)
			case 1:
				return errRollback
			}
			return nil
		})
		if errors.Is(err, projector.ErrConcurrency) || errors.Is(err, errRollback) {
			continue
		}
		if err != nil {
			w.errs <- err
			return
		}
		w.mu.Lock()
		w.versions[id] = v + int64(k)
		w.mu.Unlock()
		w.left.Add(-int64(k))
	}
}

// finish stops the writers once they wrote their events and returns each
// stream's committed version.
func (w *writers) finish() map[string]int64 {
	w.t.Helper()
	w.stop.Store(true)
	w.wg.Wait()
	close(w.errs)
	for err := range w.errs {
		w.t.Fatalf("append: %v", err)
	}
	return w.versions
}

// TestPromise16_PartitionsExactlyOnceAcrossKills: four OS processes work an
// eight-partition consumer while writers commit concurrently, some late
// (holding their transaction open past others' commits) and some rolled
// back; processes are SIGKILLed at random, mid-batch, and new ones started:
// four kills over 3,000 events by default, twenty over 50,000 in a soak run.
// Every committed event is applied exactly once, each stream in order, and
// every process that ran to the end of a phase did work.
func TestPromise16_PartitionsExactlyOnceAcrossKills(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	events, streams := 3000, 300
	kills, wantKills := 0, 4
	if promise16Soak() {
		events, streams, wantKills = 50000, 1000, 20
	}
	f := newFleet(e, 8, 4)
	w := startWriters(e, events, streams)
	rng := rand.New(rand.NewPCG(16, 16))
	began := time.Now()
	for ; kills < wantKills; kills++ {
		f.killOne(rng)
	}
	f.waitAllWorked()
	versions := w.finish()
	t.Logf("kills done in %v", time.Since(began).Round(time.Millisecond))
	f.check(versions)
	t.Logf("%d events over %d streams, %d SIGKILLs, %d processes; work per process %v", total(versions), len(versions), kills, f.started, e.workers())
}

// fleet is a set of child processes running "parted", the partitioned
// consumer of the promise 16 tests, each under its own instance id.
type fleet struct {
	e                 *env
	url               string
	partitions, batch int
	started           int
	running           map[string]*pgtest.Child
}

// newFleet starts procs processes declaring partitions.
func newFleet(e *env, partitions, procs int) *fleet {
	e.exec(`CREATE TABLE ` + e.table("workers") + ` (instance text PRIMARY KEY, n bigint NOT NULL)`)
	f := &fleet{e: e, url: pgtest.URL(e.t), partitions: partitions, batch: 25, running: map[string]*pgtest.Child{}}
	for range procs {
		f.start()
	}
	return f
}

func (f *fleet) start() {
	f.started++
	id := "proc-" + strconv.Itoa(f.started)
	f.running[id] = f.e.startChild(f.url, f.batch, childPartitions+"="+strconv.Itoa(f.partitions), projection.EnvInstanceID+"="+id)
}

// allWorked reports whether every running process applied events.
func (f *fleet) allWorked() bool {
	w := f.e.workers()
	for id := range f.running {
		if w[id] == 0 {
			return false
		}
	}
	return true
}

// waitAllWorked waits for allWorked; on a timeout it prints what the
// balancing saw (owners, cursors, heartbeats), so a stall under a loaded CI
// machine can be told from slowness (CI once timed out here after a minute
// with nothing to go on).
func (f *fleet) waitAllWorked() {
	e := f.e
	e.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for !f.allWorked() {
		if time.Now().After(deadline) {
			e.t.Logf("running: %v; applied: %d; work per process: %v", slices.Sorted(maps.Keys(f.running)), e.applied("parted"), e.workers())
			e.dumpRows(`SELECT instance_id, coalesce(owner, '-'), cursor_tx_id::text, cursor_seq, status, attempts, coalesce(last_error, '')
				FROM ` + e.store.Table("projector_consumers") + ` WHERE name = 'parted' ORDER BY instance_id`)
			e.dumpRows(`SELECT instance_id, consumers::text, round(extract(epoch FROM now() - last_seen_at)::numeric, 2), heartbeat_every::text, stopped_at IS NOT NULL
				FROM ` + e.store.Table("projector_instances") + ` ORDER BY instance_id`)
			e.t.Fatalf("timed out after 90s waiting for every running process to apply events")
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not synchronisation
	}
}

// dumpRows logs every row of query, one line each, for a failure report.
func (e *env) dumpRows(query string) {
	e.t.Helper()
	rows, err := e.store.Pool().Query(e.ctx, query)
	if err != nil {
		e.t.Logf("dump: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			e.t.Logf("dump: %v", err)
			return
		}
		e.t.Logf("  %v", vals)
	}
}

// killOne waits until every running process worked (the first ones, then
// each started in a killed one's place), SIGKILLs one chosen at random at a
// random moment, mid-batch more often than not, and starts another.
func (f *fleet) killOne(rng *rand.Rand) {
	f.e.t.Helper()
	f.waitAllWorked()
	time.Sleep(time.Duration(rng.IntN(200)) * time.Millisecond) // a random moment, not a synchronisation
	ids := make([]string, 0, len(f.running))
	for id := range f.running {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	victim := ids[rng.IntN(len(ids))]
	f.running[victim].Kill(f.e.t)
	delete(f.running, victim)
	f.start()
}

// check waits for every committed event to be applied, stops the
// processes, and checks promise 16: each event applied exactly once, each
// stream in order, and the work the processes recorded adds up.
func (f *fleet) check(versions map[string]int64) {
	e := f.e
	e.t.Helper()
	want := total(versions)
	eventually(e.t, 2*time.Minute, "every event applied", func() bool { return e.applied("parted") >= want })
	for _, c := range f.running {
		c.Terminate(e.t)
	}
	e.checkCounts("parted", versions)
	var sum int64
	for _, n := range e.workers() {
		sum += n
	}
	if sum != want {
		e.t.Errorf("processes applied %d events in all (committed), want %d", sum, want)
	}
}
