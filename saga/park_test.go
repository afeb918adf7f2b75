package saga_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/postgres"
)

// seenState records, per instance, what its steps saw, in order.
type seenState struct {
	Seen     []string `json:"seen"`
	Reminded int      `json:"reminded"`
}

// newParking defines the ParkStream saga "sla", keyed by ticket: an
// opening schedules "remind" an hour on; every comment and assignment adds
// its body (or agent) to the state, and a comment "poison" fails while
// poison is set, as it is at first (a bug a deploy fixes); the reminder
// counts itself and appends sla.reminded.
func newParking(e *env, c *clock) (*saga.Saga[seenState], *atomic.Bool) {
	return newSeen(e.types, c.Now, projection.AsyncConfig{ErrorMode: projection.ParkStream})
}

// newSeen is newParking's saga on ty with clock now and async (error
// mode; MaxAttempts 2 and a backoff of 1 ms unless set).
func newSeen(ty types, now func() time.Time, async projection.AsyncConfig) (*saga.Saga[seenState], *atomic.Bool) {
	poison := &atomic.Bool{}
	poison.Store(true)
	async.MaxAttempts = cmp.Or(async.MaxAttempts, 2)
	async.RetryBackoff, async.MaxBackoff = cmp.Or(async.RetryBackoff, time.Millisecond), cmp.Or(async.MaxBackoff, time.Millisecond)
	s := saga.New[seenState]("sla", saga.Config{Now: now, Async: async})
	must(saga.StartOn(s, ty.Opened, saga.ByStream, func(_ context.Context, in *saga.Instance[seenState], _ projector.Event, o testevents.TicketOpened) error {
		in.State.Seen = append(in.State.Seen, "opened")
		in.After("remind", time.Hour)
		return nil
	}))
	must(saga.On(s, ty.Commented, saga.ByStream, func(_ context.Context, in *saga.Instance[seenState], _ projector.Event, c testevents.TicketCommented) error {
		if c.Body == "poison" && poison.Load() {
			return errors.New("cannot digest poison")
		}
		in.State.Seen = append(in.State.Seen, c.Body)
		return nil
	}))
	must(saga.On(s, ty.Assigned, func(_ projector.Event, a Assigned) string { return a.Ticket },
		func(_ context.Context, in *saga.Instance[seenState], _ projector.Event, a Assigned) error {
			in.State.Seen = append(in.State.Seen, "agent "+a.Agent)
			return nil
		}))
	must(saga.OnTimeout(s, "remind", func(_ context.Context, in *saga.Instance[seenState], _ saga.Timeout) error {
		in.State.Reminded++
		in.Append(projector.Stream("sla", in.Key()), projector.AnyVersion, Reminded{Ticket: in.Key()})
		return nil
	}))
	return s, poison
}

func ticket(id string) projector.StreamRef { return projector.Stream("ticket", id) }

func seenOf(t *testing.T, e *env, key string) (saga.InstanceDetail, seenState) {
	t.Helper()
	in, err := saga.Show(e.ctx, e.store, "sla", projector.SystemTenant, key)
	if err != nil {
		t.Fatal(err)
	}
	var st seenState
	if err := json.Unmarshal(in.State, &st); err != nil {
		t.Fatal(err)
	}
	return in, st
}

