package rebuild_test

import (
	"context"
	"testing"
	"time"

	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
	"github.com/projectorhq/projector/stores/postgres"
)

// lockWaiting reports whether some session waits for the advisory lock of
// shard instance of consumer counter in e's schema (the key
// projection.LockShard takes).
func (e *env) lockWaiting(instance string) bool {
	e.t.Helper()
	var n int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1
			AND ((classid::text::bigint << 32) | objid::text::bigint) = hashtextextended($1, 0)`,
		"projector.shard\x1f"+e.store.Schema()+"\x1f"+"counter"+"\x1f"+instance).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n > 0
}

// An in-place rebuild reads the consumer's partitions and then waits for
// their locks (a pass of one is running). A split requested in that gap
// waits for the rebuild: both hold the consumer's fence lock (the
// unpartitioned shard's) for their whole transaction. Were the split to
// commit in the gap, the rebuild would lock the parent it read, and rewind
// the new halves without their locks while their passes run. Once the pass
// ends, the rebuild commits, the split follows (its halves inherit the
// replay mark) and the model ends equal to a fresh build.
func TestInPlaceRebuildFencesSplitBetweenReadAndLock(t *testing.T) {
	t.Parallel()
	e := partitionedEnv(t)
	e.appendTickets("s", 40)
	d, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{e.counter(1, projection.AsyncConfig{Partitions: 2})}, InstanceID: "first"})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(e.ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "version 1 to serve every stream", func() bool {
		diff, _, err := e.freshDiff()
		return err == nil && diff == 0
	})
	if err := d.Stop(e.ctx); err != nil {
		t.Fatal(err)
	}

	// A pass of 0/2 running: the rebuild reads both partitions, takes the
	// lock of 0/2 first (PartitionOrder) and waits there.
	pass, err := e.store.Pool().Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pass.Rollback(e.ctx) }()
	first := projection.PartitionInstance(0, 2)
	if err := projection.LockShard(e.ctx, pass, e.store, projection.ShardID{Consumer: "counter", Instance: first}); err != nil {
		t.Fatal(err)
	}
	rebuilt := make(chan error, 1)
	go func() {
		_, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Mode: rebuild.InPlace})
		rebuilt <- err
	}()
	eventually(t, time.Minute, "the rebuild to wait for partition 0/2", func() bool { return e.lockWaiting(first) })

	// The split of 1/2 in the gap.
	split := make(chan error, 1)
	go func() {
		_, err := projection.NewAdmin(e.store).Split(e.ctx, "counter", postgres.Segment{Value: 1, Bits: 1})
		split <- err
	}()
	splitDone := false
	eventually(t, time.Minute, "the split to wait for the fence, or be done", func() bool {
		select {
		case err := <-split:
			if err != nil {
				t.Fatalf("split: %v", err)
			}
			splitDone = true
			return true
		default:
			return e.lockWaiting(projection.SharedInstance)
		}
	})
	if splitDone {
		t.Errorf("the split committed while the in-place rebuild was between reading the partitions and locking them")
	}
	if err := pass.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-rebuilt; err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	if !splitDone {
		if err := <-split; err != nil {
			t.Fatalf("split after the rebuild: %v", err)
		}
	}
	var marked int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+e.store.Table("projector_consumers")+`
		WHERE name = 'counter' AND instance_id = ANY($1) AND replay_until_tx_id IS NOT NULL`,
		[]string{projection.PartitionInstance(2, 4), projection.PartitionInstance(3, 4)}).Scan(&marked); err != nil || marked != 2 {
		t.Errorf("halves of the rebuilt partition with a replay mark: %d, %v; want 2", marked, err)
	}
	startDispatcher(t, e.store, projection.Config{InstanceID: "run"}, e.counter(1, projection.AsyncConfig{Partitions: 2}))
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	final, err := rebuild.Wait(ctx, e.store, "counter", 20*time.Millisecond, nil)
	if err != nil || final.Status != rebuild.Done {
		t.Fatalf("rebuild: %+v, %v", final, err)
	}
	if diff, _, err := e.freshDiff(); err != nil || diff != 0 {
		t.Fatalf("model after the rebuild: %d rows differ from a fresh build, %v", diff, err)
	}
}
