package saga_test

import (
	"strings"
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
)

// A saga handler that panics fails its step like one that returns an
// error (projections.md): in continuous mode the event is dead-lettered
// and the consumer goes on, where it went dead (a relay and saga audit).
func TestSagaPanicFollowsTheErrorMode(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := newSLA(e.types, slaOptions{now: newClock().Now, remindAfter: time.Hour,
		enter: func(key string) func() {
			switch key {
			case "boom":
				panic("boom")
			case "huge":
				panic(strings.Repeat("x", 100_000))
			}
			return func() {}
		},
		async: projection.AsyncConfig{ErrorMode: projection.SkipApplyErrors, MaxAttempts: 2, BatchSize: 1}})
	e.dispatcher(s, projection.Config{})
	e.append(projector.Stream("ticket", "boom"), testevents.TicketOpened{Title: "x"})
	e.append(projector.Stream("ticket", "huge"), testevents.TicketOpened{Title: "z"})
	e.append(projector.Stream("ticket", "fine"), testevents.TicketOpened{Title: "y"})
	instances := `SELECT count(*) FROM ` + e.store.Table("projector_saga_instances") + ` WHERE key = 'fine'`
	e.waitFor("the healthy instance after the panicking one", 30*time.Second, func() bool {
		st, _ := e.shardError()
		return e.count(instances) == 1 || st == projection.StatusDead
	})
	st, msg := e.shardError()
	if st == projection.StatusDead {
		t.Fatalf("the consumer went dead on a panic in continuous mode: %s", msg)
	}
	if n := e.count(`SELECT count(*) FROM ` + e.store.Table("projector_dead_letters") + ` WHERE error LIKE '%panic in handler: boom%'`); n != 1 {
		t.Fatalf("%d dead letters for the panicking event, want 1 (%s)", n, strings.TrimSpace(msg))
	}
	// A saga records its failures cut as the dispatcher does
	// (projection.StoredError): the 100 kB message is not stored whole.
	var longest int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT coalesce(max(length(error)), 0) FROM `+e.store.Table("projector_dead_letters")).Scan(&longest); err != nil {
		t.Fatal(err)
	}
	if longest < 1000 || longest > projection.MaxErrorBytes+64 {
		t.Fatalf("the longest dead letter error is %d characters, want the 100 kB panic cut at %d", longest, projection.MaxErrorBytes)
	}
}
