package projection

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// A split handed off to the partition's own pass (docs/scaling.md,
// "Splitting and merging live").
//
// A split the command carries out itself waits for the running batch of
// each partition it splits (behind the layout gate when it splits every
// partition, which also refuses every new batch meanwhile), and the halves
// then start from nothing: the partitions involved stood still for the
// running batch, the change's round trips, the NOTIFY and the halves'
// balancing round, and the halves' first batch (about four batches, docs/
// performance.md). When a live dispatcher runs every partition to split,
// the command instead marks them (split_requested_at), under the fence
// lock, and returns once they are split. The pass of each marked partition
// does its batch as always and, at its end, in the same transaction and
// under its own lock, replaces its row by its two halves' rows at the
// cursor it just wrote: the same statements as the command's split
// (insertChild, the dead letters' and parks' moves, the removal, the layout
// NOTIFY), pipelined with the cursor advance and the COMMIT. Nothing waits
// for a running batch; the parent's last batch and the split are one
// commit; and the dispatcher that ran the parent starts its halves' loops
// at once, owned by it as the parent was, without waiting for the NOTIFY's
// balancing round.
//
// Exclusion is unchanged. The pass splits only once it also holds the
// consumer's fence lock (shared with other splitting passes), which it
// tries without waiting, in its first round trip beside its shard lock and
// state read when its row is marked (queueSplitCheck: a marked pass so
// spends no round trip of its own on it, and knows before its read whether
// it splits, so it reads its halves' first batches only then) (every layout
// change and every registration holds the fence while it waits for shard
// locks, so a pass waiting for it could deadlock), and only when its row
// is still marked as read after the fence is held: a command that gives up
// lifts the marks under the fence, so no pass splits after it said nothing
// changed. A pass that finds the fence taken leaves the mark for its next
// batch. A pass that is failing, held for a merge, a shadow's, or of a
// consumer partitioned by key does not split; a command that asked for
// one of those did not hand it off in the first place.
//
// The command falls back to splitting the rest itself when the passes have
// not split them within splitHandOff (a dispatcher of an older release
// ignores the mark; one stalled, or one that stopped after the mark): by
// then it holds the fence, so no pass splits concurrently, and it waits for
// their running batches as before.

// splitHandOff bounds how long [Admin.Split] waits for the passes to split
// the partitions it marked before it splits the rest itself.
const splitHandOff = 5 * time.Second

type handOffSQL struct {
	handOff, mark, unmark, watch, recheck string
}

func buildHandOffSQL(store *postgres.Store) handOffSQL {
	c, i := store.Table("projector_consumers"), store.Table("projector_instances")
	return handOffSQL{
		// How many of partitions $2 a live dispatcher of their model
		// version runs, healthy and not held for a merge: the split is
		// handed off only when that is all of them. Live: a recent
		// heartbeat, and the alive lock ($3 is its key but the instance,
		// aliveLockKey) held, which a killed process drops at once.
		handOff: `SELECT count(*) FROM ` + c + ` c WHERE c.name = $1 AND c.instance_id = ANY($2)
				AND c.hold_tx_id IS NULL AND c.status IN ('idle', 'processing') AND c.attempts = 0 AND c.replay_until_tx_id IS NULL
				AND EXISTS (SELECT 1 FROM ` + i + ` i WHERE i.instance_id = c.owner AND i.stopped_at IS NULL
					AND i.last_seen_at > now() - ` + fmt.Sprint(LiveHeartbeats) + ` * i.heartbeat_every
					AND c.name || '/partitions@v' || c.version::text = ANY(i.consumers))
				AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
					AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
					AND ((l.classid::int8 << 32) | l.objid::int8) = hashtextextended($3 || c.owner, 0))`,
		mark:   `UPDATE ` + c + ` SET split_requested_at = now() WHERE name = $1 AND instance_id = ANY($2)`,
		unmark: `UPDATE ` + c + ` SET split_requested_at = NULL WHERE name = $1 AND instance_id = ANY($2) AND split_requested_at IS NOT NULL`,
		watch:  `SELECT instance_id, cursor_tx_id, cursor_seq FROM ` + c + ` WHERE name = $1 AND instance_id = ANY($2)`,
		// A pass's look at its mark once it holds the fence: a statement
		// of its own, so its snapshot follows the lock.
		recheck: `SELECT coalesce(split_requested_at IS NOT NULL, false) FROM ` + c + ` WHERE name = $1 AND instance_id = $2`,
	}
}

