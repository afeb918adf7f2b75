package projection_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// A split of every partition, with a dispatcher running them, is carried
// out by each partition's own pass at the end of its batch
// (splithandoff.go): while 1/2's batch runs (held in its handler), 0/2 is
// split by its pass and its halves, 0/4 and 1/4, go on applying events.
// Before, the split closed the layout gate and waited for 1/2's batch, and
// neither 0/2 nor any half applied anything until it ended (the test
// failed so: "0/2's streams applied nothing while the split waited").
func TestSplitHandedOffToThePassesWaitsForNoRunningBatch(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	one := projection.PartitionInstance(1, 2)
	seg1 := segment(t, 1, 2)
	hold := newPassHoldIn(seg1)
	defer hold.release()
	var applied0 atomic.Int64 // events of 0/2's streams committed
	p := countingThrough(e.schema, e.types, "handoff", projection.AsyncConfig{Partitions: 2, BatchSize: 5, AfterCommit: func(evs []projector.Event) {
		for _, ev := range evs {
			if !seg1.Contains(postgres.StreamHash(ev.Stream.Tenant, ev.Stream.Type, ev.Stream.ID)) {
				applied0.Add(1)
			}
		}
	}}, hold.wrap)
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	versions := appendWith(t, e.ctx, e.store, 1, 40, 20, "a")
	e.catchUp(d)

	hold.armed.Store(true)
	maps.Copy(versions, appendWith(t, e.ctx, e.store, 1, 40, 20, "b"))
	hold.awaitEntered(t, "1/2") // 1/2's pass runs, held in its handler
	// 0/2 caught up first, so what it applies once the split began is the
	// events appended after.
	last := e.lastPosition()
	eventually(t, time.Minute, "0/2 catches up", func() bool {
		s := e.partitionShards("handoff")[0]
		return !s.Cursor.Less(last) && s.Status == projection.StatusIdle
	})
	before := e.advisoryWaiters()
	type result struct {
		changes []projection.PartitionChange
		err     error
	}
	done := make(chan result, 1)
	// The hand-off's wait is long here: on a loaded machine 0/2's pass may
	// come later than the default five seconds, and the command would then
	// split 0/2 itself, after 1/2's batch, which is not what this test
	// looks at (TestSplitOfEveryPartitionStopsNewBatchesWhileItWaits
	// covers that fallback).
	admin := projection.NewAdmin(e.store)
	projection.SetSplitHandOff(admin, 2*time.Minute)
	go func() {
		changes, err := admin.Split(e.ctx, "handoff")
		done <- result{changes, err}
	}()
	eventually(t, 30*time.Second, "the split waits", func() bool {
		return e.advisoryWaiters() > before || e.splitMarked("handoff", one)
	})
	// 0/2 is split while 1/2's batch still runs, so by its own pass: the
	// command's own split of what is left (after the hand-off's wait,
	// splitHandOff) cannot commit before 1/2's batch ends. Events, not a
	// window of time: under load the appends and passes below may outlast
	// the hand-off's wait, and the command then splits only 1/2 itself,
	// leaving 0/2's halves to run.
	eventually(t, time.Minute, "0/2 split by its own pass while the split waited for 1/2's running batch", func() bool {
		return slices.Equal(e.layout("handoff"), []string{"0/4", "1/4", "1/2"})
	})
	waiting := applied0.Load()
	maps.Copy(versions, appendWith(t, e.ctx, e.store, 1, 40, 20, "c"))
	eventually(t, time.Minute, "0/2's streams applied nothing while the split waited for 1/2's running batch", func() bool {
		return applied0.Load() > waiting
	})
	select {
	case r := <-done:
		t.Fatalf("the split returned (%v, %v) while 1/2's batch still ran", r.changes, r.err)
	default:
	}
	hold.release()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if len(r.changes) != 2 || r.changes[0].From[0] != segment(t, 0, 2) || r.changes[1].From[0] != segment(t, 1, 2) {
		t.Errorf("changes %v, want 0/2 and 1/2 split, in that order", r.changes)
	}
	s := e.partitionShards("handoff")
	if len(s) != 4 {
		t.Errorf("partitions after the split: %v, want 4", s)
	}
	e.catchUp(d)
	e.checkCounts("handoff", versions)
}

// gateWaiters counts the requests waiting for consumer's layout gate
// (layoutgate.go), by the lock's own key.
func (e *env) gateWaiters(consumer string) int {
	e.t.Helper()
	return e.lockWaiters("projector.partition-gate\x1f" + e.schema + "\x1f" + consumer)
}

// lockWaiters counts the sessions waiting for the advisory lock of key.
func (e *env) lockWaiters(key string) int {
	e.t.Helper()
	var n int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM pg_locks l WHERE l.locktype = 'advisory' AND NOT l.granted
		AND l.objsubid = 1 AND ((l.classid::bigint << 32) | l.objid::bigint) = hashtextextended($1::text, 0)`, key).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// A split cancelled while it waits for the passes it handed the split to
// lifts every mark before it returns, also when the cancellation lands in
// one of its looks at the partitions (the look fails and knows nothing of
// which are still marked): a mark left behind would have a pass split its
// partition after the command reported that it failed. The passes cannot
// split here (the test holds both partitions' locks), and the look is
// held in a lock wait when the context is cancelled.
func TestSplitCancelledWhileHandedOffLiftsItsMarks(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	p := counting(e.schema, e.types, "cancelled", projection.AsyncConfig{Partitions: 2})
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	appendWith(t, e.ctx, e.store, 1, 10, 5, "a")
	e.catchUp(d)
	for i := range 2 {
		defer e.holdShardLock("cancelled", projection.PartitionInstance(i, 2))()
	}
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := projection.NewAdmin(e.store).Split(ctx, "cancelled")
		done <- err
	}()
	eventually(t, 30*time.Second, "the split marks both partitions", func() bool {
		return e.splitMarked("cancelled", projection.PartitionInstance(0, 2)) && e.splitMarked("cancelled", projection.PartitionInstance(1, 2))
	})
	consumers := e.store.Table("projector_consumers")
	tx, err := e.store.Pool().Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(e.ctx) }()
	if _, err := tx.Exec(e.ctx, `LOCK TABLE `+consumers+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	waiting := func(prefix string) func() bool {
		return func() bool {
			var n int
			if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND query LIKE $1 || '%' AND position($2 in query) > 0`, prefix, consumers).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n > 0
		}
	}
	eventually(t, 30*time.Second, "the split's look waits for the table", waiting("SELECT instance_id, cursor_tx_id, cursor_seq FROM"))
	cancel()
	eventually(t, 30*time.Second, "the cancelled split lifts its marks", waiting("UPDATE "+consumers+" SET split_requested_at = NULL"))
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled split returned %v, want context.Canceled", err)
	}
	for i := range 2 {
		if id := projection.PartitionInstance(i, 2); e.splitMarked("cancelled", id) {
			t.Errorf("partition %s is still marked to split after the split was cancelled", id)
		}
	}
}
