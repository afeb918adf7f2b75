package cli

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
)

// The stock binary on an application's schema (a registry without the
// application's types) serves `parked show` and `parked retry --wait` of an
// open park, as README promises. Both read the parked events with the
// binary's registry before: show failed with "unknown event type", and
// retry --wait recorded the request, then reported it failed (exit 1) —
// an operator told a retry failed that a dispatcher then carried out.
func TestParkedCommandsOfTheStockBinary(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.New()
	store := pgtest.Store(t, types.Registry)
	e := &dlEnv{t: t, ctx: ctx, store: store, url: pgtest.URL(t)}
	e.exec(`CREATE TABLE ` + store.Table("trace") + ` (event_id uuid NOT NULL)`)
	e.exec(`CREATE TABLE ` + store.Table("poison_switch") + ` (fail bool NOT NULL)`)
	e.exec(`INSERT INTO ` + store.Table("poison_switch") + ` VALUES (true)`)
	if err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		_, err := store.Append(ctx, tx, projector.Stream("ticket", "p1"), projector.NoStream,
			testevents.TicketOpened{Title: "poison"}, testevents.TicketCommented{Body: "later"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	d := caughtUpDispatcher(t, store, parking(store.Schema(), types))

	stock := projector.NewRegistry()
	out, code := runIn(t, store.Schema(), stock, "parked", "list", "-o", "json")
	var listed []projection.Park
	if code != ExitOK || json.Unmarshal([]byte(out), &listed) != nil || len(listed) != 1 {
		t.Fatalf("list: exit %d:\n%s", code, out)
	}
	id := strconv.FormatInt(listed[0].ID, 10)

	out, code = runIn(t, store.Schema(), stock, "parked", "show", id)
	if code != ExitOK || !strings.Contains(out, "sequence:   2 events") || !strings.Contains(out, types.Opened.Name()) || !strings.Contains(out, "poison") {
		t.Fatalf("show of an open park by the stock binary: exit %d:\n%s", code, out)
	}
	out, code = runIn(t, store.Schema(), stock, "parked", "show", id, "-o", "json")
	var shown struct {
		Sequence []projector.Event `json:"sequence"`
	}
	if code != ExitOK || json.Unmarshal([]byte(out), &shown) != nil || len(shown.Sequence) != 2 {
		t.Fatalf("show -o json by the stock binary: exit %d:\n%s", code, out)
	}

	// No dispatcher runs: the wait runs out, says the request stays, and
	// it does; the next dispatcher carries it out.
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := d.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	out, code = runIn(t, store.Schema(), stock, "parked", "retry", id, "--wait", "--timeout", "300ms")
	if code != ExitError || !strings.Contains(out, "no dispatcher carried out the retry") || strings.Contains(out, "unknown event type") {
		t.Fatalf("retry --wait by the stock binary, no dispatcher: exit %d, want %d saying the request stays:\n%s", code, ExitError, out)
	}
	if _, err := projection.ParkByID(ctx, store, listed[0].ID+1000); !errors.Is(err, projector.ErrNotFound) {
		t.Fatalf("ParkByID of an unknown id: %v, want ErrNotFound", err)
	}
	if _, _, err := projection.GetParkRaw(ctx, store, -1); !errors.Is(err, projector.ErrNotFound) {
		t.Fatalf("GetParkRaw of a negative id: %v, want ErrNotFound", err)
	}
	p, err := projection.ParkByID(ctx, store, listed[0].ID)
	if err != nil || p.Status != projection.ParkOpen || p.RetryRequestedAt == nil {
		t.Fatalf("after the wait: %+v, %v; want open with the request recorded", p, err)
	}
	e.exec(`UPDATE ` + store.Table("poison_switch") + ` SET fail = false`)
	caughtUpDispatcher(t, store, parking(store.Schema(), types))
	pgtest.Eventually(t, 30*time.Second, "the recorded request carried out", func() bool {
		p, err := projection.ParkByID(ctx, store, listed[0].ID)
		return err == nil && p.Status == projection.ParkResolved
	})
	// Parked at its first attempt (MaxAttempts 1), resolved by a retry:
	// two attempts, not "parked after 2 attempts".
	out, code = runIn(t, store.Schema(), stock, "parked", "show", id)
	if code != ExitOK || !strings.Contains(out, "; 2 attempts in all, its retries included\n") {
		t.Fatalf("show of the retried park: exit %d:\n%s", code, out)
	}
}
