package cli

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/jetstream"
	"github.com/projectorhq/projector/stores/postgres"
)

// A bulk `relay dead-letters retry` sums up what it did (one discarded
// meanwhile does not stop the others), and Ctrl-C stops it, saying how
// many it left untried. Before, it tried every one left after an
// interrupt, each failing alike, and the error only listed failures.
func TestRelayDeadLettersRetryGoesOnAndStops(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	effects := e.store.Table("cli_bulk_effects")
	e.exec(`CREATE TABLE ` + effects + ` (event_id uuid NOT NULL)`)
	var hook sync.Map // event id → func()
	wired := Config{JetStreamConsumers: func(store *postgres.Store) ([]*jetstream.Consumer, error) {
		c, err := jetstream.NewConsumer(jetstream.ConsumerConfig{Store: store, Subscription: "feed",
			Handler: func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
				if _, err := tx.Exec(ctx, `INSERT INTO `+effects+` (event_id) VALUES ($1)`, ev.ID); err != nil {
					return err
				}
				if h, ok := hook.LoadAndDelete(ev.ID); ok {
					h.(func())()
				}
				return nil
			}})
		return []*jetstream.Consumer{c}, err
	}}
	var ids []int64
	var evs []projector.Event
	for i := range 6 {
		id, ev := e.deadLetter("feed", fmt.Sprintf("g%d", i))
		ids, evs = append(ids, id), append(evs, ev)
	}
	applied := func(ev projector.Event) int {
		return e.count(`SELECT count(*) FROM `+effects+` WHERE event_id = $1`, ev.ID)
	}

	// The second of three is discarded by another operator while the
	// first is retried.
	hook.Store(evs[0].ID, func() {
		if err := jetstream.DiscardDeadLetter(e.ctx, e.store, "feed", ids[1]); err != nil {
			t.Errorf("discard meanwhile: %v", err)
		}
	})
	out, code := e.run(wired, "relay", "dead-letters", "retry", fmt.Sprint(ids[0]), fmt.Sprint(ids[1]), fmt.Sprint(ids[2]), "--subscription", "feed")
	if code != ExitRefused {
		t.Errorf("one discarded meanwhile: exit %d, want %d", code, ExitRefused)
	}
	for _, want := range []string{
		fmt.Sprintf("dead letter %d: applied and resolved\n", ids[0]),
		fmt.Sprintf("dead letter %d: not retried: retry dead letter %d of feed: it is discarded already", ids[1], ids[1]),
		fmt.Sprintf("dead letter %d: applied and resolved\n", ids[2]),
		"error: 2 of 3 dead letters resolved; 1 could not be retried: retry dead letter",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("one discarded meanwhile: output lacks %q:\n%s", want, out)
		}
	}
	if applied(evs[0]) != 1 || applied(evs[1]) != 0 || applied(evs[2]) != 1 {
		t.Errorf("one discarded meanwhile: applied %d, %d, %d times, want 1, 0, 1", applied(evs[0]), applied(evs[1]), applied(evs[2]))
	}

	// Ctrl-C while the first of the other three is retried: the other two
	// are left untried and open.
	ctx, interrupt := context.WithCancel(context.Background())
	defer interrupt()
	hook.Store(evs[3].ID, func() { interrupt() })
	e.ctx = ctx
	out, code = e.run(wired, "relay", "dead-letters", "retry", "--all", "--subscription", "feed")
	e.ctx = context.Background()
	if code != ExitError {
		t.Errorf("interrupted: exit %d, want %d", code, ExitError)
	}
	for _, want := range []string{"interrupted: 1 of 3 dead letters tried", "2 left untried", "left untried (interrupted)"} {
		if !strings.Contains(out, want) {
			t.Errorf("interrupted: output lacks %q:\n%s", want, out)
		}
	}
	for _, id := range ids[4:] {
		if strings.Contains(out, fmt.Sprintf("dead letter %d:", id)) {
			t.Errorf("interrupted: dead letter %d tried after the interrupt:\n%s", id, out)
		}
	}
	if n := e.count(`SELECT count(*) FROM `+e.store.Table("projector_jetstream_dead_letters")+` WHERE id = ANY($1) AND status = 'open' AND last_retried_at IS NULL`, ids[4:]); n != 2 {
		t.Errorf("interrupted: %d of the two after the interrupt untouched, want 2", n)
	}
	if applied(evs[4]) != 0 || applied(evs[5]) != 0 {
		t.Errorf("interrupted: the two after it applied")
	}
}
