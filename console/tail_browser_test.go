package console_test

import (
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
)

// The live tail: a page using the live feed receives events, is
// disconnected (the server drops every connection) while events are
// appended, reconnects with Last-Event-ID by itself, and ends with exactly
// the committed events, in log order, none twice (promise 15 in a real
// browser).
func TestBrowserLiveTailResumesAfterDisconnect(t *testing.T) {
	var mu sync.Mutex
	var lastIDs []string // the Last-Event-ID of each request to the tail
	e := newEnv(t, options{tail: true, tailSpy: func(r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		lastIDs = append(lastIDs, r.Header.Get("Last-Event-ID"))
	}})
	e.dispatch()
	b := newBrowser(t, 1280, 900)
	b.do("load the console", time.Minute, chromedp.Navigate(e.srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#tail-panel")))
	b.do("tail connected", time.Minute, chromedp.WaitVisible(chromedp.CSS(`#tail-state[data-state="live"]`)))
	received := func() []string {
		ids := eval[[]string](b, `Array.from(document.querySelectorAll("#tail li:not(.note) .pos")).map(e => e.textContent).reverse()`)
		return ids
	}
	var committed []projector.Event
	for i := range 5 {
		committed = append(committed, e.appendEvents("t-"+string(rune('a'+i)), 2)...)
	}
	pgtest.Eventually(t, time.Minute, "first events on the page", func() bool { return len(received()) == len(committed) })

	// Drop every connection, and append while the page is away.
	e.srv.CloseClientConnections()
	for i := range 5 {
		committed = append(committed, e.appendEvents("u-"+string(rune('a'+i)), 3)...)
	}
	pgtest.Eventually(t, 60*time.Second, "every committed event on the page after the reconnect", func() bool { return len(received()) >= len(committed) })
	// A few more once it is live again.
	committed = append(committed, e.appendEvents("v", 4)...)
	pgtest.Eventually(t, time.Minute, "the last events on the page", func() bool { return len(received()) >= len(committed) })

	slices.SortFunc(committed, func(a, b projector.Event) int {
		if a.Position.Less(b.Position) {
			return -1
		}
		return 1
	})
	want := make([]string, len(committed))
	for i, ev := range committed {
		want[i] = ev.Position.String()
	}
	if got := received(); !slices.Equal(got, want) {
		t.Fatalf("the page received\n%s\nwant the committed events in log order\n%s", strings.Join(got, " "), strings.Join(want, " "))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(lastIDs) < 2 || lastIDs[0] != "" || lastIDs[1] != want[9] {
		t.Errorf("tail requests' Last-Event-ID: %q; want none, then %s (the last event before the disconnect)", lastIDs, want[9])
	}
}
