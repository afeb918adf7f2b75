package projection

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
)

// ErrInvalidDefinition: a projection was defined wrongly (a handler for an
// undefined or unnamed event type, the same type handled twice, a bad
// name). Returned at registration and again when the projection is bound to
// a store or a dispatcher, so an ignored registration error still stops the
// start.
var ErrInvalidDefinition = errors.New("projection: invalid definition")

// HandlerFunc handles one event inside tx. Its writes commit with the
// append (inline projections) or with the consumer's cursor (async
// projections), never separately.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, ev projector.Event) error

// Typed is a handler for events whose payload is T.
type Typed[T any] func(ctx context.Context, tx pgx.Tx, ev projector.Event, payload T) error

// TypeName is anything that names an event type: the projector.EventType
// handles returned by projector.Define.
type TypeName interface{ Name() string }

// BatchFunc handles a whole batch at once, so a projection can write
// set-based (one unnest upsert for a thousand events instead of a thousand
// statements).
type BatchFunc func(ctx context.Context, tx pgx.Tx, b Batch) error

// Batch is what a [BatchFunc] receives: the events of one tenant, grouped
// by stream, each stream's events in version order.
type Batch struct {
	// Tenant is the tenant every event of the batch belongs to; the
	// transaction is scoped to it.
	Tenant string
	// Streams are in order of each stream's first event in the log.
	Streams []StreamEvents
}

// StreamEvents are one stream's events within a batch, in version order.
type StreamEvents struct {
	Stream projector.StreamRef
	Events []projector.Event
}

// Len returns the number of events in the batch.
func (b Batch) Len() int {
	n := 0
	for _, s := range b.Streams {
		n += len(s.Events)
	}
	return n
}

// Projection is what [On] and [OnBatch] register handlers on: an [*Inline]
// or an [*Async] projection.
type Projection interface {
	Name() string
	handlers() *table
}

// table holds a projection's handlers and the first registration error.
type table struct {
	byType map[string]HandlerFunc
	types  []string // in registration order
	batch  BatchFunc
	typed  bool // some handler came from On and needs decoded payloads
	err    error
}

func (t *table) fail(name string, err error) error {
	err = fmt.Errorf("%w: projection %q: %w", ErrInvalidDefinition, name, err)
	if t.err == nil {
		t.err = err
	}
	return err
}

// On registers fn for events of type et on p. It is an error to handle a
// type twice, to mix per-event and batch handlers, or to pass an event type
// handle that was never defined (its zero value).
func On[T any](p Projection, et projector.EventType[T], fn Typed[T]) error {
	if fn == nil {
		return p.handlers().fail(p.Name(), fmt.Errorf("nil handler for %q", et.Name()))
	}
	p.handlers().typed = true
	return OnEvent(p, et, func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		payload, ok := ev.Payload.(T)
		if !ok {
			return fmt.Errorf("%w: %s handler of %q expects %T, got %T", projector.ErrInvalidPayload, ev.Type, p.Name(), payload, ev.Payload)
		}
		return fn(ctx, tx, ev, payload)
	})
}

// OnEvent registers an untyped handler for events of type et on p: for
// handlers that only need the envelope or the raw JSON in ev.Data.
func OnEvent(p Projection, et TypeName, fn HandlerFunc) error {
	t := p.handlers()
	if et == nil || et.Name() == "" {
		return t.fail(p.Name(), errors.New("handler for an undefined event type (a zero EventType: define it with projector.Define first)"))
	}
	name := et.Name()
	switch {
	case fn == nil:
		return t.fail(p.Name(), fmt.Errorf("nil handler for %q", name))
	case t.batch != nil:
		return t.fail(p.Name(), fmt.Errorf("per-event handler for %q on a projection with a batch handler", name))
	case t.byType[name] != nil:
		return t.fail(p.Name(), fmt.Errorf("%q handled twice", name))
	}
	if t.byType == nil {
		t.byType = map[string]HandlerFunc{}
	}
	t.byType[name] = func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		if err := refusedUpcast(ctx, &ev); err != nil {
			return err
		}
		return fn(ctx, tx, ev)
	}
	t.types = append(t.types, name)
	return nil
}

