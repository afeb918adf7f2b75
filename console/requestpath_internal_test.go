package console

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// A refused request is logged with the path the client asked for, not the
// one left after the mount's http.StripPrefix: a refused GET /console/ was
// logged as "/". The query stays out of the log; unprintable bytes are
// escaped.
func TestRequestPathIsTheClients(t *testing.T) {
	t.Parallel()
	var got string
	h := http.StripPrefix("/console", http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { got = requestPath(r) }))
	for target, want := range map[string]string{
		"/console/":                   "/console/",
		"/console/state.json?token=x": "/console/state.json",
		"/console/%1b[31mred":         `/console/%1b[31mred`,
	} {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, target, nil))
		if got != want {
			t.Errorf("%s: logged as %q, want %q", target, got, want)
		}
	}
	r := httptest.NewRequest(http.MethodGet, "/x", nil)
	r.RequestURI = "" // a request made in-process, as by a client's own handler chain
	if p := requestPath(r); p != "/x" {
		t.Errorf("without a request line: %q", p)
	}
}
