package projection

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// A merge swapped by the pass of the half that reaches the hold second
// (docs/scaling.md, "Splitting and merging live").
//
// A merge holds both halves at one position (split.go). The command used to
// swap them for their parent itself, once its look (every holdPoll) found
// both there: the half there first stood still until that look, the swap's
// transaction (behind the layout gate when every partition merges) and the
// NOTIFY's balancing round, and the parent's first pass started from
// nothing. Now the pass of a held half whose batch ends at its hold (or
// which stands at it already, so that two halves arriving at once in two
// processes still merge) tries, in one round trip before its commit and
// without waiting, the consumer's fence lock (shared, as a splitting pass
// does) and its sibling's shard lock, and reads both rows under them; it
// tries them only when the sibling stands at the hold (a sibling refused
// its own lock would stand aside until a wake) and a merge command holds
// its claim on the pair (claimPairs: no pass finishes a merge that was
// killed, or one of an older release's command, which swaps itself). When
// its own row is still held at the hold it read at its start and its
// sibling stands at the same hold, mergeable, it pipelines after its
// cursor advance the command's own swap (mergeOne: the parent's row at the
// hold, the dead letters' and parks' join, the halves' removal) and the
// layout NOTIFY, then the COMMIT: the last batch of the half there second
// and the merge are one commit. The dispatcher that made it starts the
// parent's loop at once, owned by it, and ends its half's (and the
// sibling's, when it runs it too); a sibling run by another process finds
// its row gone at its next pass and stops, as after the command's swap.
//
// Exclusion: both halves' cursors stand at the hold and neither can move
// (the pass holds both shard locks), so the parent at the hold applies
// every event of both exactly once. The fence, held shared, excludes a
// command (which takes it exclusively): one that lifts the holds after its
// wait (unholdFenced) or swaps itself never interleaves with a swapping
// pass, and the pass reads the rows only once it holds the fence. Anything
// refused (a lock taken, the sibling not there yet, a failure) leaves the
// merge to a later pass or to the command; a pass never waits for a lock.
//
// The command still swaps what the passes did not (a dispatcher of an
// older release never swaps, and two passes trying each other's locks at
// once both give up): it races them under the locks. Its look counts a
// pair whose parent is there and whose halves are gone as merged, and so
// does its swap transaction, which reads the layout under the fence.

// mayMerge reports whether sh's pass may swap its partition and its
// sibling for their parent: the shard kinds a merge holds.
func (sh *shard) mayMerge() bool {
	if sh.balancer == nil || sh.shadow != nil || sh.keyed() {
		return false
	}
	_, ok := sh.segment.Parent()
	return ok
}

// mergeAtEnd is a pass's swap of its held partition and its sibling, made
// in its own commit (see above).
type mergeAtEnd struct {
	pair  mergePair
	swap  *pgx.Batch // the command's statements (mergeOne) and the NOTIFY
	child PartitionChange
	// first is the parent's first read (at the hold, in its segment),
	// begun as soon as the swap committed (startParent).
	first postgres.LogQuery
}

