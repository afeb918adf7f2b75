package console_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/console"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
	"github.com/projectorhq/projector/stores/postgres"
)

// Without a token the console shows everything, offers no action, says it
// is read-only, and refuses every POST, even one that looks right.
func TestReadOnlyConsoleRefusesActions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	e.dispatch()
	e.dead()
	c := e.client()
	code, page := c.do(http.MethodGet, "/", nil, nil)
	if code != http.StatusOK {
		t.Fatalf("dashboard: %d", code)
	}
	for _, want := range []string{`id="readonly"`, "read-only", `data-consumer="tickets"`, `data-state="dead"`} {
		if !strings.Contains(page, want) {
			t.Errorf("read-only dashboard lacks %q", want)
		}
	}
	for _, not := range []string{`class="act"`, "/actions/", `id="signin"`} {
		if strings.Contains(page, not) {
			t.Errorf("read-only dashboard has %q", not)
		}
	}
	for _, path := range []string{"/actions/consumer/restart", "/login"} {
		code, _ := c.do(http.MethodPost, path, url.Values{"consumer": {"tickets"}, "token": {testToken}, "csrf": {"x"}},
			map[string]string{"Authorization": "Bearer " + testToken})
		if code != http.StatusForbidden {
			t.Errorf("POST %s on a read-only console: %d, want 403", path, code)
		}
	}
	if st := e.status(); st.Status != projection.StatusDead {
		t.Fatalf("a read-only console changed the shard: %s", st.Status)
	}
	if !strings.Contains(e.logs.String(), "request refused") {
		t.Errorf("refused POSTs not logged:\n%s", e.logs.String())
	}
	// Pages answer GET only: a state change is a POST to /actions.
	if code, _ := c.do(http.MethodPost, "/", url.Values{}, nil); code != http.StatusMethodNotAllowed {
		t.Errorf("POST /: %d, want 405", code)
	}
}

