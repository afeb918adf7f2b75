package projection

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// Splitting and merging partitions live (docs/scaling.md, "Splitting and
// merging").
//
// A partition is a hash segment (postgres.Segment). A split replaces it by
// its two children, each starting at the parent's cursor: the parent had
// applied every event of both up to there, and none after. A merge replaces
// two siblings by their parent, which is only right when their cursors are
// equal; so a merge first holds both at one position (the hold columns: a
// pass never moves a cursor past its hold, holdBatch; holdPair picks it),
// waits for both to get there, and then swaps the rows. Nothing is
// applied by the command and nothing is applied twice: the alternative, a
// merged cursor at the lower of the two with the events the one ahead had
// applied skipped by segment, would put a second filter on every read.
//
// Every layout change runs under the consumer's fence lock (the advisory
// lock of its unpartitioned row, which registration takes too), so two
// operators, or an operator and a starting dispatcher, never interleave:
// the second re-reads the layout and finds its partitions gone
// (ErrLayoutChanged). Each partition it replaces is locked with its shard
// lock, waiting for a running pass of that partition only; no other
// partition pauses. A change of every partition first closes the consumer's
// layout gate, so it waits for their running passes all at once rather than
// one after another (layoutgate.go). Dead letters and parks move with their
// stream (by its hash) to the child that holds it, and so does a failure
// being retried.

// ErrLayoutChanged is returned by [Admin.Split] and [Admin.Merge] when a
// partition they were to change no longer exists or another merge holds
// it: another operator's split or merge won. It also matches
// [projector.ErrInvalidTransition]; nothing was changed.
var ErrLayoutChanged = errors.New("projection: the consumer's partitions changed meanwhile")

// PartitionChange is one split or merge carried out: From replaced by To,
// which start at Cursor.
type PartitionChange struct {
	From, To []postgres.Segment
	Cursor   projector.Position
}

// String renders the change as status shows partitions: "1/4 -> 2/8 3/8".
func (c PartitionChange) String() string {
	seg := func(ss []postgres.Segment) string {
		out := make([]string, len(ss))
		for i, s := range ss {
			out[i] = s.String()
		}
		return strings.Join(out, " ")
	}
	return seg(c.From) + " -> " + seg(c.To)
}

// layoutChanged is the loser's error of a race between two layout changes.
func layoutChanged(consumer, what string) error {
	return fmt.Errorf("%w (%w): consumer %s: %s; list them with `projector consumer status %s`",
		ErrLayoutChanged, projector.ErrInvalidTransition, projector.Printable(consumer), what, projector.Printable(consumer))
}

type splitSQL struct {
	fence, layout, rows, failedHash, insertChild, moveDeadLetters, moveParks, remove,
	hold, unhold, poll, insertParent, joinDeadLetters, joinParks string
	// A held half's pass that merges at the hold (mergehandoff.go).
	mergeTry, peek, present string
}

func buildSplitSQL(store *postgres.Store) splitSQL {
	out := buildSplitSQLs(store)
	// rows without FOR UPDATE, for a pass that may merge (mergeAtHold): it
	// takes no row lock before its advance, so the sibling's row stays
	// free for the sibling's pass when it does not merge.
	out.peek = strings.TrimSuffix(out.rows, " FOR UPDATE")
	return out
}