// Promise 18 for sagas: a poison event parks its instance (keyed by the
// correlation key: its later events, from any stream, wait behind it in
// order) while other instances go on; the parked instance keeps its state
// and its timeout, which does not fire while parked; a failed retry keeps
// the park; a retry after the fix applies the parked sequence once, in
// order; the timeout that fell due while parked then fires exactly once,
// counted as late; and the instance takes its next events live.
func TestSagaParkStreamParksInstance(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := newClock()
	s, poison := newParking(e, c)
	e.append(ticket("a"), testevents.TicketOpened{Title: "a"}, testevents.TicketCommented{Body: "a1"},
		testevents.TicketCommented{Body: "poison"}, testevents.TicketCommented{Body: "a3"})
	e.append(ticket("b"), testevents.TicketOpened{Title: "b"}, testevents.TicketCommented{Body: "b1"})
	e.append(projector.Stream("agent", "alice"), Assigned{Ticket: "a", Agent: "alice"}) // another stream, instance a
	d := e.dispatcher(s, projection.Config{})
	e.catchUp(d)

	if st, lastErr := e.shardError(); st != projection.StatusIdle || lastErr != "" {
		t.Fatalf("shard %s (%q): parking must keep the consumer going", st, lastErr)
	}
	a, sa := seenOf(t, e, "a")
	if a.Status != saga.Parked || !slices.Equal(sa.Seen, []string{"opened", "a1"}) || len(a.Timeouts) != 1 || a.LateEvents != 0 {
		t.Fatalf("instance a: %s, seen %v, %d timeouts, %d late; want parked after a1 with its timeout kept, nothing late",
			a.Status, sa.Seen, len(a.Timeouts), a.LateEvents)
	}
	parks, err := projection.ListParks(e.ctx, e.store, projection.ParkFilter{Consumer: "sla"})
	if err != nil {
		t.Fatal(err)
	}
	if len(parks) != 1 || parks[0].Kind != projection.ParkKindSagaInstance || parks[0].SagaKey() != "a" || parks[0].Events != 3 || parks[0].Attempts != 2 {
		t.Fatalf("parks %+v: want one of instance a holding poison, a3 and the assignment, after 2 attempts", parks)
	}
	id := parks[0].ID
	if sums, err := saga.Summaries(e.ctx, e.store, "sla"); err != nil || len(sums) != 1 || sums[0].Parked != 1 || sums[0].Active != 1 {
		t.Fatalf("summaries %+v, %v: want a parked and b active", sums, err)
	}

	// While parked: a's new events join the park, b goes on, a's timeout
	// stays pending through a runner round after its due time.
	e.append(ticket("a"), testevents.TicketCommented{Body: "a4"})
	e.append(ticket("b"), testevents.TicketCommented{Body: "b2"})
	e.catchUp(d)
	if _, sb := seenOf(t, e, "b"); !slices.Equal(sb.Seen, []string{"opened", "b1", "b2"}) {
		t.Fatalf("instance b saw %v: the other instance must go on", sb.Seen)
	}
	reg := prometheus.NewRegistry()
	r, err := saga.NewRunner(saga.RunnerConfig{Store: e.store, Sagas: []saga.Definition{s}, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	c.Advance(2 * time.Hour)
	if n := e.fire(r); n != 1 {
		t.Fatalf("fired %d timeouts, want 1: b's, not parked a's", n)
	}
	if a, _ := seenOf(t, e, "a"); len(a.Timeouts) != 1 {
		t.Fatalf("parked a has %d timeouts after a runner round, want its 1 kept", len(a.Timeouts))
	}
	_, seq, err := projection.GetPark(e.ctx, e.store, id)
	if err != nil {
		t.Fatal(err)
	}
	var bodies []string
	for _, ev := range seq {
		bodies = append(bodies, ev.Type)
	}
	if want := []string{"ticket.commented", "ticket.commented", "agent.assigned", "ticket.commented"}; !slices.Equal(bodies, want) {
		t.Fatalf("parked sequence %v, want %v (log order, across streams)", bodies, want)
	}

	// A retry that fails again changes nothing and keeps the park.
	p, err := s.Projection(e.store)
	if err != nil {
		t.Fatal(err)
	}
	res, err := projection.RetryPark(e.ctx, e.store, p, id, "op", nil)
	if err != nil || res.Resolved || res.Attempts != 3 {
		t.Fatalf("failing retry: %+v, %v; want unresolved, attempt 3", res, err)
	}
	if a, sa := seenOf(t, e, "a"); a.Status != saga.Parked || len(sa.Seen) != 2 {
		t.Fatalf("after a failed retry a is %s and saw %v: nothing may be applied", a.Status, sa.Seen)
	}

	// The fix is deployed: the retry applies the sequence once, in order.
	poison.Store(false)
	if res, err = projection.RetryPark(e.ctx, e.store, p, id, "op", nil); err != nil || !res.Resolved || res.Events != 4 {
		t.Fatalf("retry: %+v, %v; want the 4 events applied", res, err)
	}
	if _, err := projection.RetryPark(e.ctx, e.store, p, id, "op", nil); !errors.Is(err, projector.ErrInvalidTransition) {
		t.Fatalf("second retry: %v, want ErrInvalidTransition (nothing applied twice)", err)
	}
	a, sa = seenOf(t, e, "a")
	if want := []string{"opened", "a1", "poison", "a3", "agent alice", "a4"}; a.Status != saga.Active || !slices.Equal(sa.Seen, want) {
		t.Fatalf("after the retry a is %s and saw %v, want active and %v", a.Status, sa.Seen, want)
	}

	// The timeout due while parked fires now, once, late.
	if n := e.fire(r); n != 1 {
		t.Fatalf("fired %d after the retry, want a's 1", n)
	}
	if n := e.fire(r); n != 0 {
		t.Fatalf("fired %d more, want 0: a timeout fires once", n)
	}
	a, sa = seenOf(t, e, "a")
	if sa.Reminded != 1 || len(a.Timeouts) != 0 || e.events("sla.reminded") != 2 {
		t.Fatalf("a reminded %d times, %d timeouts pending, %d reminders in the log; want 1, 0 and 2 (a's and b's)",
			sa.Reminded, len(a.Timeouts), e.events("sla.reminded"))
	}
	if late := latenessSum(t, reg); late < time.Hour.Seconds() {
		t.Fatalf("lateness observed %.0fs in all, want a's hour past due counted", late)
	}

	// Live again: a's next event is applied at once, after the sequence.
	e.append(ticket("a"), testevents.TicketCommented{Body: "a5"})
	e.catchUp(d)
	if _, sa := seenOf(t, e, "a"); sa.Seen[len(sa.Seen)-1] != "a5" || len(sa.Seen) != 7 {
		t.Fatalf("a saw %v, want a5 last", sa.Seen)
	}
	if open, err := projection.ListParks(e.ctx, e.store, projection.ParkFilter{Consumer: "sla", Status: projection.ParkOpen}); err != nil || len(open) != 0 {
		t.Fatalf("open parks %v, %v; want none", open, err)
	}
}

func latenessSum(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == "projector_saga_timeout_lateness_seconds" {
			for _, m := range mf.GetMetric() {
				sum += (*dto.Histogram).GetSampleSum(m.GetHistogram())
			}
		}
	}
	return sum
}

// Operators racing: two `saga retry` of one failed instance, and two
// retries of one parked instance, each pair let go at once from behind a
// lock they both wait on: exactly one of each wins, the other is refused
// with ErrInvalidTransition, and the parked sequence is applied once.
func TestSagaRetryRaceOneWinner(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := newClock()
	s, poison := newParking(e, c)
	e.append(ticket("p"), testevents.TicketOpened{Title: "p"}, testevents.TicketCommented{Body: "poison"}, testevents.TicketCommented{Body: "p2"})
	e.append(ticket("f"), testevents.TicketOpened{Title: "f"})
	d := e.dispatcher(s, projection.Config{})
	e.catchUp(d)
	if _, err := e.store.Pool().Exec(e.ctx, `UPDATE `+e.store.Table("projector_saga_instances")+`
		SET status = 'failed', last_error = 'x' WHERE key = 'f'`); err != nil {
		t.Fatal(err)
	}
	if _, err := saga.Reactivate(e.ctx, e.store, "sla", projector.SystemTenant, "p"); !errors.Is(err, projector.ErrInvalidTransition) {
		t.Fatalf("reactivate a parked instance: %v, want ErrInvalidTransition (it is retried through its park)", err)
	}
	id, err := saga.InstancePark(e.ctx, e.store, "sla", projector.SystemTenant, "p")
	if err != nil {
		t.Fatal(err)
	}
	poison.Store(false)
	p, err := s.Projection(e.store)
	if err != nil {
		t.Fatal(err)
	}

	race := func(what string, lock func(tx pgx.Tx) error, op func() error) {
		t.Helper()
		blocker, err := e.store.Pool().Begin(e.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = blocker.Rollback(e.ctx) }()
		if err := lock(blocker); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = op()
			}()
		}
		// Both are waiting on the blocker's lock before it lets go.
		pid := blocker.Conn().PgConn().PID()
		e.waitFor(what+": both operators blocked", 10*time.Second, func() bool {
			// The second waits behind the first in the lock's queue.
			return e.count(`WITH w AS (SELECT pid, pg_blocking_pids(pid) AS by FROM pg_stat_activity WHERE wait_event_type = 'Lock')
				SELECT count(*) FROM w WHERE $1::int = ANY(w.by)
				   OR EXISTS (SELECT 1 FROM w w1 WHERE $1::int = ANY(w1.by) AND w1.pid = ANY(w.by))`, int(pid)) >= 2
		})
		if err := blocker.Commit(e.ctx); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		won := 0
		for _, err := range errs {
			switch {
			case err == nil:
				won++
			case !errors.Is(err, projector.ErrInvalidTransition):
				t.Fatalf("%s: %v", what, err)
			}
		}
		if won != 1 {
			t.Fatalf("%s: %d winners (%v), want exactly 1", what, won, errs)
		}
	}
	race("reactivate", func(tx pgx.Tx) error {
		_, err := tx.Exec(e.ctx, `SELECT 1 FROM `+e.store.Table("projector_saga_instances")+` WHERE key = 'f' FOR UPDATE`)
		return err
	}, func() error {
		_, err := saga.Reactivate(e.ctx, e.store, "sla", projector.SystemTenant, "f")
		return err
	})
	race("park retry", func(tx pgx.Tx) error {
		return projection.LockShard(e.ctx, tx, e.store, projection.ShardID{Consumer: "sla", Instance: projection.SharedInstance})
	}, func() error {
		res, err := projection.RetryPark(e.ctx, e.store, p, id, "op", nil)
		if err == nil && !res.Resolved {
			return errors.New(res.Error)
		}
		return err
	})
	if f, _ := seenOf(t, e, "f"); f.Status != saga.Active {
		t.Fatalf("f is %s, want active", f.Status)
	}
	if pi, sp := seenOf(t, e, "p"); pi.Status != saga.Active || !slices.Equal(sp.Seen, []string{"opened", "poison", "p2"}) {
		t.Fatalf("p is %s and saw %v: the parked sequence must be applied once", pi.Status, sp.Seen)
	}
}