// With a token, an action needs a session (or the bearer token), the
// session's CSRF token and a same-origin request; each refusal changes
// nothing and is logged, and the accepted action is the guarded transition
// with who, what and result in the log.
func TestActionsNeedTokenCSRFAndSameOrigin(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{token: testToken})
	e.dispatch()
	e.dead()
	restart := func(c *client, form url.Values, hdr map[string]string) int {
		code, _ := c.do(http.MethodPost, "/actions/consumer/restart", form, hdr)
		return code
	}
	anon := e.client()
	// Signed out: the page offers a sign-in, no action.
	_, page := anon.do(http.MethodGet, "/", nil, nil)
	if !strings.Contains(page, `id="signin"`) || strings.Contains(page, `class="act"`) {
		t.Error("signed-out page: want a sign-in link and no actions")
	}
	if code := restart(anon, url.Values{"consumer": {"tickets"}}, nil); code != http.StatusUnauthorized {
		t.Errorf("restart without a session: %d, want 401", code)
	}
	// A script's wrong token is told so, not asked to sign in.
	if code, body := anon.do(http.MethodPost, "/actions/consumer/restart", url.Values{"consumer": {"tickets"}},
		map[string]string{"Authorization": "Bearer wrong-token-wrong-token"}); code != http.StatusUnauthorized || !strings.Contains(body, "the Authorization header is not") {
		t.Errorf("restart with a wrong bearer token: %d %s, want 401 naming the header", code, body)
	}
	if code, _ := anon.do(http.MethodPost, "/login", url.Values{"name": {"mallory"}, "token": {"not-the-token-at-all"}}, nil); code != http.StatusUnauthorized {
		t.Errorf("login with a wrong token: %d, want 401", code)
	}

	c := e.client()
	csrf := c.login("alice")
	if csrf == "" {
		t.Fatal("no CSRF token after login")
	}
	_, page = c.do(http.MethodGet, "/", nil, nil)
	if !strings.Contains(page, `id="operator">alice<`) || !strings.Contains(page, "/actions/consumer/restart") {
		t.Error("signed-in page: want the operator's name and a restart button on the dead consumer")
	}
	form := url.Values{"consumer": {"tickets"}}
	if code := restart(c, form, nil); code != http.StatusForbidden {
		t.Errorf("forged POST without the CSRF token: %d, want 403", code)
	}
	form.Set("csrf", "AAAA"+csrf[4:])
	if code := restart(c, form, nil); code != http.StatusForbidden {
		t.Errorf("POST with a wrong CSRF token: %d, want 403", code)
	}
	form.Set("csrf", csrf)
	if code := restart(c, form, map[string]string{"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}); code != http.StatusForbidden {
		t.Errorf("cross-origin POST (Sec-Fetch-Site): %d, want 403", code)
	}
	if code := restart(c, form, map[string]string{"Origin": "http://evil.example", "Sec-Fetch-Site": ""}); code != http.StatusForbidden {
		t.Errorf("cross-origin POST (Origin only): %d, want 403", code)
	}
	// A session under another token is no session.
	other, err := console.New(console.Config{Store: e.store, Token: "another-token-entirely"})
	if err != nil || other.ReadOnly() {
		t.Fatal(err)
	}
	if st := e.status(); st.Status != projection.StatusDead {
		t.Fatalf("a refused request changed the shard: %s", st.Status)
	}

	e.fail.Store(false)
	if code := restart(c, form, nil); code != http.StatusOK {
		t.Fatalf("restart with session, CSRF token and same origin: %d", code)
	}
	e.waitStatus(projection.StatusIdle)
	// Restart is allowed from dead only: a second one is refused (409)
	// by the guard, not by the console.
	if code, body := c.do(http.MethodPost, "/actions/consumer/restart", form, map[string]string{"Accept": "application/json"}); code != http.StatusConflict ||
		!strings.Contains(body, `"ok":false`) {
		t.Errorf("restart of an idle shard: %d %s, want 409", code, body)
	}
	logs := e.logs.String()
	for _, want := range []string{
		`"who":"alice"`, `"action":"consumer restart"`, `"target":"tickets"`, `"result":"ok"`, `"result":"refused"`,
		`"why":"missing or wrong CSRF token"`, `"why":"cross-origin request refused"`, `"result":"wrong token"`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %s:\n%s", want, logs)
		}
	}
	// The bearer header works for scripts, without a CSRF token.
	if code, _ := anon.do(http.MethodPost, "/actions/consumer/disable", url.Values{"consumer": {"tickets"}},
		map[string]string{"Authorization": "Bearer " + testToken, "Origin": "", "Sec-Fetch-Site": ""}); code != http.StatusOK {
		t.Errorf("disable with the bearer token: %d", code)
	}
	if st := e.status(); st.Status != projection.StatusDisabled {
		t.Errorf("after disable: %s", st.Status)
	}
	// Signing out ends the session.
	if code, _ := c.do(http.MethodPost, "/logout", url.Values{"csrf": {csrf}}, nil); code != http.StatusSeeOther {
		t.Errorf("logout: %d", code)
	}
	if code := restart(c, form, nil); code != http.StatusUnauthorized {
		t.Errorf("restart after logout: %d, want 401", code)
	}
}