func buildSplitSQLs(store *postgres.Store) splitSQL {
	c, s := store.Table("projector_consumers"), store.Schema()
	hash := s + `.projector_stream_hash(tenant_id, stream_type, stream_id)`
	// $2 the parent, $3 the child bits' shift (32 - bits), $4 the count.
	child := `'` + PartitionPrefix + `' || (` + hash + ` >> $3::int)::text || '/' || $4::int::text`
	return splitSQL{
		fence:  `SELECT version, coalesce(last_error, '') FROM ` + c + ` WHERE name = $1 AND instance_id = '` + SharedInstance + `'`,
		layout: `SELECT instance_id FROM ` + c + ` WHERE name = $1 AND instance_id LIKE '` + PartitionPrefix + `%' ORDER BY instance_id`,
		rows: `SELECT instance_id, cursor_tx_id, cursor_seq, status, attempts, coalesce(failed_tx_id, '0'), coalesce(failed_seq, 0),
				hold_tx_id IS NOT NULL, coalesce(hold_tx_id, '0'), coalesce(hold_seq, 0), version, processed, coalesce(owner, ''),
				replay_until_tx_id IS NOT NULL, split_requested_at IS NOT NULL
			FROM ` + c + ` WHERE name = $1 AND instance_id = ANY($2) FOR UPDATE`,
		failedHash: `SELECT ` + hash + ` FROM ` + store.Table("projector_events") + ` WHERE tx_id = $1 AND seq = $2`,
		// $3 the child; $4 whether it carries the parent's failure (the
		// failing event's stream is its), else it starts clean. Both
		// carry the parent's replay mark (an in-place rebuild under way):
		// the parent had handled every event of both up to it.
		insertChild: `INSERT INTO ` + c + ` (name, instance_id, cursor_tx_id, cursor_seq, status, attempts, last_error, last_error_at,
				failed_tx_id, failed_seq, failed_event_id, next_retry_at, version, owner, replay_until_tx_id, replay_until_seq)
			SELECT name, $3, cursor_tx_id, cursor_seq,
				CASE WHEN $4 OR status = 'disabled' THEN status ELSE 'idle' END, CASE WHEN $4 THEN attempts ELSE 0 END,
				CASE WHEN $4 THEN last_error END, CASE WHEN $4 THEN last_error_at END, CASE WHEN $4 THEN failed_tx_id END,
				CASE WHEN $4 THEN failed_seq END, CASE WHEN $4 THEN failed_event_id END, CASE WHEN $4 THEN next_retry_at END,
				version, owner, replay_until_tx_id, replay_until_seq
			FROM ` + c + ` WHERE name = $1 AND instance_id = $2`,
		moveDeadLetters: `UPDATE ` + store.Table("projector_dead_letters") + ` SET instance_id = ` + child + ` WHERE consumer = $1 AND instance_id = $2`,
		moveParks:       `UPDATE ` + store.Table("projector_parks") + ` SET instance_id = ` + child + ` WHERE consumer = $1 AND instance_id = $2`,
		remove:          `DELETE FROM ` + c + ` WHERE name = $1 AND instance_id = ANY($2)`,
		hold:            `UPDATE ` + c + ` SET hold_tx_id = $3, hold_seq = $4 WHERE name = $1 AND instance_id = $2`,
		unhold:          `UPDATE ` + c + ` SET hold_tx_id = NULL, hold_seq = NULL WHERE name = $1 AND instance_id = $2 AND hold_tx_id = $3 AND hold_seq = $4`,
		poll: `SELECT instance_id, cursor_tx_id, cursor_seq, status, attempts, hold_tx_id IS NOT NULL, coalesce(hold_tx_id, '0'), coalesce(hold_seq, 0)
			FROM ` + c + ` WHERE name = $1 AND instance_id = ANY($2)`,
		insertParent: `INSERT INTO ` + c + ` (name, instance_id, cursor_tx_id, cursor_seq, status, processed, version, owner)
			VALUES ($1, $2, $3, $4, 'idle', $5, $6, NULLIF($7, ''))`,
		joinDeadLetters: `UPDATE ` + store.Table("projector_dead_letters") + ` SET instance_id = $2 WHERE consumer = $1 AND instance_id = ANY($3)`,
		joinParks:       `UPDATE ` + store.Table("projector_parks") + ` SET instance_id = $2 WHERE consumer = $1 AND instance_id = ANY($3)`,
		mergeTry:        mergeTrySQL(c),
		// Which of partitions $2 are there (mergeWatch).
		present: `SELECT instance_id FROM ` + c + ` WHERE name = $1 AND instance_id = ANY($2)`,
	}
}

// partRow is a partition's row as a split or merge reads it, locked.
type partRow struct {
	cursor, failedAt, hold projector.Position
	held, replaying        bool
	splitMark              bool // a split handed to its pass (splithandoff.go)
	status                 Status
	attempts, version      int
	processed              int64
	owner                  string
}