// Archiving a stream one of whose events a parked instance holds is held
// back (the retry reads its events from the hot log), as for a parked
// stream; once the park is retried (by request, which the dispatcher
// running the saga carries out), the stream archives.
func TestSagaParkedInstanceKeepsItsEventsFromArchive(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s, poison := newParking(e, newClock())
	e.append(ticket("a"), testevents.TicketOpened{Title: "a"}, testevents.TicketCommented{Body: "poison"})
	e.append(projector.Stream("agent", "al"), Assigned{Ticket: "a", Agent: "al"}) // parked behind the poison
	e.append(projector.Stream("agent", "bo"), Assigned{Ticket: "none", Agent: "bo"})
	d := e.dispatcher(s, projection.Config{})
	e.catchUp(d)
	id, err := saga.InstancePark(e.ctx, e.store, "sla", projector.SystemTenant, "a")
	if err != nil {
		t.Fatal(err)
	}
	all := postgres.ArchiveOptions{Streams: []projector.StreamRef{ticket("a"), projector.Stream("agent", "al"), projector.Stream("agent", "bo")}}
	res, err := e.store.Archive(e.ctx, all)
	if err != nil || res.Streams != 1 || res.HeldBack != 2 {
		t.Fatalf("archive: %+v, %v; want agent/bo archived, the two streams with parked events held back", res, err)
	}
	// Retried by request (`parked retry` without --here): the dispatcher
	// running the saga carries it out.
	poison.Store(false)
	if err := projection.RequestParkRetry(e.ctx, e.store, id, "op"); err != nil {
		t.Fatal(err)
	}
	e.waitFor("the dispatcher to retry the park", 30*time.Second, func() bool {
		pk, _, err := projection.GetPark(e.ctx, e.store, id)
		return err == nil && pk.Status == projection.ParkResolved && pk.Events == 2
	})
	if res, err = e.store.Archive(e.ctx, all); err != nil || res.Streams != 2 {
		t.Fatalf("archive after the retry: %+v, %v; want both archived", res, err)
	}
}