// Every action is the library call the CLI makes: skip dead-letters the
// failing event and moves on, disable and enable follow their guards,
// retry and discard work on dead letters, and a rebuild is requested.
func TestEachActionIsTheGuardedTransition(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{token: testToken})
	stop := e.dispatch()
	c := e.client()
	csrf := c.login("bob")
	act := func(path string, form url.Values) (int, string) {
		t.Helper()
		form.Set("csrf", csrf)
		return c.do(http.MethodPost, path, form, map[string]string{"Accept": "application/json"})
	}
	e.appendEvents("a", 3)
	pgtest.Eventually(t, time.Minute, "first events applied", func() bool { return e.status().Processed == 3 })

	// enable from idle: refused, nothing changed.
	if code, body := act("/actions/consumer/enable", url.Values{"consumer": {"tickets"}}); code != http.StatusConflict {
		t.Errorf("enable of an idle shard: %d %s", code, body)
	}
	// skip: a dead shard moves past its failing event, recorded as a dead letter.
	e.dead()
	if code, body := act("/actions/consumer/skip", url.Values{"consumer": {"tickets"}}); code != http.StatusOK {
		t.Fatalf("skip: %d %s", code, body)
	}
	e.waitStatus(projection.StatusIdle)
	dls, err := projection.ListDeadLetters(e.ctx, e.store, projection.DeadLetterFilter{Status: projection.DeadLetterOpen})
	if err != nil || len(dls) != 1 || dls[0].Reason != "skipped" {
		t.Fatalf("dead letters after skip: %v %+v", err, dls)
	}
	id := strconv.FormatInt(dls[0].ID, 10)
	_, page := c.do(http.MethodGet, "/", nil, nil)
	if !strings.Contains(page, `data-dead-letter="`+id+`"`) || !strings.Contains(page, "/actions/dead-letter/retry") {
		t.Error("dashboard lacks the open dead letter and its retry button")
	}
	// retry: recorded for the dispatcher, which applies it now that the
	// handler works again.
	e.fail.Store(false)
	if code, body := act("/actions/dead-letter/retry", url.Values{"id": {id}}); code != http.StatusOK {
		t.Fatalf("retry: %d %s", code, body)
	}
	pgtest.Eventually(t, time.Minute, "retried dead letter resolved", func() bool {
		dl, _, err := projection.GetDeadLetter(e.ctx, e.store, dls[0].ID)
		return err == nil && dl.Status == projection.DeadLetterResolved
	})
	// The list: open by default (none now), every status on request.
	if _, list := c.do(http.MethodGet, "/dead-letters", nil, nil); strings.Contains(list, `data-dead-letter="`) {
		t.Error("open dead-letter list shows a resolved one")
	}
	if _, list := c.do(http.MethodGet, "/dead-letters?status=all", nil, nil); !strings.Contains(list, `data-dead-letter="`+id+`" data-status="resolved"`) ||
		strings.Contains(list, "/actions/dead-letter/") {
		t.Error("list of all dead letters: want the resolved one, without actions")
	}
	// discard of a resolved one: refused by its guard.
	if code, _ := act("/actions/dead-letter/discard", url.Values{"id": {id}}); code != http.StatusConflict {
		t.Errorf("discard of a resolved dead letter: %d, want 409", code)
	}
	if code, _ := act("/actions/dead-letter/discard", url.Values{"id": {"999999"}}); code != http.StatusNotFound {
		t.Errorf("discard of an unknown dead letter: %d, want 404", code)
	}
	// disable, then enable.
	for _, op := range []string{"disable", "enable"} {
		if code, body := act("/actions/consumer/"+op, url.Values{"consumer": {"tickets"}}); code != http.StatusOK {
			t.Fatalf("%s: %d %s", op, code, body)
		}
	}
	// rebuild: requested through rebuild.Request. No dispatcher runs its
	// shadow shard, so it is still in progress for the second request.
	stop()
	if code, body := act("/actions/rebuild/request", url.Values{"name": {"tickets"}}); code != http.StatusOK {
		t.Fatalf("rebuild: %d %s", code, body)
	}
	rb, err := rebuild.Current(e.ctx, e.store, "tickets")
	if err != nil || rb.Mode != rebuild.BlueGreen {
		t.Fatalf("rebuild after request: %v %+v", err, rb)
	}
	// A second request while it runs is refused by rebuild's own guard.
	if !rb.Active() {
		t.Fatalf("rebuild %d is %s with no dispatcher running it", rb.ID, rb.Status)
	} else if code, _ := act("/actions/rebuild/request", url.Values{"name": {"tickets"}}); code != http.StatusConflict {
		t.Errorf("second rebuild request while one runs: %d, want 409", code)
	}
	logs := e.logs.String()
	for _, want := range []string{`"action":"consumer skip"`, `"action":"dead-letter retry"`, `"action":"dead-letter discard"`,
		`"action":"consumer disable"`, `"action":"consumer enable"`, `"action":"rebuild request"`, `"result":"not found"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %s", want)
		}
	}
}

// Input is validated before it reaches PostgreSQL: bad names and ids are
// 400 with ErrInvalidInput's text, unknown actions 404.
func TestActionInputValidated(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{token: testToken})
	c := e.client()
	csrf := c.login("carol")
	cases := []struct {
		path string
		form url.Values
		want int
	}{
		{"/actions/consumer/restart", url.Values{"consumer": {""}}, http.StatusBadRequest},
		{"/actions/consumer/restart", url.Values{"consumer": {"bad\x00name"}}, http.StatusBadRequest},
		{"/actions/consumer/restart", url.Values{"consumer": {"x"}, "instance": {"\xff"}}, http.StatusBadRequest},
		{"/actions/consumer/restart", url.Values{"consumer": {strings.Repeat("a", 201)}}, http.StatusBadRequest},
		{"/actions/dead-letter/retry", url.Values{"id": {"abc"}}, http.StatusBadRequest},
		{"/actions/dead-letter/retry", url.Values{"id": {"-3"}}, http.StatusBadRequest},
		{"/actions/rebuild/request", url.Values{"name": {"tickets"}, "mode": {"sideways"}}, http.StatusBadRequest},
		{"/actions/consumer/explode", url.Values{"consumer": {"tickets"}}, http.StatusNotFound},
		{"/actions/consumer/restart", url.Values{"consumer": {"nobody"}}, http.StatusNotFound},
	}
	for _, tc := range cases {
		tc.form.Set("csrf", csrf)
		if code, body := c.do(http.MethodPost, tc.path, tc.form, nil); code != tc.want {
			t.Errorf("%s %v: %d, want %d: %s", tc.path, tc.form, code, tc.want, body)
		}
	}
	for _, q := range []string{"?status=lost", "?after=-1", "?after=x"} {
		if code, _ := c.do(http.MethodGet, "/dead-letters"+q, nil, nil); code != http.StatusBadRequest {
			t.Errorf("dead-letter list %s: %d, want 400", q, code)
		}
	}
	if code, _ := c.do(http.MethodGet, "/dead-letters/zero", nil, nil); code != http.StatusBadRequest {
		t.Errorf("dead letter view of a bad id: %d", code)
	}
	if code, _ := c.do(http.MethodGet, "/dead-letters/424242", nil, nil); code != http.StatusNotFound {
		t.Errorf("dead letter view of an unknown id: %d", code)
	}
	for _, cfg := range []console.Config{
		{},
		{Store: e.store, Token: "short"},
		{Store: e.store, Token: " padded-token-with-space\n"},
		{Store: e.store, SessionTTL: time.Second},
		{Store: e.store, DeadLetterLimit: -1},
		{Store: e.store, SagaLimit: console.MaxListLimit + 1},
		{Store: e.store, Sagas: []string{"bad\nname"}},
	} {
		if _, err := console.New(cfg); !errors.Is(err, console.ErrInvalidConfig) {
			t.Errorf("New(%+v): %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

// Payloads are never in lists and show on the single dead-letter view only
// when enabled.
func TestPayloadsHiddenUnlessEnabled(t *testing.T) {
	t.Parallel()
	for _, show := range []bool{false, true} {
		t.Run("show="+strconv.FormatBool(show), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, options{continuous: true, showPayloads: show})
			e.dispatch()
			e.fail.Store(true)
			e.appendEvents("p", 1)
			var dls []projection.DeadLetter
			pgtest.Eventually(t, time.Minute, "event dead-lettered", func() bool {
				var err error
				dls, err = projection.ListDeadLetters(e.ctx, e.store, projection.DeadLetterFilter{})
				return err == nil && len(dls) == 1
			})
			c := e.client()
			for _, path := range []string{"/", "/fragment", "/state.json"} {
				if _, body := c.do(http.MethodGet, path, nil, nil); strings.Contains(body, "secret-payload") || !strings.Contains(body, "handler refuses") {
					t.Errorf("%s: payload shown, or dead letter missing", path)
				}
			}
			_, body := c.do(http.MethodGet, "/dead-letters/"+strconv.FormatInt(dls[0].ID, 10), nil, nil)
			if got := strings.Contains(body, "secret-payload-0"); got != show {
				t.Errorf("dead-letter view shows the payload: %v, want %v", got, show)
			}
			if !show && !strings.Contains(body, `id="payload-hidden"`) {
				t.Error("dead-letter view does not say the payload is hidden")
			}
		})
	}
}

// The console works under any prefix: its links and cookie follow it; the
// state is served as JSON too, with the rate, lag and display state.
func TestMountedUnderPrefix(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{token: testToken, prefix: "/ops/console"})
	e.dispatch()
	e.appendEvents("m", 2)
	pgtest.Eventually(t, time.Minute, "events applied", func() bool { return e.status().Processed == 2 })
	c := e.client()
	c.url += "/ops/console"
	code, page := c.do(http.MethodGet, "/", nil, nil)
	if code != http.StatusOK || !strings.Contains(page, `href="/ops/console/static/console.css"`) || !strings.Contains(page, `data-src="/ops/console/fragment"`) {
		t.Fatalf("dashboard under a prefix: %d, links not under it", code)
	}
	if code, css := c.do(http.MethodGet, "/static/console.css", nil, nil); code != http.StatusOK || !strings.Contains(css, "@media") {
		t.Errorf("stylesheet: %d", code)
	}
	if csrf := c.login("dave"); csrf == "" {
		t.Fatal("no CSRF token under a prefix: the session cookie's path is wrong")
	}
	_, js := c.do(http.MethodGet, "/state.json", nil, nil)
	var st console.State
	if err := json.Unmarshal([]byte(js), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Shards) != 1 || st.Shards[0].Consumer != "tickets" || st.Shards[0].State != console.StateIdle || st.Shards[0].Processed != 2 {
		t.Errorf("state.json shards: %+v", st.Shards)
	}
	// For scripts: a shard's keys in snake_case, as `status -o json` has
	// them, and its cursor a "txid/seq" string.
	var raw struct {
		Shards []map[string]any `json:"shards"`
	}
	if err := json.Unmarshal([]byte(js), &raw); err != nil || len(raw.Shards) != 1 {
		t.Fatalf("state.json: %v\n%s", err, js)
	}
	shard := raw.Shards[0]
	for _, key := range []string{"consumer", "instance_id", "status", "state", "lag_events", "processed", "dispatcher", "updated_at", "rate", "parked_streams"} {
		if _, ok := shard[key]; !ok {
			t.Errorf("state.json shard has no %q: %v", key, shard)
		}
	}
	if cur, ok := shard["cursor"].(string); !ok || cur != st.Shards[0].Cursor.String() {
		t.Errorf("state.json shard cursor %#v, want the string %q", shard["cursor"], st.Shards[0].Cursor)
	}
	for key := range shard {
		if key != strings.ToLower(key) {
			t.Errorf("state.json shard key %q is not snake_case", key)
		}
	}
	// The rate is known once two reads a second apart were made.
	pgtest.Eventually(t, time.Minute, "a rate in state.json", func() bool {
		_, js := c.do(http.MethodGet, "/state.json", nil, nil)
		var st console.State
		return json.Unmarshal([]byte(js), &st) == nil && len(st.Shards) == 1 && st.Shards[0].Rate >= 0
	})
}

// A rebuild in progress shows with its progress bar, and its shard as
// rebuilding; the rebuild button is offered only for projections that
// declare tables, and not while one runs.
func TestRebuildInProgressShown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{token: testToken, mailer: true})
	stop := e.dispatch()
	e.appendEvents("r", 4)
	pgtest.Eventually(t, time.Minute, "events applied", func() bool { return e.status().Processed == 4 })
	c := e.client()
	csrf := c.login("frank")
	_, page := c.do(http.MethodGet, "/", nil, nil)
	if !strings.Contains(page, `value="tickets"`) || strings.Count(page, `data-op="request"`) != 1 {
		t.Errorf("want one rebuild button (tickets declares tables, mailer does not), got %d", strings.Count(page, `data-op="request"`))
	}
	// No dispatcher runs the shadow shard: the rebuild stays at 0%.
	stop()
	if code, body := c.do(http.MethodPost, "/actions/rebuild/request", url.Values{"name": {"tickets"}, "csrf": {csrf}}, nil); code != http.StatusOK {
		t.Fatalf("rebuild request: %d %s", code, body)
	}
	_, frag := c.do(http.MethodGet, "/fragment", nil, nil)
	for _, want := range []string{`data-rebuild="`, `<progress class="bar big" max="100" value="0">`, "0% · 0/4 events", `data-state="rebuilding"`, "rebuild shadow"} {
		if !strings.Contains(frag, want) {
			t.Errorf("fragment lacks %q", want)
		}
	}
	if strings.Contains(frag, `data-op="request"`) {
		t.Error("a rebuild button while a rebuild runs")
	}
}

