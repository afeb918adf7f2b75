package projection

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// holdUnlocked holds pairs without their halves' shard locks, and so
// without waiting for their running batches: the usual merge of a live
// consumer, whose halves are caught up. Taken under the locks (and, for a
// merge of every pair, behind the layout gate), the hold waited for the
// longest batch running, and no partition started a batch meanwhile: most
// of a merge's pause (docs/performance.md, "A merge's hold without the
// halves' locks").
//
// Each pair is held at the horizon tx sees after reading the rows (holdNow
// without the locks). A batch already running read below a horizon no later
// than that one, so it ends at or before the hold; a pass that read its
// state before the hold committed and its batch after it may end past the
// hold, and the database refuses its cursor (holdCheck): it rolls back and
// runs again, cut at the hold. A pass that moved a cursor past the hold
// between this read and the hold's write makes the hold's own update fail
// the same check: the hold rolls back to its savepoint and returns false.
// A pair whose halves stand at one cursor with no batch running is held
// there and swapped at once (lockAtOne).
//
// It returns false, having written nothing, unless every pair's halves are
// caught up (their last pass read less than a batch, not failing), not held,
// not marked to split, not replaying and at one model version: the rest (a
// half behind by a backlog, held at the cursor of the one ahead; a second
// merge of the same pair) is held under the locks, as before (holdPair).
// The caller holds the consumer's fence lock, so no layout change
// interleaves.
func (a *Admin) holdUnlocked(ctx context.Context, tx pgx.Tx, consumer string, pairs []mergePair) (bool, error) {
	halves := pairSegments(pairs)
	ids := make([]string, len(halves))
	for i, s := range halves {
		ids[i] = segmentInstance(s)
	}
	var read map[postgres.Segment]partRow
	var xmin string
	b := &pgx.Batch{}
	b.Queue(a.split.peek, consumer, ids).Query(func(rows pgx.Rows) (err error) {
		read, err = scanPartRows(rows)
		return err
	})
	b.Queue(holdHorizonSQL).QueryRow(func(row pgx.Row) error { return row.Scan(&xmin) })
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return false, fmt.Errorf("merge hold: %w", err)
	}
	now, err := parseHorizon(xmin)
	if err != nil {
		return false, err
	}
	holds := make([]projector.Position, len(pairs))
	var atOne []int // the pairs whose halves stand at one cursor
	for i, p := range pairs {
		lo, okLo := read[p.lo]
		hi, okHi := read[p.hi]
		if !okLo || !okHi || !holdableUnlocked(lo) || !holdableUnlocked(hi) || lo.version != hi.version {
			return false, nil
		}
		holds[i] = latest(lo.cursor, hi.cursor, now)
		if lo.cursor == hi.cursor {
			atOne = append(atOne, i)
		}
	}
	swap, err := a.lockAtOne(ctx, tx, consumer, pairs, atOne, holds, read)
	if err != nil || swap == nil {
		return false, err
	}
	if a.holdHook != nil {
		a.holdHook()
	}
	writes := &pgx.Batch{}
	writes.Queue("SAVEPOINT merge_hold")
	for i, p := range pairs {
		for _, id := range p.ids() {
			writes.Queue(a.split.hold, consumer, id, holds[i].TxID, holds[i].Seq).Exec(func(tag pgconn.CommandTag) error {
				if tag.RowsAffected() != 1 {
					return layoutChanged(consumer, "partition "+id+" was split or merged meanwhile")
				}
				return nil
			})
		}
	}
	atOnce := make([]bool, len(pairs))
	for i := range pairs {
		if swap[i] {
			p := pairs[i]
			p.hold = holds[i]
			if atOnce[i], err = a.mergeAtOnce(consumer, p, read, writes); err != nil {
				return false, err
			}
		}
	}
	if err := tx.SendBatch(ctx, writes).Close(); err != nil {
		if !pastHold(err) {
			return false, fmt.Errorf("merge hold: %w", err)
		}
		// Back to before the locks lockAtOne took, if it took any, so the
		// hold under the locks takes them in PartitionOrder.
		savepoint := "merge_hold"
		if len(atOne) > 0 {
			savepoint = "merge_try"
		}
		if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+savepoint); err != nil {
			return false, fmt.Errorf("merge hold: %w", err)
		}
		return false, nil // a pass got past the hold meanwhile: hold under the locks
	}
	for i := range pairs {
		pairs[i].hold, pairs[i].atOnce = holds[i], atOnce[i]
	}
	return true, nil
}

