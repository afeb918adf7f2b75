package console_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/console"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/live"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testToken is the operator token of the tests' consoles.
const testToken = "s3cret-operator-token"

// env is one test's schema with a consumer "tickets" counting events into
// a table, a dispatcher running it and a console on an httptest server.
type env struct {
	t     testing.TB
	ctx   context.Context
	types testevents.Types
	store *postgres.Store
	// fail makes the handler fail every event while set; slow makes it
	// take 20ms an event.
	fail atomic.Bool
	slow atomic.Bool
	// healed makes the mailer deliver to bad-… streams too.
	healed atomic.Bool
	proj   *projection.Async
	more   []*projection.Async
	logs   *pgtest.SyncBuffer
	con    *console.Console
	srv    *httptest.Server
	admin  *projection.Admin
}

type options struct {
	token        string
	showPayloads bool
	continuous   bool
	park         bool // the consumer parks failing streams (ParkStream)
	batchSize    int
	// mailer adds a continuous-mode consumer "mailer" that dead-letters
	// the events of streams named bad-…
	mailer bool
	// tail serves a live feed as the console's live tail; tailSpy sees
	// each request to it.
	tail    bool
	tailSpy func(*http.Request)
	prefix  string // mount the console under this prefix
	// partitions partitions the consumer (with the log's partition index).
	partitions int
	extra      func(cfg *console.Config)
}

