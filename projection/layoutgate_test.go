package projection_test

import (
	"context"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
)

// A split of every partition waits for their running batches at once
// (layoutgate.go): once it waits, no partition starts a batch it would then
// wait for. Here 0/2's running batch is the test's (its lock held) and
// 1/2's pass is held in its handler when the split starts; 1/2's batch
// then ends, and while 0/2's is still running 1/2 starts no other, so the
// split starts 1/2's halves exactly where that batch left it. Before the
// gate the split waited for 0/2's lock alone, holding nothing, while 1/2
// went on committing batches, each of which the split would have waited
// for had it reached 1/2's lock first (the test failed so: 1/2's cursor
// moved on after the held batch).
func TestSplitOfEveryPartitionStopsNewBatchesWhileItWaits(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	var armed atomic.Bool
	entered := make(chan struct{}, 1)
	unblock := make(chan struct{})
	count := countingHandler(e.schema, "gated")
	h := func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		if armed.Load() {
			select {
			case entered <- struct{}{}:
			default:
			}
			select {
			case <-unblock:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return count(ctx, tx, ev)
	}
	p := projection.NewAsync("gated", projection.AsyncConfig{Partitions: 2, BatchSize: 5})
	must(projection.OnEvent(p, e.types.Opened, h))
	must(projection.OnEvent(p, e.types.Commented, h))
	must(projection.OnEvent(p, e.types.Closed, h))
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	versions := appendWith(t, e.ctx, e.store, 1, 40, 20, "a")
	e.catchUp(d)

	release0 := sync.OnceFunc(e.holdShardLock("gated", projection.PartitionInstance(0, 2)))
	defer release0()
	unblock1 := sync.OnceFunc(func() { close(unblock) })
	defer unblock1()
	armed.Store(true)
	// Many batches of 1/2's: its passes would follow one another at once.
	maps.Copy(versions, appendWith(t, e.ctx, e.store, 1, 120, 40, "b"))
	select {
	case <-entered: // 1/2's pass runs, held in its handler
	case <-time.After(time.Minute):
		t.Fatal("no pass of 1/2 ran")
	}
	before := e.advisoryWaiters()
	type result struct {
		changes []projection.PartitionChange
		err     error
	}
	done := make(chan result, 1)
	go func() {
		changes, err := projection.NewAdmin(e.store).Split(e.ctx, "gated")
		done <- result{changes, err}
	}()
	eventually(t, 30*time.Second, "the split waits", func() bool { return e.advisoryWaiters() > before })
	held := e.partitionShards("gated")[1]
	unblock1()
	var ended projector.Position
	eventually(t, 30*time.Second, "1/2's held batch commits", func() bool {
		s := e.partitionShards("gated")[1]
		ended = s.Cursor
		return s.Processed > held.Processed
	})
	release0()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	for _, c := range r.changes {
		if c.From[0] == segment(t, 1, 2) && c.Cursor != ended {
			t.Errorf("1/2 split at %s, not at %s where its batch running when the split began waiting ended: it started other batches while the split waited for 0/2's", c.Cursor, ended)
		}
	}
	e.catchUp(d)
	e.checkCounts("gated", versions)
}
