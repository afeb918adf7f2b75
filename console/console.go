// Package console is Projector's operator console: an http.Handler that
// shows consumers, the horizon, dead letters, rebuilds, sagas (counts,
// overdue timeouts, instances) and a live tail of the log, updating every second, and lets an operator with
// the console token restart, skip, disable and enable consumers, retry or
// discard dead letters and request rebuilds.
//
// Every action goes through the same guarded transition as the CLI
// (projection.Admin, the dead-letter functions of package projection,
// rebuild.Request): the console adds no path around a guard, and a refused
// transition is shown as refused with nothing changed.
//
// `projector run` serves it at /console/ on its HTTP address (loopback by
// default). An application mounts it in its own server with its own store:
//
//	c, err := console.New(console.Config{Store: store, Token: os.Getenv(console.EnvToken)})
//	if err != nil { ... }
//	mux.Handle("/console/", http.StripPrefix("/console", c))
//
// Security (docs/console.md): without a token the console is read-only and
// says so, with no action buttons; with one, actions need a session cookie
// from the login form (HttpOnly, SameSite=Strict, signed with the token) or
// an "Authorization: Bearer" header, POST only, a CSRF token for cookie
// sessions and a same-origin check, and every action is logged with
// log/slog (who, what, result). Every route answers only a Host header
// that is an IP address, a localhost name or one of [Config.AllowedHosts]
// (421 otherwise), so that no web page can read the console through DNS
// rebinding. Event payloads and saga states are never
// shown unless [Config.ShowPayloads], and then only on the single
// dead-letter and saga instance views.
package console

