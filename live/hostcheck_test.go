package live_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/projectorhq/projector/live"
)

// hostGet sends GET path with the Host header host and the test's tenant
// credentials to the feed's real listener, and returns the status and the
// first bytes of the body.
func hostGet(t *testing.T, e *env, host, method string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, e.srv.URL+"?types=ticket.opened", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	req.Header.Set(tenantHeader, "acme")
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b := make([]byte, 256)
	n, _ := io.ReadAtLeast(resp.Body, b, 1)
	return resp.StatusCode, string(b[:n])
}

// TestHostileHostRefused: a page whose name its attacker re-points at the
// feed's address (DNS rebinding) sends that name as Host; the feed answers
// 421 before it asks the Authorizer, whatever the method. Loopback,
// localhost names and Config.AllowedHosts are served.
func TestHostileHostRefused(t *testing.T) {
	t.Parallel()
	var asked atomic.Int32
	e := newEnv(t, live.Config{AllowedHosts: []string{"app.example.com"}, Authorize: func(r *http.Request) (string, error) {
		asked.Add(1)
		return headerAuth(r)
	}}, false)
	_, port, _ := strings.Cut(strings.TrimPrefix(e.srv.URL, "http://"), ":")
	for _, host := range []string{"rebind.evil.example:" + port, "rebind.evil.example", "app.example.com.evil.example"} {
		for _, method := range []string{http.MethodGet, http.MethodHead, http.MethodPost} {
			code, body := hostGet(t, e, host, method)
			if code != http.StatusMisdirectedRequest {
				t.Errorf("%s with Host %s: %d, want 421 (%.100q)", method, host, code, body)
			}
		}
	}
	if n := asked.Load(); n != 0 {
		t.Errorf("the Authorizer was asked %d times for hostile hosts", n)
	}
	for _, host := range []string{e.srv.Listener.Addr().String(), "localhost:" + port, "app.example.com"} {
		if code, body := hostGet(t, e, host, http.MethodGet); code != http.StatusOK {
			t.Errorf("GET with Host %s: %d, want 200 (%.100q)", host, code, body)
		}
	}
	if _, err := live.New(live.Config{Store: e.store, AllowedHosts: []string{"app.example.com:443"}}); !errors.Is(err, live.ErrInvalidConfig) {
		t.Errorf("AllowedHosts with a port: %v, want ErrInvalidConfig", err)
	}
}
