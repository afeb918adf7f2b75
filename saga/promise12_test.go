package saga_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/postgres"
)

// A child is this test binary run as a process that runs the "sla" saga
// (dispatcher and timeout runner) on the real clock, so the crash test can
// SIGKILL a real process.
const (
	childEnv      = "PROJECTOR_TEST_SAGA_CHILD"
	childURLEnv   = "PROJECTOR_TEST_SAGA_URL"
	childSchema   = "PROJECTOR_TEST_SAGA_SCHEMA"
	childKillStep = "PROJECTOR_TEST_SAGA_KILL_STEP"
	// childKillEvent and childKillTimeout count only events' steps or only
	// timeouts' steps towards the kill: the step the child dies in.
	childKillEvent   = "PROJECTOR_TEST_SAGA_KILL_EVENT_STEP"
	childKillTimeout = "PROJECTOR_TEST_SAGA_KILL_TIMEOUT_STEP"
	// childPartitions is the saga's Async.Partitions in the child.
	childPartitions = "PROJECTOR_TEST_SAGA_PARTITIONS"
	// childPark makes the child run the parking saga of park_test.go.
	childPark = "PROJECTOR_TEST_SAGA_PARK"
	// childRemind is the reminder delay the child's saga schedules.
	childRemind = 40 * time.Millisecond
)

