package projection_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// parkCfg is a ParkStream consumer that parks after two quick attempts.
var parkCfg = projection.AsyncConfig{ErrorMode: projection.ParkStream, MaxAttempts: 2,
	RetryBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}

// catchUp waits until d's shards have caught up with the log.
func (e *env) catchUp(d *projection.Dispatcher) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) openParks(consumer string) []projection.Park {
	e.t.Helper()
	parks, err := projection.ListParks(e.ctx, e.store, projection.ParkFilter{Consumer: consumer, Status: projection.ParkOpen})
	if err != nil {
		e.t.Fatal(err)
	}
	return parks
}

// A poisoned stream is parked after MaxAttempts with every later event of
// it behind the failing one, not applied; other streams go on and the
// cursor moves. A retry that fails keeps the park with the new error; one
// that succeeds applies the whole sequence once, in order, and the stream
// is live again.
func TestParkStream_HoldsTheStreamUntilRetried(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.traceTable()
	var failing atomic.Bool
	failing.Store(true)
	p := poisoned(e, "parking", parkCfg, &failing)
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})

	e.appendOne("ok", projector.NoStream, testevents.TicketOpened{Title: "fine"})
	e.appendOne("p", projector.NoStream, testevents.TicketCommented{Body: "before"}, testevents.TicketOpened{Title: "poison"},
		testevents.TicketCommented{Body: "after"})
	e.appendOne("ok", projector.ExactVersion(1), testevents.TicketCommented{Body: "1"})
	e.catchUp(d)
	e.appendOne("p", projector.ExactVersion(3), testevents.TicketCommented{Body: "later"})
	e.appendOne("ok", projector.ExactVersion(2), testevents.TicketCommented{Body: "2"})
	e.catchUp(d)

	got, bad := e.counts("parking")
	if got["ok"] != 3 || got["p"] != 1 || bad != 0 {
		t.Fatalf("applied %v (%d bad); want ok's 3 events and only p's first", got, bad)
	}
	if st := e.status(projection.NewAdmin(e.store), "parking"); st.Status == projection.StatusDead {
		t.Fatalf("shard is dead; want it running: %+v", st)
	}
	parks := e.openParks("parking")
	if len(parks) != 1 || parks[0].StreamID != "p" || parks[0].Version != 2 || parks[0].Events != 3 || parks[0].Attempts != 2 {
		t.Fatalf("parks: %+v; want stream p parked at v2 with 3 events after 2 attempts", parks)
	}
	pk, events, err := projection.GetPark(e.ctx, e.store, parks[0].ID)
	if err != nil || len(events) != 3 || events[0].Version != 2 || events[2].Version != 4 || pk.Error == "" {
		t.Fatalf("get park: %+v, %d events, %v", pk, len(events), err)
	}

	res, err := projection.RetryPark(e.ctx, e.store, p, pk.ID, "tester", nil)
	if err != nil || res.Resolved || res.Error == "" || res.Attempts != 3 {
		t.Fatalf("failing retry: %+v, %v; want unresolved with the new error", res, err)
	}
	if got, _ := e.counts("parking"); got["p"] != 1 {
		t.Fatalf("a failed retry applied p's events: %v", got)
	}
	if parks := e.openParks("parking"); len(parks) != 1 || parks[0].Events != 3 || parks[0].Attempts != 3 {
		t.Fatalf("after a failed retry: %+v; want the park intact", parks)
	}

	failing.Store(false)
	res, err = projection.RetryPark(e.ctx, e.store, p, pk.ID, "tester", nil)
	if err != nil || !res.Resolved || res.Events != 3 {
		t.Fatalf("retry: %+v, %v", res, err)
	}
	if _, err := projection.RetryPark(e.ctx, e.store, p, pk.ID, "tester", nil); !errors.Is(err, projector.ErrInvalidTransition) {
		t.Fatalf("second retry: %v; want a refusal", err)
	}
	if _, err := projection.DiscardPark(e.ctx, e.store, pk.ID, "tester"); !errors.Is(err, projector.ErrInvalidTransition) {
		t.Fatalf("discard after retry: %v; want a refusal", err)
	}
	e.appendOne("p", projector.ExactVersion(4), testevents.TicketCommented{Body: "live again"})
	e.catchUp(d)
	got, bad = e.counts("parking")
	if got["p"] != 5 || bad != 0 {
		t.Fatalf("after retry: %v (%d bad); want p's 5 events in order", got, bad)
	}
	if n := e.traced("parking", pk.EventID); n != 1 {
		t.Fatalf("the parked event was applied %d times, want 1", n)
	}
	done, _, err := projection.GetPark(e.ctx, e.store, pk.ID)
	if err != nil || done.Status != projection.ParkResolved || done.ResolvedBy != "tester" || done.Events != 3 || done.ResolvedAt == nil {
		t.Fatalf("resolved park: %+v, %v", done, err)
	}
}

