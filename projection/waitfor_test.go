package projection_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// appendAt appends payloads to a new ticket stream and returns the
// append's position, as an application would after its commit.
func (e *env) appendAt(stream string, payloads ...any) projector.Position {
	e.t.Helper()
	var res postgres.AppendResult
	err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		var err error
		res, err = e.store.Append(e.ctx, tx, projector.Stream("ticket", stream), projector.NoStream, payloads...)
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	if want := res.Events[len(res.Events)-1].Position; res.Position() != want {
		e.t.Fatalf("AppendResult.Position() = %s, want the last event's %s", res.Position(), want)
	}
	return res.Position()
}

// waitFor is WaitFor with its own timeout; it also returns how long it took.
func (e *env) waitFor(consumer string, pos projector.Position, timeout time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(e.ctx, timeout)
	defer cancel()
	start := time.Now()
	err := projection.WaitFor(ctx, e.store, consumer, pos)
	return time.Since(start), err
}

// WaitFor returns once the dispatcher has applied the append (the read
// model shows it), at once for a position already passed even with no
// dispatcher running, and with ctx's error when nothing applies it.
func TestWaitForReadsYourWrites(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{counting(e.schema, e.types, "counting", projection.AsyncConfig{})}})

	for i, stream := range []string{"a", "b", "c"} {
		pos := e.appendAt(stream, testevents.TicketOpened{Title: stream}, testevents.TicketCommented{Body: "1"})
		if _, err := e.waitFor("counting", pos, time.Minute); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		if got, _ := e.counts("counting"); got[stream] != 2 {
			t.Fatalf("after WaitFor the read model holds %d events of stream %s, want 2", got[stream], stream)
		}
	}
	last := e.appendAt("d", testevents.TicketOpened{Title: "d"})
	if _, err := e.waitFor("counting", last, time.Minute); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	if err := d.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// Already passed: nothing needs to run for it to return.
	if took, err := e.waitFor("counting", last, 10*time.Second); err != nil || took > 5*time.Second {
		t.Fatalf("WaitFor on a passed position: %v after %v, want nil at once", err, took)
	}
	if _, err := e.waitFor("counting", projector.Start, time.Second); err != nil {
		t.Fatalf("WaitFor(Start): %v", err)
	}

	// No dispatcher runs: the wait ends with ctx, naming the shard.
	pos := e.appendAt("e", testevents.TicketOpened{Title: "e"})
	took, err := e.waitFor("counting", pos, 300*time.Millisecond)
	if !errors.Is(err, context.DeadlineExceeded) || took < 300*time.Millisecond {
		t.Fatalf("WaitFor with no dispatcher: %v after %v, want the deadline after 300ms", err, took)
	}
	t.Logf("timed out as expected: %v", err)

	// No such consumer: at once, not after ctx.
	for _, name := range []string{"nobody", "Not A Name\x00"} {
		if took, err := e.waitFor(name, pos, 10*time.Second); !errors.Is(err, projector.ErrNotFound) || took > 5*time.Second {
			t.Fatalf("WaitFor(%q): %v after %v, want ErrNotFound at once", name, err, took)
		}
	}
}

// A dead or disabled shard before the position makes WaitFor return a
// ShardStoppedError at once; past it, the shard's state does not matter.
func TestWaitForStoppedShard(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.traceTable()
	var failing atomic.Bool
	failing.Store(true)
	poison := poisoned(e, "fragile", projection.AsyncConfig{MaxAttempts: 1}, &failing)
	healthy := counting(e.schema, e.types, "healthy", projection.AsyncConfig{})
	e.dispatcher(projection.Config{Projections: []*projection.Async{poison, healthy}})
	admin := projection.NewAdmin(e.store)

	fine := e.appendAt("a", testevents.TicketOpened{Title: "fine"})
	bad := e.appendAt("b", testevents.TicketOpened{Title: "poison"})
	eventually(t, time.Minute, "the fragile shard to die", func() bool { return e.status(admin, "fragile").Status == projection.StatusDead })

	if _, err := e.waitFor("fragile", fine, time.Minute); err != nil {
		t.Fatalf("dead shard past the position: %v, want nil", err)
	}
	took, err := e.waitFor("fragile", bad, time.Minute)
	var stopped *projection.ShardStoppedError
	if !errors.Is(err, projection.ErrShardStopped) || !errors.As(err, &stopped) || took > 30*time.Second {
		t.Fatalf("dead shard before the position: %v after %v, want a ShardStoppedError at once", err, took)
	}
	if stopped.Status != projection.StatusDead || stopped.Shard.Consumer != "fragile" || !stopped.Cursor.Less(bad) || stopped.Position != bad {
		t.Fatalf("ShardStoppedError = %+v", stopped)
	}
	if _, err := e.waitFor("healthy", bad, time.Minute); err != nil {
		t.Fatalf("healthy consumer: %v", err)
	}

	if err := admin.Disable(e.ctx, projection.ShardID{Consumer: "healthy"}); err != nil {
		t.Fatal(err)
	}
	later := e.appendAt("c", testevents.TicketOpened{Title: "later"})
	took, err = e.waitFor("healthy", later, time.Minute)
	if !errors.As(err, &stopped) || stopped.Status != projection.StatusDisabled || took > 30*time.Second {
		t.Fatalf("disabled shard before the position: %v after %v, want a ShardStoppedError at once", err, took)
	}
}

