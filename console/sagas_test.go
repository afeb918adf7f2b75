package console_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/console"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
)

// scriptTitle is a ticket title that would run in the page if a saga's
// state were written into it unescaped.
const scriptTitle = `<script>alert("pwned")</script>`

// slaState is the state of the tests' saga.
type slaState struct {
	Title string `json:"title"`
}

// sagaRun is a real saga "sla" on the env's store: an opening starts an
// instance and schedules "remind" an hour later (a minute for a ticket
// titled "flaky", whose reminder fails, which with one attempt fails the
// instance); a close completes it. Its clock is the wall clock moved by at.
type sagaRun struct {
	e      *env
	at     atomic.Int64 // offset from the wall clock, in nanoseconds
	saga   *saga.Saga[slaState]
	d      *projection.Dispatcher
	runner *saga.Runner
}

func newSagaRun(e *env) *sagaRun {
	e.t.Helper()
	sr := &sagaRun{e: e}
	now := func() time.Time { return time.Now().Add(time.Duration(sr.at.Load())) }
	s := saga.New[slaState]("sla", saga.Config{Now: now, TimeoutAttempts: 1})
	for _, err := range []error{
		saga.StartOn(s, e.types.Opened, saga.ByStream, func(_ context.Context, in *saga.Instance[slaState], _ projector.Event, o testevents.TicketOpened) error {
			in.State.Title = o.Title
			if o.Title == "flaky" {
				in.After("remind", time.Minute)
			} else {
				in.After("remind", time.Hour)
			}
			return nil
		}),
		saga.On(s, e.types.Closed, saga.ByStream, func(_ context.Context, in *saga.Instance[slaState], _ projector.Event, _ testevents.TicketClosed) error {
			in.Complete()
			return nil
		}),
		saga.OnTimeout(s, "remind", func(_ context.Context, in *saga.Instance[slaState], _ saga.Timeout) error {
			if in.State.Title == "flaky" {
				return errors.New("reminder mailer down")
			}
			return nil
		}),
	} {
		if err != nil {
			e.t.Fatal(err)
		}
	}
	p, err := s.Projection(e.store)
	if err != nil {
		e.t.Fatal(err)
	}
	sr.saga = s
	if sr.d, err = projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{p}, PollMax: 20 * time.Millisecond}); err != nil {
		e.t.Fatal(err)
	}
	if err := sr.d.Start(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := sr.d.Stop(ctx); err != nil {
			e.t.Errorf("stop saga dispatcher: %v", err)
		}
	})
	if sr.runner, err = saga.NewRunner(saga.RunnerConfig{Store: e.store, Sagas: []saga.Definition{s}}); err != nil {
		e.t.Fatal(err)
	}
	return sr
}

