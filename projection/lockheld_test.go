package projection_test

import (
	"fmt"
	"testing"

	"github.com/projectorhq/projector/projection"
)

// TestShardsLocked: ShardsLocked sees a shard's lock while another session
// holds it, and only that shard's, without taking it; and sees it free
// once released. Several consumers, so keys whose halves have the high bit
// set (negative as PostgreSQL's signed integers) are among them.
func TestShardsLocked(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for i := range 8 {
		consumer := fmt.Sprintf("held_%d", i)
		shared := projection.ShardID{Consumer: consumer, Instance: projection.SharedInstance}
		part := projection.ShardID{Consumer: consumer, Instance: projection.PartitionInstance(1, 2)}
		other := projection.ShardID{Consumer: consumer + "_other"}
		locked := func(ids ...projection.ShardID) bool {
			t.Helper()
			held, err := projection.ShardsLocked(e.ctx, e.store, ids...)
			if err != nil {
				t.Fatal(err)
			}
			return held
		}
		release := e.holdShardLock(consumer, part.Instance)
		if !locked(other, part) || locked(other, shared) {
			release()
			t.Fatalf("%s: a held partition's lock: locked(other, partition) %v, locked(other, shared) %v; want true, false",
				consumer, locked(other, part), locked(other, shared))
		}
		if !e.shardLockFree(consumer, projection.SharedInstance) {
			t.Fatal("the check left a lock taken")
		}
		release()
		release = e.holdShardLock(consumer, projection.SharedInstance)
		if !locked(projection.ShardID{Consumer: consumer}) { // "" is the shared instance
			release()
			t.Fatalf("%s: the held shared shard's lock not seen", consumer)
		}
		release()
		if locked(shared, part, other) {
			t.Fatalf("%s: locks seen held after their release", consumer)
		}
	}
}