import (
	"cmp"
	"crypto/rand"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/hostcheck"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// EnvToken is the environment variable `projector run` reads the operator
// token from. Applications that mount the console pass [Config.Token]
// themselves.
const EnvToken = "PROJECTOR_CONSOLE_TOKEN"

// MinTokenLength is the shortest token [New] accepts: a short token could
// be guessed by anyone who can reach the port, and the token is all that
// stands between them and the actions.
const MinTokenLength = 16

// MaxTokenLength bounds the token so a compare stays cheap.
const MaxTokenLength = 1024

// Errors of [New] and of the console's request handling, for errors.Is.
var (
	// ErrInvalidConfig: [Config] is unusable (no store, a token too short
	// or too long, a session age out of range).
	ErrInvalidConfig = errors.New("console: invalid configuration")
	// ErrInvalidInput: a request carried a value that cannot be a consumer
	// name, instance id, dead-letter id, rebuild mode, saga name, saga
	// instance id, status, tenant or list limit; it never reached the
	// database.
	ErrInvalidInput = errors.New("console: invalid input")
)

// Bounds of [Config.SessionTTL].
const (
	DefaultSessionTTL = 12 * time.Hour
	MinSessionTTL     = time.Minute
	MaxSessionTTL     = 7 * 24 * time.Hour
)

// Bounds of [Config.DeadLetterLimit] and [Config.SagaLimit].
const (
	DefaultListLimit = 50
	MaxListLimit     = 1000
)

// Config is what an application hands the console.
type Config struct {
	// Store is the event store whose schema the console shows; required.
	Store *postgres.Store
	// Token is the operator token. Empty makes the console read-only:
	// everything is shown, no action is possible, and the page says so.
	// At least MinTokenLength characters otherwise.
	Token string
	// ShowPayloads shows event payloads and metadata (actor, headers) on
	// the single dead-letter view, and a saga instance's state on its own
	// page. Off by default: payloads and states may carry personal data.
	// Lists never show either.
	ShowPayloads bool
	// Projections are the application's async projections. The rebuild
	// button is offered on the shared shards of those that declare tables
	// (projection.AsyncConfig.Tables), and only those: without tables a
	// projection cannot be rebuilt. Without Projections no rebuild button
	// is shown (the console cannot tell which could be rebuilt).
	Projections []*projection.Async
	// Sagas names the sagas whose instances the dashboard lists (saga
	// names as defined). Sagas with failed instances are listed anyway;
	// the saga pages (/sagas) list every saga with instances, and these
	// with none too.
	Sagas []string
	// SagaPersonal holds, by saga name, the personal declarations
	// (saga.Config.Personal) of sagas whose state has sealed fields: with
	// ShowPayloads, an instance's page opens them with the store's master
	// key, or shows each as "(sealed)" and why, as `projector saga show`
	// does. Without a saga's declaration its sealed fields are never
	// shown, not even as the stored envelopes.
	SagaPersonal map[string]projector.Personal
	// Tail is the live feed the "live tail" panel reads (package live's
	// handler, or any Server-Sent Events handler whose messages carry the
	// event's log position as id and its JSON envelope as data). The
	// console serves it under tail/; nil hides the panel.
	Tail http.Handler
	// Logger receives one line per action (who, what, result) and per
	// refused request; default slog.Default().
	Logger *slog.Logger
	// SessionTTL is how long a login lasts; default DefaultSessionTTL,
	// between MinSessionTTL and MaxSessionTTL.
	SessionTTL time.Duration
	// DeadLetterLimit and SagaLimit cap the rows of those lists; default
	// DefaultListLimit, at most MaxListLimit.
	DeadLetterLimit int
	SagaLimit       int
	// AllowedHosts are the names, besides localhost names and IP
	// addresses, that the console answers to in a request's Host header:
	// the names it is reached by behind a proxy ("console.example.com",
	// "*.example.com" for the names under example.com, "*" for any). Any
	// other Host is answered 421 Misdirected Request on every route, the
	// live tail included, so that a web page whose name its attacker points
	// at the console's address (DNS rebinding) cannot read it. No scheme,
	// no port; an entry that could never match is [ErrInvalidConfig].
	AllowedHosts []string
	// JetStreamConsumers are the application's JetStream claims consumers
	// (stores/jetstream) whose parked streams (ErrorMode ParkStream) the
	// console lists at relay-parked, with retry and discard: each a
	// *jetstream.Consumer wrapped by cli.ConsoleParks. A retry runs the
	// consumer's handler in the console's process, as `projector relay
	// parked retry` does in a binary that wires its consumers. None: no
	// such page.
	JetStreamConsumers []ParkedConsumer
}

// Console is the console's http.Handler. Mount it at any path with
// http.StripPrefix; its links follow the prefix.
type Console struct {
	cfg     Config
	log     *slog.Logger
	mux     *http.ServeMux
	pages   *template.Template
	csrfKey []byte
	cop     *http.CrossOriginProtection
	hosts   *hostcheck.Checker
	rates   rateTracker
	cache   stateCache
	// tailTypes is the JSON array of the registry's event types.
	tailTypes string
	// rebuildable names the projections that declare tables.
	rebuildable map[string]bool
	// ended holds the sessions logged out before they expired (their
	// cookies' MACs, with their expiry), so a copy of a cookie kept past
	// its logout no longer signs in.
	ended endedSessions
	// logins throttles wrong tokens per client address (loginguard.go).
	logins loginGuard
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// New checks cfg and returns the console.
func New(cfg Config) (*Console, error) {
	if cfg.Store == nil {
		return nil, fmt.Errorf("%w: no store", ErrInvalidConfig)
	}
	if n := utf8.RuneCountInString(cfg.Token); cfg.Token != "" && (n < MinTokenLength || len(cfg.Token) > MaxTokenLength) {
		return nil, fmt.Errorf("%w: the token has %d characters: want %d to %d (or none for a read-only console)",
			ErrInvalidConfig, n, MinTokenLength, MaxTokenLength)
	}
	if strings.TrimSpace(cfg.Token) != cfg.Token {
		return nil, fmt.Errorf("%w: the token starts or ends with white space (a stray newline from a file?)", ErrInvalidConfig)
	}
	if cfg.SessionTTL == 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if cfg.SessionTTL < MinSessionTTL || cfg.SessionTTL > MaxSessionTTL {
		return nil, fmt.Errorf("%w: session TTL %v: want %v to %v", ErrInvalidConfig, cfg.SessionTTL, MinSessionTTL, MaxSessionTTL)
	}
	for _, l := range []*int{&cfg.DeadLetterLimit, &cfg.SagaLimit} {
		if *l == 0 {
			*l = DefaultListLimit
		}
		if *l < 1 || *l > MaxListLimit {
			return nil, fmt.Errorf("%w: list limit %d: want 1 to %d", ErrInvalidConfig, *l, MaxListLimit)
		}
	}
	subs := map[string]bool{}
	for _, jc := range cfg.JetStreamConsumers {
		if jc == nil {
			return nil, fmt.Errorf("%w: a nil JetStream consumer", ErrInvalidConfig)
		}
		if subs[jc.Subscription()] {
			return nil, fmt.Errorf("%w: two JetStream consumers of subscription %q", ErrInvalidConfig, jc.Subscription())
		}
		subs[jc.Subscription()] = true
	}
	for _, s := range cfg.Sagas {
		if err := checkName("saga", s); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	for s, p := range cfg.SagaPersonal {
		if err := checkName("saga", s); err != nil {
			return nil, fmt.Errorf("%w: SagaPersonal: %w", ErrInvalidConfig, err)
		}
		if p.Subject == "" {
			return nil, fmt.Errorf("%w: SagaPersonal: saga %s: a declaration without a Subject", ErrInvalidConfig, projector.Printable(s))
		}
	}
	hosts, err := hostcheck.New(cfg.AllowedHosts)
	if err != nil {
		return nil, fmt.Errorf("%w: AllowedHosts: %w", ErrInvalidConfig, err)
	}
	pages, err := template.New("").Funcs(funcs).ParseFS(templateFS, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("console: parse templates: %w", err)
	}
	c := &Console{cfg: cfg, log: cmp.Or(cfg.Logger, slog.Default()), pages: pages, cop: http.NewCrossOriginProtection(),
		hosts: hosts, rebuildable: map[string]bool{}}
	for _, p := range cfg.Projections {
		if p == nil {
			return nil, fmt.Errorf("%w: a nil projection", ErrInvalidConfig)
		}
		if pc := p.Config(); len(pc.Tables) > 0 && pc.Delivery == projection.Shared {
			c.rebuildable[p.Name()] = true
		}
	}
	// The CSRF key lives as long as the process: a restart invalidates the
	// forms of open pages, which reload within a second anyway.
	c.csrfKey = make([]byte, 32)
	if _, err := rand.Read(c.csrfKey); err != nil {
		return nil, fmt.Errorf("console: csrf key: %w", err)
	}
	if reg := cfg.Store.Registry(); reg != nil {
		b, err := json.Marshal(reg.Names())
		if err != nil {
			return nil, fmt.Errorf("console: event types: %w", err)
		}
		c.tailTypes = string(b)
	}
	c.cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.deny(w, r, http.StatusForbidden, "cross-origin request refused")
	}))
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, fmt.Errorf("console: static files: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", c.dashboard)
	mux.HandleFunc("GET /fragment", c.fragment)
	mux.HandleFunc("GET /state.json", c.stateJSON)
	mux.HandleFunc("GET /dead-letters", c.deadLetters)
	mux.HandleFunc("GET /dead-letters/{id}", c.deadLetter)
	mux.HandleFunc("GET /parked", c.parked)
	mux.HandleFunc("GET /relay-parked", c.relayParked)
	mux.HandleFunc("GET /sagas", c.sagas)
	mux.HandleFunc("GET /sagas/{name}", c.sagaInstances)
	mux.HandleFunc("GET /sagas/{name}/{id}", c.sagaInstance)
	mux.HandleFunc("GET /login", c.loginForm)
	mux.Handle("POST /login", c.cop.Handler(http.HandlerFunc(c.login)))
	mux.Handle("POST /logout", c.cop.Handler(http.HandlerFunc(c.logout)))
	mux.Handle("POST /actions/{kind}/{op}", c.cop.Handler(http.HandlerFunc(c.action)))
	// The two files by name: a file server listed the directory, answered
	// /static with a redirect to a path outside a mount, and a path that is
	// not UTF-8 with 500.
	mux.HandleFunc("GET /static/{file}", func(w http.ResponseWriter, r *http.Request) {
		file := r.PathValue("file")
		if file != "console.css" && file != "console.js" {
			http.NotFound(w, r)
			return
		}
		http.ServeFileFS(w, r, static, file)
	})
	if cfg.Tail != nil {
		mux.Handle("GET /tail", cfg.Tail)
	}
	// Any other method on a page is refused, never served: a state change
	// is a POST to /actions, nothing else.
	c.mux = mux
	return c, nil
}

