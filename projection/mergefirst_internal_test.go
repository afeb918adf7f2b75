package projection

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// The parent a pass merged starts warm: its first read (from the hold, in
// its segment) is begun as the swap commits, and its first pass takes it,
// though it is not a full batch, instead of reading after its lock's round
// trip. Every event is still applied once. Driven pass by pass (the
// dispatcher is not started: no balancing round races the pass's start of
// the parent), the hold and a command's claim set by hand (no command);
// the batches never fill (BatchSize 1000), so no other prefetch is taken.
// Before, the parent's first pass read for itself (the test fails so).
func TestMergedParentFirstReadPrefetched(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.New()
	store := pgtest.Store(t, types.Registry)
	if err := store.CreatePartitionIndex(ctx); err != nil {
		t.Fatal(err)
	}
	d, lower, upper, applied := ownedHalves(t, store, types, "warm")
	b := d.balancers[0]
	parent := postgres.Segment{}
	halves := []*shard{lower, upper}
	ids := []string{lower.id.Instance, upper.id.Instance}
	c := store.Table("projector_consumers")
	appendSome := func(prefix string, n int) {
		t.Helper()
		for i := range n {
			if err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
				_, err := store.Append(ctx, tx, projector.Stream("ticket", fmt.Sprintf("%s-%d", prefix, i)), projector.ExactVersion(0), testevents.TicketOpened{Title: "t"})
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
		waitHorizon(t, store)
	}
	pass := func(sh *shard) passKind {
		t.Helper()
		res, err := d.pass(ctx, sh)
		if err != nil {
			t.Fatal(err)
		}
		return res.kind
	}
	appendSome("a", 40)
	for _, sh := range halves {
		for i := 0; pass(sh) != passCaughtUp; i++ {
			if i > 10 {
				t.Fatalf("%s does not catch up", sh.id)
			}
		}
	}

	// A command's claim on the pair, and the holds at the cursor of the
	// half ahead, as holdPairs sets them.
	claim, err := store.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer claim.Release()
	if _, err := claim.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended($1::text, 0))`, mergeClaimKey(store.Schema(), "warm", parent)); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = claim.Exec(context.Background(), `SELECT pg_advisory_unlock_all()`) }()
	if _, err := store.Pool().Exec(ctx, `UPDATE `+c+` SET (hold_tx_id, hold_seq) = (SELECT cursor_tx_id, cursor_seq FROM `+c+`
			WHERE name = $1 AND instance_id = ANY($2) ORDER BY cursor_tx_id DESC, cursor_seq DESC LIMIT 1)
		WHERE name = $1 AND instance_id = ANY($2)`, "warm", ids); err != nil {
		t.Fatal(err)
	}
	// Events after the hold: the parent's first read. The half behind
	// reaches the hold (or the one there looks) and merges.
	appendSome("b", 40)
	merged := false
	for range 3 {
		for _, sh := range halves {
			if !sh.removed.Load() && pass(sh) == passGone {
				merged = true
			}
		}
		if merged {
			break
		}
	}
	b.mu.Lock()
	sh := b.shards[segmentInstance(parent)]
	b.mu.Unlock()
	if !merged || sh == nil {
		t.Fatal("the pair was not merged by a pass")
	}
	if sh.prefetch == nil {
		t.Fatal("the merged parent starts with no read under way: its first read was not begun at the swap")
	}
	<-sh.prefetch.done
	if pass(sh) != passCaughtUp {
		t.Fatal("the parent's first pass did not catch up")
	}
	if sh.prefetched != 1 {
		t.Errorf("the parent's first pass took %d batches from a read begun at the swap, want 1", sh.prefetched)
	}
	for id, n := range applied {
		if n != 1 {
			t.Errorf("%s applied %d times", id, n)
		}
	}
	if len(applied) != 80 {
		t.Errorf("%d streams applied, want 80", len(applied))
	}
}
