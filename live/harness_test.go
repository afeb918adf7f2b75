package live_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/live"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// tenantHeader carries the test's "credentials": the tenant itself.
const tenantHeader = "X-Test-Tenant"

// headerAuth is the Authorizer of the tests: no header is unauthenticated,
// "forbidden" is refused, anything else is the tenant.
func headerAuth(r *http.Request) (string, error) {
	v, ok := r.Header[tenantHeader]
	if !ok {
		return "", live.ErrUnauthenticated
	}
	if v[0] == "forbidden" {
		return "", errors.New("not yours")
	}
	return v[0], nil
}

// env is one test's store, dispatcher, feed and server.
type env struct {
	t     testing.TB
	ctx   context.Context
	types testevents.Types
	store *postgres.Store
	feed  *live.Feed
	srv   *httptest.Server
	mu    sync.Mutex
	last  projector.Position // the latest position appended
}

// newEnv starts a feed with cfg (Store and, unless noAuth, Authorize
// filled in) on a started dispatcher, behind an httptest server.
func newEnv(t testing.TB, cfg live.Config, noAuth bool) *env {
	t.Helper()
	return newEnvStore(t, cfg, noAuth, postgres.Config{})
}

// newEnvStore is newEnv with a store configured by storeCfg.
func newEnvStore(t testing.TB, cfg live.Config, noAuth bool, storeCfg postgres.Config) *env {
	t.Helper()
	types := testevents.New()
	store := pgtest.Store(t, types.Registry, storeCfg)
	e := &env{t: t, ctx: context.Background(), types: types, store: store}
	e.feed, e.srv = e.serve(cfg, noAuth)
	return e
}

// serve starts a feed on e's store with its own dispatcher and server: what
// another process of the application would run.
func (e *env) serve(cfg live.Config, noAuth bool) (*live.Feed, *httptest.Server) {
	t, store := e.t, e.store
	cfg.Store = store
	if !noAuth && cfg.Authorize == nil {
		cfg.Authorize = headerAuth
	}
	feed, err := live.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d, err := projection.New(projection.Config{Store: store, Projections: []*projection.Async{feed.Projection()}, PollMax: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := e.ctx
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(feed)
	t.Cleanup(func() {
		feed.Close()
		srv.Close()
		stopCtx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if err := d.Stop(stopCtx); err != nil {
			t.Error(err)
		}
	})
	return feed, srv
}

// appendTx appends payloads to tenant's stream id in a transaction of its
// own and returns the events' positions.
func (e *env) append(tenant, id string, payloads ...any) {
	e.t.Helper()
	e.appendTo(projector.TenantStream(tenant, "ticket", id), payloads...)
}

// appendTo appends payloads to ref in a transaction of its own.
func (e *env) appendTo(ref projector.StreamRef, payloads ...any) {
	e.t.Helper()
	if err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		res, err := e.store.Append(e.ctx, tx, ref, projector.AnyVersion, payloads...)
		if err == nil {
			e.appended(res.Events[len(res.Events)-1].Position)
		}
		return err
	}); err != nil {
		e.t.Fatal(err)
	}
}

// appended notes a committed position, for settle.
func (e *env) appended(p projector.Position) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.last.Less(p) {
		e.last = p
	}
}

// settle waits until the log's horizon has passed every append: another
// session's open transaction (another test's, anywhere in the cluster) may
// hold it back for a while.
func (e *env) settle() {
	e.t.Helper()
	e.mu.Lock()
	last := e.last
	e.mu.Unlock()
	pgtest.Eventually(e.t, time.Minute, "the horizon to pass the appended events", func() bool {
		h, err := e.store.Horizon(e.ctx)
		return err == nil && last.Less(h)
	})
}

// logIDs is what a client of tenant filtered to types (nil: all) should
// receive after position after: the ids of those events, in log order.
func (e *env) logIDs(tenant string, types []string, after projector.Position) []string {
	e.t.Helper()
	e.settle()
	var out []string
	for {
		b, err := e.store.ReadLog(e.ctx, postgres.LogQuery{After: after, EventTypes: types, Raw: true})
		if err != nil {
			e.t.Fatal(err)
		}
		for _, ev := range b.Events {
			if ev.Stream.Tenant == tenant {
				out = append(out, ev.Position.String())
			}
		}
		after = b.Next(after)
		if !b.Full {
			return out
		}
	}
}

