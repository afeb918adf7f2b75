package projection_test

import (
	"context"
	"errors"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
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
	hold := newPassHold()
	defer hold.release()
	p := countingThrough(e.schema, e.types, "gated", projection.AsyncConfig{Partitions: 2, BatchSize: 5}, hold.wrap)
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	versions := appendWith(t, e.ctx, e.store, 1, 40, 20, "a")
	e.catchUp(d)

	release0 := sync.OnceFunc(e.holdShardLock("gated", projection.PartitionInstance(0, 2)))
	defer release0()
	hold.armed.Store(true)
	// Many batches of 1/2's: its passes would follow one another at once.
	maps.Copy(versions, appendWith(t, e.ctx, e.store, 1, 120, 40, "b"))
	hold.awaitEntered(t, "1/2") // 1/2's pass runs, held in its handler
	type result struct {
		changes []projection.PartitionChange
		err     error
	}
	done := make(chan result, 1)
	go func() {
		changes, err := projection.NewAdmin(e.store).Split(e.ctx, "gated")
		done <- result{changes, err}
	}()
	// 0/2's lock is the test's, so its pass cannot split it: the split,
	// handed to the passes (splithandoff.go), splits them itself after
	// splitHandOff, behind the gate. Its wait for the gate is counted on
	// the gate's own key: other tests' waiters share the server.
	eventually(t, 30*time.Second, "the split waits for the gate", func() bool { return e.gateWaiters("gated") > 0 })
	held := e.partitionShards("gated")[1]
	hold.release()
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

// A change of every partition that fails after closing the gate wakes the
// partitions it refused: its rollback sends no layout NOTIFY, and a pass
// refused the gate otherwise waits for its next Recheck (an hour here).
// 0/2's pass is held in its handler while a merge of both partitions
// waits for the gate; once that batch ends the merge holds the gate, so
// 0/2's next pass is refused; the merge is then refused too (1/2 is
// disabled). Before the wake-up 0/2 stood still for the Recheck (the test
// failed so).
func TestFailedChangeOfEveryPartitionWakesThePartitionsItRefused(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	hold := newPassHold()
	defer hold.release()
	p := countingThrough(e.schema, e.types, "refused", projection.AsyncConfig{Partitions: 2, BatchSize: 5}, hold.wrap)
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}, Recheck: projection.MaxPoll})
	versions := appendWith(t, e.ctx, e.store, 1, 40, 20, "a")
	e.catchUp(d)
	admin := projection.NewAdmin(e.store)
	half := projection.ShardID{Consumer: "refused", Instance: projection.PartitionInstance(1, 2)}
	if err := admin.Disable(e.ctx, half); err != nil {
		t.Fatal(err)
	}

	release1 := sync.OnceFunc(e.holdShardLock("refused", half.Instance))
	defer release1()
	hold.armed.Store(true)
	maps.Copy(versions, appendWith(t, e.ctx, e.store, 1, 120, 40, "b"))
	hold.awaitEntered(t, "0/2") // 0/2's pass runs, held in its handler
	done := make(chan error, 1)
	go func() {
		_, err := admin.Merge(e.ctx, "refused", time.Minute)
		done <- err
	}()
	eventually(t, 30*time.Second, "the merge waits for the gate", func() bool { return e.gateWaiters("refused") > 0 })
	held := e.partitionShards("refused")[0]
	hold.release()
	eventually(t, 30*time.Second, "0/2's held batch commits", func() bool { return e.partitionShards("refused")[0].Processed > held.Processed })
	committed := e.partitionShards("refused")[0].Processed
	release1() // the merge reads 1/2's row, disabled: refused
	if err := <-done; !errors.Is(err, projector.ErrInvalidTransition) {
		t.Fatalf("merge with a disabled half: %v, want ErrInvalidTransition", err)
	}
	eventually(t, 20*time.Second, "0/2 applies its backlog again, well before Recheck", func() bool {
		return e.partitionShards("refused")[0].Processed > committed
	})
	if err := admin.Enable(e.ctx, half); err != nil {
		t.Fatal(err)
	}
	// 1/2, disabled, waits for its Recheck too: a dispatcher with the
	// harness's short one catches both up.
	if err := d.Stop(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.catchUp(e.dispatcher(projection.Config{Projections: []*projection.Async{p}}))
	e.checkCounts("refused", versions)
}

// passHold keeps a projection's passes in their handler once armed: the
// first event handled after that reports on entered, and every handler
// then waits until release (or its batch's context ends).
type passHold struct {
	armed   atomic.Bool
	entered chan struct{}
	unblock chan struct{}
	// in, when set, limits the hold to the events of its streams.
	in *postgres.Segment
	// release lets the held handlers go on; once, so a test may call it
	// and defer it.
	release func()
}

func newPassHold() *passHold {
	h := &passHold{entered: make(chan struct{}, 1), unblock: make(chan struct{})}
	h.release = sync.OnceFunc(func() { close(h.unblock) })
	return h
}

// newPassHoldIn is newPassHold for the events of seg's streams only: the
// passes of one partition.
func newPassHoldIn(seg postgres.Segment) *passHold {
	h := newPassHold()
	h.in = &seg
	return h
}

// wrap holds next's events while h is armed (countingThrough).
func (h *passHold) wrap(next projection.HandlerFunc) projection.HandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		if h.armed.Load() && (h.in == nil || h.in.Contains(postgres.StreamHash(ev.Stream.Tenant, ev.Stream.Type, ev.Stream.ID))) {
			select {
			case h.entered <- struct{}{}:
			default:
			}
			select {
			case <-h.unblock:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return next(ctx, tx, ev)
	}
}

// awaitEntered waits for a pass of partition to be held in its handler.
func (h *passHold) awaitEntered(t *testing.T, partition string) {
	t.Helper()
	select {
	case <-h.entered:
	case <-time.After(time.Minute):
		t.Fatalf("no pass of %s ran", partition)
	}
}