func runChild() int {
	ctx, stop := pgtest.ChildContext()
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	pool, err := pgxpool.New(ctx, os.Getenv(childURLEnv))
	if err != nil {
		return pgtest.ChildFailed(ctx, logger, "child: pool", err)
	}
	defer pool.Close()
	ty := newTypes()
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: os.Getenv(childSchema), Registry: ty.Registry, Logger: logger})
	if err != nil {
		return pgtest.ChildFailed(ctx, logger, "child: store", err)
	}
	// killStep > 0: SIGKILL this process right after the killStep-th
	// handler decided, inside the step's open transaction.
	// killEvent or killTimeout > 0: the same, counting only events' or
	// only timeouts' steps.
	killStep, _ := strconv.ParseInt(os.Getenv(childKillStep), 10, 64)
	killEvent, _ := strconv.ParseInt(os.Getenv(childKillEvent), 10, 64)
	killTimeout, _ := strconv.ParseInt(os.Getenv(childKillTimeout), 10, 64)
	var steps, eventSteps, timeoutSteps atomic.Int64
	partitions, _ := strconv.Atoi(os.Getenv(childPartitions))
	var s saga.Definition = newSLA(ty, slaOptions{remindAfter: childRemind, async: projection.AsyncConfig{BatchSize: 7, Partitions: partitions}, afterDecide: func(timeout bool) {
		kind, n := &eventSteps, killEvent
		if timeout {
			kind, n = &timeoutSteps, killTimeout
		}
		if (killStep > 0 && steps.Add(1) == killStep) || (n > 0 && kind.Add(1) == n) {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}})
	if os.Getenv(childPark) != "" {
		// The parking saga, its poison failing (the binary before the fix).
		s, _ = newSeen(ty, time.Now, projection.AsyncConfig{ErrorMode: projection.ParkStream, BatchSize: 7})
	}
	p, err := s.Projection(store)
	if err != nil {
		return pgtest.ChildFailed(ctx, logger, "child: saga", err)
	}
	d, err := projection.New(projection.Config{Store: store, Projections: []*projection.Async{p}, Logger: logger,
		PollMax: 20 * time.Millisecond, Recheck: 20 * time.Millisecond})
	if err != nil {
		return pgtest.ChildFailed(ctx, logger, "child: dispatcher", err)
	}
	r, err := saga.NewRunner(saga.RunnerConfig{Store: store, Sagas: []saga.Definition{s}, Poll: 20 * time.Millisecond, Logger: logger})
	if err != nil {
		return pgtest.ChildFailed(ctx, logger, "child: runner", err)
	}
	if err := d.Start(ctx); err != nil {
		return pgtest.ChildFailed(ctx, logger, "child: start", err)
	}
	if err := r.Start(ctx); err != nil {
		return pgtest.ChildFailed(ctx, logger, "child: start runner", err)
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := r.Stop(sctx); err != nil {
		logger.Error("child: stop runner", "error", err)
		return 1
	}
	if err := d.Stop(sctx); err != nil {
		logger.Error("child: stop", "error", err)
		return 1
	}
	return 0
}

// startChild runs this test binary as the saga's process on e's schema;
// extra is more of its environment.
func (e *env) startChild(killStep int, extra ...string) *pgtest.Child {
	e.t.Helper()
	return pgtest.StartChild(e.t, append([]string{childEnv + "=1", childURLEnv + "=" + pgtest.URL(e.t), childSchema + "=" + e.store.Schema(),
		childKillStep + "=" + strconv.Itoa(killStep)}, extra...)...)
}

// startPartitionedChild is startChild with the saga in partitions.
func (e *env) startPartitionedChild(killStep, partitions int) *pgtest.Child {
	e.t.Helper()
	return e.startChild(killStep, childPartitions+"="+strconv.Itoa(partitions))
}

// TestPromise12_CrashExactlyOnce SIGKILLs the process running the saga
// (dispatcher and timeout runner) at random moments by the clock, and from
// inside a step right after its handler decided, with the step's
// transaction open: in an event's step late in a full batch (earlier steps
// of the same transaction started instances and appended), and in a
// timeout's step. After every kill the committed state holds together:
// each instance's version is its count of steps (none started without its
// step), and each appended event and pending timeout has its cause's step.
// At the end every handled event took exactly one step and appended
// exactly one event, every reminder fired exactly once (never for an
// assigned ticket, never twice, never lost), and each appended event
// carries its cause and the instance's correlation id.
func TestPromise12_CrashExactlyOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills child processes")
	}
	e := newEnv(t)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 12))
	// Every other round assigns a ticket, always through agent ann.
	load := newSLALoad(e, rng, func() string {
		if rng.IntN(2) == 0 {
			return "ann"
		}
		return ""
	})
	// Four kills, one in an event's step and one in a timeout's, reach
	// every state the checks cover; PROJECTOR_SOAK runs twelve.
	wantKills := pgtest.Size(4, 12)
	kills := 0
	for round := 0; kills < wantKills; round++ {
		if round > 5*wantKills {
			t.Fatalf("only %d of %d kills in %d rounds", kills, wantKills, round)
		}
		var c *pgtest.Child
		switch round % 4 {
		case 1, 3:
			// The round's events are in before the child starts, so its
			// first batch is full (7): any six events in a row of the
			// load hold an opening and a comment, so the sixth event's
			// step dies after the same transaction started an instance
			// and appended a note. A timeout's step dies after the
			// runner's transaction may have fired another.
			load.appendSome()
			if round%4 == 1 {
				c = e.startChild(0, childKillEvent+"=6")
			} else {
				c = e.startChild(0, childKillTimeout+"=2")
			}
			select {
			case <-c.Done():
			case <-time.After(time.Minute):
				c.Kill(t)
				t.Fatalf("round %d: the child did not reach the step it dies in:\n%s", round, c.Output())
			}
		default:
			// Kill at a random moment unless the child killed itself first.
			c = e.startChild(0)
			load.appendSome()
			select {
			case <-c.Done():
			case <-time.After(time.Duration(30+rng.IntN(150)) * time.Millisecond):
				c.Kill(t)
			}
		}
		if c.Killed() {
			kills++
		} else {
			t.Fatalf("child exited without being killed:\n%s", c.Output())
		}
		load.checkCommittedTogether(fmt.Sprintf("after kill %d (round %d)", kills, round))
	}
	// A last child runs to the end: everything converges.
	c := e.startChild(0)
	load.waitConverged()
	c.Terminate(t)
	load.checkCommittedTogether("at the end")
	load.checkExactlyOnce()
	t.Logf("%d SIGKILLs, %d tickets", kills, load.tickets)
}

