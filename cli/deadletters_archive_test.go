package cli

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
)

// appendArchived appends one poison event, after a fine one, to each of
// the named ticket streams and archives them with `streams archive`, before
// any consumer is registered: a consumer started later reads them from the
// archive. It returns the poisons.
func (e *dlEnv) appendArchived(streams ...string) []projector.Event {
	e.t.Helper()
	var poisons []projector.Event
	for _, s := range streams {
		err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
			res, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", s), projector.NoStream,
				testevents.TicketOpened{Title: "fine"}, testevents.TicketOpened{Title: "poison"})
			if err == nil {
				poisons = append(poisons, res.Events[1])
			}
			return err
		})
		if err != nil {
			e.t.Fatal(err)
		}
	}
	args := []string{"streams", "archive"}
	for _, s := range streams {
		args = append(args, "--stream", "ticket/"+s)
	}
	if out, stderr, code := e.cli(args...); code != ExitOK || !strings.Contains(out, fmt.Sprintf("archived %d stream", len(streams))) {
		e.t.Fatalf("streams archive: exit %d: %s %s", code, out, stderr)
	}
	return poisons
}

// A late consumer's dead letter of an archived event: `dead-letters show`
// shows the event (it said "event pruned" and advised discarding it), and
// `dead-letters retry --here` applies it (it was refused as pruned).
func TestDeadLettersOfArchivedEvent(t *testing.T) {
	t.Parallel()
	e, store, types := newPoisonEnv(t)
	poison := e.appendArchived("p")[0]
	caughtUpDispatcher(t, store, tolerant(store.Schema(), types))
	dls, err := projection.ListDeadLetters(e.ctx, store, projection.DeadLetterFilter{Consumer: "tolerant"})
	if err != nil || len(dls) != 1 || dls[0].EventID != poison.ID {
		t.Fatalf("dead letters: %+v, %v; want the archived poison's", dls, err)
	}
	id := fmt.Sprint(dls[0].ID)
	if out, _, code := e.cli("dead-letters", "show", id); code != ExitOK || strings.Contains(out, "pruned") || !strings.Contains(out, `"poison"`) {
		t.Fatalf("show of an archived event: exit %d:\n%s", code, out)
	}
	e.exec(`UPDATE ` + store.Table("poison_switch") + ` SET fail = false`)
	if out, stderr, code := e.cli("dead-letters", "retry", "--here", id); code != ExitOK || !strings.Contains(out, "applied and resolved") {
		t.Fatalf("retry of an archived event: exit %d: %s %s", code, out, stderr)
	}
	if n := e.traced(poison.ID); n != 1 {
		t.Fatalf("the archived event applied %d times, want once", n)
	}
}

// A halt-mode consumer dead on an archived event: `consumer skip` moves it
// past, recording the dead letter (it exited 1, "no longer in the log", and
// the shard stayed stuck).
func TestConsumerSkipArchivedEvent(t *testing.T) {
	t.Parallel()
	e, store, types := newPoisonEnv(t)
	poison := e.appendArchived("p")[0]
	halting := poisonable("halting", store.Schema(), types, projection.AsyncConfig{MaxAttempts: 1})
	d, err := projection.New(projection.Config{Store: store, Projections: []*projection.Async{halting}, PollMax: 50 * time.Millisecond, Recheck: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = d.Stop(ctx)
	})
	admin := projection.NewAdmin(store)
	shard := projection.ShardID{Consumer: "halting"}
	pgtest.Eventually(t, time.Minute, "the shard to die on the archived poison", func() bool {
		st, err := admin.Status(e.ctx, shard)
		return err == nil && st.Status == projection.StatusDead && st.FailedEventID == poison.ID
	})
	if out, stderr, code := e.cli("consumer", "skip", "halting"); code != ExitOK {
		t.Fatalf("consumer skip of an archived event: exit %d: %s %s", code, out, stderr)
	}
	dls, err := projection.ListDeadLetters(e.ctx, store, projection.DeadLetterFilter{Consumer: "halting"})
	if err != nil || len(dls) != 1 || dls[0].EventID != poison.ID || dls[0].Reason != "skipped" {
		t.Fatalf("dead letters after the skip: %+v, %v", dls, err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatalf("catch up after the skip: %v", err)
	}
}
