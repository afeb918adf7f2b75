package cli

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/jetstream"
	"github.com/projectorhq/projector/stores/postgres"
)

type relayEnv struct {
	t     *testing.T
	ctx   context.Context
	types testevents.Types
	store *postgres.Store
}

func newRelayEnv(t *testing.T) *relayEnv {
	types := testevents.New()
	return &relayEnv{t: t, ctx: context.Background(), types: types, store: pgtest.Store(t, types.Registry)}
}

// run executes the command tree in-process on the env's schema with cfg
// and returns standard output and the exit code.
func (e *relayEnv) run(cfg Config, args ...string) (string, int) {
	e.t.Helper()
	cfg.Registry = e.types.Registry
	root := New(cfg)
	var out, errOut bytes.Buffer
	root.SetArgs(append(args, "--database-url", pgtest.URL(e.t), "--schema", e.store.Schema()))
	root.SetOut(&out)
	root.SetErr(&errOut)
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	err := root.ExecuteContext(ctx)
	if err != nil {
		out.WriteString("error: " + err.Error() + "\n")
	}
	return out.String(), ExitCode(err)
}

func (e *relayEnv) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.store.Pool().Exec(e.ctx, sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

func (e *relayEnv) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.store.Pool().QueryRow(e.ctx, sql, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// natsStream creates a JetStream stream of its own with the given
// duplicate window on the machine's NATS server.
func natsStream(t *testing.T, window time.Duration) (name, url string) {
	t.Helper()
	url = cmp.Or(os.Getenv("NATS_URL"), nats.DefaultURL)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("connect to NATS at %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := natsjs.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	name = "CLI_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, natsjs.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name) + ".>"}, Storage: natsjs.MemoryStorage, Duplicates: window}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, name)
	})
	return name, url
}

// prune-claims reads the stream's duplicate window and refuses a retention
// not longer than it plus --max-redelivery (exit 2, nothing deleted); a
// valid one deletes the subscription's claims past the window and keeps
// those inside it and other subscriptions'. Bad numbers and names exit 2.
func TestRelayPruneClaimsCommand(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	stream, url := natsStream(t, 30*time.Minute)
	claims := e.store.Table("projector_jetstream_claims")
	e.exec(`INSERT INTO ` + claims + ` (subscription, event_id, claimed_at) VALUES
		('feed', gen_random_uuid(), now() - interval '3 hours'), ('feed', gen_random_uuid(), now() - interval '20 minutes'),
		('other', gen_random_uuid(), now() - interval '3 hours')`)
	base := []string{"relay", "prune-claims", "--stream", stream, "--nats-url", url}
	for _, bad := range [][]string{
		{"--older-than", "35m"}, // window 30m + max redelivery 10m
		{"--older-than", "45m", "--max-redelivery", "20m"},
		{"--older-than", "0s"},
		{"--older-than", "-1h"},
		{"--older-than", "100000h"},
		{"--older-than", "2h", "--max-redelivery", "-1s"},
		{"--older-than", "2h", "--subscription", "a.b"},
		{"--older-than", "2h", "--subscription", "feed\x00"},
		{"--older-than", "2h", "--stream", "a b"},
		{},
	} {
		out, code := e.run(Config{}, append(base, bad...)...)
		if code != ExitUsage {
			t.Fatalf("%q: exit %d, want %d: %s", bad, code, ExitUsage, out)
		}
	}
	if n := e.count(`SELECT count(*) FROM ` + claims); n != 3 {
		t.Fatalf("%d claims after refused runs, want 3", n)
	}
	out, code := e.run(Config{}, append(base, "--older-than", "45m", "--subscription", "feed")...)
	if code != ExitOK || !strings.Contains(out, "deleted 1 claims") {
		t.Fatalf("exit %d: %s", code, out)
	}
	if n := e.count(`SELECT count(*) FROM ` + claims + ` WHERE subscription = 'feed' AND claimed_at > now() - interval '1 hour'`); n != 1 {
		t.Fatalf("the claim inside the window is gone")
	}
	if n := e.count(`SELECT count(*) FROM ` + claims); n != 2 {
		t.Fatalf("%d claims left, want the young one and the other subscription's", n)
	}
}

