package hostcheck_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/projectorhq/projector/internal/hostcheck"
)

func TestAllowedHost(t *testing.T) {
	t.Parallel()
	c, err := hostcheck.New([]string{"Console.Example.com", "*.ops.example.net", "10.1.2.3"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		host string
		want bool
	}{
		{"127.0.0.1:9464", true},
		{"127.0.0.1", true},
		{"[::1]:9464", true},
		{"[::1]", true},
		{"::1", true},
		{"10.0.0.5:80", true}, // an address literal: no DNS answer can move it
		{"localhost:9464", true},
		{"LOCALHOST.", true},
		{"app.localhost:8080", true},
		{"console.example.com:443", true},
		{"CONSOLE.EXAMPLE.COM.", true},
		{"a.ops.example.net", true},
		{"b.a.ops.example.net:1", true},
		{"ops.example.net", false}, // "*.x" is the names under x, not x
		{"rebind.evil.example:9464", false},
		{"rebind.evil.example", false},
		{"localhost.evil.example", false},
		{"evillocalhost", false},
		{"console.example.com.evil.example", false},
		{"xconsole.example.com", false},
		{"", false},
		{":9464", false},
		{"[::1]junk", false},
		{"[rebind.evil.example]:80", false},
	} {
		if got := c.AllowedHost(tc.host); got != tc.want {
			t.Errorf("AllowedHost(%q) = %v, want %v", tc.host, got, tc.want)
		}
	}
	var zero *hostcheck.Checker
	if !zero.AllowedHost("localhost:1") || zero.AllowedHost("console.example.com") {
		t.Error("a nil checker must accept localhost names and IP literals only")
	}
	anyHost, err := hostcheck.New([]string{"*"})
	if err != nil {
		t.Fatal(err)
	}
	if !anyHost.AllowedHost("rebind.evil.example") {
		t.Error(`"*" must accept any host`)
	}
}

func TestNewRefusesBadEntries(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"", " ", "example.com:443", "http://example.com", "example.com/console",
		"exa mple.com", "a..b", "*.", "**.example.com", "ex\x00ample.com", "ex\u00e4mple.com", strings.Repeat("a.", 200) + "com"} {
		if _, err := hostcheck.New([]string{bad}); !errors.Is(err, hostcheck.ErrInvalidHost) {
			t.Errorf("New(%q): %v, want ErrInvalidHost", bad, err)
		}
	}
	if _, err := hostcheck.New(make([]string, hostcheck.MaxHosts+1)); !errors.Is(err, hostcheck.ErrInvalidHost) {
		t.Errorf("too many hosts: %v", err)
	}
}