// keyedLayoutFixed is the refusal of a split or merge of a consumer
// partitioned by key (a saga): its dead letters and parks belong to
// partitions by their events' keys, which SQL cannot compute to carry them
// to the right half, so its layout stays the one it started with.
func keyedLayoutFixed(consumer string) error {
	return fmt.Errorf("%w: consumer %s is partitioned by key (AsyncConfig.PartitionKey, as sagas are): its partitions are not split or merged live; its partition count stays the one it was first started with",
		projector.ErrInvalidTransition, projector.Printable(consumer))
}

// lockLayout takes consumer's fence lock in tx and returns its partitions.
func (a *Admin) lockLayout(ctx context.Context, tx pgx.Tx, consumer string) ([]postgres.Segment, error) {
	if validName(consumer) != nil {
		return nil, fmt.Errorf("consumer %s: %w", projector.Printable(consumer), projector.ErrNotFound)
	}
	// The lock, the fence's read and the layout's go out in one round trip
	// (a pipeline of three statements, each read with a snapshot taken
	// after the lock is held): every round trip of a layout change is time
	// the partitions it changes stand still.
	var version int
	var note string
	found := true
	var ids []string
	b := &pgx.Batch{}
	b.Queue(a.sql.waitLock, shardLockKey(a.store.Schema(), ShardID{Consumer: consumer, Instance: SharedInstance}))
	b.Queue(a.split.fence, consumer).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&version, &note)
		if errors.Is(err, pgx.ErrNoRows) {
			found = false
			return nil
		}
		return err
	})
	b.Queue(a.split.layout, consumer).Query(func(rows pgx.Rows) error {
		var err error
		ids, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, err
	}
	switch {
	case !found:
		return nil, fmt.Errorf("consumer %s: %w", projector.Printable(consumer), projector.ErrNotFound)
	case version != PartitionedVersion:
		return nil, fmt.Errorf("%w: consumer %s is not partitioned: declare AsyncConfig.Partitions to partition it", projector.ErrInvalidTransition, projector.Printable(consumer))
	case KeyedFenceNote(note):
		return nil, keyedLayoutFixed(consumer)
	}
	var layout []postgres.Segment
	for _, id := range ids {
		if s, ok := partitionSegment(id); ok {
			layout = append(layout, s)
		}
	}
	return layout, nil
}

// lockPartitions waits, in tx, for a running pass of each partition of
// segs, in PartitionOrder (LockPartitions: the order every holder of
// several partitions' locks takes them in, whatever order segs are named
// in), before any of their rows is read. With gate (segs are every
// partition of the consumer) it first closes the consumer's layout gate, so
// it waits for the running passes all at once (layoutgate.go). The rows are
// read FOR UPDATE, which gives tx a transaction id: taken while tx still
// waited for another partition's running batch, that id would hold back the
// horizon of every consumer (promise 3), so every other partition would
// pause until that batch ended. Waiting for every lock first keeps a split
// or merge from pausing any partition it does not change.
func (a *Admin) lockPartitions(ctx context.Context, tx pgx.Tx, consumer string, gate bool, segs ...postgres.Segment) error {
	ids := make([]string, len(segs))
	for i, s := range segs {
		ids[i] = segmentInstance(s)
	}
	return lockPartitionsGated(ctx, tx, a.store, consumer, gate, ids)
}

// pairSegments returns the halves of every pair, to lock them at once.
func pairSegments(pairs []mergePair) []postgres.Segment {
	out := make([]postgres.Segment, 0, 2*len(pairs))
	for _, p := range pairs {
		out = append(out, p.lo, p.hi)
	}
	return out
}

// readPartitions waits for a running pass of each partition of segs (in
// PartitionOrder, or all at once behind the gate: lockPartitions), then
// reads and locks their rows in one statement. A partition whose row is
// gone is missing from the map.
func (a *Admin) readPartitions(ctx context.Context, tx pgx.Tx, consumer string, gate bool, segs ...postgres.Segment) (map[postgres.Segment]partRow, error) {
	if err := a.lockPartitions(ctx, tx, consumer, gate, segs...); err != nil {
		return nil, err
	}
	ids := make([]string, len(segs))
	for i, s := range segs {
		ids[i] = segmentInstance(s)
	}
	rows, err := tx.Query(ctx, a.split.rows, consumer, ids)
	if err != nil {
		return nil, err
	}
	return scanPartRows(rows)
}

