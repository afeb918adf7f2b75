package rebuild_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
)

// TestInlineRebuildRequestedServedCancelled: an inline projection's rebuild
// is requested by name with rebuild.Request, as an ops binary without its
// code does (`projector rebuild NAME`); it is listed (mode inline, building,
// nothing done yet) and in progress, refuses a second request, in-place and
// hold; Cancel ends it. A second request is carried out by ServeInline (what
// `projector run` runs) in a process that has the projection, which
// switches it: the model is exact, the record says switched with the old
// schema, and a cancel afterwards finds nothing to cancel.
func TestInlineRebuildRequestedServedCancelled(t *testing.T) {
	t.Parallel()
	e := newInlineEnv(t)
	for i := range 200 {
		if err := e.append(e.ctx, i%30, false); err != nil {
			t.Fatal(err)
		}
	}
	e.exec(`UPDATE ` + e.ident("tickets") + ` SET n = n + 50 WHERE stream_id = 's3'`)
	e.settle()

	rb, err := rebuild.Request(e.ctx, e.store, "tickets", rebuild.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rb.Mode != rebuild.InlineRebuild || rb.Status != rebuild.Building || rb.TotalEvents != 200 || rb.Progress() != 0 {
		t.Fatalf("requested: %+v", rb)
	}
	for _, c := range []struct {
		opts rebuild.Options
		want error
	}{
		{rebuild.Options{}, rebuild.ErrActive},
		{rebuild.Options{Mode: rebuild.InPlace}, rebuild.ErrNotRebuildable},
		{rebuild.Options{Hold: true}, rebuild.ErrNotRebuildable},
		{rebuild.Options{Version: 7}, rebuild.ErrInlineVersion},
	} {
		if _, err := rebuild.Request(e.ctx, e.store, "tickets", c.opts); !errors.Is(err, c.want) {
			t.Fatalf("request %+v: %v, want %v", c.opts, err, c.want)
		}
	}
	if rs, err := rebuild.InProgress(e.ctx, e.store); err != nil || len(rs) != 1 || rs[0].ID != rb.ID || rs[0].Mode != rebuild.InlineRebuild {
		t.Fatalf("in progress: %+v, %v", rs, err)
	}
	if err := rebuild.Cancel(e.ctx, e.store, "tickets"); err != nil {
		t.Fatal(err)
	}
	if r, err := rebuild.Current(e.ctx, e.store, "tickets"); err != nil || r.Status != rebuild.Cancelled {
		t.Fatalf("after cancel: %+v, %v", r, err)
	}

	// Served by a process with the code.
	if err := e.p.SetTables(e.schema + ".tickets"); err != nil {
		t.Fatal(err)
	}
	rb, err = rebuild.Request(e.ctx, e.store, "tickets", rebuild.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(e.ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		rebuild.ServeInline(ctx, e.store, []*projection.Inline{e.p}, rebuild.InlineOptions{BatchSize: 20}, slog.New(slog.DiscardHandler), 20*time.Millisecond)
	})
	defer func() {
		stop()
		wg.Wait()
	}()
	wctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	final, err := rebuild.Wait(wctx, e.store, "tickets", 20*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	if final.ID != rb.ID || final.Status != rebuild.Switched || final.OldSchema == "" || final.Mode != rebuild.InlineRebuild || final.Progress() != 1 {
		t.Fatalf("served: %+v", final)
	}
	if d := e.differences(); d != 0 {
		t.Fatalf("rebuilt model differs from the reference in %d rows", d)
	}
	if err := rebuild.Cancel(e.ctx, e.store, "tickets"); !errors.Is(err, rebuild.ErrNotActive) {
		t.Fatalf("cancel after the switch: %v", err)
	}
	if dropped, err := rebuild.DropOld(e.ctx, e.store, "tickets"); err != nil || len(dropped) != 1 || dropped[0] != final.OldSchema {
		t.Fatalf("drop-old: %v, %v", dropped, err)
	}
}

// TestInlineRebuildCancelledWhileReplaying: Cancel while a process replays
// an inline rebuild (held inside a batch) waits for the batch, drops the
// shadow; the replaying process stops at its next batch with ErrNotActive,
// and the live model was never touched.
func TestInlineRebuildCancelledWhileReplaying(t *testing.T) {
	t.Parallel()
	e := newInlineEnv(t)
	for i := range 50 {
		if err := e.append(e.ctx, i%10, false); err != nil {
			t.Fatal(err)
		}
	}
	e.exec(`UPDATE ` + e.ident("tickets") + ` SET n = n + 50 WHERE stream_id = 's3'`)
	e.settle()
	e.gate, e.entered = make(chan struct{}), make(chan struct{}, 1)
	var once sync.Once
	open := func() { once.Do(func() { close(e.gate) }) }
	defer open() // a failing check must not leave the replay blocked
	done := make(chan error, 1)
	go func() {
		// MaxUnderLock 1: the events must be replayed in batches, under the
		// shard lock Cancel waits for. With the default, a horizon held back
		// by another session of the cluster (the suite's other packages)
		// leaves the batches empty and the switch applies all fifty under
		// its own lock, where the gate would then hold the switch instead:
		// Cancel, behind it, found the rebuild switched (ErrNotActive).
		_, err := rebuild.Inline(e.ctx, e.store, e.p, rebuild.InlineOptions{Tables: []string{e.schema + ".tickets"}, BatchSize: 5, MaxUnderLock: 1})
		done <- err
	}()
	<-e.entered // inside the first batch
	cancelled := make(chan error, 1)
	go func() { cancelled <- rebuild.Cancel(e.ctx, e.store, "tickets") }()
	// Let the batch go once Cancel waits for it.
	waitForShardLockWaiter(t, e, "tickets", cancelled)
	open()
	if err := <-cancelled; err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, rebuild.ErrNotActive) {
		t.Fatalf("the replaying rebuild: %v, want ErrNotActive", err)
	}
	if d := e.differences(); d != 2 {
		t.Fatalf("live model changed: %d differences, want only the corrupted row (2)", d)
	}
	if n := e.count(`SELECT count(*) FROM pg_namespace WHERE starts_with(nspname, '` + e.schema + `_irb_')`); n != 0 {
		t.Fatalf("cancel left %d schemas", n)
	}
	if r, err := rebuild.Current(e.ctx, e.store, "tickets"); err != nil || r.Status != rebuild.Cancelled || r.Cursor != projector.Start {
		t.Fatalf("record: %+v, %v", r, err)
	}
}

// waitForShardLockWaiter waits until a session waits for the advisory lock
// of the projection's rebuild shard (projection.LockShard's key): Cancel,
// queued behind the replaying batch.
// A Cancel that returned already (an error) ends the wait: the caller
// reads it.
func waitForShardLockWaiter(t *testing.T, e *ienv, name string, cancelled chan error) {
	t.Helper()
	key := "projector.shard\x1f" + e.schema + "\x1f" + name + "\x1f" + projection.RebuildInstance
	eventually(t, time.Minute, "Cancel to wait for the batch", func() bool {
		if len(cancelled) > 0 {
			return true
		}
		var n int
		err := e.store.Pool().QueryRow(e.ctx, `WITH k AS (SELECT hashtextextended($1, 0) AS h)
			SELECT count(*) FROM pg_locks l, k WHERE l.locktype = 'advisory' AND NOT l.granted AND l.objsubid = 1
				AND l.classid::text::bigint = ((k.h >> 32) & 4294967295) AND l.objid::text::bigint = (k.h & 4294967295)`, key).Scan(&n)
		return err == nil && n > 0
	})
}