// slaLoad is what the crash tests feed the sla saga, remembered to check
// the saga's steps and reminders against.
type slaLoad struct {
	e   *env
	rng *rand.Rand
	// agent names the agent stream of a round's assignment, or "" for
	// none in this round.
	agent func() string
	// tickets are t-0 … t-(tickets-1), all opened; comments counts each
	// one's comments; assigned holds those assigned to an agent.
	tickets  int
	comments map[string]int
	assigned map[string]bool
}

func newSLALoad(e *env, rng *rand.Rand, agent func() string) *slaLoad {
	return &slaLoad{e: e, rng: rng, agent: agent, comments: map[string]int{}, assigned: map[string]bool{}}
}

// appendSome opens three tickets, comments four at random and assigns one
// at random (if agent names an agent and it is not assigned yet).
func (l *slaLoad) appendSome() {
	for range 3 {
		id := fmt.Sprintf("t-%d", l.tickets)
		l.tickets++
		l.e.append(projector.Stream("ticket", id), testevents.TicketOpened{Title: id})
	}
	for range 4 {
		id := fmt.Sprintf("t-%d", l.rng.IntN(l.tickets))
		l.e.append(projector.Stream("ticket", id), testevents.TicketCommented{Body: "c"})
		l.comments[id]++
	}
	if id, agent := fmt.Sprintf("t-%d", l.rng.IntN(l.tickets)), l.agent(); agent != "" && !l.assigned[id] {
		l.e.append(projector.Stream("agent", agent), Assigned{Ticket: id, Agent: "ann"})
		l.assigned[id] = true
	}
}

// waitConverged waits until the saga took every step and fired every
// reminder of what was appended.
func (l *slaLoad) waitConverged() {
	l.e.t.Helper()
	sla := l.e.store.Table("projector_saga_instances")
	l.e.waitFor("every step and reminder", 60*time.Second, func() bool {
		var steps int
		if err := l.e.store.Pool().QueryRow(l.e.ctx, `SELECT coalesce(sum(version), 0) FROM `+sla).Scan(&steps); err != nil {
			l.e.t.Fatal(err)
		}
		want := l.tickets // one opened step each
		for _, n := range l.comments {
			want += n
		}
		want += len(l.assigned)
		reminders := 0
		for i := range l.tickets {
			if !l.assigned[fmt.Sprintf("t-%d", i)] {
				reminders++
			}
		}
		// Assigned tickets may or may not have been reminded first.
		return steps >= want+reminders && l.e.pendingTimeouts() == 0 && l.e.instances() == l.tickets
	})
}

// checkCommittedTogether checks, in one snapshot of what is committed, that
// a step's writes committed with it: each instance's version is its count
// of steps and at least one (an instance committed without its first step
// has version 0), each event in an sla stream was caused by a step of that
// ticket's instance, and each pending timeout was scheduled by one. A
// write committed outside its step's transaction shows here after a kill
// inside the step, even when the step's retry would mend the count.
func (l *slaLoad) checkCommittedTogether(when string) {
	e := l.e
	e.t.Helper()
	in, st, ev, tm := e.store.Table("projector_saga_instances"), e.store.Table("projector_saga_steps"),
		e.store.Table("projector_events"), e.store.Table("projector_saga_timeouts")
	var versions, appended, timeouts string
	err := e.store.Pool().QueryRow(e.ctx, `SELECT
			coalesce((SELECT string_agg(i.key || ' at version ' || i.version || ' with ' || n.steps || ' steps', ', ')
				FROM `+in+` i CROSS JOIN LATERAL (SELECT count(*) AS steps FROM `+st+` s WHERE s.instance_id = i.id) n
				WHERE i.version = 0 OR i.version <> n.steps), ''),
			coalesce((SELECT string_agg(a.type || ' in sla/' || a.stream_id, ', ') FROM `+ev+` a
				WHERE a.stream_type = 'sla' AND NOT EXISTS (SELECT 1 FROM `+st+` s JOIN `+in+` i ON i.id = s.instance_id
					WHERE s.cause_id = a.causation_id AND i.key = a.stream_id)), ''),
			coalesce((SELECT string_agg(x.name || ' of ' || i.key, ', ') FROM `+tm+` x JOIN `+in+` i ON i.id = x.instance_id
				WHERE NOT EXISTS (SELECT 1 FROM `+st+` s WHERE s.instance_id = x.instance_id AND s.cause_id = x.scheduled_by)), '')`).
		Scan(&versions, &appended, &timeouts)
	if err != nil {
		e.t.Fatal(err)
	}
	if versions != "" {
		e.t.Errorf("%s: instances whose version is not their count of steps (a start or state committed without its step): %s", when, versions)
	}
	if appended != "" {
		e.t.Errorf("%s: events appended without their cause's step (committed outside the step's transaction): %s", when, appended)
	}
	if timeouts != "" {
		e.t.Errorf("%s: timeouts pending without the step that scheduled them: %s", when, timeouts)
	}
}

