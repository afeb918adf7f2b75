package projectiontest

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/projectorhq/projector"
)

// Fold is a projection written as a pure function of events: it returns
// the model after ev from the model before it. ev.Payload holds the
// decoded payload (its registered Go type, upcast to the current schema
// version), as a handler's typed payload does.
type Fold[M any] func(model M, ev projector.Event) (M, error)

// MemoryConfig is an in-memory spec's set-up. Registry and Fold are
// required.
type MemoryConfig[M any] struct {
	// Registry defines the event types the spec's events are encoded and
	// decoded with, upcasters included.
	Registry *projector.Registry
	// Fold is the projection under test.
	Fold Fold[M]
	// Initial is the model before the first event.
	Initial M
	// Tenant, Deterministic and Clock are as in [Config].
	Tenant        string
	Deterministic bool
	Clock         *Clock
}

// Memory is a Given/When/Then specification of a projection written as a
// [Fold], run with no database at all: events are encoded and decoded by
// the registry exactly as they are on their way through the log, then
// folded in order. It costs microseconds, so the rules of a read model can
// be specified event by event; the [Spec] on PostgreSQL then covers the
// handler that stores the model. Build it with [NewMemory].
type Memory[M any] struct {
	t     testing.TB
	cfg   MemoryConfig[M]
	clock *Clock
	ev    events
	model M
	eventLog
}

// NewMemory starts an in-memory spec. A bad config fails the test, and so
// does a spec that ends with events given and never folded, as with
// [New].
func NewMemory[M any](t testing.TB, cfg MemoryConfig[M]) *Memory[M] {
	t.Helper()
	if cfg.Registry == nil || cfg.Fold == nil {
		t.Fatalf("projectiontest: MemoryConfig.Registry and MemoryConfig.Fold are required")
	}
	m := &Memory[M]{t: t, cfg: cfg, model: cfg.Initial}
	m.clock = clockFor(cfg.Clock, cfg.Deterministic)
	m.ev = newEvents(t, cfg.Registry, cfg.Tenant, cfg.Deterministic, m.clock)
	t.Cleanup(func() { m.checkApplied(t, "Model, ThenModel, Then, ThenFails") })
	return m
}

// Clock returns the spec's clock.
func (m *Memory[M]) Clock() *Clock { return m.clock }

// Given adds events, as [Spec.Given] does.
func (m *Memory[M]) Given(stream projector.StreamRef, payloads ...any) *Memory[M] {
	m.t.Helper()
	m.add(m.ev.fromPayloads(stream, payloads))
	return m
}

// GivenEvents adds events as they are stored, as [Spec.GivenEvents] does.
func (m *Memory[M]) GivenEvents(evs ...projector.Event) *Memory[M] {
	m.t.Helper()
	m.add(m.ev.fromEvents(evs))
	return m
}

// When folds what was given so far, then adds these events.
func (m *Memory[M]) When(stream projector.StreamRef, payloads ...any) *Memory[M] {
	m.t.Helper()
	m.flush()
	return m.Given(stream, payloads...)
}

func (m *Memory[M]) flush() {
	m.t.Helper()
	if err := m.foldPending(); err != nil {
		m.t.Fatalf("projectiontest: %v\n%s", err, m.describe())
	}
}

// foldPending folds the pending events. A failing event leaves the model
// as it was before it, and the events after it stay pending for the next
// check, as [Spec.ThenFails] leaves them.
func (m *Memory[M]) foldPending() error {
	evs := m.pending
	m.pending = nil
	for i, ev := range evs {
		if err := m.fold(ev); err != nil {
			m.settle(evs, i, 1)
			return fmt.Errorf("%s v%d of %s: %w", ev.Type, ev.Version, ev.Stream, err)
		}
	}
	m.settle(evs, len(evs), 0)
	return nil
}

func (m *Memory[M]) fold(ev projector.Event) error {
	payload, data, err := m.cfg.Registry.Decode(ev.Type, ev.SchemaVersion, ev.Data)
	if err != nil {
		return err
	}
	ev.Payload, ev.Data = payload, data
	next, err := m.cfg.Fold(m.model, ev)
	if err != nil {
		return err
	}
	m.model = next
	return nil
}

// Model folds what was given and returns the model.
func (m *Memory[M]) Model() M {
	m.t.Helper()
	m.flush()
	return m.model
}

// ThenModel folds what was given and checks that the model equals want
// (reflect.DeepEqual); a difference fails the test with the events, the
// model wanted and the model found.
func (m *Memory[M]) ThenModel(want M) *Memory[M] {
	m.t.Helper()
	got := m.Model()
	if !reflect.DeepEqual(got, want) {
		m.t.Errorf("projectiontest: model differs\n%s\nwant %+v\nfound %+v", m.describe(), want, got)
	}
	return m
}

// Then folds what was given and runs check on the model; an error it
// returns fails the test, with the events.
func (m *Memory[M]) Then(check func(model M) error) *Memory[M] {
	m.t.Helper()
	if err := check(m.Model()); err != nil {
		m.t.Errorf("projectiontest: check failed: %v\n%s", err, m.describe())
	}
	return m
}

// ThenFails folds what was given and expects an event to fail with an
// error whose message contains want, as [Spec.ThenFails]: the events
// after the failing one are folded by the next check.
func (m *Memory[M]) ThenFails(want string) *Memory[M] {
	m.t.Helper()
	err := m.foldPending()
	switch {
	case err == nil:
		m.t.Errorf("projectiontest: the events applied, want a failure containing %q\n%s", want, m.describe())
	case !strings.Contains(err.Error(), want):
		m.t.Errorf("projectiontest: failed with %v, want a failure containing %q\n%s", err, want, m.describe())
	}
	return m
}