// scanPartRows reads the partitions' rows of a splitSQL.rows query (or
// mergeHandOffSQL.rows) by segment.
func scanPartRows(rows pgx.Rows) (map[postgres.Segment]partRow, error) {
	out := map[postgres.Segment]partRow{}
	var id string
	var r partRow
	_, err := pgx.ForEachRow(rows, []any{&id, &r.cursor.TxID, &r.cursor.Seq, &r.status, &r.attempts, &r.failedAt.TxID, &r.failedAt.Seq,
		&r.held, &r.hold.TxID, &r.hold.Seq, &r.version, &r.processed, &r.owner, &r.replaying, &r.splitMark}, func() error {
		if s, ok := partitionSegment(id); ok {
			out[s] = r
		}
		return nil
	})
	return out, err
}

// Split splits partitions of consumer in two, each child starting at its
// parent's cursor: the partitions only names (each must exist), or every
// partition when none is named. A partition of 1/[postgres.MaxPartitions]
// of the streams cannot split. It returns the splits done.
//
// When a live dispatcher runs every one of them (healthy, not held for a
// merge, not replaying), Split marks them and each partition's own pass
// splits it at the end of its batch, so nothing waits for a running batch
// (splithandoff.go); Split returns once every one is split, each in its
// own commit, the Cursor of each change then being where its halves stood
// when Split saw them (at or after where they started). Those the passes
// have not split within 5 s it splits itself. Otherwise it splits them
// all in one transaction, waiting for their running batches, and an error
// changes nothing; after a hand-off an error lifts the marks left, and
// names the splits the passes made before it.
func (a *Admin) Split(ctx context.Context, consumer string, only ...postgres.Segment) ([]PartitionChange, error) {
	var out []PartitionChange
	var marked []postgres.Segment
	handed := false
	err := a.inTx(ctx, func(tx pgx.Tx) error {
		out, marked, handed = nil, nil, false
		layout, err := a.lockLayout(ctx, tx, consumer)
		if err != nil {
			return err
		}
		targets := layout
		if len(only) > 0 {
			targets = only
		}
		for _, s := range targets {
			if !slices.Contains(layout, s) {
				return layoutChanged(consumer, "it has no partition "+s.String())
			}
			if _, _, ok := s.Children(); !ok {
				return fmt.Errorf("%w: consumer %s partition %s holds one bucket of the partition index (1/%d of the streams): it cannot split further",
					projector.ErrInvalidTransition, projector.Printable(consumer), s, postgres.MaxPartitions)
			}
		}
		// A live dispatcher running every one of them splits each at the
		// end of its own batch (splithandoff.go): nothing waits for a
		// running batch. The marks commit with them (errTxDone).
		if handed, err = a.splitHandedOff(ctx, tx, consumer, targets); err != nil || handed {
			marked = targets
			return err
		}
		out, err = a.splitMany(ctx, tx, consumer, targets, true, everyPartition(layout, targets))
		return err
	})
	if err != nil {
		a.notifyAborted(ctx, consumer)
		return nil, fmt.Errorf("split consumer %s: %w", projector.Printable(consumer), err)
	}
	if handed {
		if out, err = a.handedOffSplit(ctx, consumer, marked); err != nil {
			return nil, fmt.Errorf("split consumer %s: %w", projector.Printable(consumer), err)
		}
	}
	return out, nil
}

