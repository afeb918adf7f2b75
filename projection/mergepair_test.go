package projection_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/projectorhq/projector/projection"
)

// Each pair of a merge is held at its own position and merged on its own: a
// pair whose halves stand at one cursor when the command holds them is
// swapped in the hold's transaction, whatever the other pairs wait for.
// Here no dispatcher runs (nothing applies, nothing swaps but the command),
// the log is empty (so setting cursors skips nothing), 0/4 and 1/4 stand at
// one cursor and 2/4 and 3/4 at two: the merge of 0/4 and 1/4 is done at
// once, that of 2/4 and 3/4 times out (no dispatcher brings them to their
// hold), its holds lifted, and the error names the merge made. Before, the
// command held 0/4 and 1/4 until every pair stood at its hold and merged
// nothing: 0/4 and 1/4 were left as they were.
func TestMergeSwapsAPairAtOneCursorAtOnce(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	p := counting(e.schema, e.types, "atonce", projection.AsyncConfig{Partitions: 4, BatchSize: 5})
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	e.catchUp(d)
	stop, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	if err := d.Stop(stop); err != nil {
		t.Fatal(err)
	}
	c := e.store.Table("projector_consumers")
	e.exec(`UPDATE `+c+` SET cursor_tx_id = '0', cursor_seq = 0 WHERE name = $1 AND instance_id LIKE $2`, "atonce", projection.PartitionPrefix+"%")
	e.exec(`UPDATE `+c+` SET cursor_tx_id = '1', cursor_seq = 0 WHERE name = $1 AND instance_id = $2`, "atonce", projection.PartitionInstance(3, 4))

	changes, err := projection.NewAdmin(e.store).Merge(e.ctx, "atonce", 300*time.Millisecond)
	if err == nil {
		t.Fatalf("merged %v: 2/4 and 3/4 cannot reach their hold with no dispatcher", changes)
	}
	if !errors.Is(err, projection.ErrLayoutChanged) || !strings.Contains(err.Error(), "0/4 1/4 -> 0/2") {
		t.Errorf("error %v: want ErrLayoutChanged naming the merge made at once (0/4 1/4 -> 0/2)", err)
	}
	if got, want := e.layout("atonce"), []string{"0/2", "2/4", "3/4"}; !slices.Equal(got, want) {
		t.Fatalf("layout %v, want %v: the pair at one cursor merged at once, the other left", got, want)
	}
	for _, s := range mustList(t, projection.NewAdmin(e.store), "atonce") {
		if s.Held {
			t.Errorf("partition %s still held at %s after the merge gave up", s.Instance, s.Hold)
		}
		if s.Instance == projection.PartitionInstance(0, 2) && (s.Cursor.TxID != 0 || s.Cursor.Seq != 0) {
			t.Errorf("0/2 starts at %s, want its halves' cursor", s.Cursor)
		}
	}
	// The merged layout applies every event once.
	d2 := e.dispatcher(projection.Config{Projections: []*projection.Async{counting(e.schema, e.types, "atonce", projection.AsyncConfig{Partitions: 4, BatchSize: 5})}})
	versions := appendWith(t, e.ctx, e.store, 2, 100, 20, "a")
	e.catchUp(d2)
	e.checkCounts("atonce", versions)
}

