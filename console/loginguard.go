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

// attempt takes one try for addr, before its token is compared: the try
// is taken and the check made in one step, so requests racing from one
// address get LoginBurst tries between them, not each its own. It returns
// how long addr must wait (no try taken), or zero and done, which the
// caller calls with whether the token was right: a right token's try is
// given back.
func (g *loginGuard) attempt(addr string) (wait time.Duration, done func(right bool)) {
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
	k := addr
	if _, ok := g.byAddr[k]; !ok && len(g.byAddr) >= loginAddresses {
		k = overflowAddress // full of recent wrong tries: new addresses share one bucket
	}
	l := g.byAddr[k]
	if l == nil {
		l = rate.NewLimiter(rate.Every(LoginEvery), LoginBurst)
		g.byAddr[k] = l
	}
	r := l.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return d, nil
	}
	return 0, func(right bool) {
		if right {
			g.mu.Lock()
			defer g.mu.Unlock()
			r.CancelAt(g.clock())
		}
	}
}

// clientAddress is the request's client address without its port, the
// throttle's key (a client's every connection has a port of its own).
func clientAddress(r *http.Request) string {
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}