// splitMany replaces each partition of segs by its two children in tx
// (each must have children): it waits for the running pass of every one
// of them before it reads any of their rows (readPartitions), and writes
// the children, the dead letters' and parks' moves and the parents'
// removal in one round trip, with the layout NOTIFY when notify is set.
// gate says segs are every partition of the consumer: it waits for their
// running passes behind the layout gate (layoutgate.go).
func (a *Admin) splitMany(ctx context.Context, tx pgx.Tx, consumer string, segs []postgres.Segment, notify, gate bool) ([]PartitionChange, error) {
	rows, err := a.readPartitions(ctx, tx, consumer, gate, segs...)
	if err != nil {
		return nil, err
	}
	out := make([]PartitionChange, 0, len(segs))
	writes := &pgx.Batch{}
	parents := make([]string, 0, len(segs))
	for _, s := range segs {
		r, ok := rows[s]
		switch {
		case !ok:
			return nil, layoutChanged(consumer, "partition "+s.String()+" was split or merged meanwhile")
		case r.held:
			return nil, layoutChanged(consumer, "partition "+s.String()+" is held for a merge under way (`consumer merge` finishes it)")
		}
		lo, hi, _ := s.Children()
		// A failure being retried (or dead) goes with the failing event's
		// stream; the other child starts clean at the same cursor.
		carryLo, carryHi := true, true
		if r.failedAt != projector.Start {
			var h int64
			err := tx.QueryRow(ctx, a.split.failedHash, r.failedAt.TxID, r.failedAt.Seq).Scan(&h)
			switch {
			case errors.Is(err, pgx.ErrNoRows): // not found (archived): both keep it, to be retried
			case err != nil:
				return nil, err
			default:
				carryLo, carryHi = lo.Contains(uint32(h)), hi.Contains(uint32(h))
			}
		} else {
			carryLo, carryHi = false, false
		}
		parent := segmentInstance(s)
		writes.Queue(a.split.insertChild, consumer, parent, segmentInstance(lo), carryLo)
		writes.Queue(a.split.insertChild, consumer, parent, segmentInstance(hi), carryHi)
		shift, count := 32-int(lo.Bits), lo.Count()
		writes.Queue(a.split.moveDeadLetters, consumer, parent, shift, count)
		writes.Queue(a.split.moveParks, consumer, parent, shift, count)
		parents = append(parents, parent)
		out = append(out, PartitionChange{From: []postgres.Segment{s}, To: []postgres.Segment{lo, hi}, Cursor: r.cursor})
	}
	writes.Queue(a.split.remove, consumer, parents)
	if notify {
		queueNotifyLayout(writes, a.store, consumer)
	}
	if err := tx.SendBatch(ctx, writes).Close(); err != nil {
		return nil, err
	}
	return out, nil
}

// mergePair is two siblings to merge and the hold they wait at.
type mergePair struct {
	parent, lo, hi postgres.Segment
	hold           projector.Position
	// atOnce: its halves stood at one cursor when the command held them,
	// and it was swapped in the hold's transaction (mergeAtOnce).
	atOnce bool
}

func (p mergePair) ids() []string { return []string{segmentInstance(p.lo), segmentInstance(p.hi)} }

