package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/console"
	"github.com/projectorhq/projector/internal/browsertest"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// EnvScreenshot names a file the browser test writes the console's
// screenshot to (docs/img/console.png is made so).
const EnvScreenshot = "PROJECTOR_CONSOLE_SCREENSHOT"

// browser is one headless Chromium with a fresh profile, closed when the
// test ends; a failing test leaves a screenshot in an artifacts directory
// named in its log.
type browser struct {
	t   *testing.T
	ctx context.Context
}

func newBrowser(t *testing.T, width, height int) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browsertest.Chromium(t)),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true), chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(width, height),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	b := &browser{t: t, ctx: ctx}
	// The first run starts the browser; its context must carry no timeout.
	if err := chromedp.Do(ctx); err != nil {
		cancel()
		cancelAlloc()
		t.Fatalf("start chromium: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			b.screenshot(artifact(t, "failure.png"))
		}
		cancel()
		cancelAlloc()
	})
	return b
}

// artifact returns a path for a file a failing test leaves behind, in a
// directory that outlives the test ($PROJECTOR_ARTIFACTS or a temporary
// one), and logs it.
func artifact(t *testing.T, name string) string {
	dir := os.Getenv("PROJECTOR_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "projector-console-artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Logf("artifacts: %v", err)
	}
	p := filepath.Join(dir, regexp.MustCompile(`[^A-Za-z0-9_.-]+`).ReplaceAllString(t.Name(), "_")+"-"+name)
	t.Logf("artifact: %s", p)
	return p
}

// screenshot saves the page as PNG at path.
func (b *browser) screenshot(path string) {
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Logf("screenshot: %v", err)
		return
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Logf("screenshot: %v", err)
	}
}

// do runs steps with a timeout, failing the test with what it was doing.
func (b *browser) do(what string, timeout time.Duration, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, timeout)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.t.Fatalf("browser: %s: %v", what, err)
	}
}

// eval evaluates a JavaScript expression on the page.
func eval[T any](b *browser, expr string, opts ...chromedp.EvaluateOption) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, opts...))
	if err != nil {
		b.t.Fatalf("browser: evaluate %s: %v", expr, err)
	}
	return v
}

// row is the selector of the consumer's row in a given display state.
func row(state string) chromedp.CSS {
	return chromedp.CSS(fmt.Sprintf(`tr.shard[data-consumer="tickets"][data-state=%q]`, state))
}

