package jetstream_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	pjs "github.com/projectorhq/projector/stores/jetstream"
	"github.com/projectorhq/projector/stores/postgres"
)

// Concurrent writers, some holding their transaction open so commits land
// out of sequence order, feed a relay; the stream must hold every event
// exactly once, in per-stream version order. A second relay (another
// consumer name) then publishes the whole log again: the duplicate window
// must absorb every one of those re-publishes.
func TestPromise14_EachEventOnceInStreamOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.relay(e.relayConfig())
	d := e.dispatcher(r.Async())

	const writers, perWriter = 6, 25
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWriter {
				tenant := "t" + strconv.Itoa(w%2)
				id := "s" + strconv.Itoa((w+i)%5)
				err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
					_, err := e.store.Append(e.ctx, tx, projector.TenantStream(tenant, "ticket", id), projector.AnyVersion,
						testevents.TicketCommented{Body: fmt.Sprintf("w%d-%d", w, i), N: i})
					if err == nil && i%7 == 0 {
						// Hold the transaction a little so later sequence
						// values commit first.
						_, err = tx.Exec(e.ctx, `SELECT pg_sleep(0.02)`)
					}
					return err
				})
				if errors.Is(err, projector.ErrConcurrency) {
					continue
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	n := len(e.logEvents())
	if n < writers*perWriter/2 {
		t.Fatalf("only %d events appended", n)
	}
	e.checkOnceInOrder(e.streamMsgs(e.nc))

	cfg := e.relayConfig()
	cfg.Name = "second_relay"
	r2 := e.relay(cfg)
	d2 := e.dispatcher(r2.Async())
	if err := d2.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	e.checkOnceInOrder(e.streamMsgs(e.nc))
	if got := e.msgCount(e.nc); got != uint64(n) {
		t.Fatalf("after a full re-publish the stream holds %d messages, want %d", got, n)
	}
}

// A child relay process is SIGKILLed right after a batch's acknowledgements
// arrived and before its cursor commits, again and again (the next child
// re-publishes that batch from the cursor); the stream must still hold each
// event exactly once, in per-stream order.
func TestPromise14_SIGKILLBetweenPublishAndCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	url := os.Getenv("PROJECTOR_TEST_DATABASE_URL")
	if url == "" {
		t.Skip("needs PROJECTOR_TEST_DATABASE_URL for child processes")
	}
	for i := range 40 {
		e.append("acme", "k"+strconv.Itoa(i%6), testevents.TicketCommented{Body: "before", N: i})
	}
	// Every run is killed at the same place, after a batch's acks and
	// before its cursor commits, with 1, 2 or 3 batches committed first:
	// six runs place each kill twice (a relay that re-published under a
	// new message id, without reading back the stream's tail, fails the
	// check at the end); PROJECTOR_SOAK runs twelve.
	runs := pgtest.Size(6, 12)
	kills := 0
	for run := range runs {
		// Some events arrive between crashes too.
		// (enough that every child has a batch left to be killed in).
		for i := range 22 {
			e.append("acme", "k"+strconv.Itoa((run+i)%6), testevents.TicketCommented{Body: "between", N: run})
		}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"=relay", childURLEnv+"="+url, childSchemaEnv+"="+e.store.Schema(),
			childStreamEnv+"="+e.stream, childPrefixEnv+"="+e.prefix, childNATSEnv+"="+e.url,
			childKillAfterEnv+"="+strconv.Itoa(run%3+1))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		pgtest.DieWithParent(cmd)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		acked := false
		for sc.Scan() {
			if sc.Text() == "acked" {
				acked = true
				break
			}
		}
		// The child stops in its hook after the acks; kill it there.
		_ = cmd.Process.Signal(syscall.SIGKILL)
		err = cmd.Wait()
		if !acked {
			t.Fatalf("run %d: child ended before publishing: %v", run, err)
		}
		kills++
	}
	if kills < runs {
		t.Fatalf("%d kills of %d runs", kills, runs)
	}
	// A final, uninterrupted relay finishes the log.
	r := e.relay(e.relayConfig())
	d := e.dispatcher(r.Async())
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	e.checkOnceInOrder(e.streamMsgs(e.nc))
}

const (
	childEnv          = "PROJECTOR_TEST_JS_CHILD"
	childURLEnv       = "PROJECTOR_TEST_JS_CHILD_URL"
	childSchemaEnv    = "PROJECTOR_TEST_JS_CHILD_SCHEMA"
	childStreamEnv    = "PROJECTOR_TEST_JS_CHILD_STREAM"
	childPrefixEnv    = "PROJECTOR_TEST_JS_CHILD_PREFIX"
	childNATSEnv      = "PROJECTOR_TEST_JS_CHILD_NATS"
	childKillAfterEnv = "PROJECTOR_TEST_JS_CHILD_KILL_AFTER"
)

// runChild is a relay process: it lets killAfter-1 batches commit, then
// after the acknowledgements of the next one prints "acked" and waits to be
// killed before its cursor commits.
func runChild() int {
	ctx := context.Background()
	types := testevents.New()
	store, nc, closeAll, err := openChild(ctx, postgres.Config{Registry: types.Registry})
	if err != nil {
		return childFailed(err)
	}
	defer closeAll()
	killAfter, _ := strconv.Atoi(os.Getenv(childKillAfterEnv))
	r, err := pjs.NewRelay(pjs.RelayConfig{Conn: nc, Registry: types.Registry, Stream: os.Getenv(childStreamEnv),
		Prefix: os.Getenv(childPrefixEnv), Async: projection.AsyncConfig{BatchSize: 3 + rand.IntN(5)}})
	if err != nil {
		return childFailed(err)
	}
	batches := 0
	pjs.SetAfterAcks(r, func() {
		batches++
		if batches >= killAfter {
			fmt.Println("acked")
			select {} // the parent kills us here, before the cursor commits
		}
	})
	if _, err := r.Ensure(ctx); err != nil {
		return childFailed(err)
	}
	d, err := projection.New(projection.Config{Store: store, Projections: []*projection.Async{r.Async()}, PollMax: 50 * time.Millisecond})
	if err != nil {
		return childFailed(err)
	}
	if err := d.Start(ctx); err != nil {
		return childFailed(err)
	}
	select {}
}