// Merge merges pairs of sibling partitions of consumer into their parents:
// the pair of each partition only names (with its sibling, which must
// exist), or every pair whose two halves exist when none is named. It holds
// each pair at a position of its own: without the halves' locks when every
// pair is caught up (holdUnlocked), so it waits for no running batch;
// otherwise under them (holdPair), and a pair whose halves stand at one
// cursor already is swapped in the same transaction (mergeAtOnce).
// For the others it waits up to wait for both halves to stand at their
// hold (a dispatcher running the consumer brings them: nothing is applied
// by Merge). The pass of the half there second swaps the pair
// for its parent in its own commit (mergehandoff.go); Merge swaps, in one
// transaction, the pairs whose halves both stand at the hold and which no
// pass swapped (a dispatcher of an older release never does). It returns
// the merges done, the Cursor of each its hold. On timeout or cancellation
// it lifts the holds of the pairs not merged; when the passes had merged
// some, the error names them (a merge of several pairs is not all or
// nothing). Cancelled, it stops between its statements (one under way is
// given 5 s to finish: cut midway, it would close the connection through
// which the holds are lifted) and returns an error matching the context's;
// a swap under way when ctx is cancelled that commits is a merge done. A
// process killed outright leaves its holds: running the merge again
// finishes it.
func (a *Admin) Merge(ctx context.Context, consumer string, wait time.Duration, only ...postgres.Segment) ([]PartitionChange, error) {
	// The command's claims on its pairs, held until it returns (claimPairs).
	conn, err := a.store.Pool().Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("merge consumer %s: %w", projector.Printable(consumer), err)
	}
	defer releaseClaims(ctx, conn)
	pairs, err := a.holdPairs(ctx, conn, consumer, only)
	if err != nil {
		a.notifyAbortedOn(ctx, a.claimsConn(conn), consumer)
		return nil, fmt.Errorf("merge consumer %s: %w", projector.Printable(consumer), err)
	}
	all := pairs
	pairs = slices.DeleteFunc(slices.Clone(pairs), func(p mergePair) bool { return p.atOnce })
	every := func() []PartitionChange {
		out := make([]PartitionChange, len(all))
		for i, p := range all {
			out[i] = p.change()
		}
		return out
	}
	if len(pairs) == 0 {
		return every(), nil // every pair at one cursor, swapped with its hold
	}
	merged, err := a.awaitHolds(ctx, conn, consumer, pairs, wait)
	if err != nil {
		if uerr := a.unholdFenced(ctx, conn, consumer, all); uerr != nil {
			err = errors.Join(err, uerr)
		}
		return nil, fmt.Errorf("merge consumer %s: %w", projector.Printable(consumer), err)
	}
	if !slices.Contains(merged, false) {
		return every(), nil // every other pair by its passes
	}
	// The swap runs on to its end when the caller cancels meanwhile
	// (within mergeGrace): cut midway, it would close the claims'
	// connection, through which the holds are lifted if it fails.
	swapCtx, stopSwap := graceful(ctx)
	defer stopSwap()
	err = pgx.BeginFunc(swapCtx, conn, func(tx pgx.Tx) error {
		ctx := swapCtx
		layout, err := a.lockLayout(ctx, tx, consumer)
		if err != nil {
			return err
		}
		// Under the fence no pass swaps: a pair its pass swapped since
		// the look is merged, the others are the command's to swap.
		ids := make([]string, 0, len(layout))
		for _, s := range layout {
			ids = append(ids, segmentInstance(s))
		}
		done := mergedPairs(pairs, ids)
		var rest []mergePair
		for i, p := range pairs {
			if !done[i] && !merged[i] {
				rest = append(rest, p)
			}
		}
		if len(rest) == 0 {
			return nil
		}
		halves := pairSegments(rest)
		rows, err := a.readPartitions(ctx, tx, consumer, everyPartition(layout, halves), halves...)
		if err != nil {
			return err
		}
		writes := &pgx.Batch{}
		for _, p := range rest {
			if _, err := a.mergeOne(consumer, p, rows, writes); err != nil {
				return err
			}
		}
		queueNotifyLayout(writes, a.store, consumer)
		return tx.SendBatch(ctx, writes).Close()
	})
	if err != nil {
		if !errors.Is(err, ErrLayoutChanged) {
			if uerr := a.unholdFenced(ctx, conn, consumer, all); uerr != nil {
				err = errors.Join(err, uerr)
			}
		}
		a.notifyAbortedOn(ctx, a.claimsConn(conn), consumer)
		return nil, fmt.Errorf("merge consumer %s: %w", projector.Printable(consumer), err)
	}
	return every(), nil
}

// holdPairs picks the pairs to merge and holds each (holdUnlocked, or
// holdPair under the halves' locks), in one transaction, and claims each
// pair for this command
// (claimPairs): a pair another merge command is merging is refused at
// once, so of two operators merging at once one wins (promise 10).
//
// A cancellation during its statements rolls it back (nothing held), but
// not during its COMMIT, which could then have held the pairs with the
// command told it failed, its claims' connection closed: the commit runs
// on to its end (within mergeGrace), and the command, cancelled, lifts the
// holds (awaitHolds looks at its context first).
func (a *Admin) holdPairs(ctx context.Context, conn *pgxpool.Conn, consumer string, only []postgres.Segment) ([]mergePair, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return nil, err
	}
	pairs, err := a.holdPairsIn(ctx, tx, consumer, only)
	if err != nil {
		_ = tx.Rollback(ctx)
		return nil, err
	}
	commit, stop := graceful(ctx)
	defer stop()
	if err := tx.Commit(commit); err != nil {
		return nil, err
	}
	return pairs, nil
}

