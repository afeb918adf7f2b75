package projectiontest

import (
	"strconv"
	"testing"

	"github.com/google/uuid"

	"github.com/projectorhq/projector"
)

// idSpace is the namespace of deterministic event ids.
var idSpace = uuid.MustParse("5b0f3a8e-6c1d-4b7e-9a52-7d3c1f0e2a64")

// events makes a spec's events as an append would store them: payloads
// encoded by the registry (and decoded again by the apply path, as events
// read from the log are), versions per stream, positions in order.
type events struct {
	t      testing.TB
	reg    *projector.Registry
	tenant string
	// key names the spec its ids derive from ([deterministicKey]); empty
	// makes random ids.
	key      string
	clock    *Clock
	n        int
	versions map[projector.StreamRef]int64
}

func newEvents(t testing.TB, reg *projector.Registry, tenant string, deterministic bool, clock *Clock) events {
	if tenant == "" {
		tenant = projector.SystemTenant
	}
	e := events{t: t, reg: reg, tenant: tenant, clock: clock, versions: map[projector.StreamRef]int64{}}
	if deterministic {
		e.key = deterministicKey(t)
	}
	return e
}

func (e *events) fromPayloads(stream projector.StreamRef, payloads []any) []projector.Event {
	e.t.Helper()
	out := make([]projector.Event, 0, len(payloads))
	for _, p := range payloads {
		enc, err := e.reg.Encode(p)
		if err != nil {
			e.t.Fatalf("projectiontest: event %d of %s: %v", len(out)+1, stream, err)
		}
		out = append(out, e.fill(projector.Event{Stream: stream, Type: enc.Type, SchemaVersion: enc.SchemaVersion, Data: enc.Data}))
	}
	return out
}

func (e *events) fromEvents(evs []projector.Event) []projector.Event {
	e.t.Helper()
	out := make([]projector.Event, len(evs))
	for i, ev := range evs {
		if ev.Type == "" || len(ev.Data) == 0 {
			e.t.Fatalf("projectiontest: event %d: Type and Data are required", i+1)
		}
		ev.Payload = nil
		out[i] = e.fill(ev)
	}
	return out
}

// fill completes ev as an append would: tenant, version, id, position,
// time.
func (e *events) fill(ev projector.Event) projector.Event {
	if ev.Stream.Tenant == "" || ev.Stream.Tenant == projector.SystemTenant {
		ev.Stream.Tenant = e.tenant
	}
	if err := ev.Stream.Validate(); err != nil {
		e.t.Fatalf("projectiontest: %v", err)
	}
	e.n++
	if ev.Version == 0 {
		e.versions[ev.Stream]++
		ev.Version = e.versions[ev.Stream]
	} else {
		e.versions[ev.Stream] = max(e.versions[ev.Stream], ev.Version)
	}
	if ev.ID == uuid.Nil {
		if e.key != "" {
			ev.ID = uuid.NewSHA1(idSpace, []byte(e.key+"#"+strconv.Itoa(e.n)))
		} else {
			ev.ID = uuid.New()
		}
	}
	if ev.Position == projector.Start {
		ev.Position = projector.Position{TxID: 1, Seq: int64(e.n)}
	}
	if ev.RecordedAt.IsZero() {
		ev.RecordedAt = e.clock.Now()
	}
	return ev
}