// mergeAtHold tries, in tx (the pass of sh, which read st at its start
// and is to commit its cursor at next with status, having applied
// processed events), the swap of sh's partition and its sibling for their
// parent. It returns nil when this pass does not merge: not held, not at
// its hold after this batch, a lock taken, the sibling not at the hold, or
// either not mergeable. An error is the database's.
func (d *Dispatcher) mergeAtHold(ctx context.Context, tx pgx.Tx, sh *shard, st shardRow, next projector.Position, status Status, processed int) (*mergeAtEnd, error) {
	retrying := sh.holdBusy // its last look asked for another soon (see below)
	if !retrying {
		sh.holdBusySince = time.Time{} // a new wait for a busy sibling starts at its first refusal
	}
	sh.holdBusy = false
	if !st.held || next != st.hold || st.replayUntil != projector.Start || !sh.mayMerge() {
		return nil, nil
	}
	if st.cursor == st.hold && upperHalf(sh) && !retrying {
		return nil, nil // standing at the hold: its lower half looks (lowerLooks)
	}
	parent, _ := sh.segment.Parent()
	lo, hi, _ := parent.Children()
	sibling := lo
	if sibling == sh.segment {
		sibling = hi
	}
	p := mergePair{parent: parent, lo: lo, hi: hi, hold: st.hold}
	siblingKey := shardLockKey(d.store.Schema(), ShardID{Consumer: sh.id.Consumer, Instance: segmentInstance(sibling)})
	var try int
	var rows map[postgres.Segment]partRow
	b := &pgx.Batch{}
	b.Queue(d.admin.split.mergeTry, d.fenceKey(sh), siblingKey, sh.id.Consumer, segmentInstance(sibling), st.hold.TxID, st.hold.Seq,
		mergeClaimKey(d.store.Schema(), sh.id.Consumer, parent)).QueryRow(func(row pgx.Row) error { return row.Scan(&try) })
	// A statement of its own, so its snapshot follows the locks.
	b.Queue(d.admin.split.peek, sh.id.Consumer, p.ids()).Query(func(r pgx.Rows) error {
		var err error
		rows, err = scanPartRows(r)
		return err
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("merge at the hold: %w", err)
	}
	// Look again soon (atHold, holdRetry): the sibling at the hold too,
	// its lock taken; or, for the upper half just arriving, the sibling
	// not seen there (it may be arriving at once, its look before this
	// pass's commit: the upper half looks once more after it, lowerLooks).
	sh.holdBusy = try == mergeTrySiblingBusy || (try == mergeTryNotYet && upperHalf(sh) && st.cursor != st.hold)
	if try != mergeTryLocked {
		return nil, nil // the sibling not there, the fence (a command) or the sibling's pass: a later pass or the command merges
	}
	own, ok := rows[sh.segment]
	if !ok || !own.held || own.hold != st.hold || own.cursor != st.cursor {
		return nil, nil // a command lifted the hold since the pass began
	}
	if sib, ok := rows[sibling]; !ok || sib.replaying || sib.splitMark {
		return nil, nil
	}
	// This row as the advance leaves it; the parent is this process's,
	// which starts its loop at once (startParent).
	own.cursor, own.status, own.attempts = next, status, 0
	own.processed += int64(processed)
	rows[sh.segment] = own
	for s, r := range rows {
		r.owner = d.instance
		rows[s] = r
	}
	swap := &pgx.Batch{}
	change, err := d.admin.mergeOne(sh.id.Consumer, p, rows, swap)
	if err != nil {
		return nil, nil // the sibling is not at the hold yet, or not mergeable: the command decides
	}
	queueNotifyLayout(swap, d.store, sh.id.Consumer)
	first := postgres.LogQuery{After: p.hold, Limit: sh.proj.cfg.BatchSize, EventTypes: sh.proj.t.types, Raw: true,
		Partition: parent, IncludeArchived: st.archived}
	return &mergeAtEnd{pair: p, swap: swap, child: change, first: first}, nil
}

// mergeTrySQL is splitSQL.mergeTry, over consumers table c. A try goes
// through only when the sibling ($4) stands at the hold ($5, $6) as the
// statement sees it: the fence shared ($1), then, only when it was free,
// the sibling's shard lock ($2), neither waited for. A sibling not there
// yet keeps its lock: its own pass, refused it, would stand aside until a
// wake (passLocked). And only while a merge command of this release holds
// its claim on the pair ($7, claimPairs): the passes finish a merge for a
// command waiting for it, not one killed (its holds wait for it to be run
// again) nor one of an older release (which swaps itself, and would take a
// pass's swap for another's). The answer says how far it got (the
// mergeTry constants): 0 the sibling not at the hold or no claim, 1 the
// fence refused (a command holds it), 2 the sibling's lock refused (its
// pass, at the hold too, runs), 3 both held. CASE tries the locks in that
// order, each only when the conditions before it hold.
//
// The claim is looked for twice: before the locks, so that a pass with no
// command to finish for takes none, and again once both are held, the
// look that decides. With the first alone, a command killed between it and
// the lock tries (and the sibling's pass giving its lock back meanwhile)
// had its merge finished for it, which its claim is there to prevent
// (TestMergeTryLooksForTheClaimUnderTheLocks). Each look reads pg_locks
// anew (an InitPlan is evaluated when CASE first needs it); a command that
// dies after the second look died after the merge, as far as anyone can
// tell. A claim gone by the second look leaves the locks held until the
// pass commits, which it does at once.
func mergeTrySQL(c string) string {
	// A merge command's claim ($7, claimPairs), held by any session.
	claimHeld := `SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
				AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
				AND ((l.classid::bigint << 32) | l.objid::bigint) = hashtextextended($7::text, 0)`
	return `SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM ` + c + ` WHERE name = $3 AND instance_id = $4
			AND hold_tx_id = $5 AND hold_seq = $6 AND cursor_tx_id = $5 AND cursor_seq = $6) THEN 0
		WHEN NOT EXISTS (` + claimHeld + `) THEN 0
		WHEN NOT pg_try_advisory_xact_lock_shared(hashtextextended($1::text, 0)) THEN 1
		WHEN NOT pg_try_advisory_xact_lock(hashtextextended($2::text, 0)) THEN 2
		WHEN NOT EXISTS (` + claimHeld + `) THEN 0
		ELSE 3 END`
}

// What a merge try (splitSQL.mergeTry) got to.
const (
	mergeTryNotYet      = iota // the sibling not at the hold, or no command's claim
	mergeTryFenced             // a command holds the fence
	mergeTrySiblingBusy        // the sibling stands at the hold, its lock taken (its pass runs)
	mergeTryLocked             // the fence and the sibling's lock held: merge
)

// Two halves standing at their hold are woken together (a layout NOTIFY,
// another pair's swap), and their passes, each holding its own lock, try
// each other's at once and both find it taken; each then waited for the
// next wake, which woke both again. A half refused so looks again after
// holdPoll, jittered (the two then part), while its sibling stands at the
// hold and for holdBusyFor at most: a sibling's lock held longer is not a
// pass at the hold but a running batch elsewhere (a rebuild, an older
// release) or a command, which swaps the pair itself.
const holdBusyFor = 2 * time.Second

// lowerLooks: of two halves standing at their hold, only the lower one
// looks for the merge when woken. Every swap of another pair wakes every
// partition of the consumer (its NOTIFY's balancing round), so the two
// halves of a pair still standing there ran a pass each at the same
// moment, each held its own lock and tried its sibling's, and both were
// refused; woken again by the next pair's swap, they collided again (a
// traced merge of one dispatcher: a pair refusing each other for 40 ms,
// until the command's grace ran out and it swapped the pair itself, its
// parent started at the next balancing round, 120 ms after the command's
// start). Now the upper half looks only when its pass brings it to the
// hold (the second to get there swaps), once more after that when it
// found its sibling not there (the two may have arrived at once, each
// look before the other's commit), and when its last look was refused
// (holdRetry: these after the lower half's own retry). Standing there
// otherwise, it is passed by the balancing round's wakes (standing,
// wakeOwned): each of its passes would take its lock for a few round
// trips, in the way of its lower half's look. A lifted hold wakes both
// halves by name (unholdFenced), as their removal or a change of owner
// does. Nothing waits on the upper half alone: the lower half, refused,
// looks again after holdPoll; found not at the hold by the upper half's
// looks, it arrives later and swaps itself; and the command swaps a pair
// its passes leave (passesGrace).
//
// upperHalf reports whether sh is the upper half of its pair.
func upperHalf(sh *shard) bool { return sh.segment.Value%2 == 1 }

// holdRetry gives a pass of sh that atHold sent to look again soon
// (passRetryAt) its time: the lower half of the pair after holdPoll,
// jittered, the upper half upperDefers later. With the same jitter for
// both, the two looks of a pair still overlapped often enough to refuse
// each other again, poll after poll (five looks and 40 ms in a traced
// merge); now the lower half's look, a pass of a few milliseconds, has
// usually merged the pair before the upper half's comes, and the upper
// half still looks, should the lower half not merge (a process of an
// older release, a lock held by something else).
func holdRetry(sh *shard, res passResult) passResult {
	if res.kind == passRetryAt && sh.holdBusy {
		wait := holdPoll/2 + rand.N(holdPoll)
		if upperHalf(sh) {
			wait += upperDefers
		}
		res.retryAt = time.Now().Add(wait)
		// Not cut short by a wake: the swap of another pair wakes
		// both halves at once, and their looks would collide again.
		res.quiet = true
	}
	return res
}

// upperDefers is how much later than its lower half the upper half of a
// pair refused each other's lock at their hold looks again (holdRetry).
const upperDefers = 2 * holdPoll

// atHold is the kind of a pass of sh that did not merge (kind otherwise):
// one that brought its half to the hold looks again at once (its sibling's
// running pass may have refused it its lock: now it is free, or the
// sibling's own look merges); one that stood there already waits for a
// shard wake (a layout NOTIFY: a merge's swap, a lifted hold) or Recheck,
// not for every new event, which it could not apply: a half standing at
// its hold would otherwise run a pass for each, holding its lock, and the
// pass of its sibling arriving then would find that lock taken.
func atHold(sh *shard, st shardRow, next projector.Position, kind passKind) passKind {
	switch {
	case !st.held || next != st.hold || !sh.mayMerge() || kind != passCaughtUp:
		return kind
	case sh.holdBusy:
		// Its sibling at the hold too, its lock taken by its pass: look
		// again soon (holdRetry), for holdBusyFor at most.
		if sh.holdBusySince.IsZero() {
			sh.holdBusySince = time.Now()
		}
		if time.Since(sh.holdBusySince) < holdBusyFor {
			return passRetryAt
		}
		return passAtHold
	case st.cursor != st.hold && !upperHalf(sh):
		// Just arrived, its sibling not seen there: it may have arrived
		// at once, its look run before this pass's commit. The lower
		// half looks again at once (the upper one after it, holdBusy).
		return passMore
	default:
		return passAtHold
	}
}

// atEnd returns what advanceCommit queues after the cursor advance of a
// pass that splits or merges its partition, nil for one that does neither.
func (d *Dispatcher) atEnd(sh *shard, split bool, m *mergeAtEnd) func(*pgx.Batch) {
	if m != nil {
		return func(b *pgx.Batch) { b.QueuedQueries = append(b.QueuedQueries, m.swap.QueuedQueries...) }
	}
	return d.splitSelf(sh, split)
}

// changedAtEnd starts, once sh's pass committed its split or merge, the
// loops of the partitions that replace sh's.
func (d *Dispatcher) changedAtEnd(ctx context.Context, sh *shard, split bool, m *mergeAtEnd) {
	if m != nil {
		// Info, as the balancing rounds' lines are: the partitions this
		// process runs changed outside a round.
		d.logger.InfoContext(ctx, "projection dispatcher: partitions merged by the pass of the half that reached the hold second",
			slog.String("consumer", sh.id.Consumer), slog.String("merged", m.pair.lo.String()+" "+m.pair.hi.String()),
			slog.String("into", m.pair.parent.String()), slog.String("cursor", m.pair.hold.String()))
		d.startParent(ctx, sh, m)
	} else if split {
		lo, hi, _ := sh.segment.Children()
		d.logger.InfoContext(ctx, "projection dispatcher: partition split by its pass",
			slog.String("consumer", sh.id.Consumer), slog.String("partition", sh.segment.String()),
			slog.String("into", lo.String()+" "+hi.String()))
		d.startHalves(sh)
	}
}

// startParent, once sh's pass committed its merge, ends sh's loop (its pass
// returns passGone) and its sibling's when this dispatcher runs it, and
// starts the parent's at once in this dispatcher, which owns it (the row
// names it): the layout NOTIFY's balancing round then finds it running. A
// round that read the layout before the commit leaves it so (balancer.local).
//
// The parent's first read (m.first, from the hold) is begun here, on a
// connection of its own, while its loop starts and its first pass takes its
// lock and reads its state: that pass finds it read (takePrefetch), as a
// split's halves find theirs. Unlike a prefetch taken while a pass applies,
// it is used even when it is not a full batch (firstRead): it was read after
// the swap committed, so it is as new as the pass's own read, within the
// round trip it saves, and its horizon bounds where the cursor moves as any
// read's does (promise 3).
func (d *Dispatcher) startParent(ctx context.Context, sh *shard, m *mergeAtEnd) {
	b := sh.balancer
	sh.removed.Store(true)
	var added []*shard
	var stop *shard
	b.mu.Lock()
	now := time.Now()
	for _, s := range []postgres.Segment{m.pair.lo, m.pair.hi} {
		id := segmentInstance(s)
		b.local[id] = now
		if half := b.shards[id]; half != nil && half != sh {
			stop = half
		}
	}
	id := segmentInstance(m.pair.parent)
	b.local[id] = now
	var gone []*shard
	if cur := b.shards[id]; cur == nil || cur.removed.Load() {
		if cur != nil {
			// Split by its pass before a round dropped it: the new shard
			// takes its name, so it leaves the dispatcher's list here
			// (no round will find it under that name again).
			gone = append(gone, cur)
		}
		parent := newPartitionShard(d.store.Schema(), b.proj, b, m.pair.parent)
		if st := d.store.Pool().Stat(); st.IdleConns() > 0 || st.TotalConns() < st.MaxConns() {
			q := m.first
			q.Partition = parent.readSegment()
			d.launchRead(ctx, parent, q, true)
		}
		b.shards[id], b.owned[id] = parent, true
		b.sets[id]++
		added = append(added, parent)
	}
	b.mu.Unlock()
	if stop != nil {
		// Its row is gone: its next pass would find so and stop; stop it
		// now rather than at its next wake.
		stop.removed.Store(true)
		stop.wake()
	}
	// The halves stay listed, stopped, until the round the NOTIFY brings
	// drops them and their metrics, as after the command's swap.
	d.replaceShards(added, gone)
}

// mergeAtOnce queues, in the hold's transaction, the swap of pair p whose
// halves both stand at its hold already (read and locked in read): the
// pair is merged there, at its own position, whatever the other pairs of
// the command wait for. Before, it stood at its hold until every pair's
// halves stood at theirs (awaitHolds), then waited for the command's swap
// or for its halves' passes, which, both standing at the hold and woken
// together, tried each other's locks at once and each found the other's
// taken. It reports whether it swapped p.
func (a *Admin) mergeAtOnce(consumer string, p mergePair, read map[postgres.Segment]partRow, writes *pgx.Batch) (bool, error) {
	lo, hi := read[p.lo], read[p.hi]
	if lo.cursor != p.hold || hi.cursor != p.hold || lo.version != hi.version {
		return false, nil
	}
	for _, s := range []postgres.Segment{p.lo, p.hi} {
		r := read[s]
		r.held, r.hold = true, p.hold // as the hold just queued leaves it
		read[s] = r
	}
	if _, err := a.mergeOne(consumer, p, read, writes); err != nil {
		return false, err
	}
	return true, nil
}

// mergeWatch reads, for each pair of pairs, whether it was merged (its
// parent's row there, its halves' gone): by a pass, or by another
// command's swap.
func (a *Admin) mergeWatch(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, consumer string, pairs []mergePair,
) ([]bool, error) {
	var ids []string
	for _, p := range pairs {
		ids = append(ids, segmentInstance(p.parent), segmentInstance(p.lo), segmentInstance(p.hi))
	}
	rows, err := q.Query(ctx, a.split.present, consumer, ids)
	if err != nil {
		return nil, err
	}
	there, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	return mergedPairs(pairs, there), nil
}

// mergedPairs says which of pairs were merged, with there the partitions
// present.
func mergedPairs(pairs []mergePair, there []string) []bool {
	has := map[string]bool{}
	for _, id := range there {
		has[id] = true
	}
	out := make([]bool, len(pairs))
	for i, p := range pairs {
		out[i] = has[segmentInstance(p.parent)] && !has[segmentInstance(p.lo)] && !has[segmentInstance(p.hi)]
	}
	return out
}

// change is pair p's merge, as a merge reports it.
func (p mergePair) change() PartitionChange {
	return PartitionChange{From: []postgres.Segment{p.lo, p.hi}, To: []postgres.Segment{p.parent}, Cursor: p.hold}
}

// mergedChanges returns the changes of the pairs merged, in pairs' order.
func mergedChanges(pairs []mergePair, merged []bool) []PartitionChange {
	var out []PartitionChange
	for i, p := range pairs {
		if merged[i] {
			out = append(out, p.change())
		}
	}
	return out
}

// unholdFenced lifts the holds of pairs that remain, under the fence lock
// (a pass swaps only while it holds the fence, shared, and finds its row
// still held under it), and says which of them the passes had merged by
// then: a merge of several pairs handed to the passes is not all or
// nothing.
//
// It runs on conn, the connection holding the command's claims, which a
// pool of one connection would never give it a second of; on the pool
// when conn was closed (a cancelled statement closes its connection).
func (a *Admin) unholdFenced(ctx context.Context, conn *pgxpool.Conn, consumer string, pairs []mergePair) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), wakeTimeout)
	defer cancel()
	var merged []bool
	err := pgx.BeginFunc(ctx, a.claimsConn(conn), func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, a.sql.waitLock, shardLockKey(a.store.Schema(), ShardID{Consumer: consumer, Instance: SharedInstance})); err != nil {
			return err
		}
		b := &pgx.Batch{}
		var wakes []string
		for _, p := range pairs {
			for _, id := range p.ids() {
				b.Queue(a.split.unhold, consumer, id, p.hold.TxID, p.hold.Seq)
				wakes = append(wakes, shardWakePayload(a.store.Schema(), ShardID{Consumer: consumer, Instance: id}))
			}
		}
		// By name too: an upper half standing at its hold is passed by
		// the balancing round's wakes (lowerLooks).
		b.Queue(notifyShardsSQL, layoutChannel, wakes)
		// The halves standing at the hold wait for a wake (atHold).
		queueNotifyLayout(b, a.store, consumer)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		var err error
		merged, err = a.mergeWatch(ctx, tx, consumer, pairs)
		return err
	})
	if err != nil {
		return fmt.Errorf("lift the holds: %w", err)
	}
	if done := mergedChanges(pairs, merged); len(done) > 0 {
		names := make([]string, len(done))
		for i, c := range done {
			names[i] = c.String()
		}
		return fmt.Errorf("%w: some pairs were merged (at once, standing at one cursor, or by their own passes) before the command gave up (the holds of the others were lifted): %s",
			ErrLayoutChanged, strings.Join(names, ", "))
	}
	return nil
}

