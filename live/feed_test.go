package live_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/live"
)

const wait = 30 * time.Second

func TestFilterByType(t *testing.T) {
	t.Parallel()
	e := newEnv(t, live.Config{Payloads: true}, false)
	all := e.connect("a", "", "")
	opened := e.connect("a", query("types", "ticket.opened"), "")
	both := e.connect("a", query("types", "ticket.opened,ticket.closed"), "")
	pgtest.Eventually(t, wait, "three live clients", func() bool { return e.feed.Clients() == 3 })
	e.append("a", "1", testevents.TicketOpened{Title: "one"}, testevents.TicketCommented{Body: "c"}, testevents.TicketClosed{})
	e.append("a", "2", testevents.TicketOpened{Title: "two"})

	got := all.collect(t, 4, wait)
	want := []string{"ticket.opened", "ticket.commented", "ticket.closed", "ticket.opened"}
	for i, m := range got {
		if m.event != want[i] {
			t.Fatalf("event %d: %s, want %s", i, m.event, want[i])
		}
	}
	var env struct {
		ID       string `json:"id"`
		Position string `json:"position"`
		Type     string `json:"type"`
		Tenant   string `json:"tenant"`
		Stream   struct{ Type, ID string }
		Version  int64           `json:"version"`
		Recorded time.Time       `json:"recorded_at"`
		Payload  json.RawMessage `json:"payload"`
	}
	if err := json.Unmarshal([]byte(got[0].data), &env); err != nil {
		t.Fatal(err)
	}
	if env.Position != got[0].id || env.Type != "ticket.opened" || env.Tenant != "a" || env.Stream.Type != "ticket" || env.Stream.ID != "1" ||
		env.Version != 1 || env.Recorded.IsZero() || env.ID == "" || string(env.Payload) != `{"title":"one"}` {
		t.Fatalf("envelope %s", got[0].data)
	}
	for _, m := range opened.collect(t, 2, wait) {
		if m.event != "ticket.opened" {
			t.Fatalf("filtered client got %s", m.event)
		}
	}
	for i, m := range both.collect(t, 3, wait) {
		if w := []string{"ticket.opened", "ticket.closed", "ticket.opened"}[i]; m.event != w {
			t.Fatalf("event %d: %s, want %s", i, m.event, w)
		}
	}
	// Nothing more arrives for the filtered client (a comment at most).
	e.append("a", "3", testevents.TicketCommented{Body: "x"}, testevents.TicketOpened{Title: "three"})
	if m := opened.collect(t, 1, wait)[0]; m.event != "ticket.opened" {
		t.Fatalf("filtered client got %s", m.event)
	}
}

func TestPayloadsOffByDefault(t *testing.T) {
	t.Parallel()
	e := newEnv(t, live.Config{}, false)
	c := e.connect("a", "", "")
	pgtest.Eventually(t, wait, "a live client", func() bool { return e.feed.Clients() == 1 })
	e.append("a", "1", testevents.TicketOpened{Title: "secret"})
	m := c.collect(t, 1, wait)[0]
	if strings.Contains(m.data, "secret") || strings.Contains(m.data, "payload") {
		t.Fatalf("payload sent though not enabled: %s", m.data)
	}
}

func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, live.Config{Payloads: true}, false)
	a := e.connect("a", "", "")
	b := e.connect("b", "", "")
	sys := e.connect(projector.SystemTenant, "", "")
	pgtest.Eventually(t, wait, "three live clients", func() bool { return e.feed.Clients() == 3 })
	for i := range 20 {
		e.append([]string{"a", "b", projector.SystemTenant}[i%3], "s", testevents.TicketCommented{Body: "x", N: i})
	}
	for _, c := range []struct {
		tenant string
		s      *sse
	}{{"a", a}, {"b", b}, {projector.SystemTenant, sys}} {
		want := e.logIDs(c.tenant, nil, projector.Start)
		got := c.s.collect(t, len(want), wait)
		sameIDs(t, "tenant "+c.tenant, ids(got), want)
		for _, m := range got {
			if !strings.Contains(m.data, `"tenant":"`+c.tenant+`"`) {
				t.Fatalf("tenant %s got %s", c.tenant, m.data)
			}
		}
	}
	// A catch-up read from the log keeps the tenant too.
	first := e.logIDs("a", nil, projector.Start)[0]
	late := e.connect("a", "", first)
	want := e.logIDs("a", nil, projector.Start)[1:]
	sameIDs(t, "tenant a catching up", ids(late.collect(t, len(want), wait)), want)
	// An id of another tenant's event cannot be resumed as this tenant.
	other := e.connect("b", "", first)
	if m, _ := other.next(t, wait); m.event != "reset" {
		t.Fatalf("resuming after another tenant's event: %+v, want a reset", m)
	}
}

func TestRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, live.Config{}, false)
	for _, c := range []struct {
		tenant string
		want   int
	}{{"", http.StatusUnauthorized}, {"forbidden", http.StatusForbidden}} {
		if s := e.connect(c.tenant, "", ""); s.status != c.want {
			t.Errorf("tenant %q: status %d, want %d", c.tenant, s.status, c.want)
		}
	}
	empty := newEnv(t, live.Config{Authorize: func(*http.Request) (string, error) { return "", nil }}, false)
	if s := empty.connect("a", "", ""); s.status != http.StatusForbidden {
		t.Errorf("empty tenant: status %d, want 403", s.status)
	}
	bad := newEnv(t, live.Config{Authorize: func(*http.Request) (string, error) { return "a\x00b", nil }}, false)
	if s := bad.connect("a", "", ""); s.status != http.StatusForbidden {
		t.Errorf("unstorable tenant: status %d, want 403", s.status)
	}
	none := newEnv(t, live.Config{}, true)
	if s := none.connect("a", "", ""); s.status != http.StatusForbidden || !strings.Contains(s.body, "no authorisation") {
		t.Errorf("no callback: status %d %q, want 403", s.status, s.body)
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t, live.Config{EventTypes: []string{"ticket.opened", "ticket.closed"}}, false)
	for _, c := range []struct{ name, query, lastID, want string }{
		{"unknown type", query("types", "ticket.nope"), "", "not served"},
		{"type not served", query("types", "ticket.commented"), "", "not served"},
		{"empty types", query("types", ","), "", "names no event type"},
		{"NUL in type", query("types", "a\x00"), "", "not served"},
		{"id without slash", "", "12", "malformed Last-Event-ID"},
		{"id not a number", "", "x/1", "malformed Last-Event-ID"},
		{"negative seq", "", "5/-1", "malformed Last-Event-ID"},
		{"horizon form", "", "5/max", "malformed Last-Event-ID"},
		{"zero", "", "0/0", "malformed Last-Event-ID"},
		{"overflow", "", "99999999999999999999/1", "malformed Last-Event-ID"},
		{"huge", "", strings.Repeat("9", 5000), "malformed Last-Event-ID"},
		{"query fallback", query(live.LastEventIDParam, "nope"), "", "malformed Last-Event-ID"},
	} {
		s := e.connect("a", c.query, c.lastID)
		if s.status != http.StatusBadRequest || !strings.Contains(s.body, c.want) {
			t.Errorf("%s: %d %q, want 400 with %q", c.name, s.status, s.body, c.want)
		}
	}
	resp, err := http.Post(e.srv.URL, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d, want 405", resp.StatusCode)
	}
	store := pgtest.Store(t, testevents.New().Registry)
	for _, cfg := range []live.Config{
		{},
		{Store: store, BufferSize: -1},
		{Store: store, BufferSize: live.MaxBufferSize + 1},
		{Store: store, Heartbeat: time.Millisecond},
		{Store: store, Heartbeat: time.Hour},
		{Store: store, CatchUpBatch: live.MaxCatchUpBatch + 1},
		{Store: store, WriteTimeout: time.Millisecond},
		{Store: store, EventTypes: []string{"ticket.unknown"}},
		{Store: store, EventTypes: []string{"ticket.opened", "ticket.opened"}},
		{Store: store, Name: "Not A Name"},
	} {
		if _, err := live.New(cfg); !errors.Is(err, live.ErrInvalidConfig) {
			t.Errorf("New(%+v): %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

func TestHeartbeat(t *testing.T) {
	t.Parallel()
	e := newEnv(t, live.Config{Heartbeat: 20 * time.Millisecond}, false)
	c := e.connect("a", "", "")
	deadline := time.After(wait)
	for beats := 0; beats < 3; {
		select {
		case m := <-c.msgs:
			if m.comment == "heartbeat" {
				beats++
			}
		case <-deadline:
			t.Fatal("fewer than 3 heartbeats")
		}
	}
}

func TestCloseEndsStreams(t *testing.T) {
	t.Parallel()
	e := newEnv(t, live.Config{}, false)
	c := e.connect("a", "", "")
	pgtest.Eventually(t, wait, "a live client", func() bool { return e.feed.Clients() == 1 })
	e.feed.Close()
	var comments []string
	for m := range c.msgs {
		comments = append(comments, m.comment)
	}
	if len(comments) == 0 || comments[len(comments)-1] != "shutting down" {
		t.Fatalf("stream ended with %q, want a shutting-down comment", comments)
	}
	if s := e.connect("a", "", ""); s.status != http.StatusServiceUnavailable {
		t.Fatalf("after Close: %d, want 503", s.status)
	}
}
