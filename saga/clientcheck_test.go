package saga_test

import (
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
)

// A timeout runner killed while a step waits for a lock does not leave its
// backend behind holding the round's claimed timeouts (other runners skip
// them, SKIP LOCKED) until the wait ends: the round's backend checks its
// client every second (internal/clientcheck) and ends. Without the check it
// waited for as long as the test held the table.
func TestKilledRunnersWaitingBackendEnds(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.append(projector.Stream("ticket", "t1"), testevents.TicketOpened{Title: "a"})
	events := e.store.Table("projector_events")
	tx, err := e.store.Pool().Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(e.ctx) }()
	// The opening step appends nothing; the reminder's step appends, and
	// waits here.
	if _, err := tx.Exec(e.ctx, `LOCK TABLE `+events+` IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	child := e.startChild(0)
	pgtest.WaitForLockOn(t, e.store.Pool(), events)
	child.Kill(t)
	if !pgtest.NoLockWaitersWithin(t, e.store.Pool(), events, 20*time.Second) {
		t.Fatal("the killed runner's backend still waits for the events table 20 s after the kill, holding its claimed timeout")
	}
	// The claimed timeout went with it: the test takes its row at once.
	if _, err := tx.Exec(e.ctx, `SELECT 1 FROM `+e.store.Table("projector_saga_timeouts")+` FOR UPDATE NOWAIT`); err != nil {
		t.Fatalf("the timeout's row after the killed runner's backend ended: %v", err)
	}
}
