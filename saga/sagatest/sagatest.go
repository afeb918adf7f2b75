// Package sagatest tests sagas. [Fixture] runs a saga's handlers without a
// database, the way Axon's saga test fixture does: given these events, and
// this much time passing, expect these appended events, this state and
// these pending timeouts. [Run] runs a saga against a real database in a
// user's own test, with its dispatcher and timeout runner.
//
// The fixture applies the same decisions the database path applies, in the
// same order (state, appends, timeouts scheduled and cancelled, completion,
// late and ignored events), so a saga that passes its fixture tests differs
// from production only in what the fixture cannot run: aggregate commands
// ([saga.Command]) are recorded, not executed.
package sagatest

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection/projectiontest"
	"github.com/projectorhq/projector/saga"
)

// Start is the fixture clock's start: the same instant as
// projectiontest.Start.
var Start = projectiontest.Start

// Fixture drives one saga type in memory.
type Fixture[S any] struct {
	t        testing.TB
	s        *saga.Saga[S]
	reg      *projector.Registry
	clock    *projectiontest.Clock
	inst     map[instKey]*instance[S]
	versions map[projector.StreamRef]int64
	appended []Appended
	commands []saga.CommandOp
	ignored  int
	late     int
	// tenant is whose instances State and the Expect methods look up:
	// the system tenant unless InTenant named another.
	tenant string
}

type instKey struct{ tenant, key string }

type instance[S any] struct {
	snap     saga.Snapshot[S]
	timeouts map[string]pending
	late     int
}

type pending struct {
	id uuid.UUID
	at time.Time
}

// Appended is an event a saga appended, as the fixture recorded it.
type Appended struct {
	Stream  projector.StreamRef
	Payload any
	// CausationID is the id of the event or timeout whose step appended
	// it; CorrelationID the instance's.
	CausationID   uuid.UUID
	CorrelationID uuid.UUID
}

// New returns a fixture for s over reg (the registry its event types and
// the payloads it appends are defined in), its clock at [Start]. The saga's
// own clock is not used: the fixture's is, moved by [Fixture.Advance].
func New[S any](t testing.TB, s *saga.Saga[S], reg *projector.Registry) *Fixture[S] {
	t.Helper()
	if err := s.Validate(reg); err != nil {
		t.Fatalf("sagatest: %v", err)
	}
	return &Fixture[S]{t: t, s: s, reg: reg, clock: projectiontest.NewClock(Start), inst: map[instKey]*instance[S]{},
		versions: map[projector.StreamRef]int64{}, tenant: projector.SystemTenant}
}

// InTenant makes State, Timeouts and the Expect methods that take a key
// look up the instances of tenant (those its events' streams,
// projector.TenantStream, start), instead of the system tenant's, until it
// is called again.
func (f *Fixture[S]) InTenant(tenant string) *Fixture[S] {
	f.tenant = tenant
	return f
}

// Now returns the fixture's clock.
func (f *Fixture[S]) Now() time.Time { return f.clock.Now() }

// UseClock makes the fixture read and move c instead of its own clock, so
// a saga fixture and a projection spec (package projectiontest), or the
// code under test, share one time. Call it before the first event.
func (f *Fixture[S]) UseClock(c *projectiontest.Clock) *Fixture[S] {
	f.clock = c
	return f
}

// Clock returns the fixture's clock.
func (f *Fixture[S]) Clock() *projectiontest.Clock { return f.clock }

// Given delivers events, each payload appended to stream (as the next
// version) and handled, with everything the saga appends in return handled
// in turn when the saga handles its type, as the dispatcher would. A
// step's error fails the test.
func (f *Fixture[S]) Given(stream projector.StreamRef, payloads ...any) *Fixture[S] {
	f.t.Helper()
	if err := f.Deliver(stream, payloads...); err != nil {
		f.t.Fatalf("sagatest: %v", err)
	}
	return f
}

// Deliver is [Fixture.Given] returning the first step's error instead of
// failing: for testing that a step is refused. The failing step changes
// nothing, as in the database.
func (f *Fixture[S]) Deliver(stream projector.StreamRef, payloads ...any) error {
	queue := make([]projector.Event, 0, len(payloads))
	for _, p := range payloads {
		ev, err := f.event(stream, p, projector.Metadata{CorrelationID: uuid.New()})
		if err != nil {
			return err
		}
		queue = append(queue, ev)
	}
	for len(queue) > 0 {
		ev := queue[0]
		queue = queue[1:]
		more, err := f.handle(ev)
		if err != nil {
			return err
		}
		queue = append(queue, more...)
	}
	return nil
}