// claimsConn is what a merge command runs its statements on after its
// hold: conn, the connection holding its claims, or the pool once conn was
// closed (a cancelled statement closes its connection). Never a second
// connection of the pool while conn is open: a pool of one would wait for
// conn, which the command gives back only when it returns.
func (a *Admin) claimsConn(conn *pgxpool.Conn) interface {
	Begin(context.Context) (pgx.Tx, error)
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
} {
	if conn.Conn().IsClosed() {
		return a.store.Pool()
	}
	return conn
}

// A merge command's claim on its pairs: a session-level advisory lock per
// pair (key: the consumer and the parent), taken without waiting in its
// hold transaction and held until it returns. A second command merging a
// pair another command is merging is refused at once (ErrLayoutChanged, as
// it was when it found the halves gone after the first one's swap), so a
// command holding the claim knows that a pair merged meanwhile was merged
// by a pass, and reports it done. A command killed outright loses its
// claims with its session: running the merge again finishes it.

// mergeClaimKey names the claim on merging consumer's pair into parent.
func mergeClaimKey(schema, consumer string, parent postgres.Segment) string {
	return "projector.merge\x1f" + schema + "\x1f" + consumer + "\x1f" + segmentInstance(parent)
}

// claimPairs takes the claims on pairs in tx's session, or refuses the
// merge when another command holds one.
func (a *Admin) claimPairs(ctx context.Context, tx pgx.Tx, consumer string, pairs []mergePair) error {
	keys := make([]string, len(pairs))
	for i, p := range pairs {
		keys[i] = mergeClaimKey(a.store.Schema(), consumer, p.parent)
	}
	var taken []string
	rows, err := tx.Query(ctx, `SELECT k FROM unnest($1::text[]) k WHERE NOT pg_try_advisory_lock(hashtextextended(k, 0))`, keys)
	if err != nil {
		return err
	}
	if taken, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		return err
	}
	if len(taken) > 0 {
		return layoutChanged(consumer, "another `consumer merge` of the same partitions is under way")
	}
	return nil
}

// releaseClaims lifts the claims of a merge command on conn and gives the
// connection back to the pool (closed, when the unlock failed, so no claim
// outlives the command in a pooled session).
func releaseClaims(ctx context.Context, conn *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), wakeTimeout)
	defer cancel()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock_all()`); err != nil {
		_ = conn.Conn().Close(ctx)
	}
	conn.Release()
}
