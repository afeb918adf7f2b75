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

var promise16Full = flag.Bool("promise16.full", false, "run TestPromise16 at the issue's full size (50,000 events over 1,000 streams)")

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

// TestPromise16_PartitionsExactlyOnceAcrossKills: four OS processes work an
// eight-partition consumer while writers commit concurrently, some late
// (holding their transaction open past others' commits) and some rolled
// back; processes are SIGKILLed at random, mid-batch, and new ones started.
// Every committed event is applied exactly once, each stream in order, and
// every process that ran to the end of a phase did work.
func TestPromise16_PartitionsExactlyOnceAcrossKills(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	e.exec(`CREATE TABLE ` + e.table("workers") + ` (instance text PRIMARY KEY, n bigint NOT NULL)`)
	url := pgtest.URL(t)
	events, streams := 6000, 300
	if *promise16Full {
		events, streams = 50000, 1000
	}
	const partitions, procs, batch = 8, 4, 25
	nextID := 0
	start := func() (*pgtest.Child, string) {
		nextID++
		id := "proc-" + strconv.Itoa(nextID)
		return e.startChild(url, batch, childPartitions+"="+strconv.Itoa(partitions), projection.EnvInstanceID+"="+id), id
	}
	running := map[string]*pgtest.Child{}
	for range procs {
		c, id := start()
		running[id] = c
	}

	// Writers: each owns its streams (versions known without reading
	// back); a tenth of the transactions commit late, a tenth roll back.
	var mu sync.Mutex
	versions := map[string]int64{}
	var left atomic.Int64
	left.Store(int64(events))
	var stop atomic.Bool // set once the kills are done
	var wg sync.WaitGroup
	const writers = 6
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 16))
			for left.Load() > 0 || !stop.Load() {
				id := fmt.Sprintf("p-%d", w+writers*rng.IntN(max(streams/writers, 1)))
				n := 1 + rng.IntN(4)
				mu.Lock()
				v := versions[id]
				mu.Unlock()
				payloads := make([]any, n)
				for i := range payloads {
					if v == 0 && i == 0 {
						payloads[i] = testevents.TicketOpened{Title: id}
					} else {
						payloads[i] = testevents.TicketCommented{Body: "c", N: i}
					}
				}
				roll := rng.IntN(10)
				errRollback := errors.New("rolled back on purpose")
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
					errs <- err
					return
				}
				mu.Lock()
				versions[id] = v + int64(n)
				mu.Unlock()
				left.Add(-int64(n))
			}
		})
	}

	// Every process works before the next kill: the first four, then each
	// one started in a killed one's place. The victim is chosen at random
	// and killed at a random moment, mid-batch more often than not.
	allWorked := func() bool {
		w := e.workers()
		for id := range running {
			if w[id] == 0 {
				return false
			}
		}
		return true
	}
	// waitAllWorked waits for allWorked; on a timeout it prints what the
	// balancing saw (owners, cursors, heartbeats) and any writer error, so
	// a stall under a loaded CI machine can be told from a stopped writer.
	waitAllWorked := func() {
		t.Helper()
		deadline := time.Now().Add(90 * time.Second)
		for !allWorked() {
			if time.Now().After(deadline) {
				t.Logf("writer errors pending: %d; events left to write: %d; applied: %d", len(errs), left.Load(), e.applied("parted"))
				t.Logf("running: %v; work per process: %v", slices.Sorted(maps.Keys(running)), e.workers())
				e.dumpRows(`SELECT instance_id, coalesce(owner, '-'), cursor_tx_id::text, cursor_seq, status, attempts, coalesce(last_error, '')
					FROM ` + e.store.Table("projector_consumers") + ` WHERE name = 'parted' ORDER BY instance_id`)
				e.dumpRows(`SELECT instance_id, consumers::text, round(extract(epoch FROM now() - last_seen_at)::numeric, 2), heartbeat_every::text, stopped_at IS NOT NULL
					FROM ` + e.store.Table("projector_instances") + ` ORDER BY instance_id`)
				t.Fatalf("timed out after 90s waiting for every running process to apply events")
			}
			time.Sleep(5 * time.Millisecond) // polling interval, not synchronisation
		}
	}
	rng := rand.New(rand.NewPCG(16, 16))
	kills, wantKills := 0, 6
	if *promise16Full {
		wantKills = 20
	}
	began := time.Now()
	for kills < wantKills {
		waitAllWorked()
		time.Sleep(time.Duration(rng.IntN(200)) * time.Millisecond) // a random moment, not a synchronisation
		ids := make([]string, 0, len(running))
		for id := range running {
			ids = append(ids, id)
		}
		victim := ids[rng.IntN(len(ids))]
		running[victim].Kill(t)
		delete(running, victim)
		kills++
		c, id := start()
		running[id] = c
	}
	waitAllWorked()
	stop.Store(true)
	wg.Wait()
	t.Logf("kills done in %v", time.Since(began).Round(time.Millisecond))
	close(errs)
	for err := range errs {
		t.Fatalf("append: %v", err)
	}
	if kills == 0 {
		t.Fatal("no process was killed while the writers ran: the test exercised nothing")
	}
	want := total(versions)
	eventually(t, 2*time.Minute, "every event applied", func() bool { return e.applied("parted") >= want })
	for _, c := range running {
		c.Terminate(t)
	}
	e.checkCounts("parted", versions)
	var sum int64
	for _, n := range e.workers() {
		sum += n
	}
	if sum != want {
		t.Errorf("processes applied %d events in all (committed), want %d", sum, want)
	}
	t.Logf("%d events over %d streams, %d SIGKILLs, %d processes; work per process %v", want, len(versions), kills, nextID, e.workers())
}
