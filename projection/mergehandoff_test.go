package projection_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
)

// holdByHand holds consumer's partitions 0/2 and 1/2 for a merge as
// `consumer merge` does (holdPairs), with no command to look or swap: its
// claim on the pair (a session advisory lock, held until the test ends, as
// a command waiting for the passes holds it) and, under both shard locks
// (waiting for their running passes), the holds at the cursor of the one
// ahead. It returns the hold and the release of the claim.
func (e *env) holdByHand(consumer string, lockedByCaller ...string) (projector.Position, func()) {
	e.t.Helper()
	conn, err := e.store.Pool().Acquire(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	claim := "projector.merge\x1f" + e.schema + "\x1f" + consumer + "\x1f" + projection.PartitionInstance(0, 1)
	if _, err := conn.Exec(e.ctx, `SELECT pg_advisory_lock(hashtextextended($1::text, 0))`, claim); err != nil {
		e.t.Fatal(err)
	}
	release := sync.OnceFunc(func() {
		_, _ = conn.Exec(context.Background(), `SELECT pg_advisory_unlock_all()`)
		conn.Release()
	})
	e.t.Cleanup(release)
	tx, err := e.store.Pool().Begin(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(e.ctx) }()
	ids := []string{projection.PartitionInstance(0, 2), projection.PartitionInstance(1, 2)}
	for _, id := range ids {
		if slices.Contains(lockedByCaller, id) {
			continue // the caller's lock already keeps its passes out
		}
		key := "projector.shard\x1f" + e.schema + "\x1f" + consumer + "\x1f" + id
		if _, err := tx.Exec(e.ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1::text, 0))`, key); err != nil {
			e.t.Fatal(err)
		}
	}
	c := e.store.Table("projector_consumers")
	var hold projector.Position
	if err := tx.QueryRow(e.ctx, `SELECT cursor_tx_id, cursor_seq FROM `+c+` WHERE name = $1 AND instance_id = ANY($2)
		ORDER BY cursor_tx_id DESC, cursor_seq DESC LIMIT 1`, consumer, ids).Scan(&hold.TxID, &hold.Seq); err != nil {
		e.t.Fatal(err)
	}
	if _, err := tx.Exec(e.ctx, `UPDATE `+c+` SET hold_tx_id = $3, hold_seq = $4 WHERE name = $1 AND instance_id = ANY($2)`,
		consumer, ids, hold.TxID, hold.Seq); err != nil {
		e.t.Fatal(err)
	}
	if err := tx.Commit(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	return hold, release
}

// addDeadLetter gives consumer's partition instance a dead letter, to see
// where a merge takes it.
func (e *env) addDeadLetter(consumer, instance string) {
	e.t.Helper()
	e.exec(`INSERT INTO `+e.store.Table("projector_dead_letters")+`
		(consumer, instance_id, event_id, event_tx_id, event_seq, event_type, tenant_id, stream_type, stream_id, version, error, attempts, reason)
		VALUES ($1, $2, gen_random_uuid(), '1', 1, 'opened', '', 'account', 'dead-1', 1, 'boom', 1, 'apply-error')`, consumer, instance)
}

// deadLetterInstances lists the partitions holding consumer's dead letters.
func (e *env) deadLetterInstances(consumer string) []string {
	e.t.Helper()
	rows, err := e.store.Pool().Query(e.ctx, `SELECT instance_id FROM `+e.store.Table("projector_dead_letters")+` WHERE consumer = $1 ORDER BY 1`, consumer)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			e.t.Fatal(err)
		}
		out = append(out, id)
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// A held pair is swapped for its parent by the pass of the half that
// reaches the hold second, in its own commit (mergehandoff.go): here no
// command looks or swaps (the hold and a command's claim on the pair are
// set by hand), and the parent must
// still appear, at or after the hold, with the halves' dead letters, and
// every event applied once. Before, only the command swapped: the halves
// stood at the hold for ever ("the pass merges the held pair" timed out).
func TestMergeSwappedByThePassOfTheHalfThereSecond(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	p := counting(e.schema, e.types, "passmerge", projection.AsyncConfig{Partitions: 2, BatchSize: 5})
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	versions := appendWith(t, e.ctx, e.store, 2, 100, 20, "a")
	e.catchUp(d)
	e.addDeadLetter("passmerge", projection.PartitionInstance(1, 2))
	hold, _ := e.holdByHand("passmerge")
	// New events wake the halves: the one behind reaches the hold and
	// merges; the events after the hold are the parent's.
	maps.Copy(versions, appendWith(t, e.ctx, e.store, 2, 100, 20, "b"))
	eventually(t, 30*time.Second, "the pass merges the held pair", func() bool {
		return slices.Equal(e.layout("passmerge"), []string{"0/1"})
	})
	parent := e.partitionShards("passmerge")[0]
	if parent.Cursor.Less(hold) {
		t.Errorf("the parent stands at %s, before the hold %s", parent.Cursor, hold)
	}
	if got, want := e.deadLetterInstances("passmerge"), []string{projection.PartitionInstance(0, 1)}; !slices.Equal(got, want) {
		t.Errorf("dead letters in %v, want %v", got, want)
	}
	e.catchUp(d)
	e.checkCounts("passmerge", versions)
}

// Two processes, each running one half: whichever half reaches the hold
// second, its process swaps the pair (trying the other process's lock) and
// runs the parent; the other process's half stops when its row is gone.
// Every event is applied once. Before, with no command to swap (the hold
// and the claim set by hand), the halves stood at the hold for ever.
func TestMergeSwappedByAPassAcrossTwoProcesses(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	start := func(id string) *projection.Dispatcher {
		p := counting(e.schema, e.types, "twoproc", projection.AsyncConfig{Partitions: 2, BatchSize: 5})
		return e.dispatcher(projection.Config{Store: e.storeOn(pgtest.NewPool(t, 3)), Projections: []*projection.Async{p}, InstanceID: id,
			Recheck: 20 * time.Millisecond})
	}
	start("p1")
	start("p2")
	eventually(t, 30*time.Second, "each process owns one half", func() bool {
		o := e.owners("twoproc")
		return o["p1"] == 1 && o["p2"] == 1
	})
	versions := appendWith(t, e.ctx, e.store, 2, 100, 20, "a")
	eventually(t, time.Minute, "every event applied", func() bool { return e.applied("twoproc") >= total(versions) })
	_, _ = e.holdByHand("twoproc")
	maps.Copy(versions, appendWith(t, e.ctx, e.store, 2, 100, 20, "b"))
	eventually(t, 30*time.Second, "a pass merges the held pair", func() bool {
		return slices.Equal(e.layout("twoproc"), []string{"0/1"})
	})
	maps.Copy(versions, appendWith(t, e.ctx, e.store, 2, 100, 20, "c"))
	eventually(t, time.Minute, "every event applied", func() bool { return e.applied("twoproc") >= total(versions) })
	e.checkCounts("twoproc", versions)
}

// sessionShardLocks takes the shard locks of consumer's partitions ids in
// a session of their own (waiting for running passes), as a pass of
// another process would hold them; unlock gives one back. Whatever is
// still held when the test ends is given back then.
func (e *env) sessionShardLocks(consumer string, ids ...string) (unlock func(id string)) {
	e.t.Helper()
	conn, err := e.store.Pool().Acquire(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_, _ = conn.Exec(context.Background(), `SELECT pg_advisory_unlock_all()`)
		conn.Release()
	})
	key := func(id string) string { return "projector.shard\x1f" + e.schema + "\x1f" + consumer + "\x1f" + id }
	for _, id := range ids {
		if _, err := conn.Exec(e.ctx, `SELECT pg_advisory_lock(hashtextextended($1::text, 0))`, key(id)); err != nil {
			e.t.Fatal(err)
		}
	}
	return func(id string) {
		var ok bool
		if err := conn.QueryRow(e.ctx, `SELECT pg_advisory_unlock(hashtextextended($1::text, 0))`, key(id)).Scan(&ok); err != nil || !ok {
			e.t.Fatalf("unlock %s: %v (held: %v)", id, err, ok)
		}
	}
}

// A pass that reaches the hold while its sibling's lock is taken (here by
// the test, as a running pass of the sibling would) does not merge, waits
// for nothing and fails nothing: it commits its cursor at the hold and
// leaves the swap to a later pass or to the command, which completes.
func TestMergeLeftToTheCommandWhenTheSiblingIsLocked(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	d, versions := e.caughtUpHalves("locked")
	h := e.behindAtHoldBesideALockedSibling("locked", versions)
	hold, ids, ahead, behind, unclaim := h.hold, h.ids, h.ahead, h.behind, h.unclaim
	release := func() { h.unlock(ids[ahead]) }
	if st := e.partitionShards("locked")[behind]; st.Status != projection.StatusIdle || st.Attempts != 0 {
		t.Fatalf("the half behind is %s (attempts %d), want idle", st.Status, st.Attempts)
	}
	unclaim() // the command's own claim follows
	done := make(chan error, 1)
	var changes []projection.PartitionChange
	go func() {
		var err error
		changes, err = projection.NewAdmin(e.store).Merge(e.ctx, "locked", 30*time.Second)
		done <- err
	}()
	// The sibling's lock is given back once the command waits for it,
	// holding the fence: given back before, the half at the hold, which
	// looks again every few milliseconds, could find it free and the hand
	// claim, released just before, still listed in the same statement
	// (pg_locks is read before the lock tries), and swap the pair before
	// the command read its layout (it did, once, under CI's load).
	aheadKey := "projector.shard\x1f" + e.schema + "\x1f" + "locked" + "\x1f" + ids[ahead]
	eventually(t, 30*time.Second, "the command waits for the sibling's lock", func() bool { return e.lockWaiters(aheadKey) > 0 })
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(changes) != 1 || changes[0].To[0] != segment(t, 0, 1) || changes[0].Cursor != hold {
		t.Errorf("changes %v, want 0/2 1/2 -> 0/1 at %s", changes, hold)
	}
	e.catchUp(d)
	e.checkCounts("locked", versions)
}

// The command races the passes: while writers commit, a pair is merged and
// split again, several times. Whoever swaps (the pass of the half there
// second, or the command when the passes could not), the command reports
// the merge done, once, and never ErrLayoutChanged. Every event is applied
// once.
func TestMergeCommandRacingThePassesReportsItDone(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	p := counting(e.schema, e.types, "racing", projection.AsyncConfig{Partitions: 2, BatchSize: 5})
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	versions := appendWith(t, e.ctx, e.store, 2, 100, 20, "a")
	e.catchUp(d)
	ctx, cancel := context.WithCancel(e.ctx)
	written := make(chan map[string]int64, 1)
	go func() {
		all := map[string]int64{}
		for i := 0; ctx.Err() == nil; i++ {
			maps.Copy(all, appendWith(t, e.ctx, e.store, 2, 20, 20, fmt.Sprintf("w%d", i)))
		}
		written <- all
	}()
	admin := projection.NewAdmin(e.store)
	for i := range 6 {
		changes, err := admin.Merge(e.ctx, "racing", 30*time.Second)
		if err != nil {
			cancel()
			t.Fatalf("merge %d: %v (ErrLayoutChanged: %v)", i, err, errors.Is(err, projection.ErrLayoutChanged))
		}
		if len(changes) != 1 || changes[0].To[0] != segment(t, 0, 1) {
			t.Errorf("merge %d: changes %v, want one, into 0/1", i, changes)
		}
		if _, err := admin.Split(e.ctx, "racing"); err != nil {
			cancel()
			t.Fatalf("split %d: %v", i, err)
		}
	}
	cancel()
	maps.Copy(versions, <-written)
	e.catchUp(d)
	e.checkCounts("racing", versions)
}

// caughtUpHalves starts a dispatcher of consumer, counting, in two
// partitions, appends 100 events over 20 streams and waits until they are
// applied; it returns the dispatcher and the streams' versions.
func (e *env) caughtUpHalves(consumer string) (*projection.Dispatcher, map[string]int64) {
	e.t.Helper()
	p := counting(e.schema, e.types, consumer, projection.AsyncConfig{Partitions: 2, BatchSize: 5})
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	versions := appendWith(e.t, e.ctx, e.store, 2, 100, 20, "a")
	e.catchUp(d)
	return d, versions
}

// heldBesideALockedSibling is a pair of consumer's halves 0/2 and 1/2 held
// by hand (holdByHand, its claim standing for a command's), the half
// behind at the hold and the half ahead's lock taken by the test, as a
// running pass of it would hold it.
type heldBesideALockedSibling struct {
	hold          projector.Position
	ids           []string // 0/2's and 1/2's instance ids
	ahead, behind int      // indexes into ids
	unlock        func(id string)
	unclaim       func()
}

// behindAtHoldBesideALockedSibling holds consumer's two caught-up halves by
// hand at the cursor of the half ahead, with the half ahead's lock taken,
// and brings the half behind to the hold with new events (added to
// versions); it fails the test should the pair merge meanwhile.
//
// Both halves' locks are taken before the hold is set, and only the half
// behind's given back after: with the sibling's lock taken after the hold,
// the two caught-up halves could stand at the hold and merge in the gap
// (they did, once, under the whole suite's load), and the cursors of
// caught-up halves move on with the horizon, so which half is ahead is
// only known under both locks.
func (e *env) behindAtHoldBesideALockedSibling(consumer string, versions map[string]int64) heldBesideALockedSibling {
	e.t.Helper()
	h := heldBesideALockedSibling{ids: []string{projection.PartitionInstance(0, 2), projection.PartitionInstance(1, 2)}, ahead: 0, behind: 1}
	h.unlock = e.sessionShardLocks(consumer, h.ids...)
	s := e.partitionShards(consumer)
	if s[0].Cursor.Less(s[1].Cursor) {
		h.ahead, h.behind = 1, 0
	}
	h.hold, h.unclaim = e.holdByHand(consumer, h.ids...)
	if h.hold != s[h.ahead].Cursor {
		e.t.Fatalf("held at %s, want the cursor of the half ahead, %s", h.hold, s[h.ahead].Cursor)
	}
	h.unlock(h.ids[h.behind])
	maps.Copy(versions, appendWith(e.t, e.ctx, e.store, 2, 100, 20, "b"))
	eventually(e.t, 30*time.Second, "the half behind reaches the hold", func() bool {
		return e.partitionShards(consumer)[h.behind].Cursor == h.hold
	})
	if got := e.layout(consumer); len(got) != 2 {
		e.t.Fatalf("merged (%v) while the sibling's lock was taken", got)
	}
	return h
}