// msg is one SSE message, or a comment.
type msg struct {
	id, event, data, comment string
}

// sse is a test's EventSource.
type sse struct {
	status int
	body   string // the refusal's body when status is not 200
	msgs   chan msg
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

// connect opens a stream as tenant ("" sends no credentials) with the
// query and, when not empty, a Last-Event-ID header.
func (e *env) connect(tenant, query, lastID string) *sse {
	e.t.Helper()
	return e.connectTo(e.srv.URL, tenant, query, lastID)
}

// connectTo is connect to the feed at base.
func (e *env) connectTo(base, tenant, query, lastID string) *sse {
	e.t.Helper()
	ctx, cancel := context.WithCancel(e.ctx)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"?"+query, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	if tenant != "" {
		req.Header.Set(tenantHeader, tenant)
	}
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		e.t.Fatal(err)
	}
	s := &sse{status: resp.StatusCode, msgs: make(chan msg, 1024), cancel: cancel, done: make(chan struct{})}
	e.t.Cleanup(s.close)
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		s.body = string(b)
		resp.Body.Close()
		close(s.msgs)
		close(s.done)
		return s
	}
	go func() {
		defer close(s.done)
		defer close(s.msgs)
		defer resp.Body.Close()
		parse(resp.Body, s.msgs)
	}()
	return s
}

// parse reads SSE from r until it ends, sending each message and comment.
func parse(r io.Reader, out chan<- msg) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4<<10), 1<<20)
	var m msg
	var data []string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if m.event != "" || m.id != "" || len(data) > 0 {
				m.data = strings.Join(data, "\n")
				out <- m
			}
			m, data = msg{}, nil
		case strings.HasPrefix(line, ":"):
			out <- msg{comment: strings.TrimSpace(line[1:])}
		case strings.HasPrefix(line, "id: "):
			m.id = line[4:]
		case strings.HasPrefix(line, "event: "):
			m.event = line[7:]
		case strings.HasPrefix(line, "data: "):
			data = append(data, line[6:])
		}
	}
}

func (s *sse) close() {
	s.once.Do(func() {
		s.cancel()
		<-s.done
	})
}

// next returns the next message that is not a comment, failing after
// timeout. ok is false when the stream ended.
func (s *sse) next(t testing.TB, timeout time.Duration) (msg, bool) {
	t.Helper()
	tm := time.NewTimer(timeout)
	defer tm.Stop()
	for {
		select {
		case m, ok := <-s.msgs:
			if !ok {
				return msg{}, false
			}
			if m.comment != "" {
				continue
			}
			return m, true
		case <-tm.C:
			t.Fatalf("no message within %v", timeout)
		}
	}
}

// collect reads events until it has n, failing on a control event unless
// it is in allow, or on a timeout.
func (s *sse) collect(t testing.TB, n int, timeout time.Duration) []msg {
	t.Helper()
	var out []msg
	deadline := time.Now().Add(timeout)
	for len(out) < n {
		m, ok := s.next(t, time.Until(deadline))
		if !ok {
			t.Fatalf("stream ended after %d of %d events", len(out), n)
		}
		if m.id == "" {
			t.Fatalf("unexpected control message %+v", m)
		}
		out = append(out, m)
	}
	return out
}

func ids(ms []msg) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.id
	}
	return out
}

func sameIDs(t testing.TB, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("%s: got %d events, want %d\n got  %v\n want %v", what, len(got), len(want), head(got), head(want))
	}
}

func head(s []string) []string {
	if len(s) > 20 {
		return append(s[:20:20], fmt.Sprintf("… %d more", len(s)-20))
	}
	return s
}

func query(kv ...string) string {
	v := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		v.Add(kv[i], kv[i+1])
	}
	return v.Encode()
}