// checkExactlyOnce checks the saga's tables and the log against what was
// appended.
func (l *slaLoad) checkExactlyOnce() {
	t, e, tickets, comments, assigned := l.e.t, l.e, l.tickets, l.comments, l.assigned
	t.Helper()
	ev := e.store.Table("projector_events")
	for i := range tickets {
		id := fmt.Sprintf("t-%d", i)
		in, err := saga.Show(e.ctx, e.store, "sla", projector.SystemTenant, id)
		if err != nil {
			t.Fatal(err)
		}
		var notes, reminders, badCause, badCorr int
		for _, a := range in.Appended {
			switch a.Type {
			case "sla.noted":
				notes++
			case "sla.reminded":
				reminders++
			}
		}
		err = e.store.Pool().QueryRow(e.ctx, `SELECT
				count(*) FILTER (WHERE a.causation_id IS NULL OR NOT EXISTS (
					SELECT 1 FROM `+ev+` c WHERE c.id = a.causation_id AND c.type = 'ticket.commented' AND c.stream_id = $1)
					AND a.type = 'sla.noted'),
				count(*) FILTER (WHERE a.correlation_id <> $2)
			FROM `+ev+` a WHERE a.stream_type = 'sla' AND a.stream_id = $1`, id, in.CorrelationID).Scan(&badCause, &badCorr)
		if err != nil {
			t.Fatal(err)
		}
		var all int
		if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+ev+` WHERE stream_type = 'sla' AND stream_id = $1`, id).Scan(&all); err != nil {
			t.Fatal(err)
		}
		timeoutSteps := 0
		for _, s := range in.Steps {
			if s.Cause == "timeout" {
				timeoutSteps++
			}
		}
		switch {
		case notes != comments[id] || all != notes+reminders:
			t.Errorf("%s: %d notes (%d events in its sla stream) for %d comments", id, notes, all, comments[id])
		case reminders > 1 || timeoutSteps > 1:
			t.Errorf("%s: reminded %d times in %d timeout steps; a timeout fired twice", id, reminders, timeoutSteps)
		case !assigned[id] && reminders != 1:
			t.Errorf("%s: unassigned but reminded %d times; a timeout was lost", id, reminders)
		case badCause != 0 || badCorr != 0:
			t.Errorf("%s: %d notes without their comment as cause, %d events with another correlation id", id, badCause, badCorr)
		case int(in.Version) != len(in.Steps):
			t.Errorf("%s: version %d but %d steps", id, in.Version, len(in.Steps))
		}
	}
}