// A half whose pass reaches its hold while its sibling, standing at the hold
// too, has its lock taken (its own pass, trying the merge at the same
// moment) looks again soon, and merges once the lock is free. Here the
// sibling's lock is held by the test, as the sibling's pass would hold it,
// and Recheck is an hour, so nothing else wakes the half. Before, the half
// then waited for a shard wake or Recheck: two halves at the hold woken
// together refused each other, and stood until the next wake woke both
// again (the test fails so: no merge within 10 s).
func TestMergeRetriedWhileTheSiblingAtTheHoldIsBusy(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	p := counting(e.schema, e.types, "busy", projection.AsyncConfig{Partitions: 2, BatchSize: 5})
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}, Recheck: time.Hour})
	versions := appendWith(t, e.ctx, e.store, 2, 100, 20, "a")
	e.catchUp(d)
	// 1/2 is kept behind (its lock taken) while 0/2 applies new events and
	// moves on; then 0/2's lock is taken too, and both are held at 0/2's
	// cursor, 0/2 standing there.
	behind, ahead := projection.PartitionInstance(1, 2), projection.PartitionInstance(0, 2)
	unlockBehind := e.sessionShardLocks("busy", behind)
	maps.Copy(versions, appendWith(t, e.ctx, e.store, 2, 100, 20, "m"))
	last := e.lastPosition()
	eventually(t, 30*time.Second, "0/2 moves past 1/2", func() bool { return !e.partitionShards("busy")[0].Cursor.Less(last) })
	unlockAhead := e.sessionShardLocks("busy", ahead)
	hold, _ := e.holdByHand("busy", ahead, behind)
	if s := e.partitionShards("busy"); s[0].Cursor != hold || !s[1].Cursor.Less(hold) {
		t.Fatalf("held at %s with 0/2 at %s and 1/2 at %s: want 0/2 at the hold, 1/2 behind", hold, s[0].Cursor, s[1].Cursor)
	}
	unlockBehind(behind)
	if err := projection.WakeShards(e.ctx, e.store, projection.ShardID{Consumer: "busy", Instance: behind}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "1/2 reaches the hold", func() bool {
		return e.partitionShards("busy")[1].Cursor == hold
	})
	if got := e.layout("busy"); len(got) != 2 {
		t.Fatalf("merged (%v) while the sibling's lock was taken", got)
	}
	unlockAhead(ahead) // the sibling's pass ends
	eventually(t, 10*time.Second, "the half at the hold merges once its sibling's lock is free", func() bool {
		return slices.Equal(e.layout("busy"), []string{"0/1"})
	})
	e.catchUp(d)
	e.checkCounts("busy", versions)
}

// A merge whose look finds both halves of a pair at their hold, the pair
// not merged, leaves the swap to the halves' passes a moment longer
// (passesGrace, mergewait.go) instead of swapping the pair itself at once:
// a pass's swap starts the parent in its own process at once, where the
// command's takes the fence and the halves' locks and the parent waits for
// a balancing round. Here the half behind reached the hold while its
// sibling's lock was taken (by the test, as a running pass of the sibling
// would hold it); once a look has seen both there, the lock is given back
// and the half behind's pass merges the pair, and the look after that
// finds it merged. Before, the wait ended at the look that saw both at the
// hold, and the command swapped the pair.
func TestMergeLeavesAPairAtItsHoldToItsPasses(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	d, versions := e.caughtUpHalves("grace")
	// The hand's claim stands for a command's: the passes merge for it.
	h := e.behindAtHoldBesideALockedSibling("grace", versions)
	hold, ids, ahead, behind, unlock := h.hold, h.ids, h.ahead, h.behind, h.unlock
	admin := projection.NewAdmin(e.store)
	var seen bool
	projection.SetMergeLookHook(admin, func(ready bool, merged []bool) {
		if !ready || merged[0] || seen {
			return
		}
		seen = true
		// Both halves at the hold, not merged: the sibling's pass ends,
		// and the half behind looks again (woken, should it have stopped
		// looking after holdBusyFor).
		unlock(ids[ahead])
		if err := projection.WakeShards(e.ctx, e.store, projection.ShardID{Consumer: "grace", Instance: ids[behind]}); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, "the half behind's pass merges the pair", func() bool {
			return slices.Equal(e.layout("grace"), []string{"0/1"})
		})
	})
	merged, err := projection.AwaitHoldsOf(e.ctx, admin, "grace", hold, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !seen {
		t.Fatal("no look saw both halves at the hold")
	}
	if !merged {
		t.Fatal("the wait ended with the pair not merged, its passes merging it: the command would have swapped it itself")
	}
	e.catchUp(d)
	e.checkCounts("grace", versions)
}

// A merge's wait that ends while it leaves a pair standing at its hold to
// its passes (passesGrace) hands the pair to the command, which swaps it,
// instead of failing: every half stood at its hold. Here the passes cannot
// swap (no claim: the hand's is released), and the wait is shorter than
// the grace. Before, it ended in a timeout, the holds lifted, for a merge
// whose halves were there.
func TestMergeWaitEndingInTheGraceLeavesThePairToTheCommand(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	_, versions := e.caughtUpHalves("graceend")
	h := e.behindAtHoldBesideALockedSibling("graceend", versions)
	h.unclaim()
	merged, err := projection.AwaitHoldsOf(e.ctx, projection.NewAdmin(e.store), "graceend", h.hold, time.Millisecond)
	if err != nil {
		t.Fatalf("the wait ended in an error with both halves at the hold: %v", err)
	}
	if merged {
		t.Fatal("merged with no claim on the pair")
	}
}
