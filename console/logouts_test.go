package console_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/projectorhq/projector/console"
	"github.com/projectorhq/projector/projection"
)

// A logout through one console process ends the session in every other
// process over the same schema (projector_console_logouts, migration 31):
// a copy of the cookie signs in at neither. Each process used to keep its
// logouts in memory, so another process behind the same address accepted
// the session until it expired (the test fails so: olga still signed in at
// the second console).
func TestLogoutEndsTheSessionInEveryConsoleProcess(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{token: testToken})
	other, err := console.New(console.Config{Store: e.store, Token: testToken, Projections: []*projection.Async{e.proj},
		Logger: slog.New(slog.NewJSONHandler(io.MultiWriter(e.logs, tLog{t}), nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv2 := httptest.NewServer(other)
	t.Cleanup(srv2.Close)

	c := e.client()
	csrf := c.login("olga")
	u, _ := url.Parse(e.srv.URL + "/")
	var cookie string
	for _, ck := range c.hc.Jar.Cookies(u) {
		if ck.Name == console.CookieName {
			cookie = ck.Value
		}
	}
	if cookie == "" {
		t.Fatal("no session cookie after login")
	}
	signedIn := func() bool {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, srv2.URL+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.AddCookie(&http.Cookie{Name: console.CookieName, Value: cookie})
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Contains(string(b), `signed in as <b id="operator">olga</b>`)
	}
	if !signedIn() {
		t.Fatal("the session does not sign in at the second console before the logout")
	}
	if code, _ := c.do(http.MethodPost, "/logout", url.Values{"csrf": {csrf}}, nil); code != http.StatusSeeOther {
		t.Fatalf("logout: %d", code)
	}
	if signedIn() {
		t.Error("a session logged out through one console still signs in at another")
	}
}