// open appends events to ticket id of tenant and waits for the saga's steps.
func (sr *sagaRun) open(tenant, id string, payloads ...any) {
	sr.e.t.Helper()
	err := pgx.BeginFunc(sr.e.ctx, sr.e.store.Pool(), func(tx pgx.Tx) error {
		_, err := sr.e.store.Append(sr.e.ctx, tx, projector.TenantStream(tenant, "ticket", id), projector.AnyVersion, payloads...)
		return err
	})
	if err != nil {
		sr.e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(sr.e.ctx, 30*time.Second)
	defer cancel()
	if err := sr.d.CatchUp(ctx); err != nil {
		sr.e.t.Fatal(err)
	}
}

// sagaFixture runs the saga to: "overdue" active with its reminder due an
// hour ago and not fired (no runner looked since), "flaky" failed by its
// reminder, "waiting" active with its reminder due in an hour, "done"
// completed, and "t-acme" of tenant acme active, titled scriptTitle.
func sagaFixture(e *env) *sagaRun {
	e.t.Helper()
	sr := newSagaRun(e)
	sr.at.Store(int64(-2 * time.Hour))
	sr.open(projector.SystemTenant, "overdue", testevents.TicketOpened{Title: "nobody answered"})
	sr.open(projector.SystemTenant, "flaky", testevents.TicketOpened{Title: "flaky"})
	sr.at.Store(int64(-2*time.Hour + 2*time.Minute))
	if _, err := sr.runner.FireDue(e.ctx); err == nil || !strings.Contains(err.Error(), "reminder mailer down") {
		e.t.Fatalf("firing flaky's reminder: %v, want its handler's error", err)
	}
	sr.at.Store(0)
	sr.open(projector.SystemTenant, "waiting", testevents.TicketOpened{Title: "fresh"})
	sr.open(projector.SystemTenant, "done", testevents.TicketOpened{Title: "quick"}, testevents.TicketClosed{})
	sr.open("acme", "t-acme", testevents.TicketOpened{Title: scriptTitle})
	return sr
}

// rowsOf returns the data-key of each instance row of a saga list page, in
// page order, with its tenant and status.
func rowsOf(page string) (keys []string, tenants, statuses map[string]string) {
	tenants, statuses = map[string]string{}, map[string]string{}
	re := regexp.MustCompile(`data-instance="[^"]+" data-key="([^"]*)" data-tenant="([^"]*)" data-status="([^"]*)"`)
	for _, m := range re.FindAllStringSubmatch(page, -1) {
		keys = append(keys, m[1])
		tenants[m[1]], statuses[m[1]] = m[2], m[3]
	}
	return keys, tenants, statuses
}

// The saga pages show a real saga's instances as the saga package reads
// them: counts by status, pending and overdue timeouts per saga (and a
// configured saga without instances with zeros), instances newest first
// with their filters and limit, and one instance with its timeouts and
// steps; they are linked from the layout's navigation and the dashboard.
func TestSagaPages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{extra: func(cfg *console.Config) { cfg.Sagas = []string{"sla", "quiet"} }})
	sagaFixture(e)
	c := e.client()

	code, page := c.do(http.MethodGet, "/sagas", nil, nil)
	if code != http.StatusOK {
		t.Fatalf("GET /sagas: %d %s", code, page)
	}
	for _, want := range []string{
		`data-saga="sla" data-active="3" data-completed="1" data-failed="1" data-pending="3" data-overdue="1"`,
		`data-saga="quiet" data-active="0" data-completed="0" data-failed="0" data-pending="0" data-overdue="0"`,
		`href="/sagas/sla"`, `href="/sagas/sla?status=failed"`, `id="nav-sagas" href="/sagas"`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("saga list lacks %s", want)
		}
	}
	_, dash := c.do(http.MethodGet, "/", nil, nil)
	for _, want := range []string{`id="nav-sagas" href="/sagas"`, `<a class="more" href="/sagas">`, `href="/sagas/sla/`} {
		if !strings.Contains(dash, want) {
			t.Errorf("dashboard lacks the link %s", want)
		}
	}

	all, err := saga.List(e.ctx, e.store, saga.ListQuery{Saga: "sla"})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]uuid.UUID{}
	var newestFirst []string
	for _, in := range all {
		ids[in.Key] = in.ID
		newestFirst = append(newestFirst, in.Key)
	}
	code, page = c.do(http.MethodGet, "/sagas/sla", nil, nil)
	if code != http.StatusOK {
		t.Fatalf("GET /sagas/sla: %d %s", code, page)
	}
	keys, tenants, statuses := rowsOf(page)
	if !slices.Equal(keys, newestFirst) || len(keys) != 5 {
		t.Errorf("instances shown %v, want saga.List's order %v", keys, newestFirst)
	}
	if statuses["flaky"] != "failed" || statuses["done"] != "completed" || statuses["overdue"] != "active" || tenants["t-acme"] != "acme" {
		t.Errorf("statuses %v, tenants %v", statuses, tenants)
	}
	if !strings.Contains(page, `id="overdue">1 overdue</b>`) || !strings.Contains(page, "reminder mailer down") {
		t.Error("instance list lacks the overdue count or the failed instance's error")
	}
	if !regexp.MustCompile(`data-key="overdue"[^>]*>(?s:.)*?<span class="pill s-failing">overdue</span>`).MatchString(page) {
		t.Error("the instance whose reminder is overdue is not marked overdue")
	}
	if strings.Contains(page, "nobody answered") || strings.Contains(page, "alert(") {
		t.Error("the instance list shows a saga's state")
	}
	for q, want := range map[string][]string{
		"status=failed":             {"flaky"},
		"status=completed":          {"done"},
		"tenant=acme":               {"t-acme"},
		"status=active&tenant=acme": {"t-acme"},
		"status=failed&tenant=acme": nil,
		"status=all&limit=2":        newestFirst[:2],
		"tenant=" + url.QueryEscape(projector.SystemTenant): {"overdue", "flaky", "waiting", "done"},
	} {
		code, page := c.do(http.MethodGet, "/sagas/sla?"+q, nil, nil)
		keys, tenants, _ := rowsOf(page)
		slices.Sort(keys)
		w := slices.Sorted(slices.Values(want))
		if code != http.StatusOK || !slices.Equal(keys, w) {
			t.Errorf("/sagas/sla?%s: %d, instances %v; want %v", q, code, keys, w)
		}
		if strings.Contains(q, "tenant=acme") {
			for k, tn := range tenants {
				if tn != "acme" {
					t.Errorf("/sagas/sla?%s shows %s of tenant %s", q, k, tn)
				}
			}
		}
		if strings.Contains(q, "limit=2") && !strings.Contains(page, `id="limited"`) {
			t.Errorf("/sagas/sla?%s does not say the list is cut at the limit", q)
		}
	}
	if code, page := c.do(http.MethodGet, "/sagas/quiet", nil, nil); code != http.StatusOK || !strings.Contains(page, "No instances") {
		t.Errorf("a configured saga without instances: %d", code)
	}

	code, page = c.do(http.MethodGet, "/sagas/sla/"+ids["overdue"].String(), nil, nil)
	if code != http.StatusOK {
		t.Fatalf("instance page: %d %s", code, page)
	}
	for _, want := range []string{`data-timeout="remind" data-overdue="true"`, `data-step="1"`, `id="state-hidden"`, ids["overdue"].String(), "ticket.opened", "ticket/overdue"} {
		if !strings.Contains(page, want) {
			t.Errorf("instance page lacks %s", want)
		}
	}
	if strings.Contains(page, "nobody answered") {
		t.Error("the instance page shows the state without payloads enabled")
	}
	_, page = c.do(http.MethodGet, "/sagas/sla/"+ids["waiting"].String(), nil, nil)
	if !strings.Contains(page, `data-timeout="remind" data-overdue="false"`) {
		t.Error("a reminder due in an hour is not shown pending and not overdue")
	}
	_, page = c.do(http.MethodGet, "/sagas/sla/"+ids["flaky"].String(), nil, nil)
	if !strings.Contains(page, `data-status="failed"`) || !strings.Contains(page, "reminder mailer down") || !strings.Contains(page, "Pending timeouts <span class=\"count\">0</span>") {
		t.Error("the failed instance's page lacks its status, its error, or shows timeouts")
	}
	// The lists stay read-only.
	if code, _ := c.do(http.MethodPost, "/sagas/sla", url.Values{}, nil); code != http.StatusMethodNotAllowed {
		t.Errorf("POST /sagas/sla: %d, want 405", code)
	}
}