// splitHandedOff marks targets (partitions of consumer, each with
// children, checked under the fence lock tx holds) for their passes to
// split, and reports true, when a live dispatcher runs every one of them;
// otherwise it changes nothing and reports false, for the command to split
// them itself.
//
// The marks go out pipelined with the COMMIT, which ends tx (inTx then
// commits nothing): the UPDATE gives the transaction an id and locks the
// partitions' rows, and with the COMMIT a round trip later both were held
// for that round trip. A pass that ended its batch meanwhile waited for
// them at its cursor advance, holding its own id, and every partition of
// every consumer read below the older of the two (promise 3): the latency
// test's horizon sampler saw a pass wait so on Lock/transactionid for the
// command, idle in transaction after its marks.
func (a *Admin) splitHandedOff(ctx context.Context, tx pgx.Tx, consumer string, targets []postgres.Segment) (bool, error) {
	ids := segmentIDs(targets)
	var n int
	if err := tx.QueryRow(ctx, a.handOff.handOff, consumer, ids, aliveLockPrefix(a.store.Schema())).Scan(&n); err != nil {
		return false, err
	}
	if n != len(ids) {
		return false, nil
	}
	b := &pgx.Batch{}
	b.Queue(a.handOff.mark, consumer, ids)
	b.Queue("COMMIT")
	if err := commitBatch(ctx, tx, b); err != nil {
		return false, err
	}
	return true, errTxDone
}

// errTxDone tells inTx that its function committed the transaction itself,
// pipelined with its last statements.
var errTxDone = errors.New("transaction committed")

