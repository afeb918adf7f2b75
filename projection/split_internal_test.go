package projection

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

func segs(t *testing.T, pn ...[2]int) []postgres.Segment {
	t.Helper()
	out := make([]postgres.Segment, len(pn))
	for i, x := range pn {
		s, err := postgres.SegmentOf(x[0], x[1])
		if err != nil {
			t.Fatal(err)
		}
		out[i] = s
	}
	return out
}

// uncovered finds the partitions a consumer is missing, at the size its
// layout has there, and nothing a coarser or finer partition covers.
func TestUncovered(t *testing.T) {
	four := segs(t, [2]int{0, 4}, [2]int{1, 4}, [2]int{2, 4}, [2]int{3, 4})
	for _, c := range []struct {
		name   string
		layout []postgres.Segment
		want   []postgres.Segment
	}{
		{"new consumer", nil, four},
		{"complete", four, nil},
		{"one removed", segs(t, [2]int{0, 4}, [2]int{2, 4}, [2]int{3, 4}), segs(t, [2]int{1, 4})},
		{"split live to 8", segs(t, [2]int{0, 8}, [2]int{1, 8}, [2]int{2, 8}, [2]int{3, 8}, [2]int{4, 8}, [2]int{5, 8}, [2]int{6, 8}, [2]int{7, 8}), nil},
		{"merged live to 2", segs(t, [2]int{0, 2}, [2]int{1, 2}), nil},
		{"mixed, a half removed", segs(t, [2]int{0, 4}, [2]int{2, 8}, [2]int{2, 4}, [2]int{3, 4}), segs(t, [2]int{3, 8})},
	} {
		if got := uncovered(four, c.layout); !slices.Equal(got, c.want) {
			t.Errorf("%s: uncovered %v, want %v", c.name, got, c.want)
		}
	}
}

// A held partition's batch stops at its hold, and its cursor never passes
// it; below the hold nothing changes.
func TestHoldBatch(t *testing.T) {
	pos := func(tx uint64) projector.Position { return projector.Position{TxID: tx, Seq: 0} }
	events := func(txs ...uint64) []projector.Event {
		out := make([]projector.Event, len(txs))
		for i, tx := range txs {
			out[i].Position = pos(tx)
		}
		return out
	}
	for _, c := range []struct {
		name       string
		batch      postgres.LogBatch
		hold       projector.Position
		wantEvents int
		wantFull   bool
		wantNext   projector.Position
	}{
		{"events past the hold are cut", postgres.LogBatch{Events: events(10, 20, 30), Full: true, Horizon: 40}, pos(20), 2, false, pos(20)},
		{"all past the hold", postgres.LogBatch{Events: events(30), Horizon: 40}, pos(20), 0, false, pos(20)},
		{"horizon past the hold", postgres.LogBatch{Events: events(10), Horizon: 40}, pos(20), 1, false, pos(20)},
		{"full below the hold", postgres.LogBatch{Events: events(10, 15), Full: true, Horizon: 40}, pos(20), 2, true, pos(15)},
		{"horizon below the hold", postgres.LogBatch{Events: events(10), Horizon: 12}, pos(20), 1, false, projector.Horizon(12)},
	} {
		b := c.batch
		next := holdBatch(&b, b.Next(projector.Start), c.hold)
		if len(b.Events) != c.wantEvents || b.Full != c.wantFull || next != c.wantNext {
			t.Errorf("%s: %d events, full %v, next %s; want %d, %v, %s", c.name, len(b.Events), b.Full, next, c.wantEvents, c.wantFull, c.wantNext)
		}
	}
}

// A partition split and merged back between two balancing rounds: its
// shard's pass found the row gone and its loop ended, so the round that
// finds the row again runs it with a new shard rather than keeping the
// ended one.
func TestSyncLayoutRevivesEndedPartition(t *testing.T) {
	t.Parallel()
	d, _ := twoPartitionDispatcher(t, "revive")
	b := d.balancers[0]
	first := b.shards[PartitionInstance(0, 2)]
	first.removed.Store(true) // what its pass does on finding the row gone
	d.syncLayout(b, []string{PartitionInstance(0, 2), PartitionInstance(1, 2)}, time.Time{})
	var live []*shard
	for _, sh := range d.allShards() {
		if sh.id.Instance == PartitionInstance(0, 2) {
			live = append(live, sh)
		}
	}
	if len(live) != 1 || live[0] == first || live[0].removed.Load() {
		t.Fatalf("partition 0/2 after its row came back: %d shards, the ended one kept: %v", len(live), len(live) == 1 && live[0] == first)
	}
}