// parkedPoison starts a dispatcher running the "parking" consumer
// (poisoned, ParkStream) and parks stream p at its poisoned first event,
// followed by one more; it returns the dispatcher, the open park and the
// switch that makes the poison digestible again (on: failing).
func (e *env) parkedPoison() (*projection.Dispatcher, projection.Park, *atomic.Bool) {
	e.t.Helper()
	e.traceTable()
	failing := new(atomic.Bool)
	failing.Store(true)
	p := poisoned(e, "parking", parkCfg, failing)
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	e.appendOne("p", projector.NoStream, testevents.TicketOpened{Title: "poison"}, testevents.TicketCommented{Body: "after"})
	e.catchUp(d)
	parks := e.openParks("parking")
	if len(parks) != 1 {
		e.t.Fatalf("parks: %+v; want stream p parked", parks)
	}
	return d, parks[0], failing
}

// Discard drops the parked sequence with an audit record (who, when, how
// many); the stream's next event is applied.
func TestParkStream_Discard(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d, parked, _ := e.parkedPoison()
	if _, err := projection.DiscardPark(e.ctx, e.store, parked.ID, ""); !errors.Is(err, projector.ErrInvalidTransition) {
		t.Fatalf("discard without a name: %v; want a refusal", err)
	}
	pk, err := projection.DiscardPark(e.ctx, e.store, parked.ID, "alice")
	if err != nil || pk.Status != projection.ParkDiscarded || pk.ResolvedBy != "alice" || pk.Events != 2 || pk.ResolvedAt == nil {
		t.Fatalf("discard: %+v, %v", pk, err)
	}
	e.appendOne("p", projector.ExactVersion(2), testevents.TicketCommented{Body: "next"})
	e.catchUp(d)
	if got, _ := e.counts("parking"); got["p"] != 1 {
		t.Fatalf("after discard: %v; want p's next event applied and the discarded ones not", got)
	}
}