func (f *Fixture[S]) event(stream projector.StreamRef, payload any, md projector.Metadata) (projector.Event, error) {
	enc, err := f.reg.Encode(payload)
	if err != nil {
		return projector.Event{}, fmt.Errorf("sagatest: %w", err)
	}
	if stream.Tenant == "" {
		stream.Tenant = projector.SystemTenant
	}
	f.versions[stream]++
	return projector.Event{ID: uuid.New(), Stream: stream, Version: f.versions[stream], Type: enc.Type,
		SchemaVersion: enc.SchemaVersion, Data: enc.Data, Payload: reflect.ValueOf(payload).Interface(), Metadata: md, RecordedAt: f.clock.Now()}, nil
}

// handle takes one event's step and returns the events it appended that
// the saga handles.
func (f *Fixture[S]) handle(ev projector.Event) ([]projector.Event, error) {
	key, starts, handled, err := f.s.Route(ev)
	if err != nil || !handled {
		return nil, err
	}
	k := instKey{ev.Stream.Tenant, key}
	in, ok := f.inst[k]
	isNew := false
	if !ok {
		if !starts {
			f.ignored++
			return nil, nil
		}
		in = &instance[S]{snap: saga.Snapshot[S]{ID: uuid.New(), Key: key, Tenant: ev.Stream.Tenant,
			CorrelationID: ev.Metadata.CorrelationID, Status: saga.Active}, timeouts: map[string]pending{}}
		isNew = true
	}
	if in.snap.Status != saga.Active {
		in.late++
		f.late++
		return nil, nil
	}
	cur, err := f.stored(in.snap)
	if err != nil {
		return nil, err
	}
	d, err := f.s.Decide(context.Background(), f.reg, cur, isNew, ev, f.clock.Now())
	if err != nil {
		return nil, err
	}
	if isNew {
		f.inst[k] = in
	}
	return f.apply(in, d, ev.ID)
}

func (f *Fixture[S]) apply(in *instance[S], d saga.Decision[S], cause uuid.UUID) ([]projector.Event, error) {
	var out []projector.Event
	for _, a := range d.Appends {
		for _, p := range a.Payloads {
			f.appended = append(f.appended, Appended{Stream: a.Stream, Payload: p, CausationID: cause, CorrelationID: in.snap.CorrelationID})
			ev, err := f.event(a.Stream, p, projector.Metadata{CorrelationID: in.snap.CorrelationID, CausationID: cause})
			if err != nil {
				return nil, err
			}
			if _, _, handled, _ := f.s.Route(ev); handled {
				out = append(out, ev)
			}
		}
	}
	for _, t := range d.Timeouts {
		if t.Cancel {
			delete(in.timeouts, t.Name)
		} else {
			in.timeouts[t.Name] = pending{id: uuid.New(), at: t.At}
		}
	}
	f.commands = append(f.commands, d.Commands...)
	in.snap.State = d.State
	if cur, err := f.stored(in.snap); err == nil {
		in.snap.State = cur.State
	} else {
		return nil, err
	}
	in.snap.Version++
	if d.Completed {
		in.snap.Status = saga.Completed
		clear(in.timeouts)
	}
	return out, nil
}

// Advance moves the clock by d, firing every timeout that falls due on the
// way, each at its due time, earliest first, with what its step appends
// handled in turn. A step's error fails the test.
func (f *Fixture[S]) Advance(d time.Duration) *Fixture[S] {
	f.t.Helper()
	if d < 0 {
		f.t.Fatalf("sagatest: advance by %v: the clock does not go back", d)
	}
	end := f.clock.Now().Add(d)
	for {
		in, name, p, ok := f.nextDue(end)
		if !ok {
			break
		}
		if p.at.After(f.clock.Now()) {
			f.clock.Set(p.at) // a shared clock never goes back
		}
		delete(in.timeouts, name)
		cur, err := f.stored(in.snap)
		if err != nil {
			f.t.Fatalf("sagatest: %v", err)
		}
		dec, err := f.s.DecideTimeout(context.Background(), f.reg, cur, saga.Timeout{ID: p.id, Name: name, Due: p.at}, f.clock.Now())
		if err != nil {
			f.t.Fatalf("sagatest: timeout %q of %q: %v", name, in.snap.Key, err)
		}
		more, err := f.apply(in, dec, p.id)
		if err == nil {
			for _, ev := range more {
				var evs []projector.Event
				if evs, err = f.handle(ev); err != nil {
					break
				}
				more = append(more, evs...)
			}
		}
		if err != nil {
			f.t.Fatalf("sagatest: timeout %q of %q: %v", name, in.snap.Key, err)
		}
	}
	f.clock.Set(end)
	return f
}

func (f *Fixture[S]) nextDue(end time.Time) (*instance[S], string, pending, bool) {
	var best *instance[S]
	var bestName string
	var bestP pending
	for _, in := range f.inst {
		for name, p := range in.timeouts {
			if p.at.After(end) {
				continue
			}
			if best == nil || p.at.Before(bestP.at) || (p.at.Equal(bestP.at) && in.snap.Key+name < best.snap.Key+bestName) {
				best, bestName, bestP = in, name, p
			}
		}
	}
	return best, bestName, bestP, best != nil
}

