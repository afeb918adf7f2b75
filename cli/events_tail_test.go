package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
)

// ticketArchived is an event type the writer defines and the tail's binary
// does not: an older type, or another application's.
type ticketArchived struct {
	Shelf string `json:"shelf"`
}

// tailEnv is a log of two tickets (opened, commented) and one archived
// event, written by a binary that defines ticket.archived.
func tailEnv(t *testing.T) (schema string, reg *projector.Registry) {
	t.Helper()
	writer := testevents.New()
	if _, err := projector.Define[ticketArchived](writer.Registry, "ticket.archived"); err != nil {
		t.Fatal(err)
	}
	store := pgtest.Store(t, writer.Registry)
	ctx := context.Background()
	for _, id := range []string{"t1", "t2"} {
		if err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
			_, err := store.Append(ctx, tx, projector.Stream("ticket", id), projector.NoStream,
				testevents.TicketOpened{Title: id}, testevents.TicketCommented{Body: "c"})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		_, err := store.Append(ctx, tx, projector.Stream("ticket", "t1"), projector.ExactVersion(2), ticketArchived{Shelf: "B7"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return store.Schema(), testevents.New().Registry
}

func runTail(t *testing.T, reg *projector.Registry, schema string, args ...string) *cliRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := startCLI(ctx, t, reg, schema, Wiring{}, append([]string{"events", "tail"}, args...)...)
	select {
	case <-r.done:
	case <-time.After(20 * time.Second):
		cancel()
		<-r.done
		t.Fatalf("events tail %v still following after 20s:\n%s", args, r.out.String())
	}
	return r
}

// --no-follow prints the history and exits, also when fewer events match
// than --limit asks for.
func TestEventsTailNoFollow(t *testing.T) {
	t.Parallel()
	schema, reg := tailEnv(t)
	r := runTail(t, reg, schema, "--from-start", "--limit", "10", "--no-follow", "--stream-type", "ticket")
	r.want(t, ExitOK, "ticket.opened", "ticket.commented", "ticket.archived")
	if n := strings.Count(r.out.String(), "\n"); n != 5 {
		t.Fatalf("%d lines printed, want the 5 events of the log:\n%s", n, r.out.String())
	}
	r = runTail(t, reg, schema, "--from-start", "--limit", "2", "--no-follow")
	r.want(t, ExitOK)
	if n := strings.Count(r.out.String(), "\n"); n != 2 {
		t.Fatalf("--limit 2: %d lines printed:\n%s", n, r.out.String())
	}
}

// --type accepts a type the binary does not define when the log holds it,
// printing its events as stored with a note; a type in neither is refused.
func TestEventsTailTypeInLogOnly(t *testing.T) {
	t.Parallel()
	schema, reg := tailEnv(t)
	r := runTail(t, reg, schema, "--from-start", "--limit", "1", "--type", "ticket.archived")
	r.want(t, ExitOK, `"B7"`, `note: --type "ticket.archived" is not defined by this binary`)
	if strings.Contains(r.out.String(), "ticket.opened") {
		t.Fatalf("--type ticket.archived printed another type:\n%s", r.out.String())
	}
	runTail(t, reg, schema, "--from-start", "--limit", "1", "--type", "ticket.vanished").want(t, ExitUsage, `"ticket.vanished"`, "holds no event of it")
	runTail(t, reg, schema, "--type", "bad\x00type").want(t, ExitUsage, "--type")
}
