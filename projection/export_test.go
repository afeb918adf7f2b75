package projection

import (
	"context"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// SetSplitHandOff sets how long a's Split waits for the passes to split the
// partitions it marked before splitting the rest itself (splitHandOff by
// default), for tests whose passes may be slower than that under load.
func SetSplitHandOff(a *Admin, d time.Duration) { a.handOffWait = d }

// AliveLockKey is the key of the alive lock the listening session of
// instance holds (layoutnotify.go).
var AliveLockKey = aliveLockKey

// ShardLockKey is the key of a shard's transaction-scoped advisory lock.
var ShardLockKey = shardLockKey

// SetMergeLookHook has a's merge wait call f after each look, with whether
// every half not merged stands at its hold and which pairs were merged,
// before the wait decides on what it saw.
func SetMergeLookHook(a *Admin, f func(ready bool, merged []bool)) { a.lookHook = f }

// SetMergeHoldHook has a's merge hold without the halves' locks call f
// between its read of their rows and its write (holdUnlocked).
func SetMergeHoldHook(a *Admin, f func()) { a.holdHook = f }

// AwaitHoldsOf runs a merge's wait (awaitHolds), on a connection of its
// own, for consumer's pair 0/2 and 1/2 held at hold, as a merge command
// does once its hold committed, and returns whether the pair was merged
// (by its passes) when the wait ended.
func AwaitHoldsOf(ctx context.Context, a *Admin, consumer string, hold projector.Position, wait time.Duration) (bool, error) {
	conn, err := a.store.Pool().Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Release()
	parent := postgres.Segment{}
	lo, hi, _ := parent.Children()
	merged, err := a.awaitHolds(ctx, conn, consumer, []mergePair{{parent: parent, lo: lo, hi: hi, hold: hold}}, wait)
	if err != nil {
		return false, err
	}
	return merged[0], nil
}

// UnholdOf lifts the holds of consumer's pair 0/2 and 1/2 at hold as a
// merge command that gives up does (unholdFenced).
func UnholdOf(ctx context.Context, a *Admin, consumer string, hold projector.Position) error {
	conn, err := a.store.Pool().Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	parent := postgres.Segment{}
	lo, hi, _ := parent.Children()
	return a.unholdFenced(ctx, conn, consumer, []mergePair{{parent: parent, lo: lo, hi: hi, hold: hold}})
}

// StandingAtHold reports whether d's shard of consumer's partition
// instance stands at its merge hold, passed by the balancing round's wakes
// (lowerLooks).
func StandingAtHold(d *Dispatcher, consumer, instance string) bool {
	for _, sh := range d.allShards() {
		if sh.id.Consumer == consumer && sh.id.Instance == instance {
			return sh.standing.Load()
		}
	}
	return false
}
