package saga_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/aggregate"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
)

// newContinuous defines a continuous-mode saga "sla" whose steps fail on
// cue: an opening titled "boom", a comment "fail" (the handler's error),
// "half" (an append made, then a command its aggregate refuses: the append
// must be taken back), "bad-type" (an invalid step), "stale" (an append at a
// wrong expected version: contention, retried, never dead-lettered), and an
// assignment with an empty ticket (no correlation key).
func newContinuous(e *env) *saga.Saga[slaState] {
	type ticket struct{}
	repo, err := aggregate.New(e.store, aggregate.Config[ticket]{Name: "ticket", Folds: []aggregate.Fold[ticket]{
		aggregate.On(e.types.Closed, func(*ticket, testevents.TicketClosed) {}),
	}})
	if err != nil {
		e.t.Fatal(err)
	}
	s := saga.New[slaState]("sla", saga.Config{Async: projection.AsyncConfig{ErrorMode: projection.SkipApplyErrors}})
	stream := func(in *saga.Instance[slaState]) projector.StreamRef { return projector.Stream("sla", in.Key()) }
	must(saga.StartOn(s, e.types.Opened, saga.ByStream, func(_ context.Context, in *saga.Instance[slaState], _ projector.Event, o testevents.TicketOpened) error {
		if o.Title == "boom" {
			return errors.New("cannot start this one")
		}
		in.After("remind", time.Hour)
		return nil
	}))
	must(saga.On(s, e.types.Commented, saga.ByStream, func(_ context.Context, in *saga.Instance[slaState], _ projector.Event, c testevents.TicketCommented) error {
		in.State.Comments++
		switch c.Body {
		case "fail":
			return errors.New("handler says no")
		case "half":
			in.Append(stream(in), projector.AnyVersion, Noted{Ticket: in.Key(), N: in.State.Comments})
			saga.Command(in, repo, projector.Stream("ticket", in.Key()), func(context.Context, aggregate.Loaded[ticket]) ([]any, error) {
				return nil, errors.New("the ticket refuses")
			})
		case "bad-type":
			in.Append(stream(in), projector.AnyVersion, Undefined{})
		case "stale":
			in.Append(stream(in), projector.ExactVersion(99), Noted{Ticket: in.Key()})
		default:
			in.Append(stream(in), projector.AnyVersion, Noted{Ticket: in.Key(), N: in.State.Comments})
		}
		return nil
	}))
	must(saga.On(s, e.types.Assigned, func(_ projector.Event, a Assigned) string { return a.Ticket },
		func(context.Context, *saga.Instance[slaState], projector.Event, Assigned) error { return nil }))
	must(saga.OnTimeout(s, "remind", func(context.Context, *saga.Instance[slaState], saga.Timeout) error { return nil }))
	return s
}

