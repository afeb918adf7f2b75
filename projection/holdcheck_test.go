package projection_test

import (
	"context"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// A pass that read its state before a merge's hold committed, and whose
// batch ends past the hold, is refused at its cursor update by the
// database (migration 30, holdcheck.go): it rolls back whole and runs
// again, cut at the hold. A merge of caught-up halves holds them without
// their locks, so this can happen. Here 0/2's pass is kept in its handler,
// at the first event of a full batch, while the test sets a hold at that
// event as the merge would; released, the batch goes past the hold.
// Without the check the pass committed past the hold, and the events
// beyond it were applied there and again once the hold was lifted (the
// test fails so).
func TestPassPastAHoldItDidNotSeeRunsAgainCutThere(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	seg0 := segment(t, 0, 2)
	zero := projection.PartitionInstance(0, 2)
	mine := func(ev projector.Event) bool {
		return seg0.Contains(postgres.StreamHash(ev.Stream.Tenant, ev.Stream.Type, ev.Stream.ID))
	}
	var armed atomic.Bool
	entered := make(chan projector.Position, 1)
	unblock := make(chan struct{})
	var mu sync.Mutex
	var hold projector.Position             // set before the handler is let go
	var past []projector.Position           // events of 0/2 committed past the hold
	handled := map[projector.Position]int{} // handler calls per event of 0/2
	count := countingHandler(e.schema, "pasthold")
	h := func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		if !mine(ev) {
			return count(ctx, tx, ev)
		}
		mu.Lock()
		handled[ev.Position]++
		mu.Unlock()
		if armed.CompareAndSwap(true, false) {
			entered <- ev.Position
			select {
			case <-unblock:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return count(ctx, tx, ev)
	}
	p := projection.NewAsync("pasthold", projection.AsyncConfig{Partitions: 2, BatchSize: 5, AfterCommit: func(evs []projector.Event) {
		mu.Lock()
		defer mu.Unlock()
		for _, ev := range evs {
			if mine(ev) && hold != (projector.Position{}) && hold.Less(ev.Position) {
				past = append(past, ev.Position)
			}
		}
	}})
	must(projection.OnEvent(p, e.types.Opened, h))
	must(projection.OnEvent(p, e.types.Commented, h))
	must(projection.OnEvent(p, e.types.Closed, h))
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	versions := appendWith(t, e.ctx, e.store, 1, 40, 20, "a")
	e.catchUp(d)

	// A backlog for 0/2, so its next pass reads a full batch.
	release := sync.OnceFunc(e.holdShardLock("pasthold", zero))
	defer release()
	maps.Copy(versions, appendWith(t, e.ctx, e.store, 1, 60, 20, "b"))
	armed.Store(true)
	release()
	if err := projection.WakeShards(e.ctx, e.store, projection.ShardID{Consumer: "pasthold", Instance: zero}); err != nil {
		t.Fatal(err)
	}
	var at projector.Position
	select {
	case at = <-entered:
	case <-time.After(time.Minute):
		t.Fatal("no pass of 0/2 ran")
	}
	mu.Lock()
	hold = at
	mu.Unlock()
	e.setHold("pasthold", zero, &at)
	close(unblock)

	eventually(t, time.Minute, "0/2 stands at the hold", func() bool {
		return e.partitionShards("pasthold")[0].Cursor == at
	})
	mu.Lock()
	if len(past) > 0 {
		t.Errorf("0/2 committed %d events past its hold %s (first %s)", len(past), at, past[0])
	}
	if handled[at] < 2 {
		t.Errorf("the event at the hold was handled %d times: the pass that went past the hold was not rolled back and run again", handled[at])
	}
	mu.Unlock()

	e.setHold("pasthold", zero, nil)
	if err := projection.WakeShards(e.ctx, e.store, projection.ShardID{Consumer: "pasthold", Instance: zero}); err != nil {
		t.Fatal(err)
	}
	e.catchUp(d)
	e.checkCounts("pasthold", versions)
}

// setHold sets (or, with nil, lifts) a partition's merge hold directly, as
// a merge's hold does without the partition's lock.
func (e *env) setHold(consumer, instance string, at *projector.Position) {
	e.t.Helper()
	var err error
	c := e.store.Table("projector_consumers")
	if at == nil {
		_, err = e.store.Pool().Exec(e.ctx, `UPDATE `+c+` SET hold_tx_id = NULL, hold_seq = NULL WHERE name = $1 AND instance_id = $2`, consumer, instance)
	} else {
		_, err = e.store.Pool().Exec(e.ctx, `UPDATE `+c+` SET hold_tx_id = $3, hold_seq = $4 WHERE name = $1 AND instance_id = $2`,
			consumer, instance, at.TxID, at.Seq)
	}
	if err != nil {
		e.t.Fatal(err)
	}
}

// A merge's hold without the halves' locks that a pass overtakes between
// its read of the rows and its write (0/2's pass applies events committed
// after the hold's horizon) is refused by the same check: it rolls back to
// its savepoint and holds under the locks instead, at a position no cursor
// is past. Without the check the hold was written behind 0/2's cursor: the
// pass then moved the cursor back to the hold and applied those events a
// second time (the test fails so).
func TestMergeHoldOvertakenByAPassHoldsUnderTheLocks(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	p := counting(e.schema, e.types, "overtaken", projection.AsyncConfig{Partitions: 2, BatchSize: 50})
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	versions := appendWith(t, e.ctx, e.store, 1, 40, 20, "a")
	e.catchUp(d)
	_, release := e.halvesApart("overtaken", versions)
	defer release()
	admin := projection.NewAdmin(e.store)
	var overtaken projector.Position
	projection.SetMergeHoldHook(admin, func() {
		maps.Copy(versions, appendWith(t, e.ctx, e.store, 1, 40, 20, "o"))
		overtaken = e.lastPosition()
		eventually(t, 30*time.Second, "0/2 applies the events appended after the hold's read", func() bool {
			return !e.partitionShards("overtaken")[0].Cursor.Less(overtaken)
		})
		release()
	})
	changes, err := admin.Merge(e.ctx, "overtaken", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if overtaken == (projector.Position{}) {
		t.Fatal("the merge did not hold the halves without their locks")
	}
	if len(changes) != 1 || changes[0].Cursor.Less(overtaken) {
		t.Errorf("merged %v: the merged partition starts behind %s, where 0/2 stood before the hold", changes, overtaken)
	}
	e.catchUp(d)
	e.checkCounts("overtaken", versions)
}
