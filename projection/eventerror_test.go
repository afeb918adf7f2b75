package projection_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
)

// namingBatch is a batch projection counting events per stream (in order,
// noting any reordering) that fails on stream p's second event, naming it
// with projection.EventFailed, and counts the calls that met that event:
// one when the name is used, about log2 of the batch when bisecting. (Not
// every call: how many batches the rest takes depends on the read horizon,
// which another test's open transaction on the same database can hold
// back.)
func namingBatch(e *env, name string, cfg projection.AsyncConfig, calls *atomic.Int32) *projection.Async {
	p := projection.NewAsync(name, cfg)
	count := countingHandler(e.schema, name)
	must(projection.OnBatch(p, func(ctx context.Context, tx pgx.Tx, b projection.Batch) error {
		for _, s := range b.Streams {
			for _, ev := range s.Events {
				if ev.Stream.ID == "p" && ev.Version == 2 {
					calls.Add(1)
					return projection.EventFailed(ev, errors.New("cannot digest poison"))
				}
				if err := count(ctx, tx, ev); err != nil {
					return err
				}
			}
		}
		return nil
	}, e.types.Opened, e.types.Commented))
	return p
}

// appendNamingBacklog appends 3 events to each of ten streams and to p,
// interleaved, p's second event in the middle of the log, and returns that
// event.
func (e *env) appendNamingBacklog() (failing projector.Event) {
	e.t.Helper()
	streams := []string{"a", "b", "c", "d", "e", "p", "f", "g", "h", "i", "j"}
	for v := range 3 {
		for _, s := range streams {
			exp := projector.NoStream
			if v > 0 {
				exp = projector.ExactVersion(int64(v))
			}
			evs := e.appendOne(s, exp, testevents.TicketCommented{Body: "x"})
			if s == "p" && v == 1 {
				failing = evs[0]
			}
		}
	}
	return failing
}

// A batch handler that names the event it failed on parks exactly that
// stream with no bisection: the batch fails once, the events before the
// named one are applied again, then the rest without the parked stream —
// one call meets the failing event, where bisecting a 33-event batch
// meets it about six times.
func TestEventFailed_ParksTheNamedStreamWithoutBisecting(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var calls atomic.Int32
	p := namingBatch(e, "naming", projection.AsyncConfig{ErrorMode: projection.ParkStream, MaxAttempts: 1,
		RetryBackoff: time.Millisecond, MaxBackoff: time.Millisecond}, &calls)
	e.appendNamingBacklog()
	e.catchUp(e.dispatcher(projection.Config{Projections: []*projection.Async{p}}))

	got, bad := e.counts("naming")
	for _, s := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"} {
		if got[s] != 3 {
			t.Errorf("stream %s: %d events applied, want 3", s, got[s])
		}
	}
	if got["p"] != 1 || bad != 0 {
		t.Errorf("p: %d applied (%d out of order); want only its first", got["p"], bad)
	}
	parks := e.openParks("naming")
	if len(parks) != 1 || parks[0].StreamID != "p" || parks[0].Version != 2 || parks[0].Events != 2 || parks[0].Attempts != 1 {
		t.Fatalf("parks: %+v; want p parked at v2 with its 2 events after 1 attempt", parks)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the batch handler met the failing event %d times; want once (no bisection)", n)
	}
}

// In halt mode the named event is the shard's failing event: the events
// before it commit (one call after the failed one), the shard dies on it.
func TestEventFailed_HaltsOnTheNamedEvent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var calls atomic.Int32
	p := namingBatch(e, "naming", projection.AsyncConfig{MaxAttempts: 1}, &calls)
	failing := e.appendNamingBacklog()
	e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	admin := projection.NewAdmin(e.store)
	eventually(t, 30*time.Second, "the shard to die", func() bool { return e.status(admin, "naming").Status == projection.StatusDead })
	st := e.status(admin, "naming")
	if st.FailedEventID != failing.ID {
		t.Fatalf("failing event %s, want p v2 %s (%+v)", st.FailedEventID, failing.ID, st)
	}
	got, bad := e.counts("naming")
	if got["p"] != 1 || got["a"] != 2 || got["j"] != 1 || bad != 0 {
		t.Errorf("applied %v (%d out of order); want everything before p's v2 and nothing after", got, bad)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the batch handler met the failing event %d times; want once (no bisection)", n)
	}
}

// A wrong name never passes an event. Naming an event outside the batch is
// bisected like a plain error: exactly the failing stream is parked, at
// its failing event. Naming a later event than the one that fails (the
// named event is taken at the handler's word) may park a healthy stream
// too, but every event is applied once, in order, or held in a park, and
// the stream that fails is parked at its failing event.
func TestEventFailed_WrongNameNeverPassesAnEvent(t *testing.T) {
	for _, tc := range []struct {
		name  string
		namer func(failing, last projector.Event) projector.Event
	}{
		{"outside the batch", func(failing, _ projector.Event) projector.Event {
			failing.ID, failing.Version = uuid.New(), 99
			return failing
		}},
		{"a later event", func(_, last projector.Event) projector.Event { return last }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			name := "naming_wrong"
			count := countingHandler(e.schema, name)
			p := projection.NewAsync(name, projection.AsyncConfig{ErrorMode: projection.ParkStream, MaxAttempts: 1,
				RetryBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
			must(projection.OnBatch(p, func(ctx context.Context, tx pgx.Tx, b projection.Batch) error {
				var last projector.Event
				for _, s := range b.Streams {
					last = s.Events[len(s.Events)-1]
				}
				for _, s := range b.Streams {
					for _, ev := range s.Events {
						if ev.Stream.ID == "p" && ev.Version == 2 {
							return projection.EventFailed(tc.namer(ev, last), errors.New("cannot digest poison"))
						}
						if err := count(ctx, tx, ev); err != nil {
							return err
						}
					}
				}
				return nil
			}, e.types.Opened, e.types.Commented))
			e.appendNamingBacklog()
			e.catchUp(e.dispatcher(projection.Config{Projections: []*projection.Async{p}}))

			got, bad := e.counts(name)
			if got["p"] != 1 || bad != 0 {
				t.Errorf("p: %d applied (%d out of order); want only its first", got["p"], bad)
			}
			held := map[string]int64{}
			var pParked bool
			for _, k := range e.openParks(name) {
				held[k.StreamID] = int64(k.Events)
				if got[k.StreamID]+1 != k.Version {
					t.Errorf("park of %s at v%d after %d applied: not the first unapplied event", k.StreamID, k.Version, got[k.StreamID])
				}
				pParked = pParked || (k.StreamID == "p" && k.Version == 2)
			}
			if !pParked {
				t.Errorf("p is not parked at v2: parks hold %v", held)
			}
			for _, s := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "p"} {
				if got[s]+held[s] != 3 {
					t.Errorf("stream %s: %d applied + %d parked, want its 3 events", s, got[s], held[s])
				}
			}
			if tc.name == "outside the batch" && len(held) != 1 {
				t.Errorf("parks hold %v; want only p's (bisected like a plain error)", held)
			}
		})
	}
}