// Bad input to the saga pages is 400 with what was wrong, before any
// query; an unknown saga or instance is 404.
func TestSagaPagesBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{extra: func(cfg *console.Config) { cfg.Sagas = []string{"quiet"} }})
	sr := newSagaRun(e)
	sr.open(projector.SystemTenant, "t-1", testevents.TicketOpened{Title: "one"})
	in, err := saga.Show(e.ctx, e.store, "sla", projector.SystemTenant, "t-1")
	if err != nil {
		t.Fatal(err)
	}
	c := e.client()
	for _, tc := range []struct {
		path string
		code int
		want string
	}{
		{"/sagas/sla?limit=0", 400, `limit &#34;0&#34;: want a number from 1 to 1000`},
		{"/sagas/sla?limit=1001", 400, "want a number from 1 to 1000"},
		{"/sagas/sla?limit=ten", 400, "want a number from 1 to 1000"},
		{"/sagas/sla?limit=-5", 400, "want a number from 1 to 1000"},
		{"/sagas/sla?status=done", 400, "want active, completed, failed, parked or all"},
		{"/sagas/sla?tenant=" + strings.Repeat("x", 300), 400, "tenant"},
		{"/sagas/sla?tenant=a%00b", 400, "NUL"},
		{"/sagas/%01sla", 400, "control character"},
		{"/sagas/%FFsla", 400, "not valid UTF-8"},
		{"/sagas/sla?tenant=a%FFb", 400, "tenant"},
		{"/sagas/" + strings.Repeat("s", 201), 400, "at most 200"},
		{"/sagas/sla/not-a-uuid", 400, "want a UUID"},
		{"/sagas/%01sla/" + in.ID.String(), 400, "control character"},
		{"/sagas/nope", 404, "no saga"},
		{"/sagas/nope/" + in.ID.String(), 404, "not found"},
		{"/sagas/quiet/" + in.ID.String(), 404, "not found"},
		{"/sagas/sla/" + uuid.NewString(), 404, "not found"},
	} {
		code, page := c.do(http.MethodGet, tc.path, nil, nil)
		if code != tc.code || !strings.Contains(page, tc.want) {
			t.Errorf("GET %s: %d, want %d with %q:\n%s", tc.path, code, tc.code, tc.want, page)
		}
	}
	if code, _ := c.do(http.MethodGet, "/sagas/sla/"+in.ID.String(), nil, nil); code != http.StatusOK {
		t.Errorf("the instance itself: %d", code)
	}
}

