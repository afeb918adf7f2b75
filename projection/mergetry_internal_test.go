package projection

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// A pass merges at the hold only while a merge command holds its claim on
// the pair: a killed command's holds wait for it to be run again. The
// claim is another session's lock, so the pass can only look at it; the
// look must come after the pass holds the sibling's lock, or a command
// that died between the look and the lock (and the sibling's pass that
// gave the lock back after it) would have its merge finished for it.
//
// Here one session stands for both the command and the sibling's pass: it
// takes the sibling's lock, then the claim, and gives the claim back
// before the lock, in one round trip, round after round. While the claim
// is held the sibling's lock is too, so a merge try can never rightly hold
// the sibling's lock and find the claim: every answer "both held, merge"
// is the race. Two connections try without pause meanwhile. The try that
// read pg_locks before its lock tries answered so within a few hundred
// rounds (the test failed so, five runs of five); it must never.
func TestMergeTryLooksForTheClaimUnderTheLocks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.New()
	store := pgtest.Store(t, types.Registry)
	p := NewAsync("claimed", AsyncConfig{Partitions: 2})
	if err := OnEvent(p, types.Opened, func(context.Context, pgx.Tx, projector.Event) error { return nil }); err != nil {
		t.Fatal(err)
	}
	d := registered(t, Config{Store: store, Projections: []*Async{p}})
	parent := postgres.Segment{}
	_, hi, _ := parent.Children()
	sibling := segmentInstance(hi)
	// The sibling stands at its hold: the try's first condition holds.
	c := store.Table("projector_consumers")
	if _, err := store.Pool().Exec(ctx, `UPDATE `+c+` SET cursor_tx_id = '7', cursor_seq = 3, hold_tx_id = '7', hold_seq = 3
		WHERE name = 'claimed' AND instance_id = $1`, sibling); err != nil {
		t.Fatal(err)
	}
	fence := shardLockKey(store.Schema(), ShardID{Consumer: "claimed", Instance: SharedInstance})
	siblingKey := shardLockKey(store.Schema(), ShardID{Consumer: "claimed", Instance: sibling})
	claim := mergeClaimKey(store.Schema(), "claimed", parent)

	holder, err := store.Pool().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	var stop atomic.Bool
	var merged, refused, tries atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				var try int
				// Alone, in a transaction of its own: its locks go with it.
				err := store.Pool().QueryRow(ctx, d.admin.split.mergeTry, fence, siblingKey, "claimed", sibling, "7", 3, claim).Scan(&try)
				if err != nil {
					errs <- err
					return
				}
				tries.Add(1)
				switch try {
				case mergeTryLocked:
					merged.Add(1)
				case mergeTrySiblingBusy:
					refused.Add(1)
				}
			}
		}()
	}
	// The old try failed within 150-1,300 tries, 1-2 s under load.
	deadline := time.Now().Add(time.Duration(pgtest.Size(3, 30)) * time.Second)
	for merged.Load() == 0 && time.Now().Before(deadline) {
		// The sibling's lock, then the claim; the claim given back first
		// and the lock at the commit, in one round trip.
		b := &pgx.Batch{}
		b.Queue(`BEGIN`)
		b.Queue(`SELECT pg_advisory_xact_lock(hashtextextended($1::text, 0))`, siblingKey)
		b.Queue(`SELECT pg_advisory_lock(hashtextextended($1::text, 0))`, claim)
		if err := holder.SendBatch(ctx, b).Close(); err != nil {
			t.Fatal(err)
		}
		// Let the tries see the claim held for a moment.
		for n := tries.Load(); tries.Load() < n+1; {
			time.Sleep(50 * time.Microsecond)
		}
		if _, err := holder.Exec(ctx, `SELECT pg_advisory_unlock(hashtextextended('`+claim+`', 0)); COMMIT`, pgx.QueryExecModeSimpleProtocol); err != nil {
			t.Fatal(err)
		}
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if merged.Load() > 0 {
		t.Fatalf("%d of %d tries answered merge while the command's claim was already given back when the sibling's lock was free", merged.Load(), tries.Load())
	}
	if refused.Load() == 0 {
		t.Fatalf("no try found the sibling's lock taken in %d tries: the test did not run the race", tries.Load())
	}
}

// TestHoldRetryUpperHalfDefers: two halves at their hold whose merge
// tries found each other's lock taken used to look again after the same
// jittered poll, and could collide again, poll after poll (five looks, 40
// ms, in a traced merge). The lower half now looks again first, and the
// upper half no sooner than upperDefers after the lower half's latest,
// neither woken earlier by a shard wake.
func TestHoldRetryUpperHalfDefers(t *testing.T) {
	p := NewAsync("defer", AsyncConfig{Partitions: 4})
	b := newBalancer(p)
	lower := newPartitionShard("s", p, b, postgres.Segment{Bits: 3, Value: 4})
	upper := newPartitionShard("s", p, b, postgres.Segment{Bits: 3, Value: 5})
	for range 200 {
		start := time.Now()
		var at [2]time.Duration
		for i, sh := range []*shard{lower, upper} {
			sh.holdBusy = true
			res := holdRetry(sh, passResult{kind: passRetryAt})
			at[i] = res.retryAt.Sub(start)
		}
		if at[0] >= holdPoll/2+holdPoll+time.Millisecond {
			t.Fatalf("the lower half looks again after %s, want within holdPoll's jitter (%s)", at[0], holdPoll/2+holdPoll)
		}
		if at[1] < holdPoll/2+upperDefers {
			t.Fatalf("the upper half looks again after %s, want at least %s: after the lower half", at[1], holdPoll/2+upperDefers)
		}
	}
	// Its wait is not cut short by a wake: another pair's swap wakes both
	// halves at once.
	if res := holdRetry(lower, passResult{kind: passRetryAt}); !res.quiet {
		t.Error("a look again at the hold can be cut short by a wake")
	}
	upper.holdBusy = false
	if res := holdRetry(upper, passResult{kind: passRetryAt, retryAt: time.Unix(1, 0)}); !res.retryAt.Equal(time.Unix(1, 0)) || res.quiet {
		t.Fatalf("a retry that is not a busy sibling's changed to %s (quiet %v)", res.retryAt, res.quiet)
	}
}
