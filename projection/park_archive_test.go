package projection_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// A ParkStream consumer registered after `streams archive` reads the
// archived events and may park a stream whose events are all archived.
// These tests hold that show, retry (here and requested) and the park's
// sequence read them from the archive as from the hot log: they read the
// hot log alone, so the parked events were taken for deleted.

// A late ParkStream consumer parks two archived streams, the later events
// of one held in later passes (batches of two); show reads both sequences,
// a retry here and one a dispatcher carries out apply them once, in order.
func TestParkStream_ArchivedStreams(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.traceTable()
	e.appendOne("ok", projector.NoStream, testevents.TicketOpened{Title: "fine"})
	e.appendOne("p", projector.NoStream, testevents.TicketCommented{Body: "before"}, testevents.TicketOpened{Title: "poison"},
		testevents.TicketCommented{Body: "after"}, testevents.TicketCommented{Body: "later"})
	e.appendOne("q", projector.NoStream, testevents.TicketOpened{Title: "poison"}, testevents.TicketCommented{Body: "after"})
	e.archiveAll("ok", "p", "q")

	var failing atomic.Bool
	failing.Store(true)
	cfg := parkCfg
	cfg.BatchSize = 2
	late := poisoned(e, "late", cfg, &failing)
	e.catchUp(e.dispatcher(projection.Config{Projections: []*projection.Async{late}}))
	parks := e.openParks("late")
	if len(parks) != 2 || parks[0].StreamID != "p" || parks[0].Events != 3 || parks[1].StreamID != "q" || parks[1].Events != 2 {
		t.Fatalf("parks: %+v; want p parked with 3 events, q with 2", parks)
	}
	for _, pk := range parks {
		for _, get := range []func(context.Context, *postgres.Store, int64) (projection.Park, []projector.Event, error){
			projection.GetPark, projection.GetParkRaw,
		} {
			if _, events, err := get(e.ctx, e.store, pk.ID); err != nil || len(events) != pk.Events || events[0].ID != pk.EventID {
				t.Fatalf("show park %d of archived events: %d events, %v; want its %d", pk.ID, len(events), err, pk.Events)
			}
		}
	}

	failing.Store(false)
	if err := projection.RequestParkRetry(e.ctx, e.store, parks[1].ID, "tester"); err != nil {
		t.Fatal(err)
	}
	res, err := projection.RetryPark(e.ctx, e.store, late, parks[0].ID, "tester", nil)
	if err != nil || !res.Resolved || res.Events != 3 {
		t.Fatalf("retry of a park of archived events: %+v, %v; want its 3 events applied", res, err)
	}
	var q projection.Park
	eventually(t, time.Minute, "the dispatcher to carry out the retry request", func() bool {
		if q, err = projection.ParkByID(e.ctx, e.store, parks[1].ID); err != nil {
			t.Fatal(err)
		}
		return q.Status != projection.ParkOpen || q.RetryRequestedAt == nil
	})
	if q.Status != projection.ParkResolved || q.Events != 2 {
		t.Fatalf("requested retry of a park of archived events: %+v; want it resolved with its 2 events", q)
	}
	e.checkCounts("late", map[string]int64{"ok": 1, "p": 4, "q": 2})
}