// inTx runs fn in a transaction on a connection of a's pool and commits it,
// unless fn returned errTxDone (it sent the COMMIT itself, pipelined: the
// server's transaction has ended, pgx's has not, so neither COMMIT nor
// ROLLBACK is sent through it). Any other error rolls it back.
func (a *Admin) inTx(ctx context.Context, fn func(pgx.Tx) error) error {
	conn, err := a.store.Pool().Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	switch err := fn(tx); {
	case errors.Is(err, errTxDone):
		return nil
	case err != nil:
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	return tx.Commit(ctx)
}

// commitBatch sends b, whose last statement is a COMMIT, on tx, and
// reports an error unless every statement succeeded and the COMMIT
// committed. After an error the transaction is aborted, for a rollback.
func commitBatch(ctx context.Context, tx pgx.Tx, b *pgx.Batch) error {
	br := tx.SendBatch(ctx, b)
	var tag pgconn.CommandTag
	var err error
	for range b.Len() {
		if tag, err = br.Exec(); err != nil {
			break
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil && tag.String() != "COMMIT" {
		err = pgx.ErrTxCommitRollback
	}
	return err
}

// segmentIDs returns the instance ids of segs.
func segmentIDs(segs []postgres.Segment) []string {
	ids := make([]string, len(segs))
	for i, s := range segs {
		ids[i] = segmentInstance(s)
	}
	return ids
}

// splitWatch reads which of targets their passes split, with the cursor of
// the halves of each (the earlier of the two: where they stood when
// read, at or after where they started), and which are still to split.
func (a *Admin) splitWatch(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, consumer string, targets []postgres.Segment,
) (done []PartitionChange, pending []postgres.Segment, err error) {
	var ids []string
	for _, s := range targets {
		lo, hi, _ := s.Children()
		ids = append(ids, segmentInstance(s), segmentInstance(lo), segmentInstance(hi))
	}
	rows, err := q.Query(ctx, a.handOff.watch, consumer, ids)
	if err != nil {
		return nil, nil, err
	}
	at := map[string]projector.Position{}
	var id string
	var cursor projector.Position
	if _, err := pgx.ForEachRow(rows, []any{&id, &cursor.TxID, &cursor.Seq}, func() error {
		at[id] = cursor
		return nil
	}); err != nil {
		return nil, nil, err
	}
	for _, s := range targets {
		lo, hi, _ := s.Children()
		if _, ok := at[segmentInstance(s)]; ok {
			pending = append(pending, s)
			continue
		}
		l, okLo := at[segmentInstance(lo)]
		h, okHi := at[segmentInstance(hi)]
		if !okLo || !okHi {
			return nil, nil, layoutChanged(consumer, "partition "+s.String()+" was split and its halves changed meanwhile")
		}
		if h.Less(l) {
			l = h
		}
		done = append(done, PartitionChange{From: []postgres.Segment{s}, To: []postgres.Segment{lo, hi}, Cursor: l})
	}
	return done, pending, nil
}

// awaitSplits waits up to wait for the passes to split every partition of
// targets, looking every holdPoll.
func (a *Admin) awaitSplits(ctx context.Context, consumer string, targets []postgres.Segment, wait time.Duration) ([]PartitionChange, []postgres.Segment, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	tick := time.NewTicker(holdPoll)
	defer tick.Stop()
	for {
		done, pending, err := a.splitWatch(ctx, a.store.Pool(), consumer, targets)
		switch {
		case err != nil && ctx.Err() == nil:
			return nil, nil, err
		case err == nil && len(pending) == 0:
			return done, nil, nil
		}
		select {
		case <-ctx.Done():
			return done, pending, ctx.Err()
		case <-tick.C:
		}
	}
}

// finishSplits splits, under the fence lock, the partitions of targets the
// passes did not split within splitHandOff, as a command without a
// dispatcher does; an error lifts their marks, so no pass splits them
// after the command returned it.
func (a *Admin) finishSplits(ctx context.Context, consumer string, targets []postgres.Segment) ([]PartitionChange, error) {
	var out []PartitionChange
	var rest []postgres.Segment
	err := pgx.BeginFunc(ctx, a.store.Pool(), func(tx pgx.Tx) error {
		out, rest = nil, nil
		layout, err := a.lockLayout(ctx, tx, consumer)
		if err != nil {
			return err
		}
		done, pending, err := a.splitWatch(ctx, tx, consumer, targets)
		if err != nil {
			return err
		}
		out, rest = done, pending
		if len(rest) == 0 {
			return nil
		}
		more, err := a.splitMany(ctx, tx, consumer, rest, true, everyPartition(layout, rest))
		out = append(out, more...)
		return err
	})
	if err != nil {
		a.notifyAborted(ctx, consumer)
		if uerr := a.unmarkSplits(ctx, consumer, targets); uerr != nil {
			err = errors.Join(err, fmt.Errorf("lift the split marks: %w", uerr))
		}
		return nil, err
	}
	return out, nil
}

// unmarkSplits lifts the split marks of targets that remain, under the
// fence lock (a pass splits only while it holds the fence and still finds
// its mark), and says which of them their passes had split by then.
func (a *Admin) unmarkSplits(ctx context.Context, consumer string, targets []postgres.Segment) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), wakeTimeout)
	defer cancel()
	var done []PartitionChange
	err := pgx.BeginFunc(ctx, a.store.Pool(), func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, a.sql.waitLock, shardLockKey(a.store.Schema(), ShardID{Consumer: consumer, Instance: SharedInstance})); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, a.handOff.unmark, consumer, segmentIDs(targets)); err != nil {
			return err
		}
		var err error
		done, _, err = a.splitWatch(ctx, tx, consumer, targets)
		return err
	})
	if err == nil && len(done) > 0 {
		names := make([]string, len(done))
		for i, c := range done {
			names[i] = c.String()
		}
		return fmt.Errorf("%w: their own passes had split some before the command gave up: %s", ErrLayoutChanged, strings.Join(names, ", "))
	}
	return err
}

// fenceKey is the key of the consumer's fence lock, which a splitting
// pass holds shared: several partitions' passes split at once (each writes
// only its own row and its halves'), while a command or a registration,
// which takes the fence exclusively, excludes them all. The pass's state
// read tries it without waiting, and only when the partition's row is
// marked to split (dispatchSQL.state).
func (d *Dispatcher) fenceKey(sh *shard) string {
	return shardLockKey(d.store.Schema(), ShardID{Consumer: sh.id.Consumer, Instance: SharedInstance})
}

