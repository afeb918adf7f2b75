package console

import (
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Wrong tokens are throttled per client address, at the login form and in
// a script's Authorization header alike: an address may try LoginBurst
// wrong tokens at once, then one more every LoginEvery. A throttled address
// is answered 429 Too Many Requests with Retry-After, and its token is not
// even compared, so it learns nothing. A right token spends nothing.
//
// The token has at least 16 characters, so guessing it is hopeless anyway;
// the throttle keeps a script that tries does so slowly and loudly (each
// refusal is logged). Behind a reverse proxy every client shares the
// proxy's address, and an operator who mistypes while someone guesses waits
// a few seconds, no more: the throttle slows, it never locks out.
const (
	LoginBurst = 5
	LoginEvery = 2 * time.Second
	// loginAddresses bounds the addresses tracked: beyond it, addresses
	// not seen lately are forgotten, and if none is, new ones share one
	// bucket (overflowAddress).
	loginAddresses  = 4096
	overflowAddress = "*"
)

// loginGuard is the throttle's state. The zero value is ready.
type loginGuard struct {
	mu     sync.Mutex
	byAddr map[string]*rate.Limiter
	now    func() time.Time // time.Now when nil (tests set it)
}

func (g *loginGuard) clock() time.Time {
	if g.now != nil {
		return g.now()
	}
	return time.Now()
}

// wait returns how long addr must wait before its next try: zero when it
// may try now.
func (g *loginGuard) wait(addr string) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	l := g.byAddr[g.key(addr)]
	if l == nil {
		return 0
	}
	tokens := l.TokensAt(g.clock())
	if tokens >= 1 {
		return 0
	}
	return time.Duration((1 - tokens) * float64(LoginEvery))
}

// failed counts a wrong token from addr.
func (g *loginGuard) failed(addr string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.clock()
	if g.byAddr == nil {
		g.byAddr = map[string]*rate.Limiter{}
	}
	if _, ok := g.byAddr[addr]; !ok && len(g.byAddr) >= loginAddresses {
		// Forget the addresses whose bucket is full again: they have not
		// tried a wrong token for LoginBurst × LoginEvery.
		for a, l := range g.byAddr {
			if l.TokensAt(now) >= LoginBurst {
				delete(g.byAddr, a)
			}
		}
	}
	k := g.key(addr)
	l := g.byAddr[k]
	if l == nil {
		l = rate.NewLimiter(rate.Every(LoginEvery), LoginBurst)
		g.byAddr[k] = l
	}
	l.AllowN(now, 1)
}

// key is the bucket addr counts in: its own, or the shared one once the
// table is full.
func (g *loginGuard) key(addr string) string {
	if _, ok := g.byAddr[addr]; ok || len(g.byAddr) < loginAddresses {
		return addr
	}
	return overflowAddress
}

// clientAddress is the request's client address without its port, the
// throttle's key (a client's every connection has a port of its own).
func clientAddress(r *http.Request) string {
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}
