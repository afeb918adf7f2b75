package projection_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
)

// Promise 6, in one process: three dispatchers with pools of their own
// share one consumer while 8 writers append 5,000 events (16 writers and
// 20,000 events in a soak run, see pgtest.EnvSoak); every event is applied
// exactly once in total, each stream in order.
func TestPromise6_SharedDeliveryExactlyOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for i := range 3 {
		store := e.storeOn(pgtest.NewPool(t, 3))
		p := counting(e.schema, e.types, "counting", projection.AsyncConfig{BatchSize: 200})
		e.dispatcher(projection.Config{Store: store, Projections: []*projection.Async{p}, InstanceID: "d" + strconv.Itoa(i), Concurrency: 2})
	}
	versions := e.appendMany(pgtest.Size(8, 16), pgtest.Size(5000, 20000), pgtest.Size(200, 400))
	want := total(versions)
	eventually(t, 2*time.Minute, "every event applied", func() bool { return e.applied("counting") >= want })
	e.checkCounts("counting", versions)
}

// Promise 6 across OS processes: three child processes run the same shared
// consumers while the test appends (5,000 events; 20,000 in a soak run).
func TestPromise6_SharedDeliveryAcrossProcesses(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	url := pgtest.URL(t)
	children := []*pgtest.Child{e.startChild(url, 100), e.startChild(url, 100), e.startChild(url, 100)}
	versions := e.appendMany(pgtest.Size(8, 16), pgtest.Size(5000, 20000), pgtest.Size(200, 400))
	want := total(versions)
	eventually(t, 2*time.Minute, "every event applied", func() bool { return e.applied("counting") >= want })
	eventually(t, time.Minute, "every opened event emitted", func() bool { return e.emittedCount() >= openedCount(versions) })
	for _, c := range children {
		c.Terminate(t)
	}
	e.checkCounts("counting", versions)
	e.checkEmitted(openedCount(versions))
}

// Per-instance delivery: every instance applies every event (1,000 events:
// many batches each, and the size is no part of what is checked).
func TestPerInstanceDeliveryAppliesEverywhere(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	versions := e.appendMany(4, 1000, 40)
	for _, id := range []string{"alpha", "beta", "gamma"} {
		p := projection.NewAsync("live", projection.AsyncConfig{Delivery: projection.PerInstance, BatchSize: 150})
		h := countingHandler(e.schema, "live@"+id)
		must(projection.OnEvent(p, e.types.Opened, h))
		must(projection.OnEvent(p, e.types.Commented, h))
		e.dispatcher(projection.Config{Store: e.storeOn(pgtest.NewPool(t, 2)), Projections: []*projection.Async{p}, InstanceID: id})
	}
	want := total(versions)
	for _, id := range []string{"alpha", "beta", "gamma"} {
		eventually(t, time.Minute, id+" applied everything", func() bool { return e.applied("live@"+id) >= want })
		e.checkCounts("live@"+id, versions)
	}
	st, err := projection.NewAdmin(e.store).List(e.ctx, "live")
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 3 {
		t.Fatalf("per-instance consumer has %d shards, want 3", len(st))
	}
}