// gatedPoison is poisoned whose handler, once healed, waits at the poison
// for release after closing reached: a retry stopped there has read its
// sequence and not committed.
func gatedPoison(e *env, name string, failing *atomic.Bool, reached, release chan struct{}) *projection.Async {
	p := projection.NewAsync(name, parkCfg)
	count := countingHandler(e.schema, name)
	var once sync.Once
	must(projection.On(p, e.types.Opened, func(ctx context.Context, tx pgx.Tx, ev projector.Event, o testevents.TicketOpened) error {
		if o.Title == "poison" {
			if failing.Load() {
				return errors.New("cannot digest poison")
			}
			once.Do(func() { close(reached) })
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return count(ctx, tx, ev)
	}))
	must(projection.OnEvent(p, e.types.Commented, count))
	return p
}

// An unarchive racing a retry of a park of archived events, committed in
// either gap: while the retry waits for the shard's lock (it reads the
// events hot), or after it read them from the archive and before it
// commits. Either way the retry applies the whole sequence once, and the
// stream, hot again, is not applied again.
func TestParkStream_RetryRacingUnarchive(t *testing.T) {
	t.Parallel()
	for _, gap := range []string{"lock", "handlers"} {
		t.Run(gap, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.appendOne("p", projector.NoStream, testevents.TicketOpened{Title: "poison"}, testevents.TicketCommented{Body: "after"})
			e.archiveAll("p")
			var failing atomic.Bool
			failing.Store(true)
			reached, release := make(chan struct{}), make(chan struct{})
			p := gatedPoison(e, "late", &failing, reached, release)
			d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
			e.catchUp(d)
			parks := e.openParks("late")
			if len(parks) != 1 || parks[0].Events != 2 {
				t.Fatalf("parks: %+v; want p parked with its 2 events", parks)
			}
			failing.Store(false)

			var hold pgx.Tx
			if gap == "lock" {
				var err error
				if hold, err = e.store.Pool().Begin(e.ctx); err != nil {
					t.Fatal(err)
				}
				defer func() { _ = hold.Rollback(e.ctx) }()
				if err := projection.LockShard(e.ctx, hold, e.store, projection.ShardID{Consumer: "late"}); err != nil {
					t.Fatal(err)
				}
				close(release)
			}
			type result struct {
				res projection.ParkRetryResult
				err error
			}
			done := make(chan result, 1)
			go func() {
				res, err := projection.RetryPark(e.ctx, e.store, p, parks[0].ID, "tester", nil)
				done <- result{res, err}
			}()
			if gap == "lock" {
				eventually(t, 30*time.Second, "the retry to wait for the shard's lock", func() bool {
					return e.shardLockWaiting("late", projection.SharedInstance)
				})
			} else {
				select {
				case <-reached:
				case r := <-done:
					t.Fatalf("retry ended before its handlers reached the poison: %+v, %v", r.res, r.err)
				}
			}
			res, err := e.store.Unarchive(e.ctx, postgres.ArchiveOptions{Streams: []projector.StreamRef{projector.Stream("ticket", "p")}})
			if err != nil || res.Streams != 1 {
				t.Fatalf("unarchive in the retry's gap: %+v, %v", res, err)
			}
			if gap == "lock" {
				if err := hold.Commit(e.ctx); err != nil {
					t.Fatal(err)
				}
			} else {
				close(release)
			}
			if r := <-done; r.err != nil || !r.res.Resolved || r.res.Events != 2 {
				t.Fatalf("retry racing an unarchive: %+v, %v; want its 2 events applied", r.res, r.err)
			}
			e.catchUp(d)
			e.checkCounts("late", map[string]int64{"p": 2})
		})
	}
}

// A saga instance's park whose events are archived (a saga registered
// after the archive parked it) is shown with them: its sequence read the
// hot log alone. A retry reads it the same way.
func TestInstanceParkOfArchivedEvents(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.appendOne("a", projector.NoStream, testevents.TicketOpened{Title: "poison"})[0]
	b := e.appendOne("b", projector.NoStream, testevents.TicketCommented{Body: "later"})[0]
	e.archiveAll("a", "b")
	var id int64
	err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		var err error
		if id, err = projection.ParkInstance(e.ctx, tx, e.store, "saga", a.Stream.Tenant, "key-1", a, errors.New("boom"), 2); err != nil {
			return err
		}
		return projection.HoldInstanceEvents(e.ctx, tx, e.store, id, []projector.Event{a, b})
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, get := range []func(context.Context, *postgres.Store, int64) (projection.Park, []projector.Event, error){
		projection.GetPark, projection.GetParkRaw,
	} {
		_, events, err := get(e.ctx, e.store, id)
		if err != nil || len(events) != 2 || events[0].ID != a.ID || events[1].ID != b.ID {
			t.Fatalf("show instance park of archived events: %v, %v; want a's and b's events in order", events, err)
		}
	}
}
