package console

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// The rate is measured over a second or more, unknown until then, starts
// over when a counter goes back (a restarted or rewound shard), and
// forgets shards that are gone.
func TestRateTracker(t *testing.T) {
	var rt rateTracker
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	if r := rt.observe(t0, map[string]int64{"a": 100}); len(r) != 0 {
		t.Fatalf("rate after one read: %v", r)
	}
	if r := rt.observe(t0.Add(500*time.Millisecond), map[string]int64{"a": 150}); len(r) != 0 {
		t.Fatalf("rate after half a second: %v", r)
	}
	r := rt.observe(t0.Add(2*time.Second), map[string]int64{"a": 300, "b": 5})
	if r["a"] != 100 {
		t.Errorf("rate of a: %v, want 100/s", r["a"])
	}
	if _, ok := r["b"]; ok {
		t.Error("rate of b known after one read")
	}
	if r := rt.observe(t0.Add(3*time.Second), map[string]int64{"a": 10}); len(r) != 0 {
		t.Errorf("rate after the counter went back: %v", r)
	}
	if _, ok := rt.samples["b"]; ok {
		t.Error("b still tracked after it was gone")
	}
}

// base is the mount path as the browser sees it.
func TestBase(t *testing.T) {
	for _, c := range []struct{ uri, path, want string }{
		{"/console/", "/", "/console"},
		{"/console/dead-letters/4?x=1", "/dead-letters/4", "/console"},
		{"/", "/", ""},
		{"/fragment", "/fragment", ""},
	} {
		r := httptestRequest(c.uri, c.path)
		if got := base(r); got != c.want {
			t.Errorf("base(%s, %s) = %q, want %q", c.uri, c.path, got, c.want)
		}
	}
}

func httptestRequest(uri, path string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, uri, nil)
	r.URL.Path = path
	return r
}