// A park left open when the saga moves to another error mode is still held
// and retried as a whole: a retry that fails under continuous mode keeps
// the park (nothing dead-lettered, the instance not failed), and the
// instance's new events still wait behind it.
func TestSagaParkOutlivesAModeChange(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	parking, _ := newParking(e, newClock())
	e.append(ticket("a"), testevents.TicketOpened{Title: "a"}, testevents.TicketCommented{Body: "poison"})
	d := e.dispatcher(parking, projection.Config{})
	e.catchUp(d)
	if err := d.Stop(e.ctx); err != nil {
		t.Fatal(err)
	}
	id, err := saga.InstancePark(e.ctx, e.store, "sla", projector.SystemTenant, "a")
	if err != nil {
		t.Fatal(err)
	}
	continuous, poison := newSeen(e.types, newClock().Now, projection.AsyncConfig{ErrorMode: projection.SkipApplyErrors})
	e.append(ticket("a"), testevents.TicketCommented{Body: "a3"})
	e.catchUp(e.dispatcher(continuous, projection.Config{}))
	p, err := continuous.Projection(e.store)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := projection.RetryPark(e.ctx, e.store, p, id, "op", nil); err != nil || r.Resolved || r.Events != 2 {
		t.Fatalf("failing retry under continuous mode: %+v, %v; want the park kept with its 2 events", r, err)
	}
	if in, _ := seenOf(t, e, "a"); in.Status != saga.Parked || e.count(`SELECT count(*) FROM `+e.store.Table("projector_dead_letters")) != 0 {
		t.Fatalf("a is %s: want parked, nothing dead-lettered", in.Status)
	}
	poison.Store(false)
	if r, err := projection.RetryPark(e.ctx, e.store, p, id, "op", nil); err != nil || !r.Resolved {
		t.Fatalf("retry: %+v, %v", r, err)
	}
	if _, sa := seenOf(t, e, "a"); !slices.Equal(sa.Seen, []string{"opened", "poison", "a3"}) {
		t.Fatalf("a saw %v", sa.Seen)
	}
}

