package console_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/projectorhq/projector/console"
	"github.com/projectorhq/projector/internal/hostcheck"
	"github.com/projectorhq/projector/projection"
)

// consoleRoute is one request the console answers; every route of New's
// mux is here, with a method that reaches its handler.
type consoleRoute struct {
	method, path string
	form         url.Values
}

func consoleRoutes() []consoleRoute {
	return []consoleRoute{
		{http.MethodGet, "/", nil},
		{http.MethodGet, "/fragment", nil},
		{http.MethodGet, "/state.json", nil},
		{http.MethodGet, "/dead-letters", nil},
		{http.MethodGet, "/dead-letters/1", nil},
		{http.MethodGet, "/parked", nil},
		{http.MethodGet, "/relay-parked", nil},
		{http.MethodGet, "/sagas", nil},
		{http.MethodGet, "/sagas/ticket_sla", nil},
		{http.MethodGet, "/sagas/ticket_sla/" + uuid.NewString(), nil},
		{http.MethodGet, "/login", nil},
		{http.MethodPost, "/login", url.Values{"name": {"mallory"}, "token": {testToken}}},
		{http.MethodPost, "/logout", url.Values{}},
		{http.MethodPost, "/actions/consumer/disable", url.Values{"consumer": {"tickets"}}},
		{http.MethodPost, "/actions/park/discard", url.Values{"id": {"1"}}},
		{http.MethodPost, "/actions/relay-park/discard", url.Values{"id": {"1"}, "subscription": {"feed"}}},
		{http.MethodGet, "/static/console.js", nil},
		{http.MethodGet, "/static/console.css", nil},
		{http.MethodGet, "/tail?tenant=acme", nil},
		{http.MethodGet, "/no-such-page", nil},
		{http.MethodPut, "/", nil},
	}
}

// hostRequest sends route to the console's real listener with the Host
// header host, the bearer token and a same-origin Origin for that host (as
// a page served under that name would send), and returns the status and
// the first bytes of the body.
func hostRequest(t *testing.T, e *env, r consoleRoute, host string) (int, string) {
	t.Helper()
	var body io.Reader
	if r.form != nil {
		body = strings.NewReader(r.form.Encode())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, r.method, e.srv.URL+r.path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	req.Header.Set("Authorization", "Bearer "+testToken)
	if r.form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", "http://"+host)
		req.Header.Set("Sec-Fetch-Site", "same-origin")
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// The tail streams forever when served: its first bytes are enough.
	b := make([]byte, 512)
	n, _ := io.ReadAtLeast(resp.Body, b, 1)
	return resp.StatusCode, string(b[:n])
}

// TestHostileHostRefusedOnEveryRoute: a page on another site whose name
// its attacker re-points at the console's address (DNS rebinding) sends
// that name as Host. Every route of the console, its static files and its
// live tail included, answers such a request 421 with nothing of the
// console in it, and changes nothing even with the token; its own address,
// localhost names and the configured names behind a proxy are served.
func TestHostileHostRefusedOnEveryRoute(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{token: testToken, tail: true, extra: func(cfg *console.Config) {
		cfg.AllowedHosts = []string{"console.example.com", "*.ops.example.net"}
	}})
	e.dispatch()
	e.appendEvents("t1", 1)
	_, port, _ := strings.Cut(strings.TrimPrefix(e.srv.URL, "http://"), ":")
	for _, host := range []string{"rebind.evil.example:" + port, "rebind.evil.example", "localhost.evil.example:" + port,
		"ops.example.net:" + port, "console.example.com.evil.example"} {
		for _, r := range consoleRoutes() {
			code, body := hostRequest(t, e, r, host)
			if code != http.StatusMisdirectedRequest {
				t.Errorf("%s %s with Host %s: %d, want 421 (%.120q)", r.method, r.path, host, code, body)
				continue
			}
			for _, leak := range []string{"tickets", "consumer", "<html", "projector_"} {
				if strings.Contains(body, leak) {
					t.Errorf("%s %s with Host %s: the 421 carries %q: %.200q", r.method, r.path, host, leak, body)
				}
			}
		}
	}
	if st := e.status(); st.Status == projection.StatusDisabled {
		t.Fatal("a request with a hostile Host disabled the consumer")
	}
	if !strings.Contains(e.logs.String(), "rebind.evil.example") {
		t.Errorf("refused Host not logged:\n%s", e.logs.String())
	}
	for _, host := range []string{e.srv.Listener.Addr().String(), "localhost:" + port, "console.example.com:" + port, "a.ops.example.net"} {
		for _, path := range []string{"/", "/state.json", "/static/console.js"} {
			if code, body := hostRequest(t, e, consoleRoute{http.MethodGet, path, nil}, host); code != http.StatusOK {
				t.Errorf("GET %s with Host %s: %d, want 200 (%.120q)", path, host, code, body)
			}
		}
	}
	if code, body := hostRequest(t, e, consoleRoute{http.MethodGet, "/tail", nil}, "localhost:"+port); code != http.StatusOK {
		t.Errorf("GET /tail with Host localhost: %d (%.120q)", code, body)
	}
}

// TestAllowedHostsValidated: an allowed host that could never match a
// Host header is a configuration error, not a silent refusal of every
// request.
func TestAllowedHostsValidated(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	for _, bad := range []string{"", "console.example.com:443", "https://console.example.com", "con sole"} {
		_, err := console.New(console.Config{Store: e.store, AllowedHosts: []string{bad}})
		if !errors.Is(err, console.ErrInvalidConfig) || !errors.Is(err, hostcheck.ErrInvalidHost) {
			t.Errorf("AllowedHosts %q: %v, want ErrInvalidConfig", bad, err)
		}
	}
}
