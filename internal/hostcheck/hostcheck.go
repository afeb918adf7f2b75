// Package hostcheck refuses HTTP requests whose Host header names a host
// the server was not told it answers to: the defence of the console and the
// live feed against DNS rebinding.
//
// # Why
//
// A server bound to loopback trusts that only someone on the machine can
// reach it. A page on any web site can break that trust: its attacker
// points their own name (rebind.evil.example) at 127.0.0.1 once the page has
// loaded, and the browser, which checks origins by name, lets the page read
// what that name now answers — the loopback server's pages. The one thing
// such a request cannot hide is its Host header, which carries the
// attacker's name. So a server that answers only to names it knows cannot
// be read this way.
//
// # What is accepted
//
//   - localhost names: "localhost" and any name under ".localhost", which
//     resolvers must keep on loopback (RFC 6761, section 6.3);
//   - any IP address literal ("127.0.0.1", "[::1]", "10.0.0.5"): a browser
//     that sends an address as Host was given that address, not a name, so
//     its origin is that address and no DNS answer can move it elsewhere;
//   - the names of the [Checker]'s list: exact names ("console.example.com"),
//     "*.example.com" for the names under example.com (not example.com
//     itself), or "*" for any host, which turns the check off.
//
// Ports are ignored (the listener decides the port), as are a trailing dot
// and letter case. A request without a Host header is refused: every browser
// sends one.
package hostcheck

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// ErrInvalidHost: an entry of the allowed list cannot match a Host header.
var ErrInvalidHost = errors.New("invalid allowed host")

// MaxHosts bounds the allowed list.
const MaxHosts = 100

// maxHostLen is the longest DNS name (RFC 1035, section 2.3.4).
const maxHostLen = 253

// Checker decides whether a request's Host header names this server. The
// zero value accepts localhost names and IP literals only.
type Checker struct {
	exact    map[string]bool
	suffixes []string // ".example.com" for "*.example.com"
	any      bool
}

// New returns a checker that accepts, besides localhost names and IP
// literals, the hosts listed in allowed (see the package documentation for
// their forms). An entry that is empty, carries a port, a scheme, a path,
// white space or anything but letters, digits, '-', '.' and '_' is
// [ErrInvalidHost].
func New(allowed []string) (*Checker, error) {
	if len(allowed) > MaxHosts {
		return nil, fmt.Errorf("%w: %d hosts, at most %d", ErrInvalidHost, len(allowed), MaxHosts)
	}
	c := &Checker{exact: map[string]bool{}}
	for _, a := range allowed {
		h := normalize(a)
		switch {
		case a == "*":
			c.any = true
		case strings.HasPrefix(h, "*."):
			if err := checkName(a, h[2:]); err != nil {
				return nil, err
			}
			c.suffixes = append(c.suffixes, h[1:])
		default:
			if _, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil {
				continue // accepted anyway
			}
			if err := checkName(a, h); err != nil {
				return nil, err
			}
			c.exact[h] = true
		}
	}
	return c, nil
}

// checkName accepts a DNS name (letters, digits, '-', '_' in dot-separated
// labels); entry is what the user wrote, for the error.
func checkName(entry, h string) error {
	bad := func(why string) error {
		return fmt.Errorf("%w: %q %s: want a host name such as console.example.com or *.example.com, without scheme or port", ErrInvalidHost, printable(entry), why)
	}
	if h == "" {
		return bad("is empty")
	}
	if len(h) > maxHostLen {
		return bad(fmt.Sprintf("has %d characters (at most %d)", len(h), maxHostLen))
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" {
			return bad("has an empty label")
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return bad(fmt.Sprintf("holds %q", r))
			}
		}
	}
	return nil
}

// printable cuts and escapes what a user wrote for an error message.
func printable(s string) string {
	if len(s) > 80 {
		s = s[:80] + "…"
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// normalize lowercases a host and drops one trailing dot.
func normalize(h string) string {
	return strings.TrimSuffix(strings.ToLower(strings.TrimSpace(h)), ".")
}

// Allowed reports whether the request's Host header names this server.
func (c *Checker) Allowed(r *http.Request) bool {
	if c != nil && c.any {
		return true
	}
	return c.AllowedHost(r.Host)
}

// AllowedHost reports whether hostport, a Host header's value, names this
// server.
func (c *Checker) AllowedHost(hostport string) bool {
	if c != nil && c.any {
		return true
	}
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	} else if strings.HasPrefix(hostport, "[") && strings.HasSuffix(hostport, "]") {
		host = hostport[1 : len(hostport)-1]
	}
	if strings.HasPrefix(host, "[") {
		return false // "[::1]junk" or an unclosed bracket
	}
	host = normalize(host)
	if host == "" {
		return false
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	if c == nil {
		return false
	}
	if c.exact[host] {
		return true
	}
	for _, s := range c.suffixes {
		if strings.HasSuffix(host, s) && len(host) > len(s) {
			return true
		}
	}
	return false
}

// Refuse answers 421 Misdirected Request: the request reached a server
// that does not answer for the host it named (RFC 9110, section 15.5.20).
// what names the refusing server in the message.
func Refuse(w http.ResponseWriter, what string) {
	http.Error(w, what+": this server does not answer for the host this request names "+
		"(add it to the allowed hosts if it is this server's name behind a proxy)", http.StatusMisdirectedRequest)
}
