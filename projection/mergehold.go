package projection

import (
	"context"
	"fmt"
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
//
// It returns false, having written nothing, unless every pair's halves are
// caught up (their last pass read less than a batch, not failing), not held,
// not marked to split, not replaying, at one model version and at two
// cursors: the rest (halves at one cursor, which the hold swaps at once; a
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
	for i, p := range pairs {
		lo, okLo := read[p.lo]
		hi, okHi := read[p.hi]
		if !okLo || !okHi || !holdableUnlocked(lo) || !holdableUnlocked(hi) || lo.version != hi.version || lo.cursor == hi.cursor {
			return false, nil
		}
		holds[i] = latest(lo.cursor, hi.cursor, now)
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
	if err := tx.SendBatch(ctx, writes).Close(); err != nil {
		if !pastHold(err) {
			return false, fmt.Errorf("merge hold: %w", err)
		}
		if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT merge_hold"); err != nil {
			return false, fmt.Errorf("merge hold: %w", err)
		}
		return false, nil // a pass got past the hold meanwhile: hold under the locks
	}
	for i := range pairs {
		pairs[i].hold = holds[i]
	}
	return true, nil
}

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