// A saga's state shows on its instance's page only with payloads enabled,
// and then escaped: a state holding a <script> tag is text, never markup.
// The lists and state.json never carry it.
func TestSagaStateEscapedAndOnlyWithPayloads(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{showPayloads: true, extra: func(cfg *console.Config) { cfg.Sagas = []string{"sla"} }})
	sr := newSagaRun(e)
	sr.open("acme", "t-acme", testevents.TicketOpened{Title: scriptTitle})
	in, err := saga.Show(e.ctx, e.store, "sla", "acme", "t-acme")
	if err != nil {
		t.Fatal(err)
	}
	c := e.client()
	code, page := c.do(http.MethodGet, "/sagas/sla/"+in.ID.String(), nil, nil)
	if code != http.StatusOK || !strings.Contains(page, `id="state"`) {
		t.Fatalf("instance page with payloads: %d, no state shown:\n%s", code, page)
	}
	if strings.Contains(page, "<script>alert") || !strings.Contains(page, `&lt;script&gt;alert(`) || !strings.Contains(page, `&lt;/script&gt;`) {
		t.Errorf("the state is not escaped:\n%s", page)
	}
	for _, p := range []string{"/", "/state.json", "/sagas", "/sagas/sla"} {
		if _, page := c.do(http.MethodGet, p, nil, nil); strings.Contains(page, "pwned") {
			t.Errorf("%s carries the saga's state", p)
		}
	}
	// The same store behind a console without payloads: the state is hidden.
	hidden, err := console.New(console.Config{Store: e.store})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(hidden)
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + "/sagas/sla/" + in.ID.String())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	if _, err := io.Copy(&b, resp.Body); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || strings.Contains(b.String(), "pwned") || !strings.Contains(b.String(), `id="state-hidden"`) {
		t.Errorf("without payloads: %d, want the state hidden:\n%s", resp.StatusCode, b.String())
	}
}