// Promise 5: a dispatcher in a child process is SIGKILLed at random moments
// while it catches up, at least four times (ten in a soak run, see
// pgtest.EnvSoak), and restarted each time; in the end the read model is
// exactly right. One of the runs kills itself between a handler's append and
// the commit: the emitted event still exists exactly once. The default size
// (4,000 events, topped up when a child catches up before its kill) keeps
// every kill mid-batch: what the promise needs is kills landing mid-work, not
// a long log.
func TestPromise5_CrashRecoveryExactlyOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	url := pgtest.URL(t)
	versions := e.appendMany(8, pgtest.Size(4000, 20000), pgtest.Size(150, 300))
	rng := rand.New(rand.NewPCG(5, 5))
	wantKills := pgtest.Size(4, 10)

	// A crash between handler and commit, deterministically: the emitter
	// kills its process right after its 60th append (of one per stream, and
	// there are far more streams than that).
	if n := openedCount(versions); n <= 60 {
		t.Fatalf("only %d streams: the emitter would never reach its 60th append", n)
	}
	c := e.startChild(url, 50, childKillAfterEmit+"=60")
	select {
	case <-c.Done():
	case <-time.After(2 * time.Minute):
		t.Fatalf("the child meant to kill itself at its 60th append still runs after 2 minutes:\n%s", c.Output())
	}
	if !c.Killed() {
		t.Fatalf("the child meant to kill itself ended otherwise:\n%s", c.Output())
	}

	kills, round := 0, 0
	for kills < wantKills {
		round++
		if round > 60 {
			t.Fatalf("only %d kills landed while catching up in %d rounds", kills, round)
		}
		before := e.applied("counting")
		c := e.startChild(url, 50)
		// Let the child start catching up before choosing the moment: on a
		// loaded machine a -race child can take longer to start than any
		// fixed delay, and a kill during start-up tests nothing.
		started := time.Now()
		for e.applied("counting") == before && time.Since(started) < time.Minute && !exited(c) {
			time.Sleep(10 * time.Millisecond) // polling the read model; a child takes far longer to start
		}
		time.Sleep(time.Duration(rng.IntN(150)) * time.Millisecond) // a random moment, not a synchronisation
		applied := e.applied("counting")
		c.Kill(t)
		if applied > before && applied < total(versions) {
			kills++
		} else if applied >= total(versions) {
			// Caught up before the kill: give it more to catch up on.
			for id, v := range appendWith(t, e.ctx, e.store, 4, pgtest.Size(1500, 3000), 60, fmt.Sprintf("r%d", round)) {
				versions[id] = v
			}
		}
	}
	final := e.startChild(url, 500)
	want := total(versions)
	eventually(t, 2*time.Minute, "every event applied after the crashes", func() bool { return e.applied("counting") >= want })
	eventually(t, time.Minute, "every opened event emitted", func() bool { return e.emittedCount() >= openedCount(versions) })
	final.Terminate(t)
	e.checkCounts("counting", versions)
	e.checkEmitted(openedCount(versions))
	t.Logf("%d kills while catching up, %d events", kills, want)
}

// exited reports whether a child process has ended.
func exited(c *pgtest.Child) bool {
	select {
	case <-c.Done():
		return true
	default:
		return false
	}
}

func (e *env) emittedCount() int {
	e.t.Helper()
	var n int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+e.store.Table("projector_events")+` WHERE stream_type = 'emitted'`).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// Losing the database connection mid-run (backends terminated, as on a
// failover) is survived: the dispatcher retries with backoff and ends with
// every event applied exactly once. Up to five terminations, one per 250
// events applied, over a log of 1,500 (30 batches): each lands mid-run.
func TestDispatcherSurvivesConnectionLoss(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	app := "projector-connloss-" + e.schema
	cfg := pgtest.PoolConfig(t)
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	cfg.MaxConns = 4
	pool := pgtest.PoolFromConfig(t, cfg)
	versions := e.appendMany(8, 1500, 200)
	p := counting(e.schema, e.types, "counting", projection.AsyncConfig{BatchSize: 50})
	d := e.dispatcher(projection.Config{Store: e.storeOn(pool), Projections: []*projection.Async{p}})

	terminated := 0
	for i := 0; i < 5 && e.applied("counting") < total(versions); i++ {
		eventually(t, time.Minute, "progress before the next termination", func() bool { return e.applied("counting") > int64(i*250) })
		var n int
		err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1) x`, app).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		terminated += n
	}
	if terminated == 0 {
		t.Fatal("no backend was terminated: the test did not exercise connection loss")
	}
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	e.checkCounts("counting", versions)
	t.Logf("terminated %d backends", terminated)
}

// Promise 6 under heavy contention: four dispatchers fight over one shard
// with batches of one event, so passes hand the shard over hundreds of
// times (thousands in a soak run); each must see the cursor its predecessor
// committed.
func TestPromise6_ShardHandOverUnderContention(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	versions := e.appendMany(4, pgtest.Size(300, 1500), 30)
	for i := range 4 {
		store := e.storeOn(pgtest.NewPool(t, 2))
		p := counting(e.schema, e.types, "contended", projection.AsyncConfig{BatchSize: 1})
		e.dispatcher(projection.Config{Store: store, Projections: []*projection.Async{p}, InstanceID: "c" + strconv.Itoa(i),
			PollMin: time.Millisecond, PollMax: 2 * time.Millisecond, Recheck: time.Millisecond})
	}
	want := total(versions)
	eventually(t, 2*time.Minute, "every event applied", func() bool { return e.applied("contended") >= want })
	e.checkCounts("contended", versions)
}
