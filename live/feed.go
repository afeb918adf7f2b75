// Package live streams committed events to browsers as Server-Sent Events.
//
// A [Feed] is an [http.Handler]. Each connected client gets the events of
// one tenant (the one the application's [Authorizer] returns for the
// request), optionally narrowed to a few event types with the `types` query
// parameter. Every SSE message's `id:` is the event's log position
// (`txid/seq`, see [projector.Position]), so a browser that reconnects with
// `Last-Event-ID` gets every event it missed, gap-free and in order, then
// goes live (promise 15, docs/guarantees.md).
//
// One per-instance consumer per process ([Feed.Projection], registered on
// the application's dispatcher) fans committed events out to every
// connected client: there is no database read per browser while clients
// keep up. A reconnecting client first reads what it missed straight from
// the log in bounded batches, then joins the fan-out with no gap and no
// duplicate at the hand-over.
//
// Each client has a bounded buffer ([Config.BufferSize]); a client that
// falls further behind is sent `event: dropped` and disconnected, and loses
// nothing when it reconnects with its Last-Event-ID.
//
// A request whose Host header is neither an IP address, a localhost name
// nor one of [Config.AllowedHosts] is answered 421 before the Authorizer is
// asked: set AllowedHosts to the names browsers reach the feed by. See the "Live feed"
// section of docs/projections.md.
package live

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/hostcheck"
	"github.com/projectorhq/projector/internal/tracing"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// ErrInvalidConfig: a [Config] field is missing or out of range. New
// returns it wrapped with the field and the allowed range.
var ErrInvalidConfig = errors.New("live: invalid config")

// ErrUnauthenticated is what an [Authorizer] returns (wrapped or not) when
// the request carries no credentials at all: the feed answers 401. Any other
// error, or an empty tenant, is answered 403.
var ErrUnauthenticated = errors.New("live: unauthenticated")

// Authorizer returns the tenant whose events the request may watch. It is
// the application's own check (session cookie, bearer token, …): the feed
// never sends an event of any other tenant. Return an error wrapping
// [ErrUnauthenticated] for "who are you?" (401), any other error or an
// empty tenant for "not allowed" (403). Return [projector.SystemTenant] to
// watch system-tenant streams.
type Authorizer func(r *http.Request) (tenant string, err error)

// Defaults and bounds of [Config].
const (
	// DefaultName is the consumer name of a feed that names none.
	DefaultName = "live"
	// DefaultBufferSize is how many events may wait for one slow client
	// before it is dropped: about a second of a busy log, a few hundred
	// kilobytes at most (each queued event is shared by every client that
	// gets it, so the bytes are counted once per process).
	DefaultBufferSize = 1024
	MinBufferSize     = 1
	MaxBufferSize     = 1 << 20
	// DefaultHeartbeat is how often an idle stream gets a `: heartbeat`
	// comment, well under the 60 s idle timeout of common proxies.
	DefaultHeartbeat = 15 * time.Second
	MinHeartbeat     = 10 * time.Millisecond
	MaxHeartbeat     = 10 * time.Minute
	// DefaultCatchUpBatch is how many events one catch-up read of a
	// reconnecting client takes from the log.
	DefaultCatchUpBatch = 500
	MinCatchUpBatch     = 1
	MaxCatchUpBatch     = 10_000
	// DefaultWriteTimeout bounds one write to a client; a client whose
	// connection accepts nothing for that long is disconnected.
	DefaultWriteTimeout = 10 * time.Second
	MinWriteTimeout     = 100 * time.Millisecond
	MaxWriteTimeout     = 10 * time.Minute
	// DefaultMaxClients and MaxMaxClients bound Config.MaxClients.
	DefaultMaxClients = 10_000
	MaxMaxClients     = 1_000_000
	// MaxTypes bounds the event types one request may name.
	MaxTypes = 64
)

