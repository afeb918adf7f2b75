package projection

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projectorhq/projector/stores/postgres"
)

// The layout gate: a split or merge of every partition of a consumer waits
// for all their running batches at once (docs/scaling.md, "Splitting and
// merging live").
//
// A change takes the shard lock of each partition it changes, in
// PartitionOrder, one after another in one transaction: it can wait for
// one lock at a time. Waiting for partition k's running batch it already
// holds the locks of those before k, which stand still, while those after
// k go on starting batches, each of which it then waits for in turn. With
// every partition involved the first one locked stood still for about half
// a batch per partition after it (the longest pause of a split 4 → 8 was
// measured at 3.6 batches, of a merge at 6.0).
//
// So every pass of a partition takes, before its shard lock and without
// waiting, the consumer's gate lock in shared mode; a change of every
// partition takes the gate in exclusive mode, waiting, before any shard
// lock. Its request waits for the passes running at that moment, all at
// once, and while it waits PostgreSQL refuses the gate to any new pass (a
// lock request that conflicts with a waiting one queues behind it; a try
// fails), so no partition starts a batch the change would then wait for:
// the wait is the longest running batch, not one batch per partition. Its
// shard locks follow, free unless a holder that takes no gate (a rebuild, a
// retry, a process of an older release) has one, which it waits for as
// before.
//
// A change of some of the partitions does not take the gate: it would stop
// the partitions it does not change, which must go on (promise: a split
// pauses no other partition). It waits for its own partitions' locks as
// before.
//
// No deadlock: a pass only tries the gate and its shard lock, never waits
// for either; a change takes the consumer's fence lock, then the gate, then
// the shard locks, and nothing that holds a shard lock waits for the gate.
// A pass that finds the gate taken stands aside like one that finds its
// shard locked, and the change's layout NOTIFY wakes it at its commit
// (layoutnotify.go).

// gateLockKey names consumer's layout gate lock, in a namespace of its own
// (no shard's key, see shardLockKey, can equal it).
func gateLockKey(schema, consumer string) string {
	return "projector.partition-gate\x1f" + schema + "\x1f" + consumer
}

// tryLockGatedSQL is a partition pass's lock: the gate shared, then, only
// when it was free, the shard's own lock ($1 the shard's key, $2 the
// gate's). CASE evaluates its branches in order, so a pass refused the gate
// never takes the shard lock a waiting change is to take next.
const tryLockGatedSQL = `SELECT CASE WHEN pg_try_advisory_xact_lock_shared(hashtextextended($2::text, 0))
	THEN pg_try_advisory_xact_lock(hashtextextended($1::text, 0)) ELSE false END`

// queueCloseGate queues on b the exclusive wait for consumer's gate: once
// it returns, no pass of the consumer's partitions runs or starts until
// the transaction ends.
func queueCloseGate(b *pgx.Batch, store *postgres.Store, consumer string) {
	b.Queue(waitShardLockSQL, gateLockKey(store.Schema(), consumer))
}

// everyPartition reports whether segs name every partition of layout.
func everyPartition(layout, segs []postgres.Segment) bool {
	if len(segs) == 0 || len(segs) < len(layout) {
		return false
	}
	for _, s := range layout {
		found := false
		for _, t := range segs {
			if s == t {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// lockPartitionsGated is LockPartitions for a change of consumer's
// partitions segs: behind the gate, in the same round trip, when gate is
// set (a change of every partition; see above).
func lockPartitionsGated(ctx context.Context, tx pgx.Tx, store *postgres.Store, consumer string, gate bool, ids []string) error {
	if !gate {
		return LockPartitions(ctx, tx, store, consumer, ids)
	}
	ids = partitionsInOrder(ids)
	b := &pgx.Batch{}
	queueCloseGate(b, store, consumer)
	queueLockPartitions(b, store, consumer, ids)
	br := tx.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return fmt.Errorf("lock consumer %s's partitions: %w", consumer, err)
	}
	return readLockPartitions(br, consumer, ids)
}

// notifyAborted tells the dispatchers running consumer that a change which
// may have closed its gate, or held some of its partitions' locks, ended
// without a commit, so without the layout NOTIFY its commit would have
// sent: the passes it refused stood aside until a wake-up, and would
// otherwise wait for their next Recheck. Best effort, outside the
// change's transaction.
func (a *Admin) notifyAborted(ctx context.Context, consumer string) {
	a.notifyAbortedOn(ctx, a.store.Pool(), consumer)
}

// notifyAbortedOn is notifyAborted through db: a command that holds a
// connection of its pool while it runs (a merge's claims) sends it on that
// one, since a pool of one connection would never give it another.
func (a *Admin) notifyAbortedOn(ctx context.Context, db interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, consumer string) {
	if validName(consumer) != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), wakeTimeout)
	defer cancel()
	_, _ = db.Exec(ctx, notifyLayoutSQL, layoutChannel, layoutPayload(a.store.Schema(), consumer))
}