// The horizon panel names the session holding it, as `projector horizon`
// does. The test holds a transaction with an id only for one read of the
// page (it holds every consumer of the cluster back meanwhile).
func TestHorizonHolderShown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	c := e.client()
	tx, err := e.store.Pool().Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(e.ctx) }()
	var pid int32
	var xid string
	if err := tx.QueryRow(e.ctx, `SELECT pg_backend_pid(), pg_current_xact_id()::text`).Scan(&pid, &xid); err != nil {
		t.Fatal(err)
	}
	// Another test's transaction may be older and hold it instead (the
	// cluster is shared); either way the panel names a holder. One look
	// may not: the oldest transaction of the statement's snapshot can
	// end before pg_stat_activity is read (the panel then says the holder
	// is not visible, as it did once under CI's load), so the page is read
	// again while this transaction stays open, which makes it a holder
	// once the older ones are gone.
	var frag string
	pgtest.Eventually(t, 30*time.Second, fmt.Sprintf("the horizon panel to name a holder while pid %d holds a transaction id", pid), func() bool {
		var code int
		code, frag = c.do(http.MethodGet, "/fragment", nil, nil)
		if code != http.StatusOK {
			t.Fatalf("fragment: %d", code)
		}
		return strings.Contains(frag, "session pid <code>") || strings.Contains(frag, "prepared transaction <code>")
	})
	if err := tx.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
}

