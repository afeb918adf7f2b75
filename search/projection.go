package search

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
)

// Handler turns one event, its payload typed as T, into index operations
// on w. It must not have other effects: it may run again for the same
// event (a retried batch, a replay).
type Handler[T any] func(ctx context.Context, ev projector.Event, payload T, w *Writer) error

// Config configures a search projection.
type Config struct {
	// Index is the one index the projection maintains.
	Index Index
	// Backend holds the index.
	Backend Backend
	// Async configures the consumer the projection runs as: error mode,
	// batch size, retries, start position. RawPayloads may not be set
	// (handlers are typed); Tables are filled in from a backend that keeps
	// the index in PostgreSQL.
	Async projection.AsyncConfig
}

// Projection is a search projection: typed handlers that map events to
// operations on one index, run as an async consumer on the dispatcher, so
// it gets halt-on-poison, continuous mode, status, metrics and rebuilds
// like every other consumer. Define it with [New] and [On], call
// [Projection.Ensure] at start, and give [Projection.Async] to a
// dispatcher.
type Projection struct {
	name string
	cfg  Config
	mu   sync.Mutex
	fns  map[string]func(ctx context.Context, ev projector.Event, w *Writer) error
	// types are the handled types in registration order.
	types []projection.TypeName
	err   error
	async *projection.Async
}

// New returns a search projection called name (its consumer's name).
// Definition errors are kept and returned by [Projection.Async].
func New(name string, cfg Config) *Projection {
	cfg.Index = cfg.Index.withDefaults()
	p := &Projection{name: name, cfg: cfg, fns: map[string]func(context.Context, projector.Event, *Writer) error{}}
	switch {
	case cfg.Backend == nil:
		p.fail(errors.New("Config.Backend is nil"))
	case cfg.Async.Delivery == projection.PerInstance:
		p.fail(errors.New("Config.Async.Delivery is per-instance: an index has one writer, the consumer's one shard (Shared)"))
	case cfg.Async.RawPayloads:
		p.fail(errors.New("Config.Async.RawPayloads: search handlers are typed and need decoded payloads"))
	default:
		if err := cfg.Index.Validate(); err != nil {
			p.fail(err)
		}
	}
	return p
}

func (p *Projection) fail(err error) error {
	err = fmt.Errorf("%w: search projection %q: %w", projection.ErrInvalidDefinition, p.name, err)
	if p.err == nil {
		p.err = err
	}
	return err
}

// Name returns the projection's (and its consumer's) name.
func (p *Projection) Name() string { return p.name }

// SearchIndex returns the index the projection maintains.
func (p *Projection) SearchIndex() Index { return p.cfg.Index }

// SearchBackend returns the backend holding the index.
func (p *Projection) SearchBackend() Backend { return p.cfg.Backend }

// On registers fn for events of type et on p. Handling a type twice, an
// undefined type (a zero EventType) or registering after
// [Projection.Async] is an error, kept and returned again by Async.
func On[T any](p *Projection, et projector.EventType[T], fn Handler[T]) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	name := et.Name()
	switch {
	case p.async != nil:
		return p.fail(fmt.Errorf("handler for %q registered after Async", name))
	case name == "":
		return p.fail(errors.New("handler for an undefined event type (a zero EventType: define it with projector.Define first)"))
	case fn == nil:
		return p.fail(fmt.Errorf("nil handler for %q", name))
	case p.fns[name] != nil:
		return p.fail(fmt.Errorf("%q handled twice", name))
	}
	p.fns[name] = func(ctx context.Context, ev projector.Event, w *Writer) error {
		payload, ok := ev.Payload.(T)
		if !ok {
			return fmt.Errorf("%w: %s handler of %q expects %T, got %T", projector.ErrInvalidPayload, ev.Type, p.name, payload, ev.Payload)
		}
		return fn(ctx, ev, payload, w)
	}
	p.types = append(p.types, et)
	return nil
}