// TestPromise12_TimeoutsOnceNeverEarly moves an injected clock: a timeout
// does not fire a moment before it is due, fires once when due, not again
// (nor after a restart of the runner), and a cancelled one never fires.
func TestPromise12_TimeoutsOnceNeverEarly(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	clk := newClock()
	s := newSLA(e.types, slaOptions{now: clk.Now, remindAfter: time.Hour})
	d := e.dispatcher(s, projection.Config{})
	r := e.runner(s)

	e.append(projector.Stream("ticket", "due"), testevents.TicketOpened{Title: "a"})
	e.append(projector.Stream("ticket", "cancelled"), testevents.TicketOpened{Title: "b"})
	e.catchUp(d)
	e.append(projector.Stream("agent", "ann"), Assigned{Ticket: "cancelled", Agent: "ann"})
	e.catchUp(d)
	if got := e.pendingTimeouts(); got != 1 {
		t.Fatalf("%d pending timeouts, want 1 (the other was cancelled)", got)
	}

	clk.Advance(time.Hour - time.Nanosecond)
	if n := e.fire(r); n != 0 || e.events("sla.reminded") != 0 {
		t.Fatalf("fired %d timeouts a nanosecond early", n)
	}
	clk.Advance(time.Nanosecond)
	if n := e.fire(r); n != 1 || e.events("sla.reminded") != 1 {
		t.Fatalf("fired %d timeouts when due, want 1", n)
	}
	if n := e.fire(r); n != 0 {
		t.Fatalf("fired %d timeouts again", n)
	}
	clk.Advance(24 * time.Hour)
	r2 := e.runner(s) // a restarted process
	if n := e.fire(r2); n != 0 || e.events("sla.reminded") != 1 {
		t.Fatalf("after a restart fired %d more; the cancelled or fired timeout fired again", n)
	}
	in, err := saga.Show(e.ctx, e.store, "sla", projector.SystemTenant, "due")
	if err != nil {
		t.Fatal(err)
	}
	if in.Version != 2 || in.Steps[1].Cause != "timeout" || in.Steps[1].Type != "remind" || len(in.Appended) != 1 ||
		in.Appended[0].CausationID != in.Steps[1].CauseID {
		t.Fatalf("instance %+v: want the reminder as step 2, its event caused by the timeout", in)
	}
}

