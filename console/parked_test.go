package console_test

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
)

// The parked-streams page lists a consumer's parks with retry and discard
// for a signed-in operator; the actions are the library's guarded calls,
// CSRF-protected, recorded with the operator's name, and a second discard
// is refused.
func TestParkedPageAndActions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{token: testToken, park: true})
	stop := e.dispatch()
	defer stop()
	c := e.client()
	csrf := c.login("bob")
	act := func(path string, form url.Values, withCSRF bool) (int, string) {
		t.Helper()
		if withCSRF {
			form.Set("csrf", csrf)
		}
		return c.do(http.MethodPost, path, form, map[string]string{"Accept": "application/json"})
	}
	e.fail.Store(true)
	e.appendEvents("p", 2)
	e.appendEvents("q", 2)
	var parks []projection.Park
	pgtest.Eventually(t, time.Minute, "two streams parked", func() bool {
		var err error
		parks, err = projection.ListParks(e.ctx, e.store, projection.ParkFilter{Status: projection.ParkOpen})
		return err == nil && len(parks) == 2
	})
	p, q := strconv.FormatInt(parks[0].ID, 10), strconv.FormatInt(parks[1].ID, 10)
	_, page := c.do(http.MethodGet, "/parked", nil, nil)
	if !strings.Contains(page, `data-park="`+p+`"`) || !strings.Contains(page, "/actions/park/retry") || !strings.Contains(page, "/actions/park/discard") {
		t.Fatalf("parked page lacks the parks and their actions:\n%s", page)
	}
	for _, tc := range []struct {
		path string
		form url.Values
		csrf bool
		want int
	}{
		{"/actions/park/retry", url.Values{"id": {p}}, false, http.StatusForbidden},
		{"/actions/park/retry", url.Values{"id": {"x"}}, true, http.StatusBadRequest},
		{"/actions/park/discard", url.Values{"id": {"0"}}, true, http.StatusBadRequest},
		{"/actions/park/discard", url.Values{"id": {"999999"}}, true, http.StatusNotFound},
		{"/actions/park/explode", url.Values{"id": {p}}, true, http.StatusNotFound},
	} {
		if code, body := act(tc.path, tc.form, tc.csrf); code != tc.want {
			t.Errorf("%s %v (csrf %v): %d %s, want %d", tc.path, tc.form, tc.csrf, code, body, tc.want)
		}
	}
	if got, _ := c.do(http.MethodGet, "/parked?status=bogus", nil, nil); got != http.StatusBadRequest {
		t.Errorf("parked?status=bogus: %d, want 400", got)
	}

	// retry: a request the dispatcher carries out now that the handler works.
	e.fail.Store(false)
	if code, body := act("/actions/park/retry", url.Values{"id": {p}}, true); code != http.StatusOK {
		t.Fatalf("retry: %d %s", code, body)
	}
	pgtest.Eventually(t, time.Minute, "the park resolved by the dispatcher", func() bool {
		pk, _, err := projection.GetPark(e.ctx, e.store, parks[0].ID)
		return err == nil && pk.Status == projection.ParkResolved && pk.ResolvedBy == "console: bob"
	})
	// discard, then a second discard and a retry are refused.
	if code, body := act("/actions/park/discard", url.Values{"id": {q}}, true); code != http.StatusOK || !strings.Contains(body, "2 events") {
		t.Fatalf("discard: %d %s", code, body)
	}
	for _, op := range []string{"discard", "retry"} {
		if code, body := act("/actions/park/"+op, url.Values{"id": {q}}, true); code != http.StatusConflict {
			t.Errorf("%s of a discarded park: %d %s, want 409", op, code, body)
		}
	}
	if _, list := c.do(http.MethodGet, "/parked?status=all", nil, nil); !strings.Contains(list, `data-park="`+q+`" data-status="discarded"`) ||
		strings.Contains(list, `value="`+q+`"><button`) {
		t.Errorf("the list of all parks lacks the discarded one, or offers it actions:\n%s", list)
	}
	// A closed park's error is the one it had before: labelled so, never
	// shown as if the park still failed.
	if _, list := c.do(http.MethodGet, "/parked?status=resolved", nil, nil); !strings.Contains(list, "last error, before it was resolved:") {
		t.Errorf("the resolved park's error is not labelled as the one before it was resolved:\n%s", list)
	}
}