// Continuous mode: an event whose step fails is dead-lettered under the
// saga's consumer, its instance is marked failed with the error (its
// timeouts cancelled, later events counted as late), the step's writes are
// all taken back, and the consumer goes on: instances before and after the
// failures take their steps, the shard is neither dead nor failing.
func TestSagaContinuousModeDeadLettersAndFailsInstance(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := newContinuous(e)
	ticket := func(id string) projector.StreamRef { return projector.Stream("ticket", id) }
	e.append(ticket("ok"), testevents.TicketOpened{Title: "a"}, testevents.TicketCommented{Body: "x"}, testevents.TicketCommented{Body: "y"})
	e.append(ticket("fail"), testevents.TicketOpened{Title: "b"}, testevents.TicketCommented{Body: "x"},
		testevents.TicketCommented{Body: "fail"}, testevents.TicketCommented{Body: "after"})
	e.append(ticket("half"), testevents.TicketOpened{Title: "c"}, testevents.TicketCommented{Body: "half"})
	e.append(ticket("badtype"), testevents.TicketOpened{Title: "d"}, testevents.TicketCommented{Body: "bad-type"})
	e.append(ticket("boom"), testevents.TicketOpened{Title: "boom"})
	e.append(projector.Stream("agent", "alice"), Assigned{Ticket: "", Agent: "alice"})
	e.append(ticket("ok2"), testevents.TicketOpened{Title: "e"}, testevents.TicketCommented{Body: "x"})
	d := e.dispatcher(s, projection.Config{})
	e.catchUp(d)

	if st, lastErr := e.shardError(); st != projection.StatusIdle || lastErr != "" {
		t.Fatalf("shard %s (%q): continuous mode must go on, not halt", st, lastErr)
	}
	list, err := saga.List(e.ctx, e.store, saga.ListQuery{Saga: "sla", Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	status := map[string]saga.Status{}
	for _, in := range list {
		status[in.Key] = in.Status
	}
	want := map[string]saga.Status{"ok": saga.Active, "ok2": saga.Active, "fail": saga.Failed, "half": saga.Failed, "badtype": saga.Failed, "boom": saga.Failed}
	if len(status) != len(want) {
		t.Fatalf("instances %v, want %v (no instance for the keyless event)", status, want)
	}
	for k, st := range want {
		if status[k] != st {
			t.Errorf("instance %s is %q, want %q", k, status[k], st)
		}
	}
	failed, err := saga.List(e.ctx, e.store, saga.ListQuery{Saga: "sla", Statuses: []saga.Status{saga.Failed}, Limit: 100})
	if err != nil || len(failed) != 4 {
		t.Fatalf("list --status failed: %d instances, %v", len(failed), err)
	}
	in, err := saga.Show(e.ctx, e.store, "sla", projector.SystemTenant, "fail")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(in.LastError, "handler says no") || in.Version != 2 || in.LateEvents != 1 || len(in.Timeouts) != 0 {
		t.Errorf("failed instance: last error %q, %d steps (want 2: the opening and the first comment), %d late (want 1), %d timeouts (want 0)",
			in.LastError, in.Version, in.LateEvents, len(in.Timeouts))
	}
	noted := func(key string) int {
		return e.count(`SELECT count(*) FROM `+e.store.Table("projector_events")+` WHERE stream_type = 'sla' AND stream_id = $1`, key)
	}
	for key, n := range map[string]int{"ok": 2, "fail": 1, "half": 0, "badtype": 0, "ok2": 1} {
		if got := noted(key); got != n {
			t.Errorf("stream sla/%s has %d events, want %d", key, got, n)
		}
	}
	if n := e.pendingTimeouts(); n != 2 {
		t.Errorf("%d pending timeouts, want 2 (those of ok and ok2; a failed instance's are cancelled)", n)
	}
	rows, err := e.store.Pool().Query(e.ctx, `SELECT stream_type || '/' || stream_id || ' ' || event_type FROM `+e.store.Table("projector_dead_letters")+`
		WHERE consumer = 'sla' AND instance_id = $1 AND reason = 'apply-error' ORDER BY 1`, projection.SharedInstance)
	if err != nil {
		t.Fatal(err)
	}
	var letters []string
	for rows.Next() {
		var l string
		if err := rows.Scan(&l); err != nil {
			t.Fatal(err)
		}
		letters = append(letters, l)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	wantLetters := []string{"agent/alice agent.assigned", "ticket/badtype ticket.commented", "ticket/boom ticket.opened", "ticket/fail ticket.commented", "ticket/half ticket.commented"}
	if !slices.Equal(letters, wantLetters) {
		t.Errorf("dead letters %v, want %v", letters, wantLetters)
	}
	if s.DeadLettered() != int64(len(wantLetters)) {
		t.Errorf("DeadLettered() = %d, want %d", s.DeadLettered(), len(wantLetters))
	}
	// The runner's metrics read the same counts: the dead letters, and the
	// late comment that reached the failed instance.
	reg := prometheus.NewRegistry()
	if _, err := saga.NewRunner(saga.RunnerConfig{Store: e.store, Sagas: []saga.Definition{s}, Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if c := m.GetCounter(); c != nil && len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == "sla" {
				got[f.GetName()] = c.GetValue()
			}
		}
	}
	if got["projector_saga_dead_letters_total"] != 5 || got["projector_saga_late_events_total"] != 1 {
		t.Errorf("metrics %v, want 5 dead letters and 1 late event", got)
	}
}

// Contention is not a step's fault: in continuous mode too, a step refused
// for its expected version is retried (the shard failing, with backoff),
// never dead-lettered, and its instance stays active.
func TestSagaContinuousModeRetriesContention(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := newContinuous(e)
	e.append(projector.Stream("ticket", "t"), testevents.TicketOpened{Title: "a"}, testevents.TicketCommented{Body: "stale"})
	e.dispatcher(s, projection.Config{})
	e.waitFor("the stale step to fail", 30*time.Second, func() bool {
		_, lastErr := e.shardError()
		return lastErr != ""
	})
	if _, lastErr := e.shardError(); !strings.Contains(lastErr, "version") {
		t.Errorf("shard's last error %q, want the version conflict", lastErr)
	}
	if n := e.count(`SELECT count(*) FROM ` + e.store.Table("projector_dead_letters")); n != 0 {
		t.Errorf("%d dead letters: contention was dead-lettered", n)
	}
	if n := e.count(`SELECT count(*) FROM ` + e.store.Table("projector_saga_instances") + ` WHERE status <> 'active'`); n != 0 {
		t.Errorf("%d instances not active after contention", n)
	}
}
