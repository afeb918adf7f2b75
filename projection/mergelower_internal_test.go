package projection

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// heldPair is a consumer of two partitions held for a merge at the
// horizon, both halves at the start of a log of 20 streams' events,
// driven pass by pass (no dispatcher loop runs). claim takes a merge
// command's claim on the pair (claimPairs), held until the test ends: no
// pass merges without it.
type heldPair struct {
	d            *Dispatcher
	lower, upper *shard
	applied      map[string]int
}

func newHeldPair(t *testing.T) heldPair {
	t.Helper()
	ctx := context.Background()
	types := testevents.New()
	store := pgtest.Store(t, types.Registry)
	d, lower, upper, applied := ownedHalves(t, store, types, "standing")
	sp := heldPair{d: d, lower: lower, upper: upper, applied: applied}
	ids := []string{lower.id.Instance, upper.id.Instance}
	for i := range 20 {
		if err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
			_, err := store.Append(ctx, tx, projector.Stream("ticket", fmt.Sprintf("s-%d", i)), projector.ExactVersion(0), testevents.TicketOpened{Title: "t"})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	waitHorizon(t, store)
	// The hold at the horizon, as holdPairs sets it for caught-up halves:
	// each half's passes bring it there and stand.
	var hold projector.Position
	if err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		var err error
		hold, err = holdNow(ctx, tx)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if _, err := store.Pool().Exec(ctx, d.admin.split.hold, "standing", id, hold.TxID, hold.Seq); err != nil {
			t.Fatal(err)
		}
	}
	return sp
}

