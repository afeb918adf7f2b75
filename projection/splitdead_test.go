package projection_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/projectorhq/projector/projection"
)

// A split right after a process was SIGKILLed does not wait for the dead
// process's pass: the command hands a partition to its owner only while
// the owner's listening session holds its alive lock, which PostgreSQL
// dropped with the connection; it splits the dead owner's partition itself
// at once. Before, a recent heartbeat alone made the owner live (for up to
// LiveHeartbeats heartbeats after death), the dead owner's partition was
// marked for a pass that never came, and the split waited for another
// process to take it over or for the hand-off's fallback
// (TestPromise16_SplitMergeLive under PROJECTOR_SOAK measured 2.3–2.9 s).
// Here the dead process's heartbeat is made to look recent for an hour
// and the hand-off's wait is two minutes, so only the alive lock can tell:
// the split must finish well inside its context's minute.
func TestSplitRightAfterAKillDoesNotWaitForTheDeadOwner(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	f := newFleet(e, 2, 2)
	// Events until each process owns a partition and applied some: a
	// process that took its partition after the first events had nothing
	// to apply yet.
	round := 0
	eventually(t, time.Minute, "each process to own a partition and apply events", func() bool {
		o := e.owners("parted")
		if o["proc-1"] == 1 && o["proc-2"] == 1 && f.allWorked() {
			return true
		}
		if round%5 == 0 {
			appendWith(t, e.ctx, e.store, 1, 20, 10, fmt.Sprint("r", round))
		}
		round++
		return false
	})
	f.running["proc-1"].Kill(t)
	delete(f.running, "proc-1")
	// PostgreSQL drops the alive lock when the dead process's backend
	// notices its closed socket: milliseconds, more on a loaded machine
	// (the split, run in that gap, handed the partition to the dead owner
	// and waited: seen once in a CI rehearsal). That is the moment the
	// split can tell, whatever the heartbeat says.
	eventually(t, time.Minute, "the killed process's session to end (its alive lock dropped)", func() bool { return !e.aliveLockHeld("proc-1") })
	e.exec(`UPDATE ` + e.store.Table("projector_instances") + ` SET last_seen_at = now() + interval '1 hour' WHERE instance_id = 'proc-1'`)

	admin := projection.NewAdmin(e.store)
	projection.SetSplitHandOff(admin, 2*time.Minute) // no fallback to rescue a hand-off to the dead owner
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	changes, err := admin.Split(ctx, "parted")
	if err != nil {
		t.Fatalf("split after a kill: %v; want it done without waiting for the dead owner's pass", err)
	}
	if len(changes) != 2 {
		t.Fatalf("split made %v, want both partitions split", changes)
	}
	if got := e.layout("parted"); len(got) != 4 {
		t.Fatalf("partitions after the split: %v, want 4", got)
	}
}