// splitCheck is what a pass that may split learns in its first round trip
// (queueSplitCheck): whether it holds the consumer's fence, and whether
// its row is still marked as read once it did.
type splitCheck struct{ fenced, marked bool }

// mayHandOff reports whether sh's pass may split its partition when it is
// marked: the shard kinds a command hands a split to (handOff).
func (sh *shard) mayHandOff() bool {
	if sh.balancer == nil || sh.shadow != nil || sh.keyed() {
		return false
	}
	_, _, ok := sh.segment.Children()
	return ok
}

// queueSplitCheck queues on b, the pass's first round trip, after its
// state read (which tried the consumer's fence when the row was marked),
// the look at the mark under the fence: a statement of its own, so its
// snapshot follows the fence. A marked pass so learns whether it splits
// before its read, at no round trip of its own, and holds the fence
// (shared) until its commit; an unmarked one takes nothing, and its pass
// pays this one primary-key lookup in the pipeline.
func (d *Dispatcher) queueSplitCheck(b *pgx.Batch, sh *shard, into *splitCheck) {
	if !sh.mayHandOff() {
		return
	}
	b.Queue(d.admin.handOff.recheck, sh.id.Consumer, sh.id.Instance).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&into.marked)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
}

// splitAtEnd reports whether this pass of sh splits its partition when it
// commits (see above): its row is marked, it may split, and the consumer's
// fence lock was free (the pass now holds it until its end) and the mark
// was still there under it (queueSplitCheck).
func splitAtEnd(sh *shard, st shardRow, c splitCheck) bool {
	return st.splitMark && sh.mayHandOff() && !st.held && st.replayUntil == projector.Start && c.fenced && c.marked
}

// queueSplitSelf queues on b, after the pass's cursor advance, the
// replacement of sh's row by its halves' rows at that cursor (the
// command's statements, splitMany), and the layout NOTIFY.
func (d *Dispatcher) queueSplitSelf(b *pgx.Batch, sh *shard) {
	lo, hi, _ := sh.segment.Children()
	consumer, parent := sh.id.Consumer, sh.id.Instance
	s := d.admin.split
	// The advance cleared any failure, so both halves start clean.
	b.Queue(s.insertChild, consumer, parent, segmentInstance(lo), false)
	b.Queue(s.insertChild, consumer, parent, segmentInstance(hi), false)
	shift, count := 32-int(lo.Bits), lo.Count()
	b.Queue(s.moveDeadLetters, consumer, parent, shift, count)
	b.Queue(s.moveParks, consumer, parent, shift, count)
	b.Queue(s.remove, consumer, []string{parent})
	queueNotifyLayout(b, d.store, consumer)
}

// startHalves, once sh's pass committed its split, ends sh's loop (its
// pass returns passGone) and starts its halves' at once in this dispatcher, which owns them as it
// owned sh (the rows carry its owner): the layout NOTIFY's balancing round
// then finds them running. A round that read the layout before the commit
// may stop them meanwhile; the next round starts them again (a stopped
// shard's pass never runs).
func (d *Dispatcher) startHalves(sh *shard) {
	b := sh.balancer
	lo, hi, _ := sh.segment.Children()
	sh.removed.Store(true)
	var added, gone []*shard
	b.mu.Lock()
	now := time.Now()
	b.local[sh.id.Instance] = now
	sh.halves = nil
	for _, seg := range []postgres.Segment{lo, hi} {
		id := segmentInstance(seg)
		b.local[id] = now
		warm := b.warm[id] // its first batch read while the parent applied its last
		delete(b.warm, id)
		if cur := b.shards[id]; cur != nil && !cur.removed.Load() {
			// A round started it meanwhile: with the warm shard when it
			// was still here, so this one is another's read.
			if warm != nil && warm.prefetch != nil {
				warm.prefetch.cancel()
			}
			continue
		}
		if cur := b.shards[id]; cur != nil {
			// Merged away by its pass before a round dropped it: the half
			// takes its name, so it leaves the dispatcher's list here
			// (no round will find it under that name again).
			gone = append(gone, cur)
		}
		half := warm
		if half == nil {
			half = newPartitionShard(d.store.Schema(), b.proj, b, seg)
		}
		b.shards[id], b.owned[id] = half, true
		added = append(added, half)
	}
	b.mu.Unlock()
	// sh stays listed, stopped, until the round the NOTIFY brings drops
	// it and its metrics, as after a split the command made: its last
	// batch, which the split committed with, stays visible until then.
	d.replaceShards(added, gone)
}