// The dashboard shows the estimated sizes of the hot log and the archive,
// as `projector status` does, in the page and in state.json.
func TestLogSizesShown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	c := e.client()
	e.appendEvents("old", 3)
	e.appendEvents("new", 2)
	if res, err := e.store.Archive(e.ctx, postgres.ArchiveOptions{Streams: []projector.StreamRef{projector.Stream("ticket", "old")}}); err != nil || res.Events != 3 {
		t.Fatalf("archive: %+v, %v", res, err)
	}
	for _, table := range []string{"projector_events", "projector_events_archive"} {
		if _, err := e.store.Pool().Exec(e.ctx, `ANALYZE `+e.store.Table(table)); err != nil {
			t.Fatal(err)
		}
	}
	hot, archived, err := e.store.ArchiveSizes(e.ctx)
	if err != nil || hot != 2 || archived != 3 {
		t.Fatalf("estimates after ANALYZE: %d hot, %d archived, %v; want 2 and 3", hot, archived, err)
	}
	code, frag := c.do(http.MethodGet, "/fragment", nil, nil)
	if want := fmt.Sprintf("about <b>%d</b> events hot, about <b>%d</b> archived", hot, archived); code != http.StatusOK || !strings.Contains(frag, want) {
		t.Fatalf("fragment: %d, want %q in the log panel:\n%s", code, want, frag)
	}
	code, body := c.do(http.MethodGet, "/state.json", nil, nil)
	if want := fmt.Sprintf(`"log":{"hot_events_estimate":%d,"archived_events_estimate":%d}`, hot, archived); code != http.StatusOK || !strings.Contains(body, want) {
		t.Fatalf("state.json: %d, want %s in\n%s", code, want, body)
	}
}

