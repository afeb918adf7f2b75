package live_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/live"
)

// Config.MaxClients bounds the streams served at once: one more is
// answered 503 with Retry-After (an HTTP audit opened 3,000 idle streams,
// all served, each a file descriptor), and a stream that ends frees its
// place. Out of range is ErrInvalidConfig.
func TestMaxClients(t *testing.T) {
	t.Parallel()
	e := newEnv(t, live.Config{MaxClients: 2, Heartbeat: live.MinHeartbeat}, false)
	first, second := e.connect("acme", "", ""), e.connect("acme", "", "")
	for _, s := range []*sse{first, second} {
		if s.status != http.StatusOK {
			t.Fatalf("a stream within MaxClients: %d %s", s.status, s.body)
		}
	}
	pgtest.Eventually(t, wait, "two live clients", func() bool { return e.feed.Clients() == 2 })
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, e.srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(tenantHeader, "acme")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a stream over MaxClients: %d, Retry-After %q; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	first.close()
	pgtest.Eventually(t, wait, "the closed stream's place freed", func() bool { return e.feed.Clients() == 1 })
	if third := e.connect("acme", "", ""); third.status != http.StatusOK {
		t.Fatalf("a stream after one ended: %d %s; want its place", third.status, third.body)
	}
	for _, n := range []int{-1, live.MaxMaxClients + 1} {
		if _, err := live.New(live.Config{Store: e.store, MaxClients: n}); !errors.Is(err, live.ErrInvalidConfig) || !strings.Contains(err.Error(), "MaxClients") {
			t.Errorf("MaxClients %d: %v; want ErrInvalidConfig", n, err)
		}
	}
}