// OnBatch registers fn as p's batch handler for the event types given. A
// projection has either one batch handler or per-event handlers.
func OnBatch(p Projection, fn BatchFunc, types ...TypeName) error {
	t := p.handlers()
	switch {
	case fn == nil:
		return t.fail(p.Name(), errors.New("nil batch handler"))
	case t.batch != nil:
		return t.fail(p.Name(), errors.New("two batch handlers"))
	case len(t.byType) > 0:
		return t.fail(p.Name(), errors.New("batch handler on a projection with per-event handlers"))
	case len(types) == 0:
		return t.fail(p.Name(), errors.New("batch handler for no event types"))
	}
	seen := map[string]bool{}
	for _, et := range types {
		if et == nil || et.Name() == "" {
			return t.fail(p.Name(), errors.New("batch handler for an undefined event type (a zero EventType)"))
		}
		if seen[et.Name()] {
			return t.fail(p.Name(), fmt.Errorf("%q listed twice", et.Name()))
		}
		seen[et.Name()] = true
	}
	t.batch = func(ctx context.Context, tx pgx.Tx, b Batch) error {
		if err := refusedUpcastIn(ctx, b); err != nil {
			return err
		}
		return fn(ctx, tx, b)
	}
	for _, et := range types {
		t.types = append(t.types, et.Name())
	}
	return nil
}

// validate checks the table against a registry: every handled type must be
// defined there, and something must be handled at all.
func (t *table) validate(name string, reg *projector.Registry) error {
	if t.err != nil {
		return t.err
	}
	if len(t.types) == 0 {
		return fmt.Errorf("%w: projection %q handles no event types", ErrInvalidDefinition, name)
	}
	for _, typ := range t.types {
		if _, ok := reg.Lookup(typ); !ok {
			return fmt.Errorf("%w: projection %q handles %q, which the store's registry does not define", ErrInvalidDefinition, name, typ)
		}
	}
	return nil
}

func (t *table) eventTypes() []string { return slices.Clone(t.types) }

// groupBatch splits events (in log order) into one batch per tenant, each
// grouping its events by stream. Per-stream order is kept because a stream
// belongs to one tenant and its events are placed in the order they come.
// Every stream's events share one backing array: two passes, a handful of
// allocations per batch rather than one per stream.
func groupBatch(events []projector.Event) []Batch {
	type group struct{ batch, stream, n, first int }
	var batches []Batch
	byTenant := map[string]int{}
	// Keyed by stream id alone (one string to hash, not three); the rare id
	// shared by streams of another type or tenant goes to byRef.
	byID := make(map[string]int, len(events)/2)
	var byRef map[projector.StreamRef]int
	var groups []group
	of := make([]int, len(events)) // event i belongs to groups[of[i]]
	for i := range events {
		ref := events[i].Stream
		gi, ok := byID[ref.ID]
		if ok && events[groups[gi].first].Stream != ref {
			gi, ok = byRef[ref]
		}
		if !ok {
			bi, ok := byTenant[ref.Tenant]
			if !ok {
				bi = len(batches)
				byTenant[ref.Tenant] = bi
				batches = append(batches, Batch{Tenant: ref.Tenant})
			}
			gi = len(groups)
			if first, taken := byID[ref.ID]; !taken {
				byID[ref.ID] = gi
			} else if events[groups[first].first].Stream != ref {
				if byRef == nil {
					byRef = map[projector.StreamRef]int{}
				}
				byRef[ref] = gi
			}
			groups = append(groups, group{batch: bi, stream: len(batches[bi].Streams), first: i})
			batches[bi].Streams = append(batches[bi].Streams, StreamEvents{Stream: ref})
		}
		groups[gi].n++
		of[i] = gi
	}
	backing := make([]projector.Event, len(events))
	off := 0
	for _, g := range groups {
		batches[g.batch].Streams[g.stream].Events = backing[off : off : off+g.n]
		off += g.n
	}
	for i := range events {
		g := groups[of[i]]
		s := &batches[g.batch].Streams[g.stream]
		s.Events = append(s.Events, events[i])
	}
	return batches
}