// Wrong tokens are throttled per address, at the login form and in the
// Authorization header alike (loginguard.go): after LoginBurst of them the
// address is answered 429 with Retry-After, even with the right token,
// which is then not compared; each refusal is logged.
func TestWrongTokensThrottled(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{token: testToken})
	c := e.client()
	for i := range console.LoginBurst {
		wrong := url.Values{"name": {"mallory"}, "token": {fmt.Sprintf("not-the-token-%d-xxxxxx", i)}}
		if code, _ := c.do(http.MethodPost, "/login", wrong, nil); code != http.StatusUnauthorized {
			t.Fatalf("wrong token %d: %d, want 401", i+1, code)
		}
	}
	req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/login", strings.NewReader(url.Values{"token": {testToken}}.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", e.srv.URL)
	resp, err := c.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("the right token after %d wrong ones: %d, want 429", console.LoginBurst, resp.StatusCode)
	}
	if ra := resp.Header.Get("Retry-After"); ra != "1" && ra != "2" {
		t.Errorf("Retry-After %q, want 1 or 2 (seconds)", ra)
	}
	code, body := c.do(http.MethodPost, "/actions/consumer/restart", url.Values{"consumer": {"tickets"}},
		map[string]string{"Authorization": "Bearer " + testToken})
	if code != http.StatusTooManyRequests || !strings.Contains(body, "too many wrong tokens") {
		t.Errorf("a script with the right token from the throttled address: %d %s, want 429", code, body)
	}
	for _, want := range []string{`"result":"too many wrong tokens"`, `"why":"too many wrong tokens"`} {
		if !strings.Contains(e.logs.String(), want) {
			t.Errorf("the log has no %s", want)
		}
	}
}
