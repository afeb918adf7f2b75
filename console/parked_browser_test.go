package console_test

import (
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
)

// amber is --failing, the colour of a shard that is not all well.
const amber = "rgb(168, 93, 0)"

// An idle consumer with parked streams is not shown as a plain green row:
// the summary counts its parks in an amber tile, and its row carries an
// amber edge and a "2 parked" pill linking to the parked streams; both go
// once the parks are discarded.
func TestBrowserDashboardShowsParks(t *testing.T) {
	e := newEnv(t, options{park: true})
	e.dispatch()
	e.fail.Store(true)
	e.appendEvents("p", 2)
	e.appendEvents("q", 2)
	var parks []projection.Park
	pgtest.Eventually(t, time.Minute, "two streams parked", func() bool {
		var err error
		parks, err = projection.ListParks(e.ctx, e.store, projection.ParkFilter{Status: projection.ParkOpen})
		return err == nil && len(parks) == 2
	})
	e.waitStatus(projection.StatusIdle)
	b := newBrowser(t, 1280, 900)
	b.do("load the console", time.Minute, chromedp.Navigate(e.srv.URL+"/"),
		chromedp.WaitVisible(chromedp.CSS(`tr.shard[data-consumer="tickets"][data-state="idle"][data-parked="2"]`)))

	tile := func(label string) string {
		return eval[string](b, `(() => { const t = [...document.querySelectorAll(".tile")].find(t => t.querySelector("span").textContent === "`+label+`");
			return t ? t.querySelector("b").textContent + "|" + getComputedStyle(t).borderLeftColor : "missing" })()`)
	}
	if got := tile("parked streams"); got != "2|"+amber {
		t.Errorf("the parked streams tile: %s, want 2 in amber", got)
	}
	pill := eval[string](b, `(() => { const p = document.querySelector('tr.shard[data-consumer="tickets"] a.pill.parked');
		return p ? p.textContent + "|" + p.getAttribute("href") + "|" + getComputedStyle(p).color : "missing" })()`)
	if pill != "2 parked|/parked|"+amber {
		t.Errorf("the row's parks pill: %s, want \"2 parked\" linking to /parked, in amber", pill)
	}
	if got := eval[string](b, `getComputedStyle(document.querySelector('tr.shard[data-consumer="tickets"] td')).boxShadow`); !strings.Contains(got, amber) {
		t.Errorf("the row's edge: %q, want amber while streams are parked", got)
	}

	for _, pk := range parks {
		if _, err := projection.DiscardPark(e.ctx, e.store, pk.ID, "ann"); err != nil {
			t.Fatal(err)
		}
	}
	b.do("the parks gone from the row", time.Minute,
		chromedp.WaitVisible(chromedp.CSS(`tr.shard[data-consumer="tickets"][data-state="idle"][data-parked="0"]`)))
	if got := tile("parked streams"); !strings.HasPrefix(got, "0|") || strings.Contains(got, amber) {
		t.Errorf("the parked streams tile with none: %s, want 0, not amber", got)
	}
	if n := eval[int](b, `document.querySelectorAll("a.pill.parked").length`); n != 0 {
		t.Errorf("%d parks pills with no parks", n)
	}
	if got := eval[string](b, `getComputedStyle(document.querySelector('tr.shard[data-consumer="tickets"] td')).boxShadow`); strings.Contains(got, amber) {
		t.Errorf("the row's edge: %q, want the idle green once no stream is parked", got)
	}
}
