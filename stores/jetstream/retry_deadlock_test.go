package jetstream_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	pjs "github.com/projectorhq/projector/stores/jetstream"
)

// A retry of a dead letter or of a park aborted as a deadlock's victim in
// its handler is tried again, not recorded as the event's failure: the
// deadlock says nothing about the event. (The handler's savepoint rolled
// back and the retry recorded "retry: deadlock detected" and returned a
// RetryFailedError; the operator retried by hand.) The deadlock is made for
// it: the test holds the handler's table in SHARE mode, so the retry,
// holding its row (the dead letter's, the parked stream's), waits at the
// handler's INSERT; the test then asks for that row with a far longer
// deadlock_timeout, so the retry's backend finds the cycle and is the one
// aborted. Its next try waits for the row the test now holds, and goes
// through once the test lets go.
func TestDeadLetterRetryOutlivesADeadlock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, kind := range []string{"dead letter", "park"} {
		t.Run(strings.ReplaceAll(kind, " ", "_"), func(t *testing.T) {
			t.Parallel()
			types := testevents.New()
			snk := newSink(t, types.Registry)
			c, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: "feed", Handler: snk.record, ErrorMode: pjs.ParkStream,
				Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			// What the retry holds, how to ask for it, how to read what is
			// recorded, and the effects a retry that goes through makes.
			var retry func() error
			var row string
			var rowArgs []any
			var recorded func() (status, errText string)
			var events []projector.Event
			open, resolved := projection.DeadLetterOpen, projection.DeadLetterResolved
			if kind == "dead letter" {
				id, ev := snk.deadLetter(t, "feed", "deadlocked")
				events = []projector.Event{ev}
				retry = func() error { return c.RetryDeadLetter(ctx, id) }
				row, rowArgs = `SELECT 1 FROM `+snk.store.Table("projector_jetstream_dead_letters")+` WHERE id = $1 FOR UPDATE`, []any{id}
				recorded = func() (string, string) { d := snk.status(t, "feed", id); return d.Status, d.Error }
			} else {
				stream := projector.TenantStream("acme", "ticket", "deadlocked")
				id, evs := snk.parkOf(t, "feed", stream, 3, 5)
				events = evs
				open, resolved = projection.ParkOpen, projection.ParkResolved
				retry = func() error { _, err := c.RetryPark(ctx, id, "alice"); return err }
				row, rowArgs = `SELECT 1 FROM `+snk.store.Table("projector_jetstream_streams")+` WHERE subscription = 'feed' AND stream_id = $1 FOR UPDATE`, []any{stream.ID}
				recorded = func() (string, string) {
					p, _, err := pjs.GetPark(ctx, snk.store, "feed", id)
					if err != nil {
						t.Fatal(err)
					}
					return p.Status, p.Error
				}
			}
			_, errBefore := recorded()

			tx, holder := pgtest.HoldForDeadlock(t, snk.store.Pool(), snk.effects)
			done := make(chan error, 1)
			go func() { done <- retry() }()
			pgtest.WaitForLockOn(t, pgtest.Pool(t), snk.effects) // the retry holds its row and waits at the INSERT
			// The cycle: the test asks for the row the retry holds.
			if _, err := tx.Exec(ctx, row, rowArgs...); err != nil {
				t.Fatalf("the test's side of the deadlock: %v; want the retry aborted", err)
			}
			// The retry's next try waits for the row the test now holds; a
			// retry that recorded the deadlock has returned instead.
			pgtest.WaitTriedAgain(t, pgtest.Pool(t), holder, func() string {
				select {
				case err := <-done:
					return fmt.Sprintf("(%v)", err)
				default:
					return ""
				}
			})
			if status, errText := recorded(); status != open || errText != errBefore {
				t.Fatalf("%s after the aborted try: status %s, error %q; want it open, error %q as before", kind, status, errText, errBefore)
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatalf("retry: %v; want it resolved on its next try", err)
			}
			if status, errText := recorded(); status != resolved || strings.Contains(errText, "deadlock") {
				t.Fatalf("%s: status %s, error %q; want resolved, the deadlock recorded nowhere", kind, status, errText)
			}
			for _, ev := range events {
				var n int
				if err := snk.store.Pool().QueryRow(ctx, `SELECT count(*) FROM `+snk.effects+` WHERE event_id = $1`, ev.ID).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n != 1 {
					t.Fatalf("the effect of v%d is there %d times, want 1", ev.Version, n)
				}
			}
		})
	}
}
