package console_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// What an HTTP audit found, each answered as the console's rules say: a
// bad parameter's echo is cut (a 300,000-character status made a 1.2 MB
// page), a form over 8 KiB is 413 (it was read as empty: "no consumer",
// or a refused login), a bearer scheme in any case is the bearer scheme,
// the static files are the two by name (no listing, no redirect out of the
// mount, no 500 for a path that is not UTF-8), and a read-only console
// refuses every POST, logout included.
func TestHostileRequests(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{token: testToken})
	c := e.client()
	code, body := c.do(http.MethodGet, "/dead-letters?status="+strings.Repeat("%3C", 300_000), nil, nil)
	if code != http.StatusBadRequest || len(body) > 20_000 || strings.Contains(body, strings.Repeat("&lt;", 3000)) {
		t.Errorf("a 300,000-character status: %d, %d bytes; want 400, the echo cut", code, len(body))
	}
	big := url.Values{"consumer": {"tickets"}, "pad": {strings.Repeat("x", 2<<20)}}
	hdr := map[string]string{"Authorization": "Bearer " + testToken}
	if code, body := c.do(http.MethodPost, "/actions/consumer/disable", big, hdr); code != http.StatusRequestEntityTooLarge {
		t.Errorf("a 2 MB action form: %d %.200s; want 413", code, body)
	}
	if code, body := c.do(http.MethodPost, "/login", url.Values{"token": {testToken}, "pad": {strings.Repeat("x", 2<<20)}}, nil); code != http.StatusRequestEntityTooLarge {
		t.Errorf("a 2 MB login form: %d %.200s; want 413", code, body)
	}
	if code, body := c.do(http.MethodPost, "/actions/consumer/disable", url.Values{"consumer": {"nosuch"}}, map[string]string{"Authorization": "bearer " + testToken}); code == http.StatusUnauthorized {
		t.Errorf("a lowercase bearer scheme: %d %.200s; want the token taken", code, body)
	}
	for path, want := range map[string]int{
		"/static/console.css": http.StatusOK, "/static/": http.StatusNotFound, "/static": http.StatusNotFound,
		"/static/%ff": http.StatusNotFound, "/static/..%2fconsole.go": http.StatusNotFound,
	} {
		if code, _ := c.do(http.MethodGet, path, nil, nil); code != want {
			t.Errorf("GET %s: %d, want %d", path, code, want)
		}
	}
	// A session logged out is over, for a copy of its cookie too (it ran
	// an action after the logout: an HTTP audit).
	csrf := c.login("olga")
	u, _ := url.Parse(e.srv.URL + "/")
	var saved []*http.Cookie
	for _, ck := range c.hc.Jar.Cookies(u) {
		saved = append(saved, &http.Cookie{Name: ck.Name, Value: ck.Value})
	}
	if len(saved) == 0 {
		t.Fatal("no session cookie after login")
	}
	if code, _ := c.do(http.MethodPost, "/logout", url.Values{"csrf": {csrf}}, nil); code != http.StatusSeeOther {
		t.Fatalf("logout: %d", code)
	}
	c.hc.Jar.SetCookies(u, saved)
	if code, body := c.do(http.MethodPost, "/actions/consumer/disable", url.Values{"consumer": {"tickets"}, "csrf": {csrf}}, nil); code != http.StatusUnauthorized {
		t.Errorf("an action with a copy of a logged-out session's cookie: %d %.200s; want 401", code, body)
	}
	ro := newEnv(t, options{}).client()
	if code, _ := ro.do(http.MethodPost, "/logout", url.Values{}, nil); code != http.StatusForbidden {
		t.Errorf("POST /logout on a read-only console: %d, want 403", code)
	}
}
