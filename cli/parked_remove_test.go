package cli

import (
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
)

// Unknown consumers and ids in the parked and dead-letters commands, a
// discard that cancels a pending retry request, and `consumer remove`
// closing the consumer's open parks, which stay listable by its name.
func TestParkedUnknownsAndRemoval(t *testing.T) {
	t.Parallel()
	e, store, types := newPoisonEnv(t)
	base := []string{"--database-url", e.url, "--schema", store.Schema()}
	cli := func(args ...string) (string, string, int) {
		t.Helper()
		return runOps(e.ctx, parkChildEnv, "1", append(base, args...)...)
	}
	cliAsTester := func(args ...string) (string, string, int) {
		t.Helper()
		return runOpsProcess(t, e.ctx, []string{parkChildEnv + "=1", "USER=tester"}, append(base, args...)...)
	}
	for i := range 2 {
		if err := pgx.BeginFunc(e.ctx, store.Pool(), func(tx pgx.Tx) error {
			_, err := store.Append(e.ctx, tx, projector.Stream("ticket", fmt.Sprintf("p%d", i)), projector.NoStream,
				testevents.TicketOpened{Title: "poison"}, testevents.TicketCommented{Body: "later"})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	d := caughtUpDispatcher(t, store, parking(store.Schema(), types))
	if err := d.Stop(e.ctx); err != nil {
		t.Fatal(err)
	}
	parks, err := projection.ListParks(e.ctx, store, projection.ParkFilter{Status: projection.ParkOpen})
	if err != nil || len(parks) != 2 {
		t.Fatalf("parks: %+v, %v", parks, err)
	}
	ids := []string{fmt.Sprint(parks[0].ID), fmt.Sprint(parks[1].ID)}

	// A consumer name that is neither registered nor has parks (dead
	// letters) is a usage error listing the registered ones.
	for _, name := range []string{"nosuch", "Parking", "\x01", strings.Repeat("x", 100_000)} {
		for _, args := range [][]string{
			{"parked", "list", "--consumer", name},
			{"dead-letters", "list", "--consumer", name},
			{"dead-letters", "retry", "--all", "--consumer", name},
		} {
			if _, stderr, code := cli(args...); code != ExitUsage || !strings.Contains(stderr, "not found; registered consumers: parking") ||
				len(stderr) > 1000 {
				t.Errorf("%.60q: exit %d, want %d listing the registered consumers: %.300s", args, code, ExitUsage, stderr)
			}
		}
	}
	if out, stderr, code := cli("dead-letters", "list", "--consumer", "parking"); code != ExitOK || !strings.Contains(out, "no dead letters match") {
		t.Errorf("dead letters of a registered consumer with none: exit %d: %s %s", code, out, stderr)
	}
	// Text a filter cannot hold names the flag.
	for _, args := range [][]string{{"parked", "list", "--consumer", "bo\xffard"}, {"dead-letters", "list", "--consumer", "bo\xffard"}} {
		if _, stderr, code := cli(args...); code != ExitUsage || !strings.Contains(stderr, `--consumer "bo\xffard" is not valid UTF-8`) {
			t.Errorf("%q: exit %d: %s", args, code, stderr)
		}
	}
	if _, stderr, code := cli("parked", "list", "--tenant", "\x00"); code != ExitUsage || !strings.Contains(stderr, "--tenant ") {
		t.Errorf("a NUL tenant: exit %d: %s", code, stderr)
	}
	// An id that names nothing: not found, exit 1 (as an unknown subject or
	// saga instance), saying where to look.
	for _, args := range [][]string{
		{"parked", "show", "999999"}, {"parked", "retry", "999999"}, {"parked", "retry", "--wait", "999999"}, {"parked", "discard", "999999"},
		{"dead-letters", "show", "999999"}, {"dead-letters", "retry", "999999"}, {"dead-letters", "discard", "999999"},
	} {
		if _, stderr, code := cli(args...); code != ExitError || !strings.Contains(stderr, "999999: not found") || !strings.Contains(stderr, " list --status all` lists them") {
			t.Errorf("%q: exit %d, want %d: %s", args, code, ExitError, stderr)
		}
	}

	// A discard cancelling a retry no dispatcher has carried out says so.
	if out, stderr, code := cli("parked", "retry", ids[0]); code != ExitOK || !strings.Contains(out, "requested") {
		t.Fatalf("retry request: exit %d: %s %s", code, out, stderr)
	}
	if out, stderr, code := cliAsTester("parked", "discard", ids[0]); code != ExitOK || !strings.Contains(out, "discarded 2 events") ||
		!strings.Contains(out, "this cancelled the retry requested at ") {
		t.Fatalf("discard of a park with a retry requested: exit %d: %s %s", code, out, stderr)
	}
	if out, _, code := cliAsTester("parked", "discard", ids[0]); code != ExitRefused || strings.Contains(out, "cancelled") {
		t.Fatalf("second discard: exit %d: %s", code, out)
	}

	// Removing the consumer discards its open park, cancelling its retry
	// request, and says so; its parks stay listable by its name.
	if out, stderr, code := cli("parked", "retry", ids[1]); code != ExitOK {
		t.Fatalf("retry request: exit %d: %s %s", code, out, stderr)
	}
	out, stderr, code := cliAsTester("consumer", "remove", "parking")
	if code != ExitOK || !strings.Contains(out, "removed consumer parking: 1 shards") ||
		!strings.Contains(out, "discarded its 1 open park (parked list --consumer parking --status discarded), cancelling 1 pending retry request") {
		t.Fatalf("consumer remove: exit %d: %s %s", code, out, stderr)
	}
	if out, _, code := cli("parked", "show", ids[1]); code != ExitOK || !strings.Contains(out, "discarded:") || !strings.Contains(out, "(consumer removed)") ||
		!strings.Contains(out, "tester@") {
		t.Fatalf("show of the removed consumer's park: exit %d:\n%s", code, out)
	}
	if out, _, code := cli("parked", "list", "--consumer", "parking", "--status", "discarded"); code != ExitOK || strings.Count(out, "\n") != 3 {
		t.Fatalf("the removed consumer's parks: exit %d:\n%s", code, out)
	}
	if out, _, code := cli("parked", "list", "--consumer", "parking"); code != ExitOK || !strings.Contains(out, "no parks match") {
		t.Fatalf("open parks of the removed consumer: exit %d:\n%s", code, out)
	}
}