// Config configures a [Feed]. Store is required; zero fields take the
// documented defaults.
type Config struct {
	// Store is the event store the feed reads.
	Store *postgres.Store
	// Authorize returns the tenant a request may watch. Without it every
	// request is refused (403): a feed never guesses a tenant.
	Authorize Authorizer
	// EventTypes are the event types the feed serves; default every type
	// the store's registry defines when New runs. A request may narrow them
	// with ?types=a,b, never widen them.
	EventTypes []string
	// Name is the feed's consumer name; default [DefaultName]. Two feeds
	// on one dispatcher need two names.
	Name string
	// Payloads puts each event's JSON payload in its message. Off by
	// default: payloads may carry personal data, and the envelope (type,
	// stream, version) is often enough to tell a page what to refetch.
	Payloads bool
	// BufferSize is how many events may queue for one client before it is
	// dropped; default [DefaultBufferSize], between [MinBufferSize] and
	// [MaxBufferSize]. A fan-out batch with none of the client's events
	// counts as one. The feed's consumer reads batches of at most this
	// many events (and at most [projection.DefaultBatchSize]), so a client
	// is dropped only when it falls a whole buffer behind.
	BufferSize int
	// Heartbeat is the interval of `: heartbeat` comments on every stream;
	// default [DefaultHeartbeat], between [MinHeartbeat] and [MaxHeartbeat].
	Heartbeat time.Duration
	// CatchUpBatch is the size of the log reads that bring a reconnecting
	// client up to date; default [DefaultCatchUpBatch], between
	// [MinCatchUpBatch] and [MaxCatchUpBatch].
	CatchUpBatch int
	// WriteTimeout bounds each write to a client; default
	// [DefaultWriteTimeout], between [MinWriteTimeout] and [MaxWriteTimeout].
	WriteTimeout time.Duration
	// Logger receives the feed's log lines; default slog.Default().
	Logger *slog.Logger
	// TracerProvider traces each fan-out of a batch to the connected
	// clients (docs/tracing.md); nil means the global provider.
	TracerProvider trace.TracerProvider
	// MaxClients bounds the streams served at once, catching up or live;
	// one more is answered 503 with Retry-After, so a flood of idle
	// streams cannot use up the process's file descriptors (and with them
	// its metrics and probes). Default [DefaultMaxClients], between 1 and
	// [MaxMaxClients].
	MaxClients int
	// AllowedHosts are the names, besides localhost names and IP
	// addresses, that the feed answers to in a request's Host header: the
	// names browsers reach it by ("app.example.com", "*.example.com" for
	// the names under example.com, "*" for any). Any other Host is answered
	// 421 Misdirected Request before Authorize is asked, so that a web page
	// whose name its attacker points at the feed's address (DNS rebinding)
	// cannot read it. No scheme, no port; an entry that could never match
	// is [ErrInvalidConfig].
	AllowedHosts []string
}

// Feed is the live feed: an [http.Handler] and the per-instance consumer
// that feeds it. Create it with [New], register [Feed.Projection] on the
// dispatcher, mount the feed, and call [Feed.Close] when the server shuts
// down (http.Server.RegisterOnShutdown(feed.Close)).
type Feed struct {
	cfg    Config
	served map[string]bool
	types  []string
	proj   *projection.Async
	hub    *hub
	logger *slog.Logger
	hosts  *hostcheck.Checker
	tracer trace.Tracer
	// streams counts the requests being streamed (Config.MaxClients).
	streams atomic.Int64
	// joining, when set, runs between a stream's catch-up read and its
	// joining the fan-out (tests that commit a batch in that gap).
	joining func()
}

