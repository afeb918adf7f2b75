package console

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/projectorhq/projector"
)

// CookieName is the session cookie the login form sets.
const CookieName = "projector_console"

// CSRFField is the form field (and CSRFHeader the header) carrying the
// CSRF token of a cookie session.
const (
	CSRFField  = "csrf"
	CSRFHeader = "X-CSRF-Token"
)

// MaxOperatorName bounds the name an operator gives at login, which the
// action log records as "who".
const MaxOperatorName = 64

// operator is who sent a request: a signed-in session, a bearer token, or
// nobody.
type operator struct {
	name   string
	bearer bool
	cookie string // the session cookie's value, which the CSRF token is bound to
	// retry: no operator, and the request's address must wait this long
	// before its next token (loginguard.go).
	retry time.Duration
}

func (o operator) ok() bool { return o.name != "" }

// tokenMatches compares a presented token with the configured one in
// constant time (both hashed first, so neither length leaks either).
func (c *Console) tokenMatches(given string) bool {
	if c.cfg.Token == "" || given == "" {
		return false
	}
	a, b := sha256.Sum256([]byte(given)), sha256.Sum256([]byte(c.cfg.Token))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// mac signs msg with the operator token: a session cookie is valid only
// while the token it was issued under is configured.
func (c *Console) mac(msg string) string {
	h := hmac.New(sha256.New, []byte("projector-console-session\x00"+c.cfg.Token))
	h.Write([]byte(msg))
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

// sessionValue is the cookie value for name, valid until expiry:
// base64(name) "." expiry-unix "." mac.
func (c *Console) sessionValue(name string, expiry time.Time) string {
	msg := base64.RawURLEncoding.EncodeToString([]byte(name)) + "." + strconv.FormatInt(expiry.Unix(), 10)
	return msg + "." + c.mac(msg)
}

// operatorKey carries a request's operator once identified (whoOnce).
type operatorKey struct{}

// whoOnce identifies the request's operator and returns the request
// carrying it, so the who of the handlers it reaches answers from it: an
// action asks who acted two or three times (to authorise, to record, to
// render the result), and each asking would take another try from the
// address's throttle and read the shared logouts again.
func (c *Console) whoOnce(r *http.Request) (operator, *http.Request) {
	o := c.who(r)
	return o, r.WithContext(context.WithValue(r.Context(), operatorKey{}, o))
}

// who identifies the request's operator: a bearer token in the
// Authorization header, or a valid, unexpired session cookie (or the one
// whoOnce identified).
func (c *Console) who(r *http.Request) operator {
	if o, ok := r.Context().Value(operatorKey{}).(operator); ok {
		return o
	}
	if c.ReadOnly() {
		return operator{}
	}
	if auth := r.Header.Get("Authorization"); auth != "" {
		wait, done := c.logins.attempt(clientAddress(r))
		if wait > 0 {
			return operator{retry: wait}
		}
		// The scheme's name is case-insensitive (RFC 9110, section 11.1).
		scheme, tok, ok := strings.Cut(auth, " ")
		right := ok && strings.EqualFold(scheme, "Bearer") && c.tokenMatches(tok)
		done(right)
		if right {
			return operator{name: "bearer", bearer: true}
		}
		return operator{}
	}
	ck, err := r.Cookie(CookieName)
	if err != nil {
		return operator{}
	}
	parts := strings.Split(ck.Value, ".")
	if len(parts) != 3 {
		return operator{}
	}
	msg := parts[0] + "." + parts[1]
	if subtle.ConstantTimeCompare([]byte(c.mac(msg)), []byte(parts[2])) != 1 {
		return operator{}
	}
	exp, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || time.Now().Unix() >= exp || c.ended.has(parts[2]) {
		return operator{}
	}
	ctx, cancel := context.WithTimeout(r.Context(), sessionTimeout)
	defer cancel()
	if c.loggedOut(ctx, parts[2], exp) {
		return operator{}
	}
	name, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil || checkOperatorName(string(name)) != nil {
		return operator{}
	}
	return operator{name: string(name), cookie: ck.Value}
}

// csrfToken is the CSRF token of a cookie session: an HMAC of the session
// cookie under a key that never leaves the process, so a page of another
// origin can neither read nor compute it.
func (c *Console) csrfToken(o operator) string {
	if o.cookie == "" {
		return ""
	}
	h := hmac.New(sha256.New, c.csrfKey)
	h.Write([]byte(o.cookie))
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

// csrfOK checks the CSRF token of a state-changing request. A bearer
// request needs none: a browser never adds an Authorization header to a
// request another origin makes it send.
func (c *Console) csrfOK(r *http.Request, o operator) bool {
	if o.bearer {
		return true
	}
	given := r.Header.Get(CSRFHeader)
	if given == "" {
		given = r.PostFormValue(CSRFField)
	}
	want := c.csrfToken(o)
	return want != "" && subtle.ConstantTimeCompare([]byte(given), []byte(want)) == 1
}

func checkOperatorName(n string) error {
	if err := checkName("operator name", n); err != nil {
		return err
	}
	if len(n) > MaxOperatorName {
		return ErrInvalidInput
	}
	return nil
}

// remote is the request's peer for the log.
func remote(r *http.Request) string { return r.RemoteAddr }

// deny refuses a request and logs it: a refused request is as much an
// operator's business as an action.
func (c *Console) deny(w http.ResponseWriter, r *http.Request, code int, why string) {
	c.log.Warn("console: request refused", slog.String("remote", remote(r)), slog.String("method", r.Method),
		slog.String("path", requestPath(r)), slog.Int("status", code), slog.String("why", why))
	c.reply(w, r, code, why)
}

// requestPath is the path the client asked for, as logs should name it:
// the request line's, before any http.StripPrefix a mount put in front of
// the console ("/console/" was logged as "/"), made printable.
func requestPath(r *http.Request) string {
	p := r.URL.Path
	if r.RequestURI != "" {
		p, _, _ = strings.Cut(r.RequestURI, "?")
	}
	return projector.Printable(p)
}

// tooMany answers a request whose address tried too many wrong tokens
// (loginguard.go): 429, and when to try again, in whole seconds.
func (c *Console) tooMany(w http.ResponseWriter, r *http.Request, wait time.Duration) {
	secs := int64((wait + time.Second - 1) / time.Second)
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	c.reply(w, r, http.StatusTooManyRequests, "too many wrong tokens from this address: try again in "+strconv.FormatInt(secs, 10)+" s")
}

func (c *Console) loginForm(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "login.html", c.page(r, "Sign in", nil))
}

// login checks the token from the form and sets the session cookie:
// HttpOnly (no script reads it), SameSite=Strict (no other site's page
// sends it), Secure when served over TLS, Path limited to the console.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if c.ReadOnly() {
		c.deny(w, r, http.StatusForbidden, "this console is read-only: no "+EnvToken+" is configured")
		return
	}
	if !c.readForm(w, r) {
		return
	}
	name := strings.TrimSpace(r.PostFormValue("name"))
	if name == "" {
		name = "operator"
	}
	if err := checkOperatorName(name); err != nil {
		c.deny(w, r, http.StatusBadRequest, "operator name: 1 to 64 printable characters")
		return
	}
	wait, done := c.logins.attempt(clientAddress(r))
	if wait > 0 {
		c.log.Warn("console: login refused", slog.String("who", name), slog.String("remote", remote(r)), slog.String("result", "too many wrong tokens"))
		c.tooMany(w, r, wait)
		return
	}
	right := c.tokenMatches(r.PostFormValue("token"))
	done(right)
	if !right {
		c.log.Warn("console: login refused", slog.String("who", name), slog.String("remote", remote(r)), slog.String("result", "wrong token"))
		c.reply(w, r, http.StatusUnauthorized, "wrong token")
		return
	}
	exp := time.Now().Add(c.cfg.SessionTTL)
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: c.sessionValue(name, exp), Path: base(r) + "/", Expires: exp,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	c.log.Info("console: login", slog.String("who", name), slog.String("remote", remote(r)), slog.String("result", "ok"))
	http.Redirect(w, r, base(r)+"/", http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	if c.ReadOnly() {
		// No session to end: every POST of a read-only console is refused.
		c.deny(w, r, http.StatusForbidden, "this console is read-only: no "+EnvToken+" is configured")
		return
	}
	o := c.who(r)
	if o.ok() && !c.csrfOK(r, o) {
		c.deny(w, r, http.StatusForbidden, "missing or wrong CSRF token")
		return
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: base(r) + "/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	if o.ok() {
		if parts := strings.Split(o.cookie, "."); len(parts) == 3 {
			if exp, err := strconv.ParseInt(parts[1], 10, 64); err == nil {
				c.ended.add(parts[2], exp)
				ctx, cancel := context.WithTimeout(r.Context(), sessionTimeout)
				c.recordLogout(ctx, parts[2], exp)
				cancel()
			}
		}
		c.log.Info("console: logout", slog.String("who", o.name), slog.String("remote", remote(r)))
	}
	http.Redirect(w, r, base(r)+"/", http.StatusSeeOther)
}

// endedSessions are sessions logged out before they expired, by their
// cookie's MAC, until they expire: logging out cleared the browser's
// cookie, but a copy of it (another tab's request in flight, a proxy's
// log) still signed in. It is this process's; the logouts of every
// process are also in projector_console_logouts (logouts.go).
type endedSessions struct {
	mu  sync.Mutex
	mac map[string]int64 // MAC → the session's expiry (Unix seconds)
}

func (e *endedSessions) add(mac string, exp int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now().Unix()
	if e.mac == nil {
		e.mac = map[string]int64{}
	}
	for m, x := range e.mac {
		if x <= now {
			delete(e.mac, m)
		}
	}
	e.mac[mac] = exp
}

func (e *endedSessions) has(mac string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.mac[mac]
	return ok
}
