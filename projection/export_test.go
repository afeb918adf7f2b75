package projection

import "time"

// SetSplitHandOff sets how long a's Split waits for the passes to split the
// partitions it marked before splitting the rest itself (splitHandOff by
// default), for tests whose passes may be slower than that under load.
func SetSplitHandOff(a *Admin, d time.Duration) { a.handOffWait = d }

// AliveLockKey is the key of the alive lock the listening session of
// instance holds (layoutnotify.go).
var AliveLockKey = aliveLockKey

// ShardLockKey is the key of a shard's transaction-scoped advisory lock.
var ShardLockKey = shardLockKey
