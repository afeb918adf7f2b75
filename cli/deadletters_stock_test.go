package cli

import (
	"encoding/json"
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

// The stock binary knows none of the application's event types, and
// operations.md's dead-letter runbook uses it to show a dead letter and to
// request its retry: both work (they failed with "unknown event type"),
// and the request is carried out by a dispatcher that has the projection.
// --here says the binary does not wire the consumer.
func TestDeadLettersCommandsOfTheStockBinary(t *testing.T) {
	t.Parallel()
	e, store, types := newPoisonEnv(t)
	var poison projector.Event
	if err := pgx.BeginFunc(e.ctx, store.Pool(), func(tx pgx.Tx) error {
		res, err := store.Append(e.ctx, tx, projector.Stream("ticket", "p1"), projector.NoStream,
			testevents.TicketOpened{Title: "poison"}, testevents.TicketCommented{Body: "later"})
		poison = res.Events[0]
		return err
	}); err != nil {
		t.Fatal(err)
	}
	caughtUpDispatcher(t, store, tolerant(store.Schema(), types))
	dls, err := projection.ListDeadLetters(e.ctx, store, projection.DeadLetterFilter{})
	if err != nil || len(dls) != 1 {
		t.Fatalf("dead letters: %+v, %v", dls, err)
	}
	id := fmt.Sprint(dls[0].ID)

	stock := projector.NewRegistry()
	out, code := runIn(t, store.Schema(), stock, "dead-letters", "show", id)
	if code != ExitOK || !strings.Contains(out, `"poison"`) || !strings.Contains(out, poison.ID.String()) || !strings.Contains(out, types.Opened.Name()) {
		t.Fatalf("show by the stock binary: exit %d:\n%s", code, out)
	}
	out, code = runIn(t, store.Schema(), stock, "dead-letters", "show", id, "-o", "json")
	var shown struct {
		Event *projector.Event `json:"event"`
	}
	if code != ExitOK || json.Unmarshal([]byte(out), &shown) != nil || shown.Event == nil || shown.Event.ID != poison.ID || !strings.Contains(string(shown.Event.Data), "poison") {
		t.Fatalf("show -o json by the stock binary: exit %d:\n%s", code, out)
	}
	if out, code = runIn(t, store.Schema(), stock, "dead-letters", "retry", "--here", id); code != ExitUsage || !strings.Contains(out, "has no async projection or saga") {
		t.Fatalf("retry --here by the stock binary: exit %d, want %d naming the unwired consumer:\n%s", code, ExitUsage, out)
	}

	// Fixed, the request filed by the stock binary is carried out by the
	// running dispatcher, which has the projection: applied once.
	e.exec(`UPDATE ` + store.Table("poison_switch") + ` SET fail = false`)
	if out, code = runIn(t, store.Schema(), stock, "dead-letters", "retry", "--all", "--consumer", "tolerant"); code != ExitOK || !strings.Contains(out, "retry requested for 1 dead letters") {
		t.Fatalf("retry request by the stock binary: exit %d:\n%s", code, out)
	}
	pgtest.Eventually(t, 30*time.Second, "the dispatcher to carry out the stock binary's request", func() bool {
		dl, _, err := projection.GetDeadLetterRaw(e.ctx, store, dls[0].ID)
		return err == nil && dl.Status == projection.DeadLetterResolved
	})
	if n := e.traced(poison.ID); n != 1 {
		t.Fatalf("the retried event applied %d times, want once", n)
	}
}