// The console loads and shows a consumer going from processing to idle
// while events are appended, without a reload; on a narrow window its
// tables turn into cards.
func TestBrowserConsumerGoesFromProcessingToIdle(t *testing.T) {
	e := newEnv(t, options{batchSize: 2})
	e.slow.Store(true)
	e.dispatch()
	b := newBrowser(t, 1280, 900)
	b.do("load the console", time.Minute, chromedp.Navigate(e.srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#consumers")))
	if n := eval[int](b, `document.querySelectorAll("form.act").length`); n != 0 {
		t.Errorf("read-only console shows %d action forms", n)
	}
	if !strings.Contains(eval[string](b, `document.getElementById("readonly").textContent`), "read-only") {
		t.Error("read-only console does not say so")
	}
	b.do("consumer registered idle", time.Minute, chromedp.WaitVisible(row("idle")))
	e.appendEvents("busy", 150)
	b.do("consumer shown processing", time.Minute, chromedp.WaitVisible(row("processing")))
	if got := eval[string](b, `getComputedStyle(document.querySelector('tr.shard[data-consumer="tickets"] .pill')).backgroundColor`); got != "rgb(229, 239, 255)" {
		t.Errorf("processing pill colour %s, want the blue of processing", got)
	}
	b.do("consumer shown idle", 60*time.Second, chromedp.WaitVisible(row("idle")))
	if got := eval[string](b, `document.querySelector('tr.shard td[data-label="Processed"]').textContent`); got != "150" {
		t.Errorf("processed shown %q after catching up, want 150", got)
	}
	// A narrow window: the header row goes, each cell carries its label.
	b.do("narrow window", 10*time.Second, chromedp.EmulateViewport(380, 800))
	if got := eval[string](b, `getComputedStyle(document.querySelector('#consumers thead')).display`); got != "none" {
		t.Errorf("narrow window: table header display %q, want none", got)
	}
	if w := eval[float64](b, `document.documentElement.scrollWidth`); w > 400 {
		t.Errorf("narrow window: the page is %v px wide in a 380 px window", w)
	}
}

// A dead consumer turns red, and an operator signed in with the token
// restarts it from the page; it comes back.
func TestBrowserRestartDeadConsumer(t *testing.T) {
	e := newEnv(t, options{token: testToken, mailer: true, tail: true})
	e.dispatch()
	e.appendEvents("ok", 3)
	e.appendEvents("bad-7", 1)
	pgtest.Eventually(t, time.Minute, "first events applied", func() bool { return e.status().Processed == 4 })
	e.dead()
	b := newBrowser(t, 1280, 900)
	b.do("sign in", 30*time.Second,
		chromedp.Navigate(e.srv.URL+"/login"),
		chromedp.SendKeys(chromedp.CSS(`input[name="name"]`), "erin"),
		chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), testToken),
		chromedp.Click(chromedp.ID("login")),
		chromedp.WaitVisible(chromedp.ID("operator")),
	)
	b.do("dead consumer and dead letter shown", time.Minute, chromedp.WaitVisible(row("dead")), chromedp.WaitVisible(chromedp.CSS("tr[data-dead-letter]")))
	if got := eval[string](b, `getComputedStyle(document.querySelector('tr.shard[data-consumer="tickets"] .pill')).backgroundColor`); got != "rgb(198, 40, 40)" {
		t.Errorf("dead pill colour %s, want red", got)
	}
	// Events arriving show in the live tail.
	b.do("tail connected", time.Minute, chromedp.WaitVisible(chromedp.CSS(`#tail-state[data-state="live"]`)))
	e.appendEvents("tail-1", 3)
	pgtest.Eventually(t, time.Minute, "events in the live tail", func() bool {
		return eval[int](b, `document.querySelectorAll("#tail li .pos").length`) == 3
	})
	if p := os.Getenv(EnvScreenshot); p != "" {
		b.screenshot(p)
		t.Logf("screenshot written to %s", p)
	}
	e.fail.Store(false)
	// The page asks before acting; the test says yes.
	_ = eval[bool](b, `window.confirm = () => true, true`)
	b.do("click restart", 10*time.Second, chromedp.Click(chromedp.CSS(`tr.shard[data-consumer="tickets"] button[data-op="restart"]`)))
	b.do("consumer back to idle", time.Minute, chromedp.WaitVisible(row("idle")))
	b.do("result shown", 10*time.Second, chromedp.WaitVisible(chromedp.CSS("#toast div")))
	if msg := eval[string](b, `document.querySelector('#toast div').textContent`); !strings.Contains(msg, "restart tickets: now") {
		t.Errorf("toast after restart: %q", msg)
	}
	if st := e.status(); st.Status != projection.StatusIdle {
		t.Errorf("after restart from the page: %s", st.Status)
	}
	if !strings.Contains(e.logs.String(), `"who":"erin"`) {
		t.Error("the restart is not logged with the operator's name")
	}
}

// Without the token the buttons are absent and a forged POST from the
// page is refused; with it, a page of another origin (same site, another
// port) that posts the restart form for a signed-in operator is refused
// too, and nothing changes.
func TestBrowserForgedPostsRefused(t *testing.T) {
	t.Run("read-only", func(t *testing.T) {
		e := newEnv(t, options{})
		e.dispatch()
		e.dead()
		b := newBrowser(t, 1280, 900)
		b.do("load", time.Minute, chromedp.Navigate(e.srv.URL+"/"), chromedp.WaitVisible(row("dead")))
		if n := eval[int](b, `document.querySelectorAll("button[data-op]").length`); n != 0 {
			t.Errorf("%d action buttons on a read-only console", n)
		}
		code := eval[int](b, `fetch("/actions/consumer/restart", {method: "POST", headers: {"Content-Type": "application/x-www-form-urlencoded"}, body: "consumer=tickets"}).then(r => r.status)`, chromedp.EvalAwaitPromise)
		if code != http.StatusForbidden {
			t.Errorf("forged POST from the page: %d, want 403", code)
		}
		if st := e.status(); st.Status != projection.StatusDead {
			t.Errorf("forged POST changed the shard: %s", st.Status)
		}
	})
	t.Run("cross-origin", func(t *testing.T) {
		e := newEnv(t, options{token: testToken})
		e.dispatch()
		e.dead()
		evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			fmt.Fprintf(w, `<form id="f" method="post" action="%s/actions/consumer/restart"><input name="consumer" value="tickets"></form>
				<script>document.getElementById("f").submit()</script>`, e.srv.URL)
		}))
		t.Cleanup(evil.Close)
		b := newBrowser(t, 1280, 900)
		b.do("sign in", 30*time.Second,
			chromedp.Navigate(e.srv.URL+"/login"),
			chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), testToken),
			chromedp.Click(chromedp.ID("login")),
			chromedp.WaitVisible(chromedp.ID("operator")),
		)
		b.do("visit the other origin", time.Minute, chromedp.Navigate(evil.URL+"/"), chromedp.WaitVisible(chromedp.CSS("body")))
		pgtest.Eventually(t, 10*time.Second, "forged form posted and refused", func() bool {
			return strings.Contains(e.logs.String(), `"status":403`)
		})
		if st := e.status(); st.Status != projection.StatusDead {
			t.Errorf("a cross-origin form restarted the shard: %s", st.Status)
		}
	})
}

