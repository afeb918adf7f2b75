package console

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// wrong tries a wrong token from addr and returns the wait it was told
// (zero: the try was taken).
func (g *loginGuard) wrong(addr string) time.Duration {
	wait, done := g.attempt(addr)
	if wait == 0 {
		done(false)
	}
	return wait
}

// An address may try LoginBurst wrong tokens at once, then one more every
// LoginEvery; a right token costs no try; another address is not slowed.
func TestLoginGuardThrottlesWrongTokens(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	g := loginGuard{now: func() time.Time { return now }}
	for range 3 {
		wait, done := g.attempt("10.0.0.1")
		if wait != 0 {
			t.Fatalf("a right token: wait %v, want none", wait)
		}
		done(true)
	}
	for i := range LoginBurst {
		if w := g.wrong("10.0.0.1"); w != 0 {
			t.Fatalf("wrong token %d: wait %v, want none (right tokens cost no try)", i+1, w)
		}
	}
	w := g.wrong("10.0.0.1")
	if w <= 0 || w > LoginEvery {
		t.Fatalf("after %d wrong tokens: wait %v, want (0, %v]", LoginBurst, w, LoginEvery)
	}
	if w := g.wrong("10.0.0.2"); w != 0 {
		t.Errorf("another address waits %v, want none", w)
	}
	now = now.Add(w)
	if w := g.wrong("10.0.0.1"); w != 0 {
		t.Fatalf("after the wait: wait %v, want none", w)
	}
	if w := g.wrong("10.0.0.1"); w <= LoginEvery/2 {
		t.Errorf("after one more wrong token: wait %v, want about %v", w, LoginEvery)
	}
}

// Requests racing from one address share its tries: of many wrong tokens
// sent at once, LoginBurst are compared. A check of the bucket apart from
// taking the try let every racing request through.
func TestLoginGuardRacingTries(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	g := loginGuard{now: func() time.Time { return now }}
	var mu sync.Mutex
	taken := 0
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 50 {
		wg.Go(func() {
			<-start
			wait, done := g.attempt("10.0.0.1")
			if wait == 0 {
				mu.Lock()
				taken++
				mu.Unlock()
				done(false)
			}
		})
	}
	close(start)
	wg.Wait()
	if taken != LoginBurst {
		t.Errorf("%d of 50 racing wrong tokens were compared, want %d", taken, LoginBurst)
	}
}

// The table of addresses stays bounded: once full, new addresses share one
// bucket, and addresses idle long enough are forgotten to make room.
func TestLoginGuardBounded(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	g := loginGuard{now: func() time.Time { return now }}
	for i := range loginAddresses {
		g.wrong(fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255))
	}
	for range LoginBurst {
		g.wrong("192.0.2.1")
	}
	if w := g.wrong("192.0.2.2"); w <= 0 {
		t.Errorf("a new address after the table filled up: wait %v, want the shared bucket's", w)
	}
	if n := len(g.byAddr); n > loginAddresses+1 {
		t.Errorf("%d addresses tracked, want at most %d", n, loginAddresses+1)
	}
	now = now.Add(LoginBurst * LoginEvery)
	g.wrong("192.0.2.3")
	if _, ok := g.byAddr["192.0.2.3"]; !ok {
		t.Errorf("an address after the idle ones aged out has no bucket of its own")
	}
	if n := len(g.byAddr); n > 2 {
		t.Errorf("%d addresses tracked after every one aged out, want at most 2", n)
	}
}

// An action asks who acted more than once (to authorise, to record, to
// render the result): whoOnce's request answers them all from the one
// identification, so a wrong bearer token costs its address one try, not
// one per asking.
func TestWhoOnceTakesOneTry(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	c := &Console{cfg: Config{Token: strings.Repeat("t", 20)}}
	c.logins.now = func() time.Time { return now }
	r := httptest.NewRequest(http.MethodPost, "/actions/consumer/restart", nil)
	r.RemoteAddr = "192.0.2.7:41000"
	r.Header.Set("Authorization", "Bearer not-the-token-at-all")
	o, r := c.whoOnce(r)
	if o.ok() {
		t.Fatal("a wrong bearer token identified an operator")
	}
	for range 3 {
		if c.who(r).ok() {
			t.Fatal("a wrong bearer token identified an operator")
		}
	}
	for i := range LoginBurst - 1 {
		if w := c.logins.wrong("192.0.2.7"); w != 0 {
			t.Fatalf("try %d after the action: wait %v; the action took more than one try", i+2, w)
		}
	}
	if w := c.logins.wrong("192.0.2.7"); w == 0 {
		t.Error("the address had more than LoginBurst tries")
	}
}
