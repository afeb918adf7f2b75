package cli

import (
	"context"
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

// parkChildEnv makes this test binary the ops binary of an application with
// the "parking" projection wired in.
const parkChildEnv = "PROJECTOR_TEST_PARKED_CLI"

func init() {
	asOpsBinary(parkChildEnv, func(types testevents.Types, schema, _ string) Wiring {
		return Wiring{Async: []*projection.Async{parking(schema, types)}}
	})
}

// parking is poisonable (see deadletters_test.go) in ParkStream mode,
// parking at the first failure.
func parking(schema string, types testevents.Types) *projection.Async {
	return poisonable("parking", schema, types, projection.AsyncConfig{ErrorMode: projection.ParkStream, MaxAttempts: 1})
}

// The parked commands end to end, as the application's ops binary: list and show
// with the parked sequence, retry --here that fails (exit 1, park intact),
// succeeds and is refused the second time (exit 3), discard with its
// record, a retry request a running dispatcher carries out, and usage
// errors for numbers and names out of range (exit 2).
func TestParkedCommand(t *testing.T) {
	t.Parallel()
	types := testevents.New()
	store := pgtest.Store(t, types.Registry)
	e := &dlEnv{t: t, ctx: context.Background(), store: store, url: pgtest.URL(t)}
	base := []string{"--database-url", e.url, "--schema", store.Schema()}
	cli := func(args ...string) (string, string, int) {
		t.Helper()
		return runOps(e.ctx, parkChildEnv, "1", append(base, args...)...)
	}
	// The commands whose record names the operator run as a separate
	// process, with $USER set: the default of --by is read from it.
	cliAsTester := func(args ...string) (string, string, int) {
		t.Helper()
		return runOpsProcess(t, e.ctx, []string{parkChildEnv + "=1", "USER=tester"}, append(base, args...)...)
	}
	e.exec(`CREATE TABLE ` + store.Table("trace") + ` (event_id uuid NOT NULL)`)
	e.exec(`CREATE TABLE ` + store.Table("poison_switch") + ` (fail bool NOT NULL)`)
	e.exec(`INSERT INTO ` + store.Table("poison_switch") + ` VALUES (true)`)
	var poisons []projector.Event
	for i := range 3 {
		err := pgx.BeginFunc(e.ctx, store.Pool(), func(tx pgx.Tx) error {
			res, err := store.Append(e.ctx, tx, projector.Stream("ticket", fmt.Sprintf("p%d", i)), projector.NoStream,
				testevents.TicketOpened{Title: "poison"}, testevents.TicketCommented{Body: "later"})
			poisons = append(poisons, res.Events[0])
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	caughtUpDispatcher(t, store, parking(store.Schema(), types))

	out, stderr, code := cli("parked", "list", "-o", "json")
	var listed []projection.Park
	if code != ExitOK || json.Unmarshal([]byte(out), &listed) != nil || len(listed) != 3 {
		t.Fatalf("list -o json: exit %d, %q, %s", code, out, stderr)
	}
	ids := make([]string, 3)
	for i, p := range listed {
		ids[i] = fmt.Sprint(p.ID)
		if p.EventID != poisons[i].ID || p.Status != projection.ParkOpen || p.Events != 2 {
			t.Fatalf("listed %d: %+v, want the poison %s parked with 2 events", i, p, poisons[i].ID)
		}
	}
	if out, _, code := cli("parked", "list", "--consumer", "parking", "--limit", "1", "--after", ids[0]); code != ExitOK ||
		!strings.Contains(out, "cannot digest poison") || strings.Count(out, "\n") != 2 || !strings.Contains(out, "\n"+ids[1]+" ") {
		t.Fatalf("list, a page of one after the first:\n%s", out)
	}
	if out, _, code := cli("status"); code != ExitOK || !strings.Contains(out, "PARKED STREAMS") || !strings.Contains(out, "parked list --consumer parking") {
		t.Fatalf("status: exit %d:\n%s", code, out)
	}
	if out, _, code := cli("consumer", "status", "parking"); code != ExitOK || !strings.Contains(out, "parked streams  3,") {
		t.Fatalf("consumer status: exit %d:\n%s", code, out)
	}
	if out, _, code := cli("parked", "show", ids[0]); code != ExitOK || !strings.Contains(out, "sequence:   2 events") || !strings.Contains(out, poisons[0].ID.String()) {
		t.Fatalf("show: exit %d:\n%s", code, out)
	}
	for _, args := range [][]string{
		{"parked", "list", "--limit", "0"}, {"parked", "list", "--limit", "10001"}, {"parked", "list", "--after", "-1"},
		{"parked", "list", "--status", "open"}, {"parked", "show", "0"}, {"parked", "show", "x"}, {"parked", "retry"},
		{"parked", "discard", ids[0], "--by", "\x1b[2J"}, {"parked", "list", "--consumer", "a\xffb"},
	} {
		if _, stderr, code := cli(args...); code != ExitUsage {
			t.Fatalf("%q: exit %d (%s), want %d", args, code, stderr, ExitUsage)
		}
	}

	// A failing retry applies nothing and keeps the park.
	if _, stderr, code := cli("parked", "retry", "--here", ids[0]); code != ExitError || !strings.Contains(stderr, "still parked") {
		t.Fatalf("failing retry: exit %d: %s", code, stderr)
	}
	e.exec(`UPDATE ` + store.Table("poison_switch") + ` SET fail = false`)
	if out, stderr, code := cli("parked", "retry", "--here", ids[0]); code != ExitOK || !strings.Contains(out, "applied its 2 events") {
		t.Fatalf("retry: exit %d: %s %s", code, out, stderr)
	}
	if n := e.traced(poisons[0].ID); n != 1 {
		t.Fatalf("retried event applied %d times", n)
	}
	if _, stderr, code := cli("parked", "retry", "--here", ids[0]); code != ExitRefused || !strings.Contains(stderr, "resolved already") {
		t.Fatalf("second retry: exit %d: %s", code, stderr)
	}

	// Discard, with its record.
	if out, stderr, code := cliAsTester("parked", "discard", ids[1]); code != ExitOK || !strings.Contains(out, "discarded 2 events") || !strings.Contains(out, "tester@") {
		t.Fatalf("discard: exit %d: %s %s", code, out, stderr)
	}
	if _, _, code := cli("parked", "discard", ids[1]); code != ExitRefused {
		t.Fatalf("second discard: exit %d, want %d", code, ExitRefused)
	}
	if out, _, code := cli("parked", "show", ids[1]); code != ExitOK || !strings.Contains(out, "discarded:") || !strings.Contains(out, "2 events") {
		t.Fatalf("show discarded: exit %d:\n%s", code, out)
	}

	// A retry request the running dispatcher carries out.
	if out, stderr, code := cliAsTester("parked", "retry", ids[2]); code != ExitOK || !strings.Contains(out, "requested") {
		t.Fatalf("retry request: exit %d: %s %s", code, out, stderr)
	}
	pgtest.Eventually(t, 30*time.Second, "the dispatcher carries out the retry request", func() bool {
		p, _, err := projection.GetPark(e.ctx, store, listed[2].ID)
		return err == nil && p.Status == projection.ParkResolved && strings.HasPrefix(p.ResolvedBy, "tester@")
	})
}