// New validates cfg and returns a feed. Its consumer does nothing until
// [Feed.Projection] is handed to a started dispatcher.
func New(cfg Config) (*Feed, error) {
	if cfg.Store == nil {
		return nil, fmt.Errorf("%w: Store is required", ErrInvalidConfig)
	}
	cfg.Name = cmp.Or(cfg.Name, DefaultName)
	cfg.BufferSize = cmp.Or(cfg.BufferSize, DefaultBufferSize)
	cfg.Heartbeat = cmp.Or(cfg.Heartbeat, DefaultHeartbeat)
	cfg.CatchUpBatch = cmp.Or(cfg.CatchUpBatch, DefaultCatchUpBatch)
	cfg.WriteTimeout = cmp.Or(cfg.WriteTimeout, DefaultWriteTimeout)
	cfg.MaxClients = cmp.Or(cfg.MaxClients, DefaultMaxClients)
	switch {
	case cfg.MaxClients < 1 || cfg.MaxClients > MaxMaxClients:
		return nil, fmt.Errorf("%w: MaxClients %d outside 1..%d", ErrInvalidConfig, cfg.MaxClients, MaxMaxClients)
	case cfg.BufferSize < MinBufferSize || cfg.BufferSize > MaxBufferSize:
		return nil, fmt.Errorf("%w: BufferSize %d outside %d..%d", ErrInvalidConfig, cfg.BufferSize, MinBufferSize, MaxBufferSize)
	case cfg.Heartbeat < MinHeartbeat || cfg.Heartbeat > MaxHeartbeat:
		return nil, fmt.Errorf("%w: Heartbeat %v outside %v..%v", ErrInvalidConfig, cfg.Heartbeat, MinHeartbeat, MaxHeartbeat)
	case cfg.CatchUpBatch < MinCatchUpBatch || cfg.CatchUpBatch > MaxCatchUpBatch:
		return nil, fmt.Errorf("%w: CatchUpBatch %d outside %d..%d", ErrInvalidConfig, cfg.CatchUpBatch, MinCatchUpBatch, MaxCatchUpBatch)
	case cfg.WriteTimeout < MinWriteTimeout || cfg.WriteTimeout > MaxWriteTimeout:
		return nil, fmt.Errorf("%w: WriteTimeout %v outside %v..%v", ErrInvalidConfig, cfg.WriteTimeout, MinWriteTimeout, MaxWriteTimeout)
	}
	hosts, err := hostcheck.New(cfg.AllowedHosts)
	if err != nil {
		return nil, fmt.Errorf("%w: AllowedHosts: %w", ErrInvalidConfig, err)
	}
	reg := cfg.Store.Registry()
	types := cfg.EventTypes
	if len(types) == 0 {
		types = reg.Names()
	}
	if len(types) == 0 {
		return nil, fmt.Errorf("%w: the store's registry defines no event types", ErrInvalidConfig)
	}
	served := make(map[string]bool, len(types))
	names := make([]projection.TypeName, 0, len(types))
	for _, t := range types {
		if _, ok := reg.Lookup(t); !ok {
			return nil, fmt.Errorf("%w: event type %s is not defined in the store's registry", ErrInvalidConfig, projector.Printable(t))
		}
		if served[t] {
			return nil, fmt.Errorf("%w: event type %s listed twice", ErrInvalidConfig, projector.Printable(t))
		}
		served[t] = true
		names = append(names, typeName(t))
	}
	f := &Feed{cfg: cfg, served: served, types: append([]string(nil), types...), logger: cmp.Or(cfg.Logger, slog.Default()), hosts: hosts,
		tracer: tracing.Tracer(cfg.TracerProvider)}
	f.hub = newHub(f)
	f.proj = projection.NewAsync(cfg.Name, projection.AsyncConfig{
		Delivery:    projection.PerInstance,
		StartFrom:   projection.FromNow,
		ErrorMode:   projection.SkipApplyErrors,
		RawPayloads: true,
		// A fan-out batch never exceeds one client's buffer on its own:
		// only a client that falls a buffer behind is dropped.
		BatchSize:   min(projection.DefaultBatchSize, cfg.BufferSize),
		AfterCommit: f.hub.publish,
	})
	if err := projection.OnBatch(f.proj, noop, names...); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if err := f.proj.Validate(reg); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return f, nil
}

// Projection returns the feed's per-instance consumer: add it to the
// dispatcher's Config.Projections. It writes nothing; its commits hand each
// batch of committed events to the connected clients.
func (f *Feed) Projection() *projection.Async { return f.proj }

// Clients returns how many clients are connected and live (caught up and
// receiving the fan-out).
func (f *Feed) Clients() int { return f.hub.count() }

// Close ends every stream (each gets a `: shutting down` comment, and
// browsers reconnect by themselves) and refuses new requests with 503. It
// is safe to call more than once; pass it to http.Server.RegisterOnShutdown,
// because Shutdown alone waits for streams that never end.
func (f *Feed) Close() { f.hub.close() }

// typeName adapts a type name string to [projection.TypeName].
type typeName string

func (t typeName) Name() string { return string(t) }