// Ensure creates the index on the backend if it does not exist and applies
// its settings. Call it at start, before the dispatcher runs the
// projection: a backend that cannot be reached or refuses the settings is a
// start-up error with the backend's reason, not a halted shard later.
func (p *Projection) Ensure(ctx context.Context) error {
	if p.err != nil {
		return p.err
	}
	if err := p.cfg.Backend.Ensure(ctx, p.cfg.Index); err != nil {
		return fmt.Errorf("search projection %q: ensure %s index %q: %w", p.name, p.cfg.Backend.Kind(), p.cfg.Index.Name, err)
	}
	return nil
}

// Async returns the consumer that runs the projection on a dispatcher,
// built on the first call; handlers may not be added afterwards. It
// returns the first definition error.
func (p *Projection) Async() (*projection.Async, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return nil, p.err
	}
	if p.async != nil {
		return p.async, nil
	}
	if len(p.types) == 0 {
		return nil, p.fail(errors.New("handles no event types"))
	}
	cfg := p.cfg.Async
	if owner, ok := p.cfg.Backend.(TableOwner); ok {
		cfg.Tables = append(slices.Clone(cfg.Tables), owner.Tables(p.cfg.Index)...)
	}
	if rs, ok := p.cfg.Backend.(RebuildSwapper); ok && cfg.External == nil {
		cfg.External = external{p: p, rs: rs}
	}
	a := projection.NewAsync(p.name, cfg)
	if err := projection.OnBatch(a, p.apply, p.types...); err != nil {
		return nil, err
	}
	p.async = a
	byAsync.Store(a, p)
	return a, nil
}

// byAsync maps the consumers [Projection.Async] built back to their search
// projections, for tools that get an application's consumers as
// *projection.Async (the CLI's wiring).
var byAsync sync.Map

// ProjectionOf returns the search projection a consumer was built from by
// [Projection.Async], if it was.
func ProjectionOf(a *projection.Async) (*Projection, bool) {
	p, ok := byAsync.Load(a)
	if !ok {
		return nil, false
	}
	return p.(*Projection), true
}

// apply runs the handlers over one tenant's events of a dispatcher batch,
// in log order, and hands the operations to the backend in one call. The
// dispatcher groups a batch by stream; the operations are put back in log
// order so a delete-where and an upsert of another stream keep theirs.
func (p *Projection) apply(ctx context.Context, tx pgx.Tx, b projection.Batch) error {
	events := make([]projector.Event, 0, b.Len())
	for _, s := range b.Streams {
		events = append(events, s.Events...)
	}
	slices.SortStableFunc(events, func(a, b projector.Event) int {
		switch {
		case a.Position.Less(b.Position):
			return -1
		case b.Position.Less(a.Position):
			return 1
		}
		return 0
	})
	w := &Writer{idx: p.cfg.Index, tenant: b.Tenant}
	if p.cfg.Index.Shared {
		w.tenant = ""
	}
	for _, ev := range events {
		fn := p.fns[ev.Type]
		if fn == nil {
			continue // the dispatcher reads only the handled types
		}
		if err := fn(ctx, ev, w); err != nil {
			return fmt.Errorf("%s v%d of %s: %w", ev.Type, ev.Version, ev.Stream, err)
		}
	}
	if len(w.ops) == 0 {
		return nil
	}
	backend := p.cfg.Backend
	id, shadow := projection.ShadowRebuild(ctx)
	if shadow {
		if rs, ok := backend.(RebuildSwapper); ok {
			backend = rs.RebuildShadow(id) // a blue/green rebuild's shadow pass
		}
	}
	sctx, span := startIndexSpan(ctx, p.cfg.Backend.Kind(), p.cfg.Index.Name, w.ops, shadow)
	err := backend.Apply(sctx, tx, p.cfg.Index, w.ops)
	endIndexSpan(span, err)
	if err != nil {
		return fmt.Errorf("%s index %q: %w", p.cfg.Backend.Kind(), p.cfg.Index.Name, err)
	}
	return nil
}
