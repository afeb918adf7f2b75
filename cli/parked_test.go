package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/user"
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
	if out, _, code := cli("parked", "show", ids[0]); code != ExitOK || !strings.Contains(out, "sequence:   2 events") || !strings.Contains(out, poisons[0].ID.String()) ||
		!strings.Contains(out, " after 1 attempt\n") {
		t.Fatalf("show: exit %d:\n%s", code, out)
	}
	for _, args := range [][]string{
		{"parked", "list", "--limit", "0"}, {"parked", "list", "--limit", "10001"}, {"parked", "list", "--after", "-1"},
		{"parked", "list", "--status", "open"}, {"parked", "show", "0"}, {"parked", "show", "x"}, {"parked", "retry"},
		{"parked", "discard", ids[0], "--by", "\x1b[2J"}, {"parked", "list", "--consumer", "a\xffb"},
		{"parked", "retry", ids[0], "--wait", "--timeout", "0s"}, {"parked", "retry", ids[0], "--wait", "--timeout", "2h"},
		{"parked", "retry", ids[0], "--timeout", "1s"}, {"parked", "retry", ids[0], "--here", "--wait"},
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
	// Its record says what resolved it; the error of the failed retry
	// before is labelled as such, in show and in list.
	if out, _, code := cli("parked", "show", ids[0]); code != ExitOK || !strings.Contains(out, "resolved:   ") ||
		!strings.Contains(out, "a retry applied its 2 events in order") || strings.Contains(out, "\nerror:") ||
		!strings.Contains(out, "last error: retry: ") || !strings.Contains(out, "(before it was resolved") {
		t.Fatalf("show resolved: exit %d:\n%s", code, out)
	}
	if out, _, code := cli("parked", "list", "--status", "resolved"); code != ExitOK || !strings.Contains(out, "resolved by ") ||
		!strings.Contains(out, "last error before: retry: ") {
		t.Fatalf("list resolved: exit %d:\n%s", code, out)
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

	// A retry request the running dispatcher carries out, followed with
	// --wait, by an operator whose shell has no $USER: the record names
	// the OS user.
	osUser, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	out, stderr, code = runOpsProcess(t, e.ctx, []string{parkChildEnv + "=1", "USER="}, append(base, "parked", "retry", "--wait", ids[2])...)
	if code != ExitOK || !strings.Contains(out, "requested") || !strings.Contains(out, "a dispatcher applied its 2 events in order and resolved it") {
		t.Fatalf("retry --wait: exit %d: %s %s", code, out, stderr)
	}
	if p, _, err := projection.GetPark(e.ctx, store, listed[2].ID); err != nil || p.Status != projection.ParkResolved ||
		!strings.HasPrefix(p.ResolvedBy, osUser.Username+"@") {
		t.Fatalf("after retry --wait: %+v, %v; want resolved by %s@host", p, err, osUser.Username)
	}

	// A requested retry that fails again: --wait reports the new error,
	// exit 1, and the park stays.
	e.exec(`UPDATE ` + store.Table("poison_switch") + ` SET fail = true`)
	if err := pgx.BeginFunc(e.ctx, store.Pool(), func(tx pgx.Tx) error {
		_, err := store.Append(e.ctx, tx, projector.Stream("ticket", "p3"), projector.NoStream, testevents.TicketOpened{Title: "poison"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var again projection.Park
	pgtest.Eventually(t, 30*time.Second, "the new stream parked", func() bool {
		open, err := projection.ListParks(e.ctx, store, projection.ParkFilter{Status: projection.ParkOpen})
		if err == nil && len(open) == 1 {
			again = open[0]
		}
		return again.ID != 0
	})
	if _, stderr, code := cli("parked", "retry", "--wait", "--timeout", "30s", fmt.Sprint(again.ID)); code != ExitError ||
		!strings.Contains(stderr, "still parked") || !strings.Contains(stderr, "cannot digest poison") {
		t.Fatalf("failing retry --wait: exit %d: %s", code, stderr)
	}
	if p, _, err := projection.GetPark(e.ctx, store, again.ID); err != nil || p.Status != projection.ParkOpen || p.RetryRequestedAt != nil {
		t.Fatalf("after the failing retry --wait: %+v, %v; want parked, no request left", p, err)
	}
	// A request no running dispatcher carries out (its consumer is none of
	// theirs): --wait gives up at --timeout, exit 1, saying what to do.
	e.exec(`UPDATE ` + store.Table("projector_parks") + ` SET consumer = 'elsewhere' WHERE id = ` + fmt.Sprint(again.ID))
	if _, stderr, code := cli("parked", "retry", "--wait", "--timeout", "300ms", fmt.Sprint(again.ID)); code != ExitError ||
		!strings.Contains(stderr, "no dispatcher carried out the retry within 300ms; the request stays") ||
		!strings.Contains(stderr, "with consumer elsewhere") {
		t.Fatalf("retry --wait with no dispatcher: exit %d: %s", code, stderr)
	}
}

// Without $USER the operator is the OS account's name, else the uid.
func TestDefaultOperator(t *testing.T) {
	t.Parallel()
	noEnv := func(string) string { return "" }
	if got := defaultOperator(func(string) string { return "ann" }, user.Current); got != "ann" {
		t.Errorf("with $USER: %q, want ann", got)
	}
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	if got := defaultOperator(noEnv, user.Current); got != u.Username {
		t.Errorf("without $USER: %q, want the OS user %q", got, u.Username)
	}
	noUser := func() (*user.User, error) { return nil, user.UnknownUserIdError(os.Getuid()) }
	if got, want := defaultOperator(noEnv, noUser), fmt.Sprintf("uid %d", os.Getuid()); got != want {
		t.Errorf("without $USER or an account: %q, want %q", got, want)
	}
}

// `parked retry --wait` on a park another operator discards while it
// waits: exit 3, naming who discarded it. The command is started first;
// the test discards the park once the retry request is in its row, so
// the command has requested and is following the park, with no dispatcher
// running to carry the request out.
func TestParkedRetryWaitDiscardedMeanwhile(t *testing.T) {
	t.Parallel()
	e, store, types := newPoisonEnv(t)
	if err := pgx.BeginFunc(e.ctx, store.Pool(), func(tx pgx.Tx) error {
		_, err := store.Append(e.ctx, tx, projector.Stream("ticket", "p0"), projector.NoStream, testevents.TicketOpened{Title: "poison"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	d := caughtUpDispatcher(t, store, parking(store.Schema(), types))
	if err := d.Stop(e.ctx); err != nil {
		t.Fatal(err)
	}
	parks, err := projection.ListParks(e.ctx, store, projection.ParkFilter{Status: projection.ParkOpen})
	if err != nil || len(parks) != 1 {
		t.Fatalf("parks: %+v, %v; want the poisoned stream's", parks, err)
	}
	id := parks[0].ID

	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	r := startCLI(ctx, t, types.Registry, store.Schema(), Wiring{}, "parked", "retry", "--wait", "--timeout", "1m", fmt.Sprint(id))
	pgtest.Eventually(t, time.Minute, "the retry request in the park's row", func() bool {
		p, _, err := projection.GetPark(e.ctx, store, id)
		return err == nil && p.RetryRequestedAt != nil
	})
	if _, err := projection.DiscardPark(e.ctx, store, id, "ann"); err != nil {
		t.Fatal(err)
	}
	<-r.done
	if r.code != ExitRefused || !strings.Contains(r.errOut.String(), fmt.Sprintf("park %d: discarded meanwhile by ann; its events are never applied", id)) {
		t.Fatalf("exit %d, want %d naming the discard\nstdout:\n%s\nstderr:\n%s", r.code, ExitRefused, r.out.String(), r.errOut.String())
	}
}