// deadLetter writes a dead letter for a real event of the log, as the
// claims consumer does, and returns its id.
func (e *relayEnv) deadLetter(subscription, streamID string) (int64, projector.Event) {
	e.t.Helper()
	var ev projector.Event
	err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		res, err := e.store.Append(e.ctx, tx, projector.TenantStream("acme", "ticket", streamID), projector.AnyVersion, testevents.TicketCommented{Body: "dl", N: 1})
		if err == nil {
			ev = res.Events[0]
		}
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	msg, err := jetstream.NewMsg("projector", ev)
	if err != nil {
		e.t.Fatal(err)
	}
	headers, err := json.Marshal(msg.Header)
	if err != nil {
		e.t.Fatal(err)
	}
	var id int64
	if err := e.store.Pool().QueryRow(e.ctx, `INSERT INTO `+e.store.Table("projector_jetstream_dead_letters")+
		` (subscription, event_id, subject, headers, data, error, deliveries) VALUES ($1, $2, $3, $4, $5, 'boom', 5) RETURNING id`,
		subscription, ev.ID, msg.Subject, headers, msg.Data).Scan(&id); err != nil {
		e.t.Fatal(err)
	}
	return id, ev
}

// The dead-letter commands of the claims consumer: list and show from any
// binary, retry only from one that wires the consumer (its handler runs,
// the dead letter is resolved with its effect), discard without the
// handler. Both keep the dead letter, listed with --status, and a second
// retry or discard is refused (exit 3). Bad ids, limits, statuses and names
// exit 2; a retry racing a discard of the same dead letter applies it at
// most once and only when the discard lost.
func TestRelayDeadLettersCommands(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	effects := e.store.Table("cli_feed_effects")
	e.exec(`CREATE TABLE ` + effects + ` (event_id uuid NOT NULL)`)
	handler := func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (event_id) VALUES ($1)`, ev.ID)
		return err
	}
	wired := Config{JetStreamConsumers: func(store *postgres.Store) ([]*jetstream.Consumer, error) {
		c, err := jetstream.NewConsumer(jetstream.ConsumerConfig{Store: store, Subscription: "feed", Handler: handler})
		return []*jetstream.Consumer{c}, err
	}}
	id1, ev1 := e.deadLetter("feed", "t1")
	id2, _ := e.deadLetter("feed", "t2")
	e.deadLetter("other", "t3")

	out, code := e.run(Config{}, "relay", "dead-letters", "list", "--subscription", "feed")
	if code != ExitOK || !strings.Contains(out, ev1.ID.String()) || !strings.Contains(out, "ticket.commented") || strings.Count(out, "\n") != 3 ||
		!strings.Contains(out, "STATUS") || strings.Count(out, " open ") != 2 {
		t.Fatalf("list: exit %d:\n%s", code, out)
	}
	out, code = e.run(Config{}, "relay", "dead-letters", "list", "--subscription", "feed", "-o", "json", "--limit", "1")
	var listed []relayDLJSON
	if err := json.Unmarshal([]byte(out), &listed); code != ExitOK || err != nil || len(listed) != 1 || listed[0].ID != id1 || listed[0].Error != "boom" ||
		listed[0].Status != "open" || listed[0].ResolvedAt != nil {
		t.Fatalf("list -o json: exit %d, %v: %s", code, err, out)
	}
	out, code = e.run(Config{}, "relay", "dead-letters", "show", fmt.Sprint(id1), "--subscription", "feed")
	if code != ExitOK || !strings.Contains(out, jetstream.HeaderEventID+": "+ev1.ID.String()) || !strings.Contains(out, `"body":"dl"`) ||
		!strings.Contains(out, "status      open\n") || strings.Contains(out, "resolved") {
		t.Fatalf("show: exit %d:\n%s", code, out)
	}
	if _, code := e.run(Config{}, "relay", "dead-letters", "show", fmt.Sprint(id1), "--subscription", "other"); code != ExitError {
		t.Fatalf("show of another subscription's id: exit %d, want %d", code, ExitError)
	}
	for _, bad := range [][]string{
		{"list", "--subscription", "feed", "--limit", "0"},
		{"list", "--subscription", "feed", "--limit", "10001"},
		{"list"},
		{"list", "--subscription", "feed.x"},
		{"list", "--subscription", "fe\x00ed"},
		{"list", "--subscription", "fe\xffed"},
		{"list", "--subscription", "feed", "--status", "gone"},
		{"list", "--subscription", "feed", "--status", ""},
		{"list", "--subscription", "feed", "--status", "OPEN"},
		{"list", "--subscription", "feed", "--after", "-1"},
		{"list", "--subscription", "feed", "--after", "x"},
		{"list", "--subscription", "feed", "--after", "99999999999999999999"},
		{"show", "0", "--subscription", "feed"},
		{"show", "-3", "--subscription", "feed"},
		{"show", "x", "--subscription", "feed"},
		{"show", "99999999999999999999", "--subscription", "feed"},
		{"show", "1", "2", "--subscription", "feed"},
		{"discard", "--subscription", "feed"},
		{"discard", "1", "--subscription", "fe ed"},
		{"retry", fmt.Sprint(id1), "--subscription", "feed"}, // no consumer wired
	} {
		out, code := e.run(Config{}, append([]string{"relay", "dead-letters"}, bad...)...)
		if code != ExitUsage {
			t.Fatalf("%q: exit %d, want %d: %s", bad, code, ExitUsage, out)
		}
	}
	if out, code := e.run(wired, "relay", "dead-letters", "retry", fmt.Sprint(id1), "--subscription", "other"); code != ExitUsage || !strings.Contains(out, "JetStreamConsumers") {
		t.Fatalf("retry of an unwired subscription: exit %d: %s", code, out)
	}

	out, code = e.run(wired, "relay", "dead-letters", "retry", fmt.Sprint(id1), "--subscription", "feed")
	if code != ExitOK || e.count(`SELECT count(*) FROM `+effects+` WHERE event_id = $1`, ev1.ID) != 1 || !strings.Contains(out, "resolved") {
		t.Fatalf("retry: exit %d: %s", code, out)
	}
	if out, code := e.run(wired, "relay", "dead-letters", "retry", fmt.Sprint(id1), "--subscription", "feed"); code != ExitRefused || !strings.Contains(out, "resolved already") {
		t.Fatalf("second retry: exit %d, want %d: %s", code, ExitRefused, out)
	}
	out, code = e.run(Config{}, "relay", "dead-letters", "discard", fmt.Sprint(id2), "--subscription", "feed")
	if code != ExitOK || !strings.Contains(out, "discarded") {
		t.Fatalf("discard: exit %d: %s", code, out)
	}
	if out, code := e.run(Config{}, "relay", "dead-letters", "discard", fmt.Sprint(id2), "--subscription", "feed"); code != ExitRefused || !strings.Contains(out, "discarded already") {
		t.Fatalf("second discard: exit %d, want %d: %s", code, ExitRefused, out)
	}
	if out, code := e.run(wired, "relay", "dead-letters", "retry", fmt.Sprint(id2), "--subscription", "feed"); code != ExitRefused || !strings.Contains(out, "discarded already") {
		t.Fatalf("retry after discard: exit %d, want %d: %s", code, ExitRefused, out)
	}
	if out, code := e.run(Config{}, "relay", "dead-letters", "discard", fmt.Sprint(id1), "--subscription", "feed"); code != ExitRefused {
		t.Fatalf("discard after retry: exit %d, want %d: %s", code, ExitRefused, out)
	}
	if n := e.count(`SELECT count(*) FROM ` + effects); n != 1 {
		t.Fatalf("%d effects after a discard, want the retried one only", n)
	}
	// Both kept, neither listed by default, each under its status and all.
	if out, code := e.run(Config{}, "relay", "dead-letters", "list", "--subscription", "feed"); code != ExitOK || !strings.Contains(out, "no open dead letters for feed") {
		t.Fatalf("list after retry and discard: exit %d:\n%s", code, out)
	}
	for status, want := range map[string][]int64{"resolved": {id1}, "discarded": {id2}, "all": {id1, id2}, "open": nil} {
		out, code := e.run(Config{}, "relay", "dead-letters", "list", "--subscription", "feed", "--status", status, "-o", "json")
		var got []relayDLJSON
		if err := json.Unmarshal([]byte(out), &got); code != ExitOK || err != nil || len(got) != len(want) {
			t.Fatalf("list --status %s: exit %d, %v: %s", status, code, err, out)
		}
		for i, d := range got {
			if d.ID != want[i] || d.ResolvedAt == nil || (status != "all" && d.Status != status) {
				t.Fatalf("list --status %s: %+v, want ids %v", status, got, want)
			}
		}
	}
	out, code = e.run(Config{}, "relay", "dead-letters", "list", "--subscription", "feed", "--status", "all")
	if code != ExitOK || !strings.Contains(out, " resolved ") || !strings.Contains(out, " discarded ") || strings.Count(out, "\n") != 3 {
		t.Fatalf("list --status all: exit %d:\n%s", code, out)
	}
	for id, status := range map[int64]string{id1: "resolved", id2: "discarded"} {
		out, code := e.run(Config{}, "relay", "dead-letters", "show", fmt.Sprint(id), "--subscription", "feed")
		if code != ExitOK || !strings.Contains(out, "status      "+status+"\n") || !strings.Contains(out, "  "+status+"  ") {
			t.Fatalf("show of the %s one: exit %d:\n%s", status, code, out)
		}
		if retried := strings.Contains(out, "retried  "); retried != (status == "resolved") {
			t.Fatalf("show of the %s one: retried line shown %v:\n%s", status, retried, out)
		}
	}

	// Retry and discard of the same dead letter at once, many times: each
	// dead letter ends applied once (the retry won) or not at all (the
	// discard won), never both, never twice.
	slow := func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		if _, err := tx.Exec(ctx, `SELECT pg_sleep(0.005)`); err != nil { // widens the race, synchronises nothing
			return err
		}
		return handler(ctx, tx, ev)
	}
	c, err := jetstream.NewConsumer(jetstream.ConsumerConfig{Store: e.store, Subscription: "race", Handler: slow})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 15 {
		id, ev := e.deadLetter("race", fmt.Sprintf("r%d", i))
		var wg sync.WaitGroup
		var retryErr, discardErr error
		wg.Go(func() { retryErr = c.RetryDeadLetter(e.ctx, id) })
		wg.Go(func() { discardErr = jetstream.DiscardDeadLetter(e.ctx, e.store, "race", id) })
		wg.Wait()
		applied := e.count(`SELECT count(*) FROM `+effects+` WHERE event_id = $1`, ev.ID)
		switch {
		case retryErr == nil && errors.Is(discardErr, jetstream.ErrDeadLetterNotOpen) && applied == 1:
		case discardErr == nil && errors.Is(retryErr, jetstream.ErrDeadLetterNotOpen) && applied == 0:
		default:
			t.Fatalf("round %d: retry %v, discard %v, applied %d times", i, retryErr, discardErr, applied)
		}
	}
}

// relay dead-letters list pages with --after: every page of --status all,
// --limit rows each, in id order, ends with the message that names the id
// it listed after; --after 0 is the start.
func TestRelayDeadLettersListPages(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	var all []int64
	for i := range 5 {
		id, _ := e.deadLetter("feed", fmt.Sprintf("p%d", i))
		all = append(all, id)
	}
	e.deadLetter("other", "o1")
	if err := jetstream.DiscardDeadLetter(e.ctx, e.store, "feed", all[2]); err != nil {
		t.Fatal(err)
	}
	list := func(status string, after int64) []int64 {
		t.Helper()
		out, code := e.run(Config{}, "relay", "dead-letters", "list", "--subscription", "feed", "--status", status,
			"--limit", "2", "--after", fmt.Sprint(after), "-o", "json")
		var page []relayDLJSON
		if err := json.Unmarshal([]byte(out), &page); code != ExitOK || err != nil || len(page) > 2 {
			t.Fatalf("list --status %s --after %d: exit %d, %v: %s", status, after, code, err, out)
		}
		got := make([]int64, len(page))
		for i, d := range page {
			got[i] = d.ID
		}
		return got
	}
	for status, want := range map[string][]int64{"all": all, "open": {all[0], all[1], all[3], all[4]}} {
		var got []int64
		var after int64
		for {
			page := list(status, after)
			if len(page) == 0 {
				break
			}
			got = append(got, page...)
			after = page[len(page)-1]
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("every page of --status %s: %v, want %v", status, got, want)
		}
	}
	out, code := e.run(Config{}, "relay", "dead-letters", "list", "--subscription", "feed", "--after", fmt.Sprint(all[4]))
	if code != ExitOK || !strings.Contains(out, fmt.Sprintf("no open dead letters for feed after id %d", all[4])) {
		t.Fatalf("list past the last page: exit %d:\n%s", code, out)
	}
	out, code = e.run(Config{}, "relay", "dead-letters", "list", "--subscription", "feed", "--status", "all", "--after", fmt.Sprint(all[3]))
	if code != ExitOK || strings.Count(out, "\n") != 2 || !strings.Contains(out, fmt.Sprintf("\n%d ", all[4])) {
		t.Fatalf("table after id %d: exit %d:\n%s", all[3], code, out)
	}
}

// relay status ends with the claims consumers' open dead letters per
// subscription in its schema, in text and in -o json ("open_dead_letters",
// an empty array when none are open); resolved and discarded ones are not
// counted.
func TestRelayStatusShowsOpenDeadLetters(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	stream, url, ctx, d := startRelayDispatcher(t, e)
	status := func() (string, jetstream.Status) {
		t.Helper()
		if err := d.CatchUp(ctx); err != nil {
			t.Fatal(err)
		}
		args := []string{"relay", "status", "--nats-url", url, "--stream", stream}
		text, code := e.run(Config{}, args...)
		if code != ExitOK {
			t.Fatalf("relay status: exit %d:\n%s", code, text)
		}
		out, code := e.run(Config{}, append(args, "-o", "json")...)
		var st jetstream.Status
		if err := json.Unmarshal([]byte(out), &st); code != ExitOK || err != nil {
			t.Fatalf("relay status -o json: exit %d, %v:\n%s", code, err, out)
		}
		if !strings.Contains(out, `"open_dead_letters": [`) {
			t.Fatalf("relay status -o json has no open_dead_letters array:\n%s", out)
		}
		return text, st
	}

	// Other tests' schemas share the database: only this one's rows count.
	mine := func(st jetstream.Status) []jetstream.OpenDeadLetters {
		var out []jetstream.OpenDeadLetters
		for _, o := range st.OpenDeadLetters {
			if o.Schema == e.store.Schema() {
				out = append(out, o)
			}
		}
		return out
	}
	text, st := status()
	if strings.Contains(text, "  "+e.store.Schema()+" ") || st.OpenDeadLetters == nil || len(mine(st)) != 0 {
		t.Fatalf("with no dead letters: %+v\n%s", st.OpenDeadLetters, text)
	}

	var feed []int64
	for i := range 3 {
		id, _ := e.deadLetter("feed", fmt.Sprintf("s%d", i))
		feed = append(feed, id)
	}
	e.deadLetter("billing-2", "b1")
	if err := jetstream.DiscardDeadLetter(e.ctx, e.store, "feed", feed[0]); err != nil {
		t.Fatal(err)
	}
	text, st = status()
	sc := e.store.Schema()
	if want := []jetstream.OpenDeadLetters{{Schema: sc, Subscription: "billing-2", Open: 1}, {Schema: sc, Subscription: "feed", Open: 2}}; fmt.Sprint(mine(st)) != fmt.Sprint(want) {
		t.Fatalf("open dead letters %+v, want %+v", st.OpenDeadLetters, want)
	}
	for _, want := range []string{"RELAY jetstream_relay", "CONSUMER DEAD LETTERS open, per schema and subscription (projector relay dead-letters list --schema SCHEMA --subscription S)\n"} {
		if !strings.Contains(text, want) {
			t.Fatalf("relay status lacks %q:\n%s", want, text)
		}
	}
	for _, want := range []string{`\n  ` + sc + ` +billing-2 +1\n`, `\n  ` + sc + ` +feed +2\n`} {
		if !regexp.MustCompile(want).MatchString(text) {
			t.Fatalf("relay status lacks %s:\n%s", want, text)
		}
	}
	if regexp.MustCompile(sc + ` +billing-2`).FindStringIndex(text)[0] > regexp.MustCompile(sc + ` +feed`).FindStringIndex(text)[0] {
		t.Fatalf("subscriptions not in name order:\n%s", text)
	}

	// Parked streams (ErrorMode ParkStream) likewise, open ones only.
	if !strings.Contains(text, "CONSUMER PARKED STREAMS none in this database") && !strings.Contains(text, "CONSUMER PARKED STREAMS per schema") {
		t.Fatalf("relay status lacks its parked streams:\n%s", text)
	}
	e.park("feed", "p1", 2)
	e.park("feed", "p2", 1)
	done, _ := e.park("feed", "p3", 1)
	if _, err := jetstream.DiscardPark(e.ctx, e.store, "feed", done, "ops"); err != nil {
		t.Fatal(err)
	}
	text, st = status()
	var parked []jetstream.ParkedStreams
	for _, p := range st.ParkedStreams {
		if p.Schema == sc {
			parked = append(parked, p)
		}
	}
	if want := []jetstream.ParkedStreams{{Schema: sc, Subscription: "feed", Parked: 2}}; fmt.Sprint(parked) != fmt.Sprint(want) {
		t.Fatalf("parked streams %+v, want %+v", st.ParkedStreams, want)
	}
	if !strings.Contains(text, "CONSUMER PARKED STREAMS per schema and subscription (projector relay parked list --schema SCHEMA --subscription S)\n") ||
		!regexp.MustCompile(`PARKED STREAMS[^\n]*\n(  .*\n)*  `+sc+` +feed +2\n`).MatchString(text) {
		t.Fatalf("relay status lacks the parked streams:\n%s", text)
	}
}

// relay status pointed at either side: in the relaying application's
// schema it shows the relay's shard (its cursor as tx/max once caught up,
// like every other command) and the open dead letters of a claims consumer
// whose tables are in another schema of the database; in the consumer's
// schema it shows the stream and those dead letters, and says the relay is
// not there, instead of failing. A stream the server does not have is
// named with the flag to pass and the streams it has, not NATS's bare 404.
func TestRelayStatusEitherSide(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	consumerSide := pgtest.Store(t, e.types.Registry)
	stream, url, ctx, d := startRelayDispatcher(t, e)
	e.deadLetter("x", "relay-side") // an event to relay (the dead letter is this schema's)
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	// Three open dead letters in the consumer's schema.
	other := &relayEnv{t: t, ctx: e.ctx, types: e.types, store: consumerSide}
	for i := range 3 {
		other.deadLetter("billing", fmt.Sprintf("c%d", i))
	}

	run := func(schema string, args ...string) (string, int) {
		t.Helper()
		cfg := Config{Registry: e.types.Registry}
		root := New(cfg)
		var out, errOut bytes.Buffer
		root.SetArgs(append(append([]string{"relay", "status", "--nats-url", url}, args...), "--database-url", pgtest.URL(t), "--schema", schema))
		root.SetOut(&out)
		root.SetErr(&errOut)
		err := root.ExecuteContext(ctx)
		if err != nil {
			out.WriteString("error: " + err.Error() + "\n")
		}
		return out.String(), ExitCode(err)
	}
	out, code := run(e.store.Schema(), "--stream", stream)
	if code != ExitOK {
		t.Fatalf("relay side: exit %d:\n%s", code, out)
	}
	countLine := regexp.MustCompile(`\n  ` + consumerSide.Schema() + ` +billing +3\n`)
	if !countLine.MatchString(out) {
		t.Fatalf("relay side lacks the consumer schema's count:\n%s", out)
	}
	for _, want := range []string{"RELAY jetstream_relay", "/max\n"} {
		if !strings.Contains(out, want) {
			t.Fatalf("relay side lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "9223372036854775807") {
		t.Fatalf("relay side prints the horizon cursor raw:\n%s", out)
	}
	out, code = run(consumerSide.Schema(), "--stream", stream)
	if code != ExitOK {
		t.Fatalf("consumer side: exit %d:\n%s", code, out)
	}
	if !countLine.MatchString(out) {
		t.Fatalf("consumer side lacks its count:\n%s", out)
	}
	for _, want := range []string{"STREAM " + stream, "not in schema " + consumerSide.Schema()} {
		if !strings.Contains(out, want) {
			t.Fatalf("consumer side lacks %q:\n%s", want, out)
		}
	}
	out, code = run(consumerSide.Schema(), "--stream", stream, "-o", "json")
	var st jetstream.Status
	if err := json.Unmarshal([]byte(out), &st); code != ExitOK || err != nil || st.Relay != nil || st.Stream != stream {
		t.Fatalf("consumer side -o json: exit %d, %v:\n%s", code, err, out)
	}
	missing := stream + "_GONE"
	out, code = run(e.store.Schema(), "--stream", missing)
	if code != ExitError || !strings.Contains(out, "pass --stream") || !strings.Contains(out, stream) || strings.Contains(out, "code=404") {
		t.Fatalf("a stream the server lacks: exit %d, want %d with the flag and the streams named:\n%s", code, ExitError, out)
	}
}

// relay dead-letters retry --all retries every open dead letter of the
// subscription, and says of one whose handler failed again that it was
// retried and failed (not that it was "not retried"); the failures of
// several dead letters are separated in the error, not run together.
func TestRelayDeadLettersRetryAll(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	effects := e.store.Table("cli_all_effects")
	e.exec(`CREATE TABLE ` + effects + ` (event_id uuid NOT NULL)`)
	var failing sync.Map
	wired := Config{JetStreamConsumers: func(store *postgres.Store) ([]*jetstream.Consumer, error) {
		c, err := jetstream.NewConsumer(jetstream.ConsumerConfig{Store: store, Subscription: "feed",
			Handler: func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
				if _, bad := failing.Load(ev.ID); bad {
					return errors.New("still broken")
				}
				_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (event_id) VALUES ($1)`, ev.ID)
				return err
			}})
		return []*jetstream.Consumer{c}, err
	}}
	var ids []int64
	for i := range 4 {
		id, ev := e.deadLetter("feed", fmt.Sprintf("a%d", i))
		ids = append(ids, id)
		if i == 2 {
			failing.Store(ev.ID, true)
		}
	}
	e.deadLetter("other", "o1")
	for _, bad := range [][]string{
		{"retry", "--subscription", "feed"},
		{"retry", "--all", fmt.Sprint(ids[0]), "--subscription", "feed"},
		{"retry", "--all"},
	} {
		if out, code := e.run(wired, append([]string{"relay", "dead-letters"}, bad...)...); code != ExitUsage {
			t.Fatalf("%q: exit %d, want %d:\n%s", bad, code, ExitUsage, out)
		}
	}
	out, code := e.run(wired, "relay", "dead-letters", "retry", "--all", "--subscription", "feed")
	if code != ExitError {
		t.Fatalf("retry --all with one failing: exit %d, want %d:\n%s", code, ExitError, out)
	}
	if want := fmt.Sprintf("dead letter %d: retried, the handler failed again; still open: still broken\n", ids[2]); !strings.Contains(out, want) || strings.Contains(out, "not retried") {
		t.Fatalf("retry --all lacks %q:\n%s", want, out)
	}
	if n := strings.Count(out, "applied and resolved"); n != 3 {
		t.Fatalf("%d resolved, want 3:\n%s", n, out)
	}
	if n := e.count(`SELECT count(*) FROM ` + effects); n != 3 {
		t.Fatalf("%d effects, want 3", n)
	}
	if n := e.count(`SELECT count(*) FROM ` + e.store.Table("projector_jetstream_dead_letters") + ` WHERE subscription = 'other' AND status = 'open'`); n != 1 {
		t.Fatalf("another subscription's dead letter touched")
	}
	// Two refused at once: both named, separated.
	out, code = e.run(wired, "relay", "dead-letters", "retry", fmt.Sprint(ids[0]), fmt.Sprint(ids[1]), "--subscription", "feed")
	if code != ExitRefused {
		t.Fatalf("two resolved ones: exit %d, want %d:\n%s", code, ExitRefused, out)
	}
	errLine := out[strings.LastIndex(out, "error: "):]
	if !strings.Contains(errLine, fmt.Sprintf("0 of 2 dead letters resolved; 2 could not be retried: retry dead letter %d of feed: it is resolved already", ids[0])) ||
		!strings.Contains(errLine, fmt.Sprintf("not open; retry dead letter %d of feed", ids[1])) {
		t.Fatalf("the two errors are not separated:\n%s", errLine)
	}
}

// startRelayDispatcher ensures a memory stream on a test NATS server and
// runs e's relay under a dispatcher until the test ends; ctx bounds the
// test's waits.
func startRelayDispatcher(t *testing.T, e *relayEnv) (stream, url string, ctx context.Context, d *projection.Dispatcher) {
	t.Helper()
	stream, url = natsStream(t, jetstream.DefaultDuplicateWindow)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	r, err := jetstream.NewRelay(jetstream.RelayConfig{Conn: nc, Registry: e.types.Registry, Stream: stream,
		Prefix: strings.ToLower(stream), Storage: natsjs.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	t.Cleanup(cancel)
	if _, err := r.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	d, err = projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{r.Async()},
		PollMax: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := d.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return stream, url, ctx, d
}