// State returns the state of the instance of key (of the system tenant, or
// of the one [Fixture.InTenant] names) and its status; the test fails if
// there is none.
func (f *Fixture[S]) State(key string) (S, saga.Status) {
	f.t.Helper()
	in := f.instance(key)
	return in.snap.State, in.snap.Status
}

func (f *Fixture[S]) instance(key string) *instance[S] {
	f.t.Helper()
	in, ok := f.inst[instKey{f.tenant, key}]
	if !ok {
		// The likeliest slip: the instance is another tenant's.
		var elsewhere []string
		for k := range f.inst {
			if k.key == key {
				elsewhere = append(elsewhere, k.tenant)
			}
		}
		if len(elsewhere) > 0 {
			slices.Sort(elsewhere)
			f.t.Fatalf("sagatest: no instance for key %q in tenant %s; it has one in %s: look there with InTenant", key, f.tenant, strings.Join(elsewhere, ", "))
		}
		f.t.Fatalf("sagatest: no instance for key %q in tenant %s", key, f.tenant)
	}
	return in
}

// ExpectState fails the test unless the instance of key has state want.
func (f *Fixture[S]) ExpectState(key string, want S) *Fixture[S] {
	f.t.Helper()
	if got, _ := f.State(key); !reflect.DeepEqual(got, want) {
		f.t.Errorf("sagatest: state of %q = %+v, want %+v", key, got, want)
	}
	return f
}

// ExpectStatus fails the test unless the instance of key has status want.
func (f *Fixture[S]) ExpectStatus(key string, want saga.Status) *Fixture[S] {
	f.t.Helper()
	if _, got := f.State(key); got != want {
		f.t.Errorf("sagatest: status of %q = %s, want %s", key, got, want)
	}
	return f
}

// Timeouts returns the pending timeouts of key: name → due time.
func (f *Fixture[S]) Timeouts(key string) map[string]time.Time {
	f.t.Helper()
	out := map[string]time.Time{}
	for name, p := range f.instance(key).timeouts {
		out[name] = p.at
	}
	return out
}

// ExpectTimeouts fails the test unless key's pending timeouts are exactly
// want (name → due time).
func (f *Fixture[S]) ExpectTimeouts(key string, want map[string]time.Time) *Fixture[S] {
	f.t.Helper()
	got := f.Timeouts(key)
	if len(got) == 0 && len(want) == 0 {
		return f
	}
	if !reflect.DeepEqual(got, want) {
		f.t.Errorf("sagatest: timeouts of %q = %v, want %v", key, describe(got), describe(want))
	}
	return f
}

func describe(m map[string]time.Time) []string {
	var out []string
	for name, at := range m {
		out = append(out, name+"@"+at.Format(time.RFC3339Nano))
	}
	sort.Strings(out)
	return out
}

// Appended returns what the saga appended since the last [Fixture.ExpectAppended]
// or [Fixture.Appended] call, and forgets it.
func (f *Fixture[S]) Appended() []Appended {
	out := f.appended
	f.appended = nil
	return out
}

// ExpectAppended fails the test unless the payloads the saga appended
// since the last check are exactly want, in order; then forgets them.
func (f *Fixture[S]) ExpectAppended(want ...any) *Fixture[S] {
	f.t.Helper()
	got := f.Appended()
	payloads := make([]any, len(got))
	for i, a := range got {
		payloads[i] = a.Payload
	}
	if len(payloads) == 0 && len(want) == 0 {
		return f
	}
	if !reflect.DeepEqual(payloads, want) {
		f.t.Errorf("sagatest: appended %+v, want %+v", payloads, want)
	}
	return f
}

// Commands returns the aggregate commands the saga decided since the last
// call, and forgets them.
func (f *Fixture[S]) Commands() []saga.CommandOp {
	out := slices.Clone(f.commands)
	f.commands = nil
	return out
}

// Ignored returns how many events mapped to no instance and could not start one.
func (f *Fixture[S]) Ignored() int { return f.ignored }

// Late returns how many events reached a completed instance.
func (f *Fixture[S]) Late() int { return f.late }

// stored returns snap with its state as the database would hold it: through
// JSON, as the saga stores it. A handler then never shares maps or slices
// with the stored state (a failing step leaves it untouched), and a field
// JSON drops (unexported, no tag) is dropped here too, as in production.
func (f *Fixture[S]) stored(snap saga.Snapshot[S]) (saga.Snapshot[S], error) {
	data, err := json.Marshal(snap.State)
	if err != nil {
		return snap, fmt.Errorf("sagatest: encode state of %q: %w", snap.Key, err)
	}
	var st S
	if err := json.Unmarshal(data, &st); err != nil {
		return snap, fmt.Errorf("sagatest: decode state of %q: %w", snap.Key, err)
	}
	snap.State = st
	return snap, nil
}