// ServeHTTP serves the console, with headers that keep its pages out of
// frames and other origins' scripts. A request naming a host the console
// does not answer to ([Config.AllowedHosts]) is refused before any route,
// the live tail's included, sees it.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !c.hosts.Allowed(r) {
		c.log.Warn("console: request refused", slog.String("remote", remote(r)), slog.String("method", r.Method),
			slog.String("path", requestPath(r)), slog.String("host", projector.Printable(r.Host)),
			slog.Int("status", http.StatusMisdirectedRequest), slog.String("why", "Host is not this console's (DNS rebinding?)"))
		hostcheck.Refuse(w, "console")
		return
	}
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("X-Frame-Options", "DENY")
	if r.URL.Path != "/tail" {
		h.Set("Cache-Control", "no-store")
	}
	c.mux.ServeHTTP(w, r)
}

// ReadOnly reports a console without a token: no action is possible.
func (c *Console) ReadOnly() bool { return c.cfg.Token == "" }

// base is the path the console is mounted at, as the browser sees it: the
// request's path less what http.StripPrefix left, so links work under any
// prefix.
func base(r *http.Request) string {
	u, err := url.ParseRequestURI(r.RequestURI)
	if err != nil || r.RequestURI == "" {
		return ""
	}
	if b, ok := strings.CutSuffix(u.Path, r.URL.Path); ok {
		return strings.TrimSuffix(b, "/")
	}
	return ""
}

