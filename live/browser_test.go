package live_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/browsertest"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/live"
)

// page is what an application serves: a plain EventSource that records the
// id of every event it receives.
const page = `<!doctype html><meta charset="utf-8"><title>live</title>
<script>
window.got = [];
window.errors = 0;
window.es = new EventSource("/live"); const es = window.es;
es.addEventListener("ticket.commented", (e) => { window.got.push(e.lastEventId); });
es.addEventListener("reset", () => { window.got.push("reset"); });
es.onerror = () => { window.errors++; };
</script>`

// quickRetry tells the browser to reconnect after 200 ms instead of the
// feed's 2 s: the reconnection delay is idle time in
// TestPromise15_BrowserReconnectsWithoutGaps (five cuts, 10 s of it), and
// at 200 ms the writer still commits dozens of events while the browser is
// away. The browser still reconnects by itself, with Last-Event-ID.
type quickRetry struct{ http.ResponseWriter }

var retryField = regexp.MustCompile(`(?m)^retry: \d+$`)

func (w quickRetry) Write(b []byte) (int, error) {
	if !retryField.Match(b) {
		return w.ResponseWriter.Write(b)
	}
	if _, err := w.ResponseWriter.Write(retryField.ReplaceAll(b, []byte("retry: 200"))); err != nil {
		return 0, err
	}
	return len(b), nil
}

// Unwrap lets the feed's http.ResponseController reach the connection
// (flushes, write deadlines).
func (w quickRetry) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// TestPromise15_BrowserReconnectsWithoutGaps: a page in real headless
// Chromium receives events through EventSource while a writer appends and
// its connections are cut five times mid-stream; the browser reconnects by itself with
// Last-Event-ID, and the page ends with exactly the committed events of its
// tenant, in order.
func TestPromise15_BrowserReconnectsWithoutGaps(t *testing.T) {
	t.Parallel()
	bin := browsertest.Chromium(t)
	e := newEnv(t, live.Config{Authorize: func(*http.Request) (string, error) { return "a", nil }, EventTypes: []string{"ticket.commented"}}, false)
	var resumed atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, page)
	})
	mux.Handle("GET /live", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Last-Event-ID") != "" {
			resumed.Add(1)
		}
		e.feed.ServeHTTP(quickRetry{w}, r)
	}))
	srv := httptest.NewServer(mux)
	t.Cleanup(func() { e.feed.Close(); srv.Close() })

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(bin), chromedp.NoSandbox, chromedp.Headless)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	ctx, cancel := context.WithTimeout(bctx, 2*time.Minute)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatal(err)
	}
	pgtest.Eventually(t, wait, "the page's stream to go live", func() bool { return e.feed.Clients() == 1 })

	count := func() int {
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`window.got.length`))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// A writer appends all along, so events commit while the browser is
	// disconnected, while it catches up and while it hands over to the
	// fan-out.
	stop := make(chan struct{})
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			e.append("a", fmt.Sprint("s", i%3), testevents.TicketCommented{Body: "x", N: i})
			e.append("b", "other", testevents.TicketCommented{Body: "not yours"})
		}
	}()
	for round := range 5 {
		// Cut the stream once the page has more events, while more are on
		// their way.
		seen := count()
		pgtest.Eventually(t, wait, "the page to receive events", func() bool { return count() > seen+5 })
		before := resumed.Load()
		srv.CloseClientConnections()
		pgtest.Eventually(t, wait, fmt.Sprintf("the browser to reconnect with Last-Event-ID (round %d)", round), func() bool {
			return resumed.Load() > before
		})
	}
	close(stop)
	<-writerDone
	want := e.logIDs("a", nil, projector.Start)
	pgtest.Eventually(t, wait, "the page to receive every event", func() bool { return count() >= len(want) })
	got, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`window.got`))
	if err != nil {
		t.Fatal(err)
	}
	sameIDs(t, fmt.Sprintf("the page after %d reconnects", resumed.Load()), got, want)
	if strings.Contains(strings.Join(got, " "), "reset") {
		t.Fatal("the page was reset")
	}
}