// Operators racing retry and discard of one park, while events of the
// parked stream keep arriving and a dispatcher keeps passing: exactly one
// operation wins, the others are refused, and when the retry wins the
// stream's events are applied exactly once each, in order.
func TestParkStream_RetryDiscardRace(t *testing.T) {
	t.Parallel()
	for round := range 4 {
		e := newEnv(t)
		e.traceTable()
		var failing atomic.Bool
		failing.Store(true)
		p := poisoned(e, "parking", parkCfg, &failing)
		d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}, PollMax: 5 * time.Millisecond})
		e.appendOne("p", projector.NoStream, testevents.TicketOpened{Title: "poison"}, testevents.TicketCommented{Body: "after"})
		e.catchUp(d)
		parks := e.openParks("parking")
		if len(parks) != 1 {
			t.Fatalf("parks: %+v", parks)
		}
		failing.Store(false)

		stop := make(chan struct{})
		var writer sync.WaitGroup
		version := int64(2)
		writer.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				e.appendOne("p", projector.ExactVersion(version), testevents.TicketCommented{Body: "more"})
				version++
			}
		})
		var won, refused atomic.Int32
		var retried atomic.Bool
		var ops sync.WaitGroup
		start := make(chan struct{})
		for i := range 6 {
			ops.Go(func() {
				<-start
				var err error
				if (i+round)%2 == 0 {
					var res projection.ParkRetryResult
					if res, err = projection.RetryPark(e.ctx, e.store, p, parks[0].ID, "op", nil); err == nil && res.Resolved {
						retried.Store(true)
					}
				} else {
					_, err = projection.DiscardPark(e.ctx, e.store, parks[0].ID, "op")
				}
				switch {
				case err == nil:
					won.Add(1)
				case errors.Is(err, projector.ErrInvalidTransition):
					refused.Add(1)
				default:
					t.Errorf("operation: %v", err)
				}
			})
		}
		close(start)
		ops.Wait()
		close(stop)
		writer.Wait()
		if won.Load() != 1 || refused.Load() != 5 {
			t.Fatalf("round %d: %d won, %d refused; want exactly one winner", round, won.Load(), refused.Load())
		}
		e.catchUp(d)
		got, bad := e.counts("parking")
		if retried.Load() && (got["p"] != version || bad != 0) {
			t.Fatalf("round %d: retry won, applied %d of %d events of p with %d out of order or twice", round, got["p"], version, bad)
		}
		if !retried.Load() && got["p"] >= version {
			t.Fatalf("round %d: discard won, yet all %d events applied", round, got["p"])
		}
		if n := e.traced("parking", parks[0].EventID); retried.Load() && n != 1 {
			t.Fatalf("round %d: parked event applied %d times", round, n)
		}
	}
}

// events prune racing a consumer that parks: the cursor moves past parked
// events, and the prune's guard must keep them, so every open park's
// sequence can still be read and retried. Without the parks in the guard
// the prune deletes them (seen failing so).
func TestParkStream_PruneKeepsParkedEvents(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.traceTable()
	var failing atomic.Bool
	failing.Store(true)
	cfg := parkCfg
	cfg.MaxAttempts = 1
	p := poisoned(e, "parking", cfg, &failing)
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}, PollMax: 5 * time.Millisecond})

	stop := make(chan struct{})
	var pruner sync.WaitGroup
	var pruned atomic.Int64
	pruner.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			res, err := e.store.Prune(e.ctx, postgres.PruneOptions{OlderThan: time.Microsecond, StreamTypes: []string{"ticket"}, IncludeAggregates: true})
			if err != nil {
				t.Errorf("prune: %v", err)
				return
			}
			pruned.Add(res.Deleted)
		}
	})
	for i := range 40 {
		id := "s" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		title := "fine"
		if i%4 == 0 {
			title = "poison"
		}
		e.appendOne(id, projector.NoStream, testevents.TicketOpened{Title: title}, testevents.TicketCommented{Body: "after"})
		e.appendOne(id, projector.ExactVersion(2), testevents.TicketCommented{Body: "later"})
	}
	e.catchUp(d)
	// On a loaded machine the dispatcher may pass every event only after
	// the appends: the pruner keeps running until it has deleted something
	// behind the cursor, so the guard is always put to the test.
	eventually(t, 30*time.Second, "the prune to delete an event behind the cursor", func() bool { return pruned.Load() > 0 })
	close(stop)
	pruner.Wait()
	parks := e.openParks("parking")
	if len(parks) != 10 {
		t.Fatalf("%d parks, want 10", len(parks))
	}
	failing.Store(false)
	for _, pk := range parks {
		if pk.Events != 3 {
			t.Fatalf("park %+v: want 3 events", pk)
		}
		res, err := projection.RetryPark(e.ctx, e.store, p, pk.ID, "tester", nil)
		if err != nil || !res.Resolved || res.Events != 3 {
			t.Fatalf("retry of park %d (stream %s): %+v, %v", pk.ID, pk.StreamID, res, err)
		}
	}
}