// ownedHalves registers with store a consumer name of two partitions that
// counts, per stream, the TicketOpened events it applies, and makes the
// dispatcher (not started: the test drives its passes) the owner of both
// halves, as a balancing round would. It returns the dispatcher, the
// halves' shards and the counts.
func ownedHalves(t *testing.T, store *postgres.Store, types testevents.Types, name string) (d *Dispatcher, lower, upper *shard, applied map[string]int) {
	t.Helper()
	applied = map[string]int{}
	p := NewAsync(name, AsyncConfig{Partitions: 2, BatchSize: 1000})
	if err := OnEvent(p, types.Opened, func(_ context.Context, _ pgx.Tx, ev projector.Event) error {
		applied[ev.Stream.ID]++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	d = registered(t, Config{Store: store, Projections: []*Async{p}})
	b := d.balancers[0]
	lo, hi, _ := postgres.Segment{}.Children()
	ids := []string{segmentInstance(lo), segmentInstance(hi)}
	b.mu.Lock()
	for _, id := range ids {
		b.owned[id] = true
	}
	lower, upper = b.shards[ids[0]], b.shards[ids[1]]
	b.mu.Unlock()
	c := store.Table("projector_consumers")
	if _, err := store.Pool().Exec(context.Background(), `UPDATE `+c+` SET owner = $2 WHERE name = $1 AND instance_id = ANY($3)`, name, d.instance, ids); err != nil {
		t.Fatal(err)
	}
	return d, lower, upper, applied
}

// claim takes a merge command's claim on the pair until the test ends.
func (sp heldPair) claim(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	claim, err := sp.d.store.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = claim.Exec(context.Background(), `SELECT pg_advisory_unlock_all()`)
		claim.Release()
	})
	if _, err := claim.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended($1::text, 0))`, mergeClaimKey(sp.d.store.Schema(), "standing", postgres.Segment{})); err != nil {
		t.Fatal(err)
	}
}

// newStandingPair is a held pair whose halves both stand at their hold,
// the command's claim taken only once both stand there, so that neither
// half's arrival merged it.
func newStandingPair(t *testing.T) heldPair {
	t.Helper()
	sp := newHeldPair(t)
	for _, sh := range []*shard{sp.lower, sp.upper} {
		for i := 0; ; i++ {
			kind := sp.pass(t, sh)
			if kind == passGone {
				t.Fatalf("%s merged with no command's claim", sh.id.Instance)
			}
			if kind == passAtHold {
				break
			}
			if i > 10 {
				t.Fatalf("%s does not reach its hold (last pass: %d)", sh.id.Instance, kind)
			}
		}
	}
	sp.claim(t)
	return sp
}

func (sp heldPair) pass(t *testing.T, sh *shard) passKind {
	t.Helper()
	res, err := sp.d.pass(context.Background(), sh)
	if err != nil {
		t.Fatal(err)
	}
	return res.kind
}

// merged reports whether the pair's parent replaced its halves.
func (sp heldPair) merged(t *testing.T) bool {
	t.Helper()
	got, err := sp.d.admin.mergeWatch(context.Background(), sp.d.store.Pool(), "standing",
		[]mergePair{{parent: postgres.Segment{}, lo: sp.lower.segment, hi: sp.upper.segment}})
	if err != nil {
		t.Fatal(err)
	}
	return got[0]
}

// Of two halves standing at their hold, only the lower one looks for the
// merge when woken (mergehandoff.go, lowerLooks): every other pair's swap
// wakes both at once, and two looks at once refuse each other. The upper
// half's pass there takes no look, unless its last look was refused (its
// retry, after the lower half's); the lower half's pass merges. Before,
// the upper half's pass merged the pair here.
func TestHalvesStandingAtTheHoldLeaveTheLookToTheLowerHalf(t *testing.T) {
	t.Parallel()
	t.Run("lower", func(t *testing.T) {
		t.Parallel()
		sp := newStandingPair(t)
		if kind := sp.pass(t, sp.upper); kind != passAtHold {
			t.Fatalf("the upper half's pass standing at the hold ended %d, want %d (at the hold, no look)", kind, passAtHold)
		}
		if sp.merged(t) {
			t.Fatal("the upper half standing at the hold merged the pair: its lower half was to look")
		}
		if kind := sp.pass(t, sp.lower); kind != passGone {
			t.Fatalf("the lower half's pass standing at the hold ended %d, want %d (merged)", kind, passGone)
		}
		if !sp.merged(t) {
			t.Fatal("the lower half's pass did not merge the pair")
		}
		for id, n := range sp.applied {
			if n != 1 {
				t.Errorf("%s applied %d times", id, n)
			}
		}
		if len(sp.applied) != 20 {
			t.Errorf("%d streams applied, want 20", len(sp.applied))
		}
	})
	t.Run("upper retrying", func(t *testing.T) {
		t.Parallel()
		sp := newStandingPair(t)
		// Its last look found the lower half's lock taken (holdRetry).
		sp.upper.holdBusy = true
		if kind := sp.pass(t, sp.upper); kind != passGone {
			t.Fatalf("the upper half's retry ended %d, want %d (merged)", kind, passGone)
		}
		if !sp.merged(t) {
			t.Fatal("the upper half's retry did not merge the pair")
		}
	})
}

// A half whose pass brought it to the hold without merging, its sibling
// not seen there (it may have arrived at the same moment, its look before
// this pass's commit), looks again: the lower half at once, the upper half
// once more after the lower half's chance, its wait not cut short by a
// wake (holdRetry), and standing after that. Before, both looked again at
// once, and collided. Here the upper half arrives first; the lower half's
// arrival then merges the pair, and the upper half's look finds it gone.
func TestArrivingHalvesLookAgainLowerFirst(t *testing.T) {
	t.Parallel()
	sp := newHeldPair(t)
	sp.claim(t)
	start := time.Now()
	res, err := sp.d.pass(context.Background(), sp.upper)
	if err != nil {
		t.Fatal(err)
	}
	if res.kind != passRetryAt || !res.quiet {
		t.Fatalf("the upper half arriving, its sibling not there, ended %d (quiet %v), want %d, quiet: a look after its lower half's", res.kind, res.quiet, passRetryAt)
	}
	if d := res.retryAt.Sub(start); d < upperDefers {
		t.Errorf("the upper half looks again after %s, want at least %s", d, upperDefers)
	}
	if kind := sp.pass(t, sp.lower); kind != passGone {
		t.Fatalf("the lower half's arrival ended %d, want %d (merged)", kind, passGone)
	}
	if !sp.merged(t) {
		t.Fatal("the lower half's arrival did not merge the pair")
	}
	if kind := sp.pass(t, sp.upper); kind != passGone {
		t.Fatalf("the upper half's look after the merge ended %d, want %d", kind, passGone)
	}
	if len(sp.applied) != 20 {
		t.Errorf("%d streams applied, want 20", len(sp.applied))
	}
	for id, n := range sp.applied {
		if n != 1 {
			t.Errorf("%s applied %d times", id, n)
		}
	}

	p := NewAsync("arrive", AsyncConfig{Partitions: 2})
	b := newBalancer(p)
	lower := newPartitionShard("s", p, b, postgres.Segment{Bits: 1, Value: 0})
	upper := newPartitionShard("s", p, b, postgres.Segment{Bits: 1, Value: 1})
	hold := projector.Position{TxID: 9, Seq: 1}
	arriving := shardRow{held: true, hold: hold, cursor: projector.Position{TxID: 7, Seq: 1}}
	if got := atHold(lower, arriving, hold, passCaughtUp); got != passMore {
		t.Errorf("the lower half arriving unmerged: atHold = %d, want %d (look again at once)", got, passMore)
	}
	if got := atHold(upper, arriving, hold, passCaughtUp); got != passAtHold {
		t.Errorf("the upper half arriving, merge refused by the fence: atHold = %d, want %d (the command swaps)", got, passAtHold)
	}
}