// An operator finds the sagas from the navigation: the saga list with its
// overdue timeout, the saga's instances (filtered from the form), and the
// instance whose reminder is overdue; its state, escaped, is text on the
// page and never markup; on a narrow window the lists turn into cards.
func TestBrowserSagaPages(t *testing.T) {
	e := newEnv(t, options{showPayloads: true, extra: func(cfg *console.Config) { cfg.Sagas = []string{"sla"} }})
	sagaFixture(e)
	b := newBrowser(t, 1280, 900)
	b.do("load the console", time.Minute, chromedp.Navigate(e.srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#consumers")))
	b.do("open the saga list", 30*time.Second, chromedp.Click(chromedp.ID("nav-sagas")),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-saga="sla"]`)))
	if got := eval[string](b, `document.querySelector('tr[data-saga="sla"] td[data-label="Overdue timeouts"] .pill').textContent`); got != "1" {
		t.Errorf("overdue timeouts shown %q, want 1", got)
	}
	b.do("open the saga", 30*time.Second, chromedp.Click(chromedp.CSS(`tr[data-saga="sla"] a.saga-link`)),
		chromedp.WaitVisible(chromedp.CSS("#saga-instances tr[data-instance]")))
	if n := eval[int](b, `document.querySelectorAll("#saga-instances tr[data-instance]").length`); n != 5 {
		t.Errorf("%d instances shown, want 5", n)
	}
	b.do("filter failed", 30*time.Second, chromedp.SetValue(chromedp.CSS(`select[name="status"]`), "failed"),
		chromedp.Submit(chromedp.CSS("form.filters")), chromedp.WaitNotPresent(chromedp.CSS(`tr[data-key="overdue"]`)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-key="flaky"]`)))
	if got := eval[string](b, `location.search`); !strings.Contains(got, "status=failed") {
		t.Errorf("the filter form sent %q, want status=failed", got)
	}
	if n := eval[int](b, `document.querySelectorAll("#saga-instances tr[data-instance]").length`); n != 1 {
		t.Errorf("failed filter shows %d instances, want flaky alone", n)
	}
	b.do("all instances again", 30*time.Second, chromedp.Navigate(e.srv.URL+"/sagas/sla"), chromedp.WaitVisible(chromedp.CSS(`tr[data-key="overdue"]`)))
	b.do("open the overdue instance", 30*time.Second, chromedp.Click(chromedp.CSS(`tr[data-key="overdue"] a`)),
		chromedp.WaitVisible(chromedp.CSS(`#saga-timeouts tr[data-timeout="remind"][data-overdue="true"]`)))
	b.do("open the acme instance", 30*time.Second, chromedp.Navigate(e.srv.URL+"/sagas/sla?tenant=acme"),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-key="t-acme"] a`)), chromedp.Click(chromedp.CSS(`tr[data-key="t-acme"] a`)),
		chromedp.WaitVisible(chromedp.ID("state")))
	if got := eval[string](b, `document.getElementById("state").textContent`); !strings.Contains(got, scriptTitle[:8]) {
		t.Errorf("state shown as %q, want the title's text with its <script>", got)
	}
	if n := eval[int](b, `document.querySelectorAll("#state *, main script").length`); n != 0 {
		t.Errorf("the state became %d elements in the page", n)
	}
	b.do("narrow window", 30*time.Second, chromedp.EmulateViewport(380, 800), chromedp.Navigate(e.srv.URL+"/sagas/sla"),
		chromedp.WaitVisible(chromedp.CSS("#saga-instances tr[data-instance]")))
	if w := eval[float64](b, `document.documentElement.scrollWidth`); w > 400 {
		t.Errorf("narrow window: the saga page is %v px wide in a 380 px window", w)
	}
}

// The Log panel shows the hot and archived estimates in a real browser.
func TestBrowserLogSizes(t *testing.T) {
	e := newEnv(t, options{})
	e.appendEvents("old", 3)
	e.appendEvents("new", 2)
	if res, err := e.store.Archive(e.ctx, postgres.ArchiveOptions{Streams: []projector.StreamRef{projector.Stream("ticket", "old")}}); err != nil || res.Events != 3 {
		t.Fatalf("archive: %+v, %v", res, err)
	}
	for _, table := range []string{"projector_events", "projector_events_archive"} {
		if _, err := e.store.Pool().Exec(e.ctx, `ANALYZE `+e.store.Table(table)); err != nil {
			t.Fatal(err)
		}
	}
	b := newBrowser(t, 1280, 900)
	b.do("load the console", time.Minute, chromedp.Navigate(e.srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#log")))
	if got := eval[string](b, `document.querySelector("#log p").textContent`); !strings.Contains(got, "about 2 events hot, about 3 archived") {
		t.Errorf("the Log panel reads %q", got)
	}
}