// projector_parked_streams counts a consumer's open parks and
// projector_parked_oldest_age_seconds the age of the oldest; both follow a
// discard.
func TestParkStream_Gauges(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.traceTable()
	var failing atomic.Bool
	failing.Store(true)
	p := poisoned(e, "parking", parkCfg, &failing)
	reg := prometheus.NewRegistry()
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}, Registerer: reg, MetricsEvery: 20 * time.Millisecond})
	gauge := func(name string) float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name {
				for _, m := range mf.GetMetric() {
					if m.GetLabel()[0].GetValue() == "parking" {
						return m.GetGauge().GetValue()
					}
				}
			}
		}
		return -1
	}
	eventually(t, 30*time.Second, "the gauges at zero", func() bool {
		return gauge("projector_parked_streams") == 0 && gauge("projector_parked_oldest_age_seconds") == 0
	})
	e.appendOne("a", projector.NoStream, testevents.TicketOpened{Title: "poison"})
	e.appendOne("b", projector.NoStream, testevents.TicketOpened{Title: "poison"})
	e.catchUp(d)
	eventually(t, 30*time.Second, "two parks counted, the oldest aging", func() bool {
		return gauge("projector_parked_streams") == 2 && gauge("projector_parked_oldest_age_seconds") > 0
	})
	for _, pk := range e.openParks("parking") {
		if _, err := projection.DiscardPark(e.ctx, e.store, pk.ID, "tester"); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, "the gauges back at zero", func() bool {
		return gauge("projector_parked_streams") == 0 && gauge("projector_parked_oldest_age_seconds") == 0
	})
}