// holdPairsIn is holdPairs's transaction, tx.
func (a *Admin) holdPairsIn(ctx context.Context, tx pgx.Tx, consumer string, only []postgres.Segment) ([]mergePair, error) {
	var pairs []mergePair
	err := func() error {
		layout, err := a.lockLayout(ctx, tx, consumer)
		if err != nil {
			return err
		}
		if len(only) > 0 {
			for _, s := range only {
				parent, ok := s.Parent()
				if !ok {
					return fmt.Errorf("%w: partition %s holds every stream: nothing to merge", projector.ErrInvalidTransition, s)
				}
				lo, hi, _ := parent.Children()
				if !slices.Contains(layout, lo) || !slices.Contains(layout, hi) {
					return layoutChanged(consumer, fmt.Sprintf("it has no partitions %s and %s to merge into %s", lo, hi, parent))
				}
				if !slices.ContainsFunc(pairs, func(p mergePair) bool { return p.parent == parent }) {
					pairs = append(pairs, mergePair{parent: parent, lo: lo, hi: hi})
				}
			}
		} else {
			for _, lo := range layout {
				parent, ok := lo.Parent()
				if _, hi, _ := parent.Children(); ok && lo.Value%2 == 0 && slices.Contains(layout, hi) {
					pairs = append(pairs, mergePair{parent: parent, lo: lo, hi: hi})
				}
			}
			if len(pairs) == 0 {
				return fmt.Errorf("%w: consumer %s has no two sibling partitions to merge", projector.ErrInvalidTransition, projector.Printable(consumer))
			}
		}
		if err := a.claimPairs(ctx, tx, consumer, pairs); err != nil {
			return err
		}
		writes := &pgx.Batch{}
		if held, err := a.holdUnlocked(ctx, tx, consumer, pairs); err != nil || held {
			if err == nil {
				queueNotifyLayout(writes, a.store, consumer)
				err = tx.SendBatch(ctx, writes).Close()
			}
			return err
		}
		halves := pairSegments(pairs)
		rows, err := a.readPartitions(ctx, tx, consumer, everyPartition(layout, halves), halves...)
		if err != nil {
			return err
		}
		now, err := holdNow(ctx, tx)
		if err != nil {
			return err
		}
		for i := range pairs {
			if err := a.holdPair(consumer, &pairs[i], rows, now, writes); err != nil {
				return err
			}
			if pairs[i].atOnce, err = a.mergeAtOnce(consumer, pairs[i], rows, writes); err != nil {
				return err
			}
		}
		// The halves' passes that found their locks taken here wait a
		// Recheck before they try again; the one behind must not. The
		// pairs swapped at once: their parents start at the NOTIFY.
		queueNotifyLayout(writes, a.store, consumer)
		return tx.SendBatch(ctx, writes).Close()
	}()
	return pairs, err
}

// holdNow returns the horizon as tx sees it now, once it holds the
// halves' locks (readPartitions): every event below it is final, so a half
// reaches it on its next pass whatever transaction is still open, and no
// cursor is past it, since every pass read below a horizon no later than
// this one (the oldest running transaction id only moves forward) and no
// pass of the halves runs while tx holds their locks. Every event
// committed before the hold, and before any transaction still open then,
// lies below it.
func holdNow(ctx context.Context, tx pgx.Tx) (projector.Position, error) {
	var xmin string
	if err := tx.QueryRow(ctx, holdHorizonSQL).Scan(&xmin); err != nil {
		return projector.Position{}, fmt.Errorf("merge hold: %w", err)
	}
	return parseHorizon(xmin)
}