// lockAtOne tries, without waiting, both halves' shard locks of each pair
// of atOne (its halves at one cursor): such a pair is held at that cursor
// and swapped at once, in the hold's transaction, as under the locks
// (mergeAtOnce), so no dispatcher need run. It re-reads those rows under
// the locks into read (a pair a pass moved meanwhile is held with the
// others), and returns which pairs to swap. It returns nil, having written
// nothing, when it did not get a pair's locks (a pass runs; the hold under
// the locks waits for it, as a pair whose halves are at one cursor is held
// at it, and holding it there unlocked would roll back the running batch
// past it) or a pair is no longer one holdUnlocked may hold.
func (a *Admin) lockAtOne(ctx context.Context, tx pgx.Tx, consumer string, pairs []mergePair, atOne []int,
	holds []projector.Position, read map[postgres.Segment]partRow) ([]bool, error) {
	swap := make([]bool, len(pairs))
	if len(atOne) == 0 {
		return swap, nil
	}
	got := make([]bool, len(atOne))
	var ids []string
	b := &pgx.Batch{}
	b.Queue("SAVEPOINT merge_try") // its rollback lifts the locks taken after it
	for j, i := range atOne {
		p := pairs[i]
		ids = append(ids, p.ids()...)
		b.Queue(tryLockPairSQL, shardLockKey(a.store.Schema(), ShardID{Consumer: consumer, Instance: segmentInstance(p.lo)}),
			shardLockKey(a.store.Schema(), ShardID{Consumer: consumer, Instance: segmentInstance(p.hi)})).
			QueryRow(func(row pgx.Row) error { return row.Scan(&got[j]) })
	}
	var locked map[postgres.Segment]partRow
	var xmin string
	b.Queue(a.split.peek, consumer, ids).Query(func(rows pgx.Rows) (err error) {
		locked, err = scanPartRows(rows)
		return err
	})
	b.Queue(holdHorizonSQL).QueryRow(func(row pgx.Row) error { return row.Scan(&xmin) })
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("merge hold: %w", err)
	}
	now, err := parseHorizon(xmin)
	if err != nil {
		return nil, err
	}
	// Giving up, it gives back the locks it got, so the hold under the
	// locks takes them in PartitionOrder.
	giveUp := func() ([]bool, error) {
		if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT merge_try"); err != nil {
			return nil, fmt.Errorf("merge hold: %w", err)
		}
		return nil, nil
	}
	if slices.Contains(got, false) {
		return giveUp()
	}
	for _, i := range atOne {
		p := pairs[i]
		lo, okLo := locked[p.lo]
		hi, okHi := locked[p.hi]
		if !okLo || !okHi || !holdableUnlocked(lo) || !holdableUnlocked(hi) || lo.version != hi.version {
			return giveUp()
		}
		read[p.lo], read[p.hi] = lo, hi
		holds[i] = latest(lo.cursor, hi.cursor, now)
		if lo.cursor == hi.cursor {
			holds[i], swap[i] = lo.cursor, true
		}
	}
	return swap, nil
}

// tryLockPairSQL tries two halves' shard locks, the second only once the
// first is held.
const tryLockPairSQL = `SELECT CASE WHEN pg_try_advisory_xact_lock(hashtextextended($1::text, 0))
	THEN pg_try_advisory_xact_lock(hashtextextended($2::text, 0)) ELSE false END`

// holdableUnlocked reports whether a half may be held by holdUnlocked: caught
// up and in none of the states a locked hold looks at (holdPair).
func holdableUnlocked(r partRow) bool {
	return caughtUp(r) && !r.held && !r.splitMark && !r.replaying
}

// holdHorizonSQL reads the horizon: the oldest transaction id still running,
// as the statement's snapshot sees it. Every event below it is final.
const holdHorizonSQL = `SELECT pg_snapshot_xmin(pg_current_snapshot())::text`

// parseHorizon turns holdHorizonSQL's answer into a position.
func parseHorizon(xmin string) (projector.Position, error) {
	x, err := strconv.ParseUint(xmin, 10, 64)
	if err != nil {
		return projector.Position{}, fmt.Errorf("merge hold: horizon %q: %w", xmin, err)
	}
	return projector.Horizon(x), nil
}