// checkName validates a consumer, instance or saga name before it goes
// anywhere near PostgreSQL: not empty, at most 200 bytes of valid UTF-8
// without control characters.
func checkName(what, s string) error {
	switch {
	case s == "":
		return fmt.Errorf("%w: no %s", ErrInvalidInput, what)
	case len(s) > 200:
		return fmt.Errorf("%w: %s of %d bytes (at most 200)", ErrInvalidInput, what, len(s))
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalidInput, what)
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return fmt.Errorf("%w: %s holds a control character", ErrInvalidInput, what)
		}
	}
	return nil
}

// rateTracker turns the processed counters of successive reads into
// events per second, per shard, measured over at least a second.
type rateTracker struct {
	mu      sync.Mutex
	samples map[string]rateSample
}

type rateSample struct {
	at        time.Time
	processed int64
	rate      float64
	known     bool
}

// observe records shard's processed count at now and returns its rate,
// false until two reads a second apart were seen. keep lists the shards
// still present, so removed ones are forgotten.
func (t *rateTracker) observe(now time.Time, counts map[string]int64) map[string]float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.samples == nil {
		t.samples = map[string]rateSample{}
	}
	out := make(map[string]float64, len(counts))
	for id, n := range counts {
		s, ok := t.samples[id]
		switch {
		case !ok || n < s.processed:
			s = rateSample{at: now, processed: n}
		case now.Sub(s.at) >= time.Second:
			s = rateSample{at: now, processed: n, rate: float64(n-s.processed) / now.Sub(s.at).Seconds(), known: true}
		}
		t.samples[id] = s
		if s.known {
			out[id] = s.rate
		}
	}
	for id := range t.samples {
		if _, ok := counts[id]; !ok {
			delete(t.samples, id)
		}
	}
	return out
}
