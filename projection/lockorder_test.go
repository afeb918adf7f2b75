package projection_test

import (
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
	e.catchUp(e.dispatcher(projection.Config{Projections: []*projection.Async{p}}))
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
