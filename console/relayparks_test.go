package console_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/cli"
	"github.com/projectorhq/projector/console"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/jetstream"
)

// relayEnv is a console with one JetStream claims consumer, subscription
// "feed" (ParkStream), on the test's store: its handler records each
// event in relay_effects, and fails while failing is set.
type relayEnv struct {
	*env
	jc      *jetstream.Consumer
	failing atomic.Bool
	effects string
}

func newRelayEnv(t *testing.T) *relayEnv {
	t.Helper()
	re := &relayEnv{}
	re.env = newEnv(t, options{token: testToken, extra: func(cfg *console.Config) {
		re.effects = cfg.Store.Table("relay_effects")
		jc, err := jetstream.NewConsumer(jetstream.ConsumerConfig{Store: cfg.Store, Subscription: "feed", ErrorMode: jetstream.ParkStream,
			Logger: slog.New(slog.DiscardHandler),
			Handler: func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
				if re.failing.Load() {
					return errors.New("handler refuses: failing")
				}
				_, err := tx.Exec(ctx, `INSERT INTO `+re.effects+` (event_id) VALUES ($1)`, ev.ID)
				return err
			}})
		if err != nil {
			t.Fatal(err)
		}
		re.jc = jc
		cfg.JetStreamConsumers = []console.ParkedConsumer{cli.ConsoleParks(jc)}
	}})
	if _, err := re.store.Pool().Exec(re.ctx, `CREATE TABLE `+re.effects+` (event_id uuid NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return re
}

var relayEventSeq atomic.Int64

// park writes, as the claims consumer does, a park of "feed" for stream
// id holding its versions 1..n, and returns the park's id.
func (re *relayEnv) park(id string, n int) int64 {
	re.t.Helper()
	stream := projector.TenantStream("acme", "ticket", id)
	var parkID int64
	err := pgx.BeginFunc(re.ctx, re.store.Pool(), func(tx pgx.Tx) error {
		if _, err := tx.Exec(re.ctx, `INSERT INTO `+re.store.Table("projector_jetstream_streams")+` (subscription, tenant_id, stream_type, stream_id, last_version)
			VALUES ('feed', $1, $2, $3, $4)`, stream.Tenant, stream.Type, stream.ID, n); err != nil {
			return err
		}
		for v := 1; v <= n; v++ {
			ev := projector.Event{ID: uuid.Must(uuid.NewV7()), Stream: stream, Version: int64(v), Type: "ticket.commented", SchemaVersion: 1,
				Data: []byte(fmt.Sprintf(`{"body":"b","n":%d}`, v)), Position: projector.Position{TxID: 10, Seq: relayEventSeq.Add(1)}, RecordedAt: time.Now()}
			if v == 1 {
				if err := tx.QueryRow(re.ctx, `INSERT INTO `+re.store.Table("projector_jetstream_parks")+` (subscription, tenant_id, stream_type, stream_id, event_id, event_type, version, error, failures)
					VALUES ('feed', $1, $2, $3, $4, $5, 1, 'boom', 5) RETURNING id`, stream.Tenant, stream.Type, stream.ID, ev.ID, ev.Type).Scan(&parkID); err != nil {
					return err
				}
			}
			msg, err := jetstream.NewMsg("projector", ev)
			if err != nil {
				return err
			}
			headers, err := json.Marshal(msg.Header)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(re.ctx, `INSERT INTO `+re.store.Table("projector_jetstream_claims")+` (subscription, event_id) VALUES ('feed', $1)`, ev.ID); err != nil {
				return err
			}
			if _, err := tx.Exec(re.ctx, `INSERT INTO `+re.store.Table("projector_jetstream_parked_messages")+` (park_id, version, event_id, subject, headers, data)
				VALUES ($1, $2, $3, $4, $5, $6)`, parkID, ev.Version, ev.ID, msg.Subject, headers, msg.Data); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		re.t.Fatal(err)
	}
	return parkID
}

func (re *relayEnv) effectCount() int {
	re.t.Helper()
	var n int
	if err := re.store.Pool().QueryRow(re.ctx, `SELECT count(*) FROM `+re.effects).Scan(&n); err != nil {
		re.t.Fatal(err)
	}
	return n
}

// The JetStream parked-streams page lists a claims consumer's parks with
// retry and discard for a signed-in operator, as the dispatcher's parked
// page does: CSRF-protected, input checked, the consumer's guarded calls
// recorded with the operator's name; a failed retry keeps the park with
// its error, a retry applies the sequence once, a second action is
// refused, and racing operators get exactly one winner. A stream id with
// terminal escapes is shown printable.
func TestRelayParkedPageAndActions(t *testing.T) {
	t.Parallel()
	re := newRelayEnv(t)
	c := re.client()
	csrf := c.login("bob")
	act := func(path string, form url.Values, withCSRF bool) (int, string) {
		t.Helper()
		if withCSRF {
			form.Set("csrf", csrf)
		}
		return c.do(http.MethodPost, path, form, map[string]string{"Accept": "application/json"})
	}
	p := strconv.FormatInt(re.park("p", 3), 10)
	q := strconv.FormatInt(re.park("q\x1b[2Jq", 2), 10)

	_, page := c.do(http.MethodGet, "/relay-parked", nil, nil)
	for _, want := range []string{`data-relay-park="` + p + `"`, `data-relay-park="` + q + `"`, "/actions/relay-park/retry", "/actions/relay-park/discard",
		`name="subscription" value="feed"`, `id="nav-relay-parked"`} {
		if !strings.Contains(page, want) {
			t.Fatalf("JetStream parked page lacks %s:\n%s", want, page)
		}
	}
	if strings.Contains(page, "\x1b") {
		t.Errorf("the page carries a raw escape character from a stream id")
	}
	for _, tc := range []struct {
		path string
		form url.Values
		csrf bool
		want int
	}{
		{"/actions/relay-park/retry", url.Values{"id": {p}, "subscription": {"feed"}}, false, http.StatusForbidden},
		{"/actions/relay-park/retry", url.Values{"id": {"x"}, "subscription": {"feed"}}, true, http.StatusBadRequest},
		{"/actions/relay-park/discard", url.Values{"id": {"0"}, "subscription": {"feed"}}, true, http.StatusBadRequest},
		{"/actions/relay-park/discard", url.Values{"id": {p}, "subscription": {"other"}}, true, http.StatusBadRequest},
		{"/actions/relay-park/discard", url.Values{"id": {p}, "subscription": {"fe\x00ed"}}, true, http.StatusBadRequest},
		{"/actions/relay-park/discard", url.Values{"id": {"999999"}, "subscription": {"feed"}}, true, http.StatusNotFound},
		{"/actions/relay-park/explode", url.Values{"id": {p}, "subscription": {"feed"}}, true, http.StatusNotFound},
	} {
		if code, body := act(tc.path, tc.form, tc.csrf); code != tc.want {
			t.Errorf("%s %v (csrf %v): %d %s, want %d", tc.path, tc.form, tc.csrf, code, body, tc.want)
		}
	}
	for _, path := range []string{"/relay-parked?status=bogus", "/relay-parked?subscription=other", "/relay-parked?after=-1"} {
		if got, _ := c.do(http.MethodGet, path, nil, nil); got != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", path, got)
		}
	}

	// A retry that fails again keeps the park, with the new error.
	re.failing.Store(true)
	if code, body := act("/actions/relay-park/retry", url.Values{"id": {p}, "subscription": {"feed"}}, true); code != http.StatusInternalServerError ||
		!strings.Contains(body, "handler refuses") {
		t.Fatalf("failing retry: %d %s, want the handler's error", code, body)
	}
	pk, msgs, err := jetstream.GetPark(re.ctx, re.store, "feed", mustID(t, p))
	if err != nil || pk.Status != projection.ParkOpen || len(msgs) != 3 || pk.Failures != 6 || !strings.Contains(pk.Error, "handler refuses") || re.effectCount() != 0 {
		t.Fatalf("after a failing retry: %+v, %d messages, %v, %d effects", pk, len(msgs), err, re.effectCount())
	}
	re.failing.Store(false)
	if code, body := act("/actions/relay-park/retry", url.Values{"id": {p}, "subscription": {"feed"}}, true); code != http.StatusOK ||
		!strings.Contains(body, "applied its 3 messages") {
		t.Fatalf("retry: %d %s", code, body)
	}
	if pk, _, err := jetstream.GetPark(re.ctx, re.store, "feed", mustID(t, p)); err != nil || pk.Status != projection.ParkResolved ||
		pk.ResolvedBy != "console: bob" || re.effectCount() != 3 {
		t.Fatalf("after the retry: %+v, %v, %d effects", pk, err, re.effectCount())
	}
	for _, op := range []string{"retry", "discard"} {
		if code, body := act("/actions/relay-park/"+op, url.Values{"id": {p}, "subscription": {"feed"}}, true); code != http.StatusConflict {
			t.Errorf("%s of a resolved park: %d %s, want 409", op, code, body)
		}
	}

	// Two operators at once on one park: exactly one wins.
	var wg sync.WaitGroup
	codes := make([]int, 2)
	for i, op := range []string{"retry", "discard"} {
		wg.Go(func() {
			codes[i], _ = act("/actions/relay-park/"+op, url.Values{"id": {q}, "subscription": {"feed"}}, true)
		})
	}
	wg.Wait()
	if (codes[0] == http.StatusOK) == (codes[1] == http.StatusOK) || codes[0]+codes[1] != http.StatusOK+http.StatusConflict {
		t.Fatalf("racing retry and discard answered %v, want one 200 and one 409", codes)
	}
	pk, _, err = jetstream.GetPark(re.ctx, re.store, "feed", mustID(t, q))
	applied := re.effectCount() - 3
	if err != nil || pk.ResolvedBy != "console: bob" || pk.Messages != 2 ||
		!(pk.Status == projection.ParkResolved && applied == 2 && codes[0] == http.StatusOK ||
			pk.Status == projection.ParkDiscarded && applied == 0 && codes[1] == http.StatusOK) {
		t.Fatalf("after the race (%v): %+v, %v, %d applied", codes, pk, err, applied)
	}
	if _, list := c.do(http.MethodGet, "/relay-parked?status=all", nil, nil); !strings.Contains(list, `data-relay-park="`+p+`" data-status="resolved"`) ||
		strings.Contains(list, `value="`+p+`"><button`) {
		t.Errorf("the list of all parks lacks the resolved one, or offers it actions:\n%s", list)
	}
}

func mustID(t *testing.T, s string) int64 {
	t.Helper()
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// A read-only console and one without JetStream consumers show the page
// without actions; two consumers of one subscription are refused.
func TestRelayParkedWithoutConsumersOrToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{token: testToken})
	c := e.client()
	c.login("bob")
	if code, page := c.do(http.MethodGet, "/relay-parked", nil, nil); code != http.StatusOK || !strings.Contains(page, "no JetStream claims consumers") ||
		strings.Contains(page, `id="nav-relay-parked"`) {
		t.Errorf("without consumers: %d\n%s", code, page)
	}
	jc, err := jetstream.NewConsumer(jetstream.ConsumerConfig{Store: e.store, Subscription: "feed",
		Handler: func(context.Context, pgx.Tx, projector.Event) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := console.New(console.Config{Store: e.store, JetStreamConsumers: []console.ParkedConsumer{cli.ConsoleParks(jc), cli.ConsoleParks(jc)}}); !errors.Is(err, console.ErrInvalidConfig) {
		t.Errorf("two consumers of one subscription: %v, want ErrInvalidConfig", err)
	}
	if _, err := console.New(console.Config{Store: e.store, JetStreamConsumers: []console.ParkedConsumer{cli.ConsoleParks(nil)}}); !errors.Is(err, console.ErrInvalidConfig) {
		t.Errorf("a nil consumer: %v, want ErrInvalidConfig", err)
	}
}

// In the browser: the page lists the park, and its retry button (after
// the confirmation) applies the sequence and says so.
func TestBrowserRelayParkRetry(t *testing.T) {
	re := newRelayEnv(t)
	id := re.park("p", 2)
	b := newBrowser(t, 1280, 900)
	b.do("sign in", 30*time.Second,
		chromedp.Navigate(re.srv.URL+"/login"),
		chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), testToken),
		chromedp.Click(chromedp.ID("login")),
		chromedp.WaitVisible(chromedp.ID("operator")),
	)
	row := `tr[data-relay-park="` + strconv.FormatInt(id, 10) + `"]`
	b.do("the JetStream parked page", 30*time.Second,
		chromedp.Click(chromedp.ID("nav-relay-parked")),
		chromedp.WaitVisible(chromedp.CSS(row)),
	)
	if got := eval[string](b, `document.querySelector('`+row+` td[data-label="Stream"]').textContent`); got != "acme/ticket/p" {
		t.Errorf("stream cell %q, want acme/ticket/p", got)
	}
	_ = eval[bool](b, `window.confirm = () => true, true`)
	b.do("retry", 10*time.Second, chromedp.Click(chromedp.CSS(row+` button[data-op="retry"]`)))
	b.do("the result", 30*time.Second, chromedp.WaitVisible(chromedp.CSS(`#toast div`)))
	if got := eval[string](b, `document.querySelector('#toast div').textContent`); !strings.Contains(got, "applied its 2 messages") {
		t.Errorf("toast %q, want the retry's result", got)
	}
	if pk, _, err := jetstream.GetPark(re.ctx, re.store, "feed", id); err != nil || pk.Status != projection.ParkResolved || re.effectCount() != 2 {
		t.Errorf("after the retry from the page: %+v, %v, %d effects", pk, err, re.effectCount())
	}
}