// A retry waits for a pass that holds the shard and reads the park after
// it: an event the pass added to the park meanwhile (the other actor in the
// gap) is applied by the retry, in order, and none is left behind.
func TestParkStream_RetryWaitsForThePassInTheGap(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.traceTable()
	var failing atomic.Bool
	failing.Store(true)
	p := poisoned(e, "parking", parkCfg, &failing)
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	e.appendOne("p", projector.NoStream, testevents.TicketOpened{Title: "poison"}, testevents.TicketCommented{Body: "after"})
	e.catchUp(d)
	if err := d.Stop(e.ctx); err != nil {
		t.Fatal(err)
	}
	parks := e.openParks("parking")
	if len(parks) != 1 || parks[0].Events != 2 {
		t.Fatalf("parks: %+v", parks)
	}
	late := e.appendOne("p", projector.ExactVersion(2), testevents.TicketCommented{Body: "in the gap"})[0]
	failing.Store(false)

	// The other actor: a transaction holding the shard's lock, as a pass
	// does, that parks the late event behind the others.
	gap, err := e.store.Pool().Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = gap.Rollback(e.ctx) }()
	if err := projection.LockShard(e.ctx, gap, e.store, projection.ShardID{Consumer: "parking"}); err != nil {
		t.Fatal(err)
	}
	done := make(chan projection.ParkRetryResult, 1)
	go func() {
		res, err := projection.RetryPark(e.ctx, e.store, p, parks[0].ID, "tester", nil)
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	eventually(t, 30*time.Second, "the retry to wait for the shard's lock", func() bool {
		var waiting bool
		_ = e.store.Pool().QueryRow(e.ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks
			WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))`).Scan(&waiting)
		return waiting
	})
	if _, err := gap.Exec(e.ctx, `INSERT INTO `+e.table("projector_parked_events")+` (park_id, version, event_id) VALUES ($1, $2, $3)`,
		parks[0].ID, late.Version, late.ID); err != nil {
		t.Fatal(err)
	}
	if err := gap.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if !res.Resolved || res.Events != 3 {
		t.Fatalf("retry: %+v; want the 3 events, the one parked in the gap included", res)
	}
	if got, bad := e.counts("parking"); got["p"] != 3 || bad != 0 {
		t.Fatalf("applied %v (%d bad); want p's 3 events once, in order", got, bad)
	}
}

// Archiving passes over a parked stream: the guard holds it back until the
// park is resolved, and archives it after. (A park of a stream archived
// before it was parked, by a consumer behind the archive, is
// park_archive_test.go's.)
func TestParkStream_ArchiveKeepsParkedStreams(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.traceTable()
	var failing atomic.Bool
	failing.Store(true)
	p := poisoned(e, "parking", parkCfg, &failing)
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})

	e.appendOne("ok", projector.NoStream, testevents.TicketOpened{Title: "fine"})
	e.appendOne("p", projector.NoStream, testevents.TicketOpened{Title: "poison"}, testevents.TicketCommented{Body: "after"})
	e.catchUp(d)
	parks := e.openParks("parking")
	if len(parks) != 1 || parks[0].StreamID != "p" {
		t.Fatalf("parks: %+v; want stream p parked", parks)
	}
	both := postgres.ArchiveOptions{Streams: []projector.StreamRef{projector.Stream("ticket", "ok"), projector.Stream("ticket", "p")}}
	res, err := e.store.Archive(e.ctx, both)
	if err != nil || res.Streams != 1 || res.HeldBack != 1 {
		t.Fatalf("archive: %+v, %v; want ok archived and the parked p held back", res, err)
	}
	failing.Store(false)
	if r, err := projection.RetryPark(e.ctx, e.store, p, parks[0].ID, "tester", nil); err != nil || !r.Resolved || r.Events != 2 {
		t.Fatalf("retry after the archive: %+v, %v", r, err)
	}
	res, err = e.store.Archive(e.ctx, postgres.ArchiveOptions{Streams: []projector.StreamRef{projector.Stream("ticket", "p")}})
	if err != nil || res.Streams != 1 {
		t.Fatalf("archive after the retry: %+v, %v; want p archived", res, err)
	}
}

// A retry that waited for the shard's lock while a rebuild's switch or a
// split moved the park to another shard (the other actor in the gap) holds
// the wrong lock: it applies nothing and says to try again, and the park
// stays open with its events.
func TestParkStream_RetryRefusesAParkMovedInTheGap(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.traceTable()
	var failing atomic.Bool
	failing.Store(true)
	p := poisoned(e, "parking", parkCfg, &failing)
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	e.appendOne("p", projector.NoStream, testevents.TicketOpened{Title: "poison"}, testevents.TicketCommented{Body: "after"})
	e.catchUp(d)
	if err := d.Stop(e.ctx); err != nil {
		t.Fatal(err)
	}
	parks := e.openParks("parking")
	if len(parks) != 1 {
		t.Fatalf("parks: %+v", parks)
	}
	failing.Store(false)

	gap, err := e.store.Pool().Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = gap.Rollback(e.ctx) }()
	if err := projection.LockShard(e.ctx, gap, e.store, projection.ShardID{Consumer: "parking"}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := projection.RetryPark(e.ctx, e.store, p, parks[0].ID, "tester", nil)
		done <- err
	}()
	eventually(t, 30*time.Second, "the retry to wait for the shard's lock", func() bool {
		return e.shardLockWaiting("parking", projection.SharedInstance)
	})
	if _, err := gap.Exec(e.ctx, `UPDATE `+e.table("projector_parks")+` SET instance_id = 'elsewhere' WHERE id = $1`, parks[0].ID); err != nil {
		t.Fatal(err)
	}
	if err := gap.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, projector.ErrInvalidTransition) || !strings.Contains(err.Error(), "moved") {
		t.Fatalf("retry of a park moved in the gap: %v, want ErrInvalidTransition saying it moved", err)
	}
	if got, _ := e.counts("parking"); got["p"] != 0 {
		t.Fatalf("applied %v; want nothing of p under the wrong shard's lock", got)
	}
	if pk := e.openParks("parking"); len(pk) != 1 || pk[0].Events != 2 {
		t.Fatalf("parks after the refused retry: %+v; want the park open with its 2 events", pk)
	}
}
