package projection_test

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/projectorhq/projector/projection"
)

// A merge of every pair of a live, caught-up consumer waits for no running
// batch (holdUnlocked): while 0/4's batch runs (kept in its handler), the
// other pair, 2/4 and 3/4, is held, merged into 1/2, and 1/2 applies new
// events. Before, the merge closed the consumer's layout gate and waited
// for 0/4's batch, and no partition started a batch until it ended (the
// test fails so: no 1/2 before the release).
func TestMergeOfEveryPairWaitsForNoRunningBatch(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	hold := newPassHoldIn(segment(t, 0, 4))
	defer hold.release()
	p := countingThrough(e.schema, e.types, "nowait", projection.AsyncConfig{Partitions: 4, BatchSize: 20}, hold.wrap)
	// Passes run when woken only: none starts on its own while the merge
	// tries the locks of a pair at one cursor.
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}, Recheck: time.Hour})
	versions := appendWith(t, e.ctx, e.store, 1, 80, 20, "a")
	e.catchUp(d)

	hold.armed.Store(true)
	maps.Copy(versions, appendWith(t, e.ctx, e.store, 1, 80, 20, "b"))
	hold.awaitEntered(t, "0/4") // 0/4's pass runs, kept in its handler
	last := e.lastPosition()
	eventually(t, time.Minute, "1/4, 2/4 and 3/4 catch up", func() bool {
		s := e.partitionShards("nowait")
		for _, i := range []int{1, 2, 3} {
			if s[i].Cursor.Less(last) || s[i].Status != projection.StatusIdle {
				return false
			}
		}
		return true
	})
	type result struct {
		changes []projection.PartitionChange
		err     error
	}
	done := make(chan result, 1)
	go func() {
		changes, err := projection.NewAdmin(e.store).Merge(e.ctx, "nowait", time.Minute)
		done <- result{changes, err}
	}()
	upper := projection.PartitionInstance(1, 2)
	eventually(t, 30*time.Second, "2/4 and 3/4 merged into 1/2 while 0/4's batch runs", func() bool {
		return slices.Contains(e.layout("nowait"), "1/2")
	})
	maps.Copy(versions, appendWith(t, e.ctx, e.store, 1, 40, 20, "c"))
	after := e.lastPosition()
	eventually(t, 30*time.Second, "1/2 applies new events while 0/4's batch runs", func() bool {
		for _, s := range mustList(t, projection.NewAdmin(e.store), "nowait") {
			if s.Instance == upper {
				return !s.Cursor.Less(after)
			}
		}
		return false
	})
	hold.release()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if len(r.changes) != 2 {
		t.Errorf("merged %v, want two merges", r.changes)
	}
	e.catchUp(d)
	e.checkCounts("nowait", versions)
}
