package meilisearch

import (
	"strings"
	"testing"

	"github.com/projectorhq/projector/search"
)

// TestNewRefusesBadConfig: no URL (and no MEILISEARCH_URL), a URL that is
// not http(s), and negative timeouts are refused before anything connects.
func TestNewRefusesBadConfig(t *testing.T) {
	t.Setenv("MEILISEARCH_URL", "")
	for name, cfg := range map[string]Config{
		"no url":           {},
		"no scheme":        {URL: "127.0.0.1:7700"},
		"negative timeout": {URL: "http://127.0.0.1:7700", RequestTimeout: -1},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: New accepted %+v", name, cfg)
		}
	}
	t.Setenv("MEILISEARCH_URL", "http://127.0.0.1:7700")
	b, err := New(Config{})
	if err != nil || b.cfg.URL != "http://127.0.0.1:7700" {
		t.Fatalf("New from MEILISEARCH_URL: %v, %+v", err, b)
	}
}

// TestFilterAndKey: string values are double-quoted with backslash
// escapes, so a value cannot end the string early and add a condition;
// the tenant comes first; keys of two tenants with the same id differ and
// stay within Meilisearch's id alphabet.
func TestFilterAndKey(t *testing.T) {
	f, err := filter(`ac"me`, []search.Filter{search.Eq("status", `open" OR status = "closed`), search.Eq("n", 3), search.Eq("ok", true)}, true)
	if err != nil {
		t.Fatal(err)
	}
	want := `projector_tenant = "ac\"me" AND status = "open\" OR status = \"closed" AND n = 3 AND ok = true`
	if f != want {
		t.Fatalf("filter:\n got %s\nwant %s", f, want)
	}
	if f, _ := filter("acme", nil, false); f != "" {
		t.Fatalf("a shared index without filters: %q, want none", f)
	}
	if _, err := filter("acme", []search.Filter{search.Eq("x", []int{1})}, true); err == nil {
		t.Fatal("an array filter value was accepted")
	}
	a, b := key("acme", "T-1"), key("globex", "T-1")
	if a == b || !idPattern(a) || !idPattern(key("a/b", "ü id with spaces")) {
		t.Fatalf("keys %q and %q", a, b)
	}
}

func idPattern(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return len(s) > 0 && len(s) <= 511
}

// TestRedactURL: a URL's password never reaches a message, whether the URL
// parses or not, and New's refusal of a scheme shows the redacted URL (the
// demo printed both whole: a hostile-input audit).
func TestRedactURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"http://127.0.0.1:7700":                  "http://127.0.0.1:7700",
		"http://alice:S3cretPW@127.0.0.1:1":      "http://alice:xxxxx@127.0.0.1:1",
		"ftp://alice:S3cretPW@127.0.0.1:1":       "ftp://alice:xxxxx@127.0.0.1:1",
		"http://alice:S3cret%zzPW@127.0.0.1:1/x": "http://xxxxx@127.0.0.1:1/x",
		"alice:S3cretPW@127.0.0.1:1":             "xxxxx@127.0.0.1:1",
	} {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
	for _, url := range []string{"ftp://alice:S3cretPW@127.0.0.1:1", "alice:S3cret%zzPW@127.0.0.1:1"} {
		_, err := New(Config{URL: url})
		if err == nil || strings.Contains(err.Error(), "S3cret") {
			t.Errorf("New(%q): %v; want a refusal without the password", url, err)
		}
	}
}
