package console_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/projectorhq/projector/console"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
)

// EnvShots names a directory the polish test saves its screenshots in, to
// be looked at.
const EnvShots = "PROJECTOR_CONSOLE_SHOTS"

// shot saves the page as name.png in $PROJECTOR_CONSOLE_SHOTS, if set.
func (b *browser) shot(name string) {
	if dir := os.Getenv(EnvShots); dir != "" {
		b.screenshot(filepath.Join(dir, name+".png"))
	}
}

const red = "rgb(198, 40, 40)"

// What an operator sees must say what is true, at a glance: a tile that
// counts nothing is not red, a discarded dead letter does not look
// resolved and a resolved one shows no red error, the dashboard lists the
// saga instances that need attention (not every completed one) with a
// link to the rest, every page names the schema, the live tail's badge
// says "live" only once it is, and one rebuild is one tile.
func TestBrowserPolish(t *testing.T) {
	var blockTail atomic.Bool
	release := make(chan struct{})
	e := newEnv(t, options{token: testToken, mailer: true, tail: true, tailSpy: func(r *http.Request) {
		if blockTail.Load() {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
	}, extra: func(cfg *console.Config) { cfg.Sagas = []string{"sla"} }})
	stop := e.dispatch()
	e.appendEvents("ok", 3)
	pgtest.Eventually(t, time.Minute, "first events applied", func() bool { return e.status().Processed == 3 })
	b := newBrowser(t, 1280, 900)
	b.do("load the console", time.Minute, chromedp.Navigate(e.srv.URL+"/"), chromedp.WaitVisible(row("idle")))

	t.Log("a tile that counts nothing is not red")
	tile := func(label, prop string) string {
		return eval[string](b, `(() => { const t = [...document.querySelectorAll(".tile")].find(t => t.querySelector("span").textContent === "`+label+`");
			return t ? getComputedStyle(t).`+prop+` + "|" + getComputedStyle(t.querySelector("b")).color + "|" + t.querySelector("b").textContent : "missing" })()`)
	}
	if got := tile("dead", "borderLeftColor"); got == "missing" || strings.Contains(got, red) {
		t.Errorf("the dead tile with nothing dead: %s, want no red", got)
	}
	b.shot("dashboard-calm")

	t.Log("dead letters: open, discarded, resolved")
	for _, id := range []string{"bad-1", "bad-2", "bad-3"} {
		e.appendEvents(id, 1)
	}
	var dls []projection.DeadLetter
	pgtest.Eventually(t, time.Minute, "three open dead letters", func() bool {
		var err error
		dls, err = projection.ListDeadLetters(e.ctx, e.store, projection.DeadLetterFilter{Status: projection.DeadLetterOpen})
		return err == nil && len(dls) == 3
	})
	if err := projection.DiscardDeadLetters(e.ctx, e.store, []int64{dls[0].ID}); err != nil {
		t.Fatal(err)
	}
	e.healed.Store(true)
	if err := projection.RequestDeadLetterRetry(e.ctx, e.store, []int64{dls[1].ID}); err != nil {
		t.Fatal(err)
	}
	pgtest.Eventually(t, time.Minute, "the retried dead letter resolved", func() bool {
		r, err := projection.ListDeadLetters(e.ctx, e.store, projection.DeadLetterFilter{Status: projection.DeadLetterResolved})
		return err == nil && len(r) == 1
	})
	b.do("all dead letters", 30*time.Second, chromedp.Navigate(e.srv.URL+"/dead-letters?status=all"),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-status="resolved"]`)))
	dl := func(status, what string) string {
		return eval[string](b, `(() => { const r = document.querySelector('tr[data-status="`+status+`"]');
			const p = r.querySelector(".pill"); const e = r.querySelector('td[data-label="Error"]');
			return "`+what+`" === "pill" ? (p ? getComputedStyle(p).backgroundColor + "|" + getComputedStyle(p).color : "none") : getComputedStyle(e).color })()`)
	}
	if res, dis := dl("resolved", "pill"), dl("discarded", "pill"); res == dis {
		t.Errorf("resolved and discarded dead letters carry the same badge (%s)", res)
	}
	if got := dl("resolved", "error"); got == red {
		t.Errorf("a resolved dead letter's error is red (%s)", got)
	}
	if got := dl("open", "error"); got != red {
		t.Errorf("an open dead letter's error is %s, want red", got)
	}
	b.shot("dead-letters-all")
	b.do("the discarded one", 30*time.Second, chromedp.Navigate(e.srv.URL+"/dead-letters/"+itoa(dls[0].ID)), chromedp.WaitVisible(chromedp.ID("dead-letter")))
	discarded := eval[string](b, `getComputedStyle(document.querySelector("#dead-letter h2 .pill")).backgroundColor`)
	b.do("the resolved one", 30*time.Second, chromedp.Navigate(e.srv.URL+"/dead-letters/"+itoa(dls[1].ID)), chromedp.WaitVisible(chromedp.ID("dead-letter")))
	if resolved := eval[string](b, `getComputedStyle(document.querySelector("#dead-letter h2 .pill")).backgroundColor`); resolved == discarded {
		t.Errorf("the dead-letter pages show resolved and discarded alike (%s)", resolved)
	}

	t.Log("every page names the schema")
	for _, path := range []string{"/", "/dead-letters", "/dead-letters/" + itoa(dls[1].ID), "/sagas", "/sagas/sla", "/login"} {
		b.do("open "+path, 30*time.Second, chromedp.Navigate(e.srv.URL+path), chromedp.WaitVisible(chromedp.CSS("header.top")))
		if got := eval[string](b, `(document.querySelector("header .schema") || {}).textContent || ""`); got != e.store.Schema() {
			t.Errorf("%s: schema badge %q, want %q", path, got, e.store.Schema())
		}
	}

	t.Log("sagas: the dashboard lists what needs attention")
	sagaFixture(e)
	// The dashboard reads the state at most every MinReadInterval: the
	// read before the fixture may still be served, so load it again until
	// the instances show (or the deadline says they never do).
	var keys []string
	for deadline := time.Now().Add(30 * time.Second); ; {
		b.do("dashboard with sagas", time.Minute, chromedp.Navigate(e.srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#sagas")))
		keys = eval[[]string](b, `[...document.querySelectorAll("#sagas tr[data-key]")].map(r => r.dataset.key).sort()`)
		if len(keys) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(console.MinReadInterval) // the cache's age, not a synchronisation
	}
	if strings.Join(keys, ",") != "flaky,overdue,t-acme,waiting" {
		t.Errorf("dashboard saga rows %v, want the active and failed ones: flaky, overdue, t-acme, waiting", keys)
	}
	if n := eval[int](b, `document.querySelectorAll('#sagas a[href$="/sagas/sla?status=completed"]').length`); n != 1 {
		t.Errorf("no link from the dashboard to the completed instances (%d)", n)
	}
	if got := eval[string](b, `(document.querySelector('#sagas tr[data-key="overdue"] .pill.overdue') || {}).textContent || ""`); got != "overdue" {
		t.Errorf("the overdue instance is not marked overdue on the dashboard: %q", got)
	}
	b.shot("dashboard-sagas")

	t.Log("the live tail's badge")
	b.do("tail connected", time.Minute, chromedp.WaitVisible(chromedp.CSS(`#tail-state[data-state="live"]`)))
	blockTail.Store(true)
	_ = eval[bool](b, `(() => { const i = document.getElementById("tail-tenant"); i.value = "acme"; i.dispatchEvent(new Event("change")); return true })()`)
	if got := eval[string](b, `document.getElementById("tail-state").textContent`); got == "live" {
		t.Errorf("the tail badge reads %q while its new connection is still pending", got)
	}
	b.shot("tail-connecting")
	blockTail.Store(false)
	close(release)
	b.do("tail connected again", time.Minute, chromedp.WaitVisible(chromedp.CSS(`#tail-state[data-state="live"]`)))

	t.Log("one rebuild, one tile")
	stop() // no dispatcher runs the shadow shard: the rebuild stays in progress
	if _, err := rebuild.Request(e.ctx, e.store, "tickets", rebuild.Options{}); err != nil {
		t.Fatal(err)
	}
	b.do("rebuild shown", time.Minute, chromedp.Navigate(e.srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("[data-rebuild]")))
	tiles := eval[[]string](b, `[...document.querySelectorAll(".tile")].map(t => t.querySelector("b").textContent + " " + t.querySelector("span").textContent)`)
	n := 0
	for _, t := range tiles {
		if strings.Contains(t, "rebuil") {
			n++
		}
	}
	if n != 1 || !strings.Contains(strings.Join(tiles, ","), "1 rebuild") {
		t.Errorf("tiles %q: want one tile for the one rebuild", tiles)
	}
	b.shot("dashboard-rebuild")
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