// handedOffSplit is the part of Split after the marks committed: wake the
// marked partitions' loops (a caught-up one waits for new events or a
// Recheck), wait for their passes, and split what they did not.
func (a *Admin) handedOffSplit(ctx context.Context, consumer string, targets []postgres.Segment) ([]PartitionChange, error) {
	ids := make([]ShardID, len(targets))
	for i, s := range targets {
		ids[i] = ShardID{Consumer: consumer, Instance: segmentInstance(s)}
	}
	_ = WakeShards(ctx, a.store, ids...) // best effort: the passes also come at their next batch or Recheck
	wait := splitHandOff
	if a.handOffWait > 0 {
		wait = a.handOffWait
	}
	done, _, err := a.awaitSplits(ctx, consumer, targets, wait)
	switch {
	case err == nil:
		return orderChanges(done, targets), nil
	case ctx.Err() != nil:
		// Every target, not pending: a cancellation that lands in a
		// look (splitWatch) leaves pending empty, and the marks would
		// stay for the passes to split after the command said it
		// failed. The unmark touches only rows still marked.
		if uerr := a.unmarkSplits(ctx, consumer, targets); uerr != nil {
			err = errors.Join(err, uerr)
		}
		return nil, err
	case !errors.Is(err, context.DeadlineExceeded):
		return nil, errors.Join(err, a.unmarkSplits(ctx, consumer, targets))
	}
	out, err := a.finishSplits(ctx, consumer, targets)
	if err != nil {
		return nil, err
	}
	return orderChanges(out, targets), nil
}

// orderChanges puts changes in the order of targets, as the command's own
// split returns them.
func orderChanges(changes []PartitionChange, targets []postgres.Segment) []PartitionChange {
	slices.SortFunc(changes, func(x, y PartitionChange) int {
		return slices.Index(targets, x.From[0]) - slices.Index(targets, y.From[0])
	})
	return changes
}

// prefetchHalves starts, in the pass of a partition marked to split, the
// read of each half's first batch (the batch after next, in the half's
// segment) while the pass applies its own: the halves' first passes then
// find their batches read, as the parent's next pass would have found its
// own (prefetch.go). The halves' shards are made now, to be started by
// startHalves if the split commits; a pass that did not split drops them.
// Nothing is read when the pool has no connection to spare.
func (d *Dispatcher) prefetchHalves(ctx context.Context, sh *shard, q postgres.LogQuery, next projector.Position) {
	lo, hi, ok := sh.segment.Children()
	if !ok || sh.balancer == nil || sh.shadow != nil || sh.keyed() {
		d.startPrefetch(ctx, sh, q, next)
		return
	}
	sh.halves = []*shard{newPartitionShard(d.store.Schema(), sh.proj, sh.balancer, lo), newPartitionShard(d.store.Schema(), sh.proj, sh.balancer, hi)}
	for _, half := range sh.halves {
		if st := d.store.Pool().Stat(); st.IdleConns() == 0 && st.TotalConns() >= st.MaxConns() {
			break
		}
		hq := q
		hq.After, hq.Partition = next, half.readSegment()
		d.launchPrefetch(ctx, half, hq)
	}
	b := sh.balancer
	b.mu.Lock()
	for _, half := range sh.halves {
		b.warm[half.id.Instance] = half
	}
	b.mu.Unlock()
}

// dropHalves cancels the reads prefetchHalves started for a split that did
// not happen.
func dropHalves(sh *shard) {
	if len(sh.halves) == 0 {
		return
	}
	b := sh.balancer
	b.mu.Lock()
	for _, half := range sh.halves {
		// Only those no round took (balancer.warm): a taken one is its
		// own loop's, and its pass checks its read against its cursor.
		if b.warm[half.id.Instance] == half {
			delete(b.warm, half.id.Instance)
			if half.prefetch != nil {
				half.prefetch.cancel()
			}
		}
	}
	b.mu.Unlock()
	sh.halves = nil
}