func newEnv(t testing.TB, o options) *env {
	t.Helper()
	e := &env{t: t, ctx: context.Background(), types: testevents.New(), logs: &pgtest.SyncBuffer{}}
	e.store = pgtest.Store(t, e.types.Registry)
	e.admin = projection.NewAdmin(e.store)
	counts := pgx.Identifier{e.store.Schema(), "counts"}.Sanitize()
	if _, err := e.store.Pool().Exec(e.ctx, `CREATE TABLE `+counts+` (stream_id text PRIMARY KEY, n int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	cfg := projection.AsyncConfig{MaxAttempts: 2, RetryBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
		Tables: []string{e.store.Schema() + ".counts"}, BatchSize: o.batchSize}
	if o.continuous {
		cfg.ErrorMode = projection.SkipApplyErrors
	}
	if o.partitions > 0 {
		cfg.Partitions = o.partitions
		if err := e.store.CreatePartitionIndex(e.ctx); err != nil {
			t.Fatal(err)
		}
	}
	if o.park {
		cfg.ErrorMode = projection.ParkStream
	}
	e.proj = projection.NewAsync("tickets", cfg)
	h := func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		if e.slow.Load() {
			time.Sleep(20 * time.Millisecond) // a handler with work to do, so "processing" lasts long enough to be seen
		}
		if e.fail.Load() {
			return errors.New("handler refuses: fail flag set")
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+counts+` AS c VALUES ($1, 1) ON CONFLICT (stream_id) DO UPDATE SET n = c.n + 1`, ev.Stream.ID)
		return err
	}
	for _, err := range []error{projection.OnEvent(e.proj, e.types.Opened, h), projection.OnEvent(e.proj, e.types.Commented, h)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if o.mailer {
		m := projection.NewAsync("mailer", projection.AsyncConfig{ErrorMode: projection.SkipApplyErrors})
		err := projection.OnEvent(m, e.types.Commented, func(_ context.Context, _ pgx.Tx, ev projector.Event) error {
			if strings.HasPrefix(ev.Stream.ID, "bad-") && !e.healed.Load() {
				return errors.New("smtp: 550 mailbox unavailable")
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		e.more = append(e.more, m)
	}
	var feed *live.Feed
	if o.tail {
		var err error
		if feed, err = live.New(live.Config{Store: e.store, Authorize: console.TailTenant, Logger: slog.New(slog.NewTextHandler(tLog{t}, nil))}); err != nil {
			t.Fatal(err)
		}
		e.more = append(e.more, feed.Projection())
	}
	ccfg := console.Config{Store: e.store, Token: o.token, ShowPayloads: o.showPayloads, Projections: append([]*projection.Async{e.proj}, e.more...),
		Logger: slog.New(slog.NewJSONHandler(io.MultiWriter(e.logs, tLog{t}), nil))}
	if feed != nil {
		ccfg.Tail = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if o.tailSpy != nil {
				o.tailSpy(r)
			}
			feed.ServeHTTP(w, r)
		})
	}
	if o.extra != nil {
		o.extra(&ccfg)
	}
	var err error
	if e.con, err = console.New(ccfg); err != nil {
		t.Fatal(err)
	}
	var h2 http.Handler = e.con
	if o.prefix != "" {
		mux := http.NewServeMux()
		mux.Handle(o.prefix+"/", http.StripPrefix(o.prefix, e.con))
		h2 = mux
	}
	e.srv = httptest.NewServer(h2)
	t.Cleanup(e.srv.Close)
	if feed != nil {
		t.Cleanup(feed.Close) // before the server's close, which waits for the streams to end
	}
	return e
}

// dispatch starts a dispatcher running the consumer, stopped at the end
// of the test or when the returned function is called.
func (e *env) dispatch() (stop func()) {
	e.t.Helper()
	d, err := projection.New(projection.Config{Store: e.store, Projections: append([]*projection.Async{e.proj}, e.more...),
		PollMax: 20 * time.Millisecond, Recheck: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(tLog{e.t}, nil))})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := d.Start(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := d.Stop(ctx); err != nil {
				e.t.Errorf("stop dispatcher: %v", err)
			}
		})
	}
	e.t.Cleanup(stop)
	return stop
}

// appendEvents appends n events to stream id in one transaction.
func (e *env) appendEvents(id string, n int) []projector.Event {
	e.t.Helper()
	payloads := make([]any, n)
	for i := range payloads {
		payloads[i] = testevents.TicketCommented{Body: fmt.Sprintf("secret-payload-%d", i), N: i}
	}
	var out []projector.Event
	err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		res, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", id), projector.AnyVersion, payloads...)
		out = res.Events
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

func (e *env) status() projection.ShardState {
	e.t.Helper()
	st, err := e.admin.Status(e.ctx, projection.ShardID{Consumer: "tickets"})
	if err != nil {
		e.t.Fatal(err)
	}
	return st
}

// waitStatus waits until the consumer's shard is in want.
func (e *env) waitStatus(want projection.Status) {
	e.t.Helper()
	pgtest.Eventually(e.t, time.Minute, "consumer tickets "+string(want), func() bool {
		st, err := e.admin.Status(e.ctx, projection.ShardID{Consumer: "tickets"})
		return err == nil && st.Status == want
	})
}

// dead makes the consumer dead: the handler fails, an event comes, the
// shard gives up after MaxAttempts.
func (e *env) dead() {
	e.t.Helper()
	e.fail.Store(true)
	e.appendEvents("poison", 1)
	e.waitStatus(projection.StatusDead)
}

// client is a browser-like HTTP client with its own cookie jar.
type client struct {
	t   testing.TB
	e   *env
	hc  *http.Client
	url string
}

func (e *env) client() *client {
	jar, err := cookiejar.New(nil)
	if err != nil {
		e.t.Fatal(err)
	}
	return &client{t: e.t, e: e, url: e.srv.URL, hc: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

// do sends a request as the console's own page would: same origin.
func (c *client) do(method, path string, form url.Values, hdr map[string]string) (int, string) {
	c.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, c.url+path, body)
	if err != nil {
		c.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if method == http.MethodPost {
		req.Header.Set("Origin", c.url)
		req.Header.Set("Sec-Fetch-Site", "same-origin")
	}
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// login signs in as name and returns the CSRF token the dashboard carries.
func (c *client) login(name string) string {
	c.t.Helper()
	code, body := c.do(http.MethodPost, "/login", url.Values{"name": {name}, "token": {testToken}}, nil)
	if code != http.StatusSeeOther {
		c.t.Fatalf("login: %d %s", code, body)
	}
	return c.csrf()
}

// csrf reads the CSRF token from the dashboard.
func (c *client) csrf() string {
	c.t.Helper()
	_, page := c.do(http.MethodGet, "/", nil, nil)
	_, rest, ok := strings.Cut(page, `data-csrf="`)
	if !ok {
		c.t.Fatalf("no data-csrf on the dashboard")
	}
	tok, _, _ := strings.Cut(rest, `"`)
	return tok
}

// tLog writes log lines to the test's log.
type tLog struct{ t testing.TB }

func (w tLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
