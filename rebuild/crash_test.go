package rebuild_test

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
	"github.com/projectorhq/projector/stores/postgres"
)

// A child is this test binary run as a dispatcher of the counter
// projection at some version, so a test can SIGKILL a real rebuilding
// process.
const (
	childEnv        = "PROJECTOR_TEST_REBUILD_CHILD"
	childURLEnv     = "PROJECTOR_TEST_REBUILD_URL"
	childSchemaEnv  = "PROJECTOR_TEST_REBUILD_SCHEMA"
	childVersionEnv = "PROJECTOR_TEST_REBUILD_VERSION"
)

func runChild() int {
	ctx, stop := pgtest.ChildContext()
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	pool, err := pgxpool.New(ctx, os.Getenv(childURLEnv))
	if err != nil {
		return pgtest.ChildFailed(ctx, logger, "child: pool", err)
	}
	defer pool.Close()
	types := testevents.New()
	schema := os.Getenv(childSchemaEnv)
	version, _ := strconv.Atoi(os.Getenv(childVersionEnv))
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: types.Registry, Logger: logger})
	if err != nil {
		return pgtest.ChildFailed(ctx, logger, "child: store", err)
	}
	d, err := projection.New(projection.Config{Store: store, Logger: logger, PollMax: 20 * time.Millisecond, Recheck: 20 * time.Millisecond,
		Projections: []*projection.Async{counter(types, schema+".counts", version, projection.AsyncConfig{BatchSize: 25})}})
	if err == nil {
		err = d.Start(ctx)
	}
	if err != nil {
		return pgtest.ChildFailed(ctx, logger, "child: dispatcher", err)
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_ = d.Stop(sctx)
	return 0
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

func (e *env) startChild(version int) *pgtest.Child {
	e.t.Helper()
	return pgtest.StartChild(e.t, childEnv+"=1", childURLEnv+"="+pgtest.URL(e.t), childSchemaEnv+"="+e.schema,
		childVersionEnv+"="+strconv.Itoa(version))
}

// Promise 11, crash: the process building a blue/green rebuild is SIGKILLed
// at random moments of its replay, four times (six over a log twice as long
// in a soak run, see pgtest.EnvSoak), while writers append and version 1
// serves. Each new process resumes the shadow cursor where the killed one
// committed (it never goes back to the start), the live model stays
// complete throughout, and the switched model is exact. Each kill waits for
// the new process to replay first: on a loaded machine a race-detector
// child takes longer to start than any fixed delay, and kills that all
// landed before the replay began (as they once did here, every one at
// shadow cursor 0/0) test nothing.
func TestPromise11_RebuildResumesAfterSIGKILL(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for i := range pgtest.Size(100, 200) { // a log long enough to be killed in the middle of
		e.appendBatch(t, i, 40)
	}
	e.dispatcher(e.counter(1, projection.AsyncConfig{}))
	// Version 1 serves before anything is killed: on a loaded machine its
	// first pass can come after the first kill, and an empty model (no
	// version yet) is not what the checks below are about.
	eventually(t, time.Minute, "version 1 to serve", func() bool {
		lr, err := e.read()
		return err == nil && len(lr.versions) == 1
	})
	stop := make(chan struct{})
	writers := e.write(2, stop)
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		writers.Wait()
	}()

	child := e.startChild(2)
	eventually(t, time.Minute, "version 2 to be registered", func() bool {
		var n int
		_ = e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+e.store.Table("projector_projections")+` WHERE name = 'counter' AND version = 2`).Scan(&n)
		return n == 1
	})
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{}); err != nil {
		t.Fatal(err)
	}
	var last projector.Position
	kills, wantKills := 0, pgtest.Size(4, 6)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 11))
	for kills < wantKills {
		// This process has replayed past where the last one was killed.
		eventually(t, time.Minute, "the rebuilding process to replay", func() bool {
			r, err := rebuild.Current(e.ctx, e.store, "counter")
			if err != nil {
				t.Fatal(err)
			}
			return !r.Active() || last.Less(r.Cursor) || exited(child)
		})
		time.Sleep(time.Duration(20+rng.IntN(150)) * time.Millisecond) // a random moment to crash at
		r, err := rebuild.Current(e.ctx, e.store, "counter")
		if err != nil {
			t.Fatal(err)
		}
		if !r.Active() {
			break // it finished between kills: fine, the checks below hold
		}
		child.Kill(t)
		kills++
		r, err = rebuild.Current(e.ctx, e.store, "counter")
		if err != nil {
			t.Fatal(err)
		}
		if r.Active() && r.Cursor.Less(last) {
			t.Fatalf("after kill %d the shadow cursor went back from %s to %s", kills, last, r.Cursor)
		}
		last = r.Cursor
		t.Logf("kill %d: %d of %d events left to replay, shadow cursor %s", kills, r.Remaining, r.TotalEvents, r.Cursor)
		if lr, err := e.read(); err != nil || lr.counted != lr.expected || len(lr.versions) != 1 {
			t.Fatalf("after kill %d the live model is not whole: %+v, %v", kills, lr, err)
		}
		child = e.startChild(2)
	}
	t.Logf("killed the rebuilding process %d times; last shadow cursor %s", kills, last)
	if kills > 0 && last == projector.Start {
		t.Fatalf("%d kills, none after the replay began: the crash was never mid-replay", kills)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	final, err := rebuild.Wait(ctx, e.store, "counter", 20*time.Millisecond, nil)
	if err != nil || final.Status != rebuild.Switched {
		t.Fatalf("rebuild ended %+v, %v", final, err)
	}
	close(stop)
	writers.Wait()
	// Waiting for at least every event, then checking for exactly: an
	// event applied twice fails here at once, with the numbers, instead of
	// as a wait that never ends.
	var total int64
	eventually(t, time.Minute, "version 2 to catch up with the writers", func() bool {
		r, err := e.read()
		_ = e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+e.store.Table("projector_events")).Scan(&total)
		return err == nil && r.counted >= total && len(r.versions) == 1 && r.versions[0] == 2
	})
	if r, err := e.read(); err != nil || r.counted != total || r.counted != r.expected {
		t.Fatalf("version 2 counted %d events for a log of %d (%d up to its cursor): an event applied twice or skipped (%v)", r.counted, total, r.expected, err)
	}
	// Every stream counted exactly its events.
	var wrong int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM (SELECT s.stream_id FROM `+e.store.Table("projector_streams")+` s
		LEFT JOIN `+e.store.Schema()+`.counts c ON c.stream_id = s.stream_id WHERE c.n IS DISTINCT FROM s.version) x`).Scan(&wrong); err != nil || wrong != 0 {
		t.Fatalf("%d streams counted wrong after the rebuild (%v)", wrong, err)
	}
}