// WaitFor works from another process than the dispatcher's: the dispatcher
// runs in a child process, is SIGKILLed while a wait is pending, and the
// wait returns once a restarted child has applied the append.
func TestWaitForAcrossProcessesWithKilledDispatcher(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	url := pgtest.URL(t)
	c := e.startChild(url, 50)
	// Until a dispatcher has registered the consumer, WaitFor says it does
	// not exist rather than wait.
	admin := projection.NewAdmin(e.store)
	eventually(t, time.Minute, "the child to register its shards", func() bool {
		st, err := admin.List(e.ctx, "counting")
		return err == nil && len(st) == 1
	})
	pos := e.appendAt("a", testevents.TicketOpened{Title: "a"}, testevents.TicketCommented{Body: "1"})
	if _, err := e.waitFor("counting", pos, 2*time.Minute); err != nil {
		t.Fatalf("%v\nchild output:\n%s", err, c.Output())
	}
	if got, _ := e.counts("counting"); got["a"] != 2 {
		t.Fatalf("after WaitFor the read model holds %d events of stream a, want 2", got["a"])
	}
	c.Kill(t)

	pos = e.appendAt("b", testevents.TicketOpened{Title: "b"}, testevents.TicketCommented{Body: "1"})
	if _, err := e.waitFor("counting", pos, 200*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitFor with the dispatcher killed: %v, want the deadline", err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := e.waitFor("counting", pos, 2*time.Minute)
		done <- err
	}()
	c = e.startChild(url, 50)
	if err := <-done; err != nil {
		t.Fatalf("%v\nchild output:\n%s", err, c.Output())
	}
	if got, _ := e.counts("counting"); got["b"] != 2 {
		t.Fatalf("after WaitFor the read model holds %d events of stream b, want 2", got["b"])
	}
	c.Terminate(t)
}

// A per-instance consumer is read from every instance's tables: WaitFor
// waits for each instance's shard, not just the first to pass.
func TestWaitForEveryInstanceShard(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ds := map[string]*projection.Dispatcher{}
	for _, id := range []string{"alpha", "beta"} {
		p := projection.NewAsync("live", projection.AsyncConfig{Delivery: projection.PerInstance})
		h := countingHandler(e.schema, "live@"+id)
		must(projection.OnEvent(p, e.types.Opened, h))
		ds[id] = e.dispatcher(projection.Config{Store: e.storeOn(pgtest.NewPool(t, 2)), Projections: []*projection.Async{p}, InstanceID: id})
	}
	pos := e.appendAt("a", testevents.TicketOpened{Title: "a"})
	if _, err := e.waitFor("live", pos, time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"alpha", "beta"} {
		if got, _ := e.counts("live@" + id); got["a"] != 1 {
			t.Fatalf("after WaitFor instance %s holds %d events of stream a, want 1", id, got["a"])
		}
	}

	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	if err := ds["beta"].Stop(ctx); err != nil {
		t.Fatal(err)
	}
	pos = e.appendAt("b", testevents.TicketOpened{Title: "b"})
	eventually(t, time.Minute, "alpha to apply b", func() bool { got, _ := e.counts("live@alpha"); return got["b"] == 1 })
	// Long enough for a loaded machine to answer the first poll, which is
	// what names the shard still behind.
	_, err := e.waitFor("live", pos, 4*time.Second)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "live@beta") {
		t.Fatalf("WaitFor with instance beta stopped: %v, want the deadline naming live@beta", err)
	}
}
