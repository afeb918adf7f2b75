package projection_test

import (
	"strings"
	"testing"
	"time"

	"github.com/projectorhq/projector/projection"
)

// shardLockWaiting reports whether some session waits for the advisory
// lock of shard instance of consumer (the dispatcher's key).
func (e *env) shardLockWaiting(consumer, instance string) bool {
	e.t.Helper()
	var n int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1
			AND ((classid::text::bigint << 32) | objid::text::bigint) = hashtextextended($1, 0)`,
		"projector.shard\x1f"+e.schema+"\x1f"+consumer+"\x1f"+instance).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n > 0
}

// shardLockFree reports whether the advisory lock of shard instance of
// consumer is free now (tried, and released at once).
func (e *env) shardLockFree(consumer, instance string) bool {
	e.t.Helper()
	var free bool
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))`,
		"projector.shard\x1f"+e.schema+"\x1f"+consumer+"\x1f"+instance).Scan(&free); err != nil {
		e.t.Fatal(err)
	}
	return free
}

// A split (or merge) takes the locks of the partitions it changes in
// PartitionOrder, whatever order the operator names them in: the order
// every holder of several partitions' locks takes them in
// (projection.LockPartitions), so a split and a blue/green switch (which
// takes them without the fence lock) never each hold a lock the other
// waits for. Named 1/2 then 0/2 with a pass of 1/2 running, the split
// holds 0/2's lock while it waits for 1/2's.
func TestSplitLocksPartitionsInPartitionOrder(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	p := counting(e.schema, e.types, "order", projection.AsyncConfig{Partitions: 2})
	// Registered, then stopped: no pass takes a partition's lock but the
	// test's.
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	e.catchUp(d)
	if err := d.Stop(e.ctx); err != nil {
		t.Fatal(err)
	}
	lo, hi := projection.PartitionInstance(0, 2), projection.PartitionInstance(1, 2)
	release := e.holdShardLock("order", hi)
	released := false
	defer func() {
		if !released {
			release()
		}
	}()
	split := make(chan error, 1)
	go func() {
		_, err := projection.NewAdmin(e.store).Split(e.ctx, "order", segment(t, 1, 2), segment(t, 0, 2))
		split <- err
	}()
	eventually(t, 30*time.Second, "the split to wait for partition 1/2", func() bool { return e.shardLockWaiting("order", hi) })
	if e.shardLockFree("order", lo) {
		t.Errorf("the split waits for 1/2 without holding 0/2: it takes the partitions' locks in the order named, not in PartitionOrder")
	}
	release()
	released = true
	if err := <-split; err != nil {
		t.Fatal(err)
	}
	if got := e.layout("order"); len(got) != 4 {
		t.Fatalf("layout after the split: %v, want 4 partitions", got)
	}
}

// A merge of every sibling pair takes the halves' locks in PartitionOrder
// too, not in the order of their instance ids: with pairs 12/16+13/16 and
// 2/8+3/8 (text order puts 12/16 first, its segment starts at 3/4 of the
// hash range, 2/8's at 1/4) and a pass of 3/8 running, the merge waits for
// 3/8 holding 2/8 only, 12/16 still free.
func TestMergeLocksPartitionsInPartitionOrder(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	p := counting(e.schema, e.types, "order", projection.AsyncConfig{Partitions: 2})
	// Registered, then stopped: no pass takes a partition's lock but the
	// test's.
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	e.catchUp(d)
	if err := d.Stop(e.ctx); err != nil {
		t.Fatal(err)
	}
	admin := projection.NewAdmin(e.store)
	for _, s := range [][2]int{{0, 2}, {1, 4}, {1, 2}, {3, 4}, {6, 8}} {
		if _, err := admin.Split(e.ctx, "order", segment(t, s[0], s[1])); err != nil {
			t.Fatalf("split %d/%d: %v", s[0], s[1], err)
		}
	}
	want := "0/4 2/8 3/8 2/4 12/16 13/16 7/8"
	if got := e.layout("order"); strings.Join(got, " ") != want {
		t.Fatalf("layout: %v, want %s", got, want)
	}
	release := e.holdShardLock("order", projection.PartitionInstance(3, 8))
	released := false
	defer func() {
		if !released {
			release()
		}
	}()
	merged := make(chan error, 1)
	go func() {
		_, err := admin.Merge(e.ctx, "order", 30*time.Second)
		merged <- err
	}()
	eventually(t, 30*time.Second, "the merge to wait for partition 3/8", func() bool {
		return e.shardLockWaiting("order", projection.PartitionInstance(3, 8))
	})
	if e.shardLockFree("order", projection.PartitionInstance(2, 8)) {
		t.Errorf("the merge waits for 3/8 without holding 2/8")
	}
	if !e.shardLockFree("order", projection.PartitionInstance(12, 16)) {
		t.Errorf("the merge holds 12/16 while it waits for 3/8: it takes the partitions' locks in instance-id order, not in PartitionOrder")
	}
	release()
	released = true
	if err := <-merged; err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(e.layout("order"), " "), "0/4 1/4 2/4 6/8 7/8"; got != want {
		t.Fatalf("layout after the merge: %s, want %s", got, want)
	}
}