// A change closes the layout gate only when it involves every partition:
// closing it for some would stop the others, which must go on.
func TestEveryPartition(t *testing.T) {
	layout := segs(t, [2]int{0, 4}, [2]int{2, 8}, [2]int{3, 8}, [2]int{2, 4}, [2]int{3, 4})
	for _, c := range []struct {
		name string
		segs []postgres.Segment
		want bool
	}{
		{"all, in another order", segs(t, [2]int{3, 4}, [2]int{2, 4}, [2]int{0, 4}, [2]int{3, 8}, [2]int{2, 8}), true},
		{"all but one", segs(t, [2]int{0, 4}, [2]int{2, 8}, [2]int{3, 8}, [2]int{2, 4}), false},
		{"one pair", segs(t, [2]int{2, 8}, [2]int{3, 8}), false},
		{"as many, one repeated", segs(t, [2]int{0, 4}, [2]int{0, 4}, [2]int{2, 8}, [2]int{3, 8}, [2]int{2, 4}), false},
		{"none", nil, false},
	} {
		if got := everyPartition(layout, c.segs); got != c.want {
			t.Errorf("%s: everyPartition = %v, want %v", c.name, got, c.want)
		}
	}
}

// A round that sees a split's rows before the splitting pass's startHalves
// runs (the pass's commit reached the server, its answer not yet the pass)
// starts the halves with the shards that pass made, whose first batches it
// read while applying its last, and the pass's startHalves then leaves
// their reads alone. Before, the round started cold shards and startHalves
// cancelled the warm reads: the halves read again.
func TestSyncLayoutStartsWarmHalves(t *testing.T) {
	t.Parallel()
	d, p := twoPartitionDispatcher(t, "warmhalves")
	b := d.balancers[0]
	parent := b.shards[PartitionInstance(0, 2)]
	q := postgres.LogQuery{Limit: 10, EventTypes: p.t.types, Raw: true, Partition: parent.readSegment()}
	d.prefetchHalves(t.Context(), parent, q, projector.Start)
	if len(parent.halves) != 2 {
		t.Fatalf("the marked pass made %d halves, want 2", len(parent.halves))
	}
	warm := slices.Clone(parent.halves)
	lo, hi, _ := parent.segment.Children()
	d.syncLayout(b, []string{segmentInstance(lo), segmentInstance(hi), PartitionInstance(1, 2)}, time.Now())
	d.startHalves(parent)
	for i, seg := range []postgres.Segment{lo, hi} {
		id := segmentInstance(seg)
		if got := b.shards[id]; got != warm[i] {
			t.Errorf("half %s runs a shard the pass did not make (its first batch read again)", id)
		}
		pf := warm[i].prefetch
		if pf == nil {
			continue // the pool had no connection to spare for it
		}
		<-pf.done
		if pf.err != nil {
			t.Errorf("half %s: its first batch's read was dropped: %v", id, pf.err)
		}
	}
	if len(b.warm) != 0 {
		t.Errorf("%d warm halves left behind", len(b.warm))
	}
}

// twoPartitionDispatcher is a dispatcher, not started, of one consumer
// named name in two partitions, on a store of its own; its handler does
// nothing.
func twoPartitionDispatcher(t *testing.T, name string) (*Dispatcher, *Async) {
	t.Helper()
	types := testevents.New()
	store := pgtest.Store(t, types.Registry)
	p := NewAsync(name, AsyncConfig{Partitions: 2})
	if err := OnEvent(p, types.Opened, func(context.Context, pgx.Tx, projector.Event) error { return nil }); err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{Store: store, Projections: []*Async{p}})
	if err != nil {
		t.Fatal(err)
	}
	return d, p
}

// A partition split and merged back by passes before a balancing round ran
// (a split's halves merged while the parent's stopped shard was still
// listed) gets a new shard under the old one's name. The old one must leave
// the dispatcher's list with it: left there, it stood for a partition that
// never catches up, and CatchUp waited for it for ever
// (TestMergeCommandRacingThePassesReportsItDone timed out so under load).
func TestPassLayoutChangesBetweenRoundsLeaveNoStaleShard(t *testing.T) {
	t.Parallel()
	d, p := twoPartitionDispatcher(t, "stalelayout")
	b := d.balancers[0]
	first := b.shards[PartitionInstance(0, 2)]
	lo, hi, _ := first.segment.Children()
	d.startHalves(first) // 0/2 → 0/4 1/4 by its pass
	half := b.shards[segmentInstance(lo)]
	q := postgres.LogQuery{Limit: 10, EventTypes: p.t.types, Raw: true}
	d.startParent(t.Context(), half, &mergeAtEnd{pair: mergePair{parent: first.segment, lo: lo, hi: hi}, first: q}) // and back, by a pass
	again := b.shards[PartitionInstance(0, 2)]
	if again == first {
		t.Fatal("the merged parent runs the shard that was split: want a new one")
	}
	d.syncLayout(b, []string{PartitionInstance(0, 2), PartitionInstance(1, 2)}, time.Now().Add(time.Second))
	var ids []string
	for _, sh := range d.allShards() {
		ids = append(ids, sh.id.Instance)
		if sh == first {
			t.Errorf("the split parent's stopped shard is still listed after the round")
		}
	}
	if len(ids) != 2 {
		t.Errorf("dispatcher lists %v, want the two partitions 0/2 and 1/2 once each", ids)
	}
	if pf := again.prefetch; pf != nil {
		pf.cancel()
		<-pf.done
	}
}