// holdPair picks p's hold from both halves' rows (read and locked) and
// queues setting it on writes. Halves at the same cursor are held there:
// the swap follows at once, with no pass of either (no dispatcher need
// run). Otherwise, when both halves are caught up (their last pass read
// less than a batch), the hold is now (holdNow), not the cursor of the one
// ahead: each goes on to apply what was committed while the merge waited
// for their running batches, within about a batch of where they stand,
// instead of the half ahead standing still from the moment the merge
// locked it. A half behind by a backlog gets the cursor of the one ahead,
// as before, so the merge does not wait for both to catch up with the
// whole log.
func (a *Admin) holdPair(consumer string, p *mergePair, read map[postgres.Segment]partRow, now projector.Position, writes *pgx.Batch) error {
	var rows [2]partRow
	for i, s := range []postgres.Segment{p.lo, p.hi} {
		r, ok := read[s]
		if !ok {
			return layoutChanged(consumer, "partition "+s.String()+" was split or merged meanwhile")
		}
		if err := mergeable(consumer, s, r); err != nil {
			return err
		}
		if r.splitMark {
			return layoutChanged(consumer, "partition "+s.String()+" is to split (a `consumer split` under way)")
		}
		if r.replaying {
			// Each half replays its own streams up to its own mark; the
			// parent has one cursor and one mark for both, which would
			// count some of one half's events as replays they are not.
			return fmt.Errorf("%w: consumer %s partition %s replays an in-place rebuild (or the events it handled past a blue/green switch's cursor): merge once its replay is done",
				projector.ErrInvalidTransition, projector.Printable(consumer), s)
		}
		rows[i] = r
	}
	switch {
	case rows[0].held && rows[1].held && rows[0].hold == rows[1].hold:
		p.hold = rows[0].hold // another merge of the same pair is waiting
	case rows[0].version != rows[1].version:
		return fmt.Errorf("%w: partitions %s and %s are at model versions %d and %d", projector.ErrInvalidTransition, p.lo, p.hi, rows[0].version, rows[1].version)
	default:
		p.hold = latest(rows[0].cursor, rows[1].cursor)
		if rows[0].cursor != rows[1].cursor && caughtUp(rows[0]) && caughtUp(rows[1]) {
			p.hold = latest(p.hold, now)
		}
		for _, r := range rows {
			if r.held {
				p.hold = latest(p.hold, r.hold)
			}
		}
	}
	for _, id := range p.ids() {
		writes.Queue(a.split.hold, consumer, id, p.hold.TxID, p.hold.Seq)
	}
	return nil
}

// caughtUp reports whether a partition's last pass read less than a full
// batch (status idle, not failing).
func caughtUp(r partRow) bool { return r.status == StatusIdle && r.attempts == 0 }

// latest returns the latest of positions.
func latest(ps ...projector.Position) projector.Position {
	var out projector.Position
	for _, p := range ps {
		if out.Less(p) {
			out = p
		}
	}
	return out
}

// mergeable refuses to merge a partition that is failing, dead or disabled:
// it would not catch up, and its failure has no single place in the parent.
func mergeable(consumer string, s postgres.Segment, r partRow) error {
	if (r.status != StatusIdle && r.status != StatusProcessing) || r.attempts > 0 {
		return &TransitionError{Shard: ShardID{Consumer: consumer, Instance: segmentInstance(s)}, Op: "merge", From: r.status,
			Allowed: []Status{StatusIdle, StatusProcessing},
			Detail:  "a failing, dead or disabled partition cannot merge: restart, skip or enable it first"}
	}
	return nil
}

// mergeOne queues on writes the swap of pair p for its parent, both halves
// standing at the hold in read (their rows, read and locked).
func (a *Admin) mergeOne(consumer string, p mergePair, read map[postgres.Segment]partRow, writes *pgx.Batch) (PartitionChange, error) {
	var rows [2]partRow
	for i, s := range []postgres.Segment{p.lo, p.hi} {
		r, ok := read[s]
		switch {
		case !ok:
			return PartitionChange{}, layoutChanged(consumer, "partition "+s.String()+" was merged or split meanwhile")
		case !r.held || r.hold != p.hold || r.cursor != p.hold:
			return PartitionChange{}, layoutChanged(consumer, fmt.Sprintf("partition %s left its hold %s (at %s)", s, p.hold, r.cursor))
		}
		if err := mergeable(consumer, s, r); err != nil {
			return PartitionChange{}, err
		}
		rows[i] = r
	}
	parent := segmentInstance(p.parent)
	writes.Queue(a.split.insertParent, consumer, parent, p.hold.TxID, p.hold.Seq,
		rows[0].processed+rows[1].processed, rows[0].version, rows[0].owner)
	writes.Queue(a.split.joinDeadLetters, consumer, parent, p.ids())
	writes.Queue(a.split.joinParks, consumer, parent, p.ids())
	writes.Queue(a.split.remove, consumer, p.ids())
	return p.change(), nil
}
