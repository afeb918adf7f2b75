package console

import (
	"fmt"
	"testing"
	"time"
)

// An address may try LoginBurst wrong tokens at once, then one more every
// LoginEvery; another address is not slowed by it.
func TestLoginGuardThrottlesWrongTokens(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	g := loginGuard{now: func() time.Time { return now }}
	for i := range LoginBurst {
		if w := g.wait("10.0.0.1"); w != 0 {
			t.Fatalf("wrong token %d: wait %v before it, want none", i+1, w)
		}
		g.failed("10.0.0.1")
	}
	w := g.wait("10.0.0.1")
	if w <= 0 || w > LoginEvery {
		t.Fatalf("after %d wrong tokens: wait %v, want (0, %v]", LoginBurst, w, LoginEvery)
	}
	if w := g.wait("10.0.0.2"); w != 0 {
		t.Errorf("another address waits %v, want none", w)
	}
	now = now.Add(w)
	if w := g.wait("10.0.0.1"); w != 0 {
		t.Fatalf("after the wait: wait %v, want none", w)
	}
	g.failed("10.0.0.1")
	if w := g.wait("10.0.0.1"); w <= LoginEvery/2 {
		t.Errorf("after one more wrong token: wait %v, want about %v", w, LoginEvery)
	}
}

// The table of addresses stays bounded: once full, new addresses share one
// bucket, and addresses idle long enough are forgotten to make room.
func TestLoginGuardBounded(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	g := loginGuard{now: func() time.Time { return now }}
	for i := range loginAddresses {
		g.failed(fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255))
	}
	for range LoginBurst {
		g.failed("192.0.2.1")
	}
	if w := g.wait("192.0.2.2"); w <= 0 {
		t.Errorf("a new address after the table filled up: wait %v, want the shared bucket's", w)
	}
	if n := len(g.byAddr); n > loginAddresses+1 {
		t.Errorf("%d addresses tracked, want at most %d", n, loginAddresses+1)
	}
	now = now.Add(LoginBurst * LoginEvery)
	g.failed("192.0.2.3")
	if _, ok := g.byAddr["192.0.2.3"]; !ok {
		t.Errorf("an address after the idle ones aged out has no bucket of its own")
	}
	if n := len(g.byAddr); n > 2 {
		t.Errorf("%d addresses tracked after every one aged out, want at most 2", n)
	}
}