// TestPromise12_RunnerLoopFires checks the running loop (not FireDue
// called by hand) fires a due timeout on the real clock, not before it is
// due, after Start and stops cleanly.
func TestPromise12_RunnerLoopFires(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := newSLA(e.types, slaOptions{remindAfter: 200 * time.Millisecond})
	d := e.dispatcher(s, projection.Config{})
	r := e.runner(s)
	if err := r.Start(e.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := r.Stop(e.ctx); err != nil {
			t.Error(err)
		}
		if err := r.Stop(e.ctx); err != nil { // twice is fine
			t.Error(err)
		}
	}()
	e.append(projector.Stream("ticket", "t-1"), testevents.TicketOpened{Title: "a"})
	e.catchUp(d)
	e.waitFor("the reminder", 20*time.Second, func() bool { return e.events("sla.reminded") == 1 })
	var opened, reminded time.Time
	ev := e.store.Table("projector_events")
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT (SELECT created_at FROM `+e.store.Table("projector_saga_steps")+` WHERE step = 1),
		(SELECT recorded_at FROM `+ev+` WHERE type = 'sla.reminded')`).Scan(&opened, &reminded); err != nil {
		t.Fatal(err)
	}
	if reminded.Sub(opened) < 200*time.Millisecond {
		t.Fatalf("reminder %v after the step that scheduled it; due after 200ms", reminded.Sub(opened))
	}
}

// TestPromise12_ThreeDispatchersOneInstanceAtATime runs three dispatchers
// and three runners over one saga while events and timeouts for the same
// few instances flow: a check inside every handler fails the test if two
// steps of one instance ever overlap. A timeout due while an event's step
// holds its instance waits for that step, and each sees the other's result.
func TestPromise12_ThreeDispatchersOneInstanceAtATime(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var mu sync.Mutex
	busy := map[string]bool{}
	var overlaps, stepsSeen atomic.Int64
	enter := func(key string) func() {
		mu.Lock()
		if busy[key] {
			overlaps.Add(1)
		}
		busy[key] = true
		mu.Unlock()
		stepsSeen.Add(1)
		return func() {
			mu.Lock()
			busy[key] = false
			mu.Unlock()
		}
	}
	// Every handler sees the same saga definition's state, so each
	// dispatcher and runner gets a saga of its own, as separate processes.
	var runners []*saga.Runner
	var ds []*projection.Dispatcher
	for range 3 {
		s := newSLA(e.types, slaOptions{remindAfter: 5 * time.Millisecond, enter: enter, async: projection.AsyncConfig{BatchSize: 3}})
		ds = append(ds, e.dispatcher(s, projection.Config{}))
		r := e.runner(s)
		if err := r.Start(e.ctx); err != nil {
			t.Fatal(err)
		}
		runners = append(runners, r)
	}
	defer func() {
		for _, r := range runners {
			if err := r.Stop(e.ctx); err != nil {
				t.Error(err)
			}
		}
	}()
	const tickets, rounds = 4, 30
	for i := range tickets {
		e.append(projector.Stream("ticket", fmt.Sprintf("t-%d", i)), testevents.TicketOpened{Title: "x"})
	}
	for j := range rounds {
		for i := range tickets {
			e.append(projector.Stream("ticket", fmt.Sprintf("t-%d", i)), testevents.TicketCommented{Body: "c", N: j})
			e.append(projector.Stream("ticket", fmt.Sprintf("t-%d", i)), testevents.TicketOpened{Title: "again"}) // reschedules
		}
	}
	for _, d := range ds {
		e.catchUp(d)
	}
	e.waitFor("every reminder", 30*time.Second, func() bool { return e.pendingTimeouts() == 0 })
	if n := overlaps.Load(); n != 0 {
		t.Fatalf("%d times two steps of one instance ran at once", n)
	}
	if got := e.events("sla.noted"); got != tickets*rounds {
		t.Fatalf("%d notes, want %d", got, tickets*rounds)
	}
	var steps int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+e.store.Table("projector_saga_steps")).Scan(&steps); err != nil {
		t.Fatal(err)
	}
	if reminders := e.events("sla.reminded"); steps != tickets*(1+2*rounds)+reminders || reminders < tickets {
		t.Fatalf("%d steps, %d reminders; want one step per event plus one per reminder, and each ticket reminded", steps, reminders)
	}
	t.Logf("%d handler calls, %d reminders", stepsSeen.Load(), e.events("sla.reminded"))
}

// A timeout due while an event's step holds its instance is not fired
// through the lock: the runner passes it over until the step commits, then
// fires it against the state the step left.
func TestPromise12_TimeoutWaitsForEventStep(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	clk := newClock()
	s := newSLA(e.types, slaOptions{now: clk.Now, remindAfter: time.Minute})
	d := e.dispatcher(s, projection.Config{})
	r := e.runner(s)
	e.append(projector.Stream("ticket", "t-1"), testevents.TicketOpened{Title: "x"})
	e.catchUp(d)
	clk.Advance(time.Hour)

	// Hold the instance's row lock as an event's step in flight would.
	tx, err := e.store.Pool().Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(e.ctx) }()
	if _, err := tx.Exec(e.ctx, `SELECT 1 FROM `+e.store.Table("projector_saga_instances")+` WHERE key = 't-1' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	if n := e.fire(r); n != 0 {
		t.Fatalf("fired %d timeouts through the instance's lock", n)
	}
	// The "step" assigns the ticket, as an event's step would.
	if _, err := tx.Exec(e.ctx, `UPDATE `+e.store.Table("projector_saga_instances")+` SET state = jsonb_set(state, '{agent}', '"ann"') WHERE key = 't-1'`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.fire(r); n != 1 {
		t.Fatalf("fired %d after the step committed, want 1", n)
	}
	if got := e.events("sla.reminded"); got != 0 {
		t.Fatalf("the timeout step did not see the committed state: %d reminders for an assigned ticket", got)
	}
}

var _ = pgx.ErrNoRows
