package saga_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
)

// refuseSLAAppends makes every append to a stream of type "sla" fail as a
// revoked grant does (SQLSTATE 42501, raised by a trigger, not a row
// policy: projection.IsSystemic), until the returned func lifts it.
func (e *env) refuseSLAAppends() (lift func()) {
	e.t.Helper()
	exec := func(sql string) {
		e.t.Helper()
		if _, err := e.store.Pool().Exec(e.ctx, sql); err != nil {
			e.t.Fatal(err)
		}
	}
	fn, table := e.store.Table("refuse_sla"), e.store.Table("projector_events")
	exec(`CREATE FUNCTION ` + fn + `() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'permission denied for the test' USING ERRCODE = 'insufficient_privilege'; END $$`)
	exec(`CREATE TRIGGER refuse_sla BEFORE INSERT ON ` + table + ` FOR EACH ROW WHEN (NEW.stream_type = 'sla') EXECUTE FUNCTION ` + fn + `()`)
	return func() { exec(`DROP TRIGGER refuse_sla ON ` + table) }
}

// A timeout step that fails for a reason not about the step (the
// database refuses its append as a revoked grant would) is not an
// attempt: with TimeoutAttempts 1 the instance stays active and the
// timeout due, the round says why, and once the grant is back the timeout
// fires. Before, each such round counted an attempt, and an outage longer
// than the backoff failed every instance whose timeout came due in it.
func TestSagaTimeoutWithASystemicFailureIsNotAnAttempt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	clk := newClock()
	s := saga.New[slaState]("reminder", saga.Config{Now: clk.Now, TimeoutAttempts: 1})
	must(saga.StartOn(s, e.types.Opened, saga.ByStream, func(_ context.Context, in *saga.Instance[slaState], _ projector.Event, _ testevents.TicketOpened) error {
		in.After("remind", time.Minute)
		return nil
	}))
	must(saga.OnTimeout(s, "remind", func(_ context.Context, in *saga.Instance[slaState], _ saga.Timeout) error {
		in.Append(projector.Stream("sla", in.Key()), projector.AnyVersion, Noted{Ticket: in.Key(), N: 1})
		in.Complete()
		return nil
	}))
	d := e.dispatcher(s, projection.Config{})
	r, err := saga.NewRunner(saga.RunnerConfig{Store: e.store, Sagas: []saga.Definition{s}})
	if err != nil {
		t.Fatal(err)
	}
	e.append(projector.Stream("ticket", "t1"), testevents.TicketOpened{Title: "a"})
	e.catchUp(d)
	clk.Advance(time.Minute)
	lift := e.refuseSLAAppends()
	for round := range 3 {
		n, err := r.FireDue(e.ctx)
		if n != 0 || err == nil || !projection.IsSystemic(err) || !strings.Contains(err.Error(), "nothing counted, still due") {
			t.Fatalf("round %d under the refusal: fired %d, %v; want nothing fired and the systemic failure reported", round, n, err)
		}
	}
	in, err := saga.Show(e.ctx, e.store, "reminder", projector.SystemTenant, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if in.Status != saga.Active || len(in.Timeouts) != 1 || in.Timeouts[0].Attempts != 0 || in.Timeouts[0].LastError != "" {
		t.Fatalf("after three refused rounds: %+v; want the instance active, its timeout due, no attempt", in)
	}
	lift()
	if n := e.fire(r); n != 1 {
		t.Fatalf("fired %d once the refusal is lifted, want 1", n)
	}
	if in, err := saga.Show(e.ctx, e.store, "reminder", projector.SystemTenant, "t1"); err != nil || in.Status != saga.Completed {
		t.Fatalf("after the refusal: %+v, %v; want it completed", in, err)
	}
}

// Continuous mode: an event step that fails for a reason not about the
// event (its append refused as by a revoked grant) stops the shard, as a
// projection's would; it is neither dead-lettered nor does it fail the
// instance, and once the grant is back and the shard restarted the event
// is applied. Before, every
// event of the kind was dead-lettered and its instance failed until the
// fix.
func TestSagaContinuousStepWithASystemicFailureIsNotDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := newContinuous(e)
	lift := e.refuseSLAAppends()
	e.append(projector.Stream("ticket", "sys"), testevents.TicketOpened{Title: "a"}, testevents.TicketCommented{Body: "x"})
	d := e.dispatcher(s, projection.Config{})
	letters := func() int {
		return e.count(`SELECT count(*) FROM ` + e.store.Table("projector_dead_letters") + ` WHERE consumer = 'sla'`)
	}
	pgtest.Eventually(t, 30*time.Second, "the shard reports the refusal (or dead-letters the event)", func() bool {
		_, lastErr := e.shardError()
		return strings.Contains(lastErr, "permission denied for the test") || letters() > 0
	})
	if n := letters(); n != 0 {
		t.Fatalf("%d dead letters under the refusal, want none", n)
	}
	if in, err := saga.Show(e.ctx, e.store, "sla", projector.SystemTenant, "sys"); err == nil && in.Status != saga.Active {
		t.Fatalf("instance under the refusal: %+v; want it active or not yet started", in)
	}
	lift()
	// A systemic failure stops the shard for the operator, as a
	// projection's does; fixed, they restart it.
	if err := projection.NewAdmin(e.store).Restart(e.ctx, projection.ShardID{Consumer: "sla", Instance: projection.SharedInstance}); err != nil {
		t.Fatal(err)
	}
	e.catchUp(d)
	in, err := saga.Show(e.ctx, e.store, "sla", projector.SystemTenant, "sys")
	if err != nil || in.Status != saga.Active || in.Version != 2 {
		t.Fatalf("after the refusal: %+v, %v; want the instance active with both steps taken", in, err)
	}
	if n := e.count(`SELECT count(*) FROM ` + e.store.Table("projector_events") + ` WHERE stream_type = 'sla' AND stream_id = 'sys'`); n != 1 {
		t.Fatalf("stream sla/sys has %d events, want the step's 1", n)
	}
}