// A partitioned saga parks its instance as an unpartitioned one does: the
// attempts counted are the partition's that handled the event, the park
// belongs to that partition (whose dispatcher retries it), and no
// partition halts.
func TestSagaPartitionsParkInstance(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s, poison := newSeen(e.types, newClock().Now, projection.AsyncConfig{ErrorMode: projection.ParkStream, Partitions: 4})
	e.append(ticket("a"), testevents.TicketOpened{Title: "a"}, testevents.TicketCommented{Body: "poison"}, testevents.TicketCommented{Body: "a2"})
	e.append(ticket("b"), testevents.TicketOpened{Title: "b"}, testevents.TicketCommented{Body: "b1"})
	d := e.dispatcher(s, projection.Config{})
	e.catchUp(d)
	shards, err := projection.NewAdmin(e.store).List(e.ctx, "sla")
	if err != nil {
		t.Fatal(err)
	}
	for _, sh := range shards {
		if sh.Partitions > 0 && (sh.Status == projection.StatusDead || sh.LastError != "") {
			t.Fatalf("partition %s is %s (%q): parking must keep every partition going", sh.Instance, sh.Status, sh.LastError)
		}
	}
	if _, sb := seenOf(t, e, "b"); !slices.Equal(sb.Seen, []string{"opened", "b1"}) {
		t.Fatalf("instance b saw %v", sb.Seen)
	}
	parks, err := projection.ListParks(e.ctx, e.store, projection.ParkFilter{Consumer: "sla"})
	if err != nil {
		t.Fatal(err)
	}
	if len(parks) != 1 || parks[0].SagaKey() != "a" || parks[0].Events != 2 {
		t.Fatalf("parks %+v: want one of instance a holding poison and a2", parks)
	}
	if _, _, ok := projection.ParsePartition(parks[0].Instance); !ok {
		t.Fatalf("the park is under %q, want the partition that handled the event", parks[0].Instance)
	}
	if id, err := saga.InstancePark(e.ctx, e.store, "sla", projector.SystemTenant, "a"); err != nil || id != parks[0].ID {
		t.Fatalf("InstancePark: %d, %v; want %d", id, err, parks[0].ID)
	}
	poison.Store(false)
	p, err := s.Projection(e.store)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := projection.RetryPark(e.ctx, e.store, p, parks[0].ID, "op", nil); err != nil || !res.Resolved || res.Events != 2 {
		t.Fatalf("retry: %+v, %v; want the 2 events applied", res, err)
	}
	if a, sa := seenOf(t, e, "a"); a.Status != saga.Active || !slices.Equal(sa.Seen, []string{"opened", "poison", "a2"}) {
		t.Fatalf("after the retry a is %s and saw %v", a.Status, sa.Seen)
	}
}
