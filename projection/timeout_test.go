package projection_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
)

// tenEvents appends one stream of ten events in one transaction, so they
// reach a consumer in one batch: opened, then nine comments.
func (e *env) tenEvents(stream string) []projector.Event {
	e.t.Helper()
	payloads := []any{testevents.TicketOpened{Title: stream}}
	for i := range 9 {
		payloads = append(payloads, testevents.TicketCommented{Body: "c", N: i})
	}
	return e.appendOne(stream, projector.NoStream, payloads...)
}

// deadLettered lists the ids of the events dead-lettered for consumer.
func (e *env) deadLettered(consumer string) map[string]string {
	e.t.Helper()
	rows, err := e.store.Pool().Query(e.ctx, `SELECT event_id::text, error FROM `+e.store.Table("projector_dead_letters")+` WHERE consumer = $1`, consumer)
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]string{}
	var id, msg string
	if _, err := pgx.ForEachRow(rows, []any{&id, &msg}, func() error { out[id] = msg; return nil }); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// A batch whose 7th event outlasts the batch timeout fails blaming the 7th,
// with the six before it applied; skipping then dead-letters the 7th alone.
// Every event ends up applied exactly once or dead-lettered, never neither:
// before, the cursor stayed before the 1st while the failure named the 7th,
// so skip passed six events that were never applied.
func TestBatchTimeoutBlamesRunningEventAndSkipPassesOnlyIt(t *testing.T) {
	t.Parallel()
	hangs := map[string]func(ctx context.Context, tx pgx.Tx) error{
		// A statement that outlives the deadline: the deadline closes the
		// connection under it.
		"statement": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `SELECT pg_sleep(20)`)
			return err
		},
		// A handler that waits for its context and returns its error: the
		// connection stays usable.
		"context": func(ctx context.Context, tx pgx.Tx) error {
			<-ctx.Done()
			return ctx.Err()
		},
	}
	for name, hang := range hangs {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.traceTable()
			trace := e.table("trace")
			var hanging atomic.Bool
			hanging.Store(true)
			p := projection.NewAsync("slow", projection.AsyncConfig{BatchTimeout: 300 * time.Millisecond, MaxAttempts: 2,
				RetryBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
			h := func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
				if _, err := tx.Exec(ctx, `INSERT INTO `+trace+` (consumer, event_id) VALUES ('slow', $1)`, ev.ID); err != nil {
					return err
				}
				if ev.Version == 7 && hanging.Load() {
					return hang(ctx, tx)
				}
				return nil
			}
			must(projection.OnEvent(p, e.types.Opened, h))
			must(projection.OnEvent(p, e.types.Commented, h))
			events := e.tenEvents("t1")
			e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
			admin := projection.NewAdmin(e.store)
			eventually(t, time.Minute, "the shard to die", func() bool { return e.status(admin, "slow").Status == projection.StatusDead })
			st := e.status(admin, "slow")
			if st.FailedEventID != events[6].ID {
				t.Fatalf("the dead shard blames event %s, want the 7th, %s (state %+v)", st.FailedEventID, events[6].ID, st)
			}
			if !strings.Contains(st.LastError, "batch timeout") {
				t.Errorf("last error %q does not name the batch timeout", st.LastError)
			}
			if name == "statement" {
				// The cut-off statement's backend was cancelled, not left to
				// hold the shard's lock and the horizon for 20 seconds.
				eventually(t, 5*time.Second, "the timed-out statement's backend to end", func() bool {
					var n int
					err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM pg_stat_activity
						WHERE query = 'SELECT pg_sleep(20)' AND state <> 'idle' AND pid <> pg_backend_pid()`).Scan(&n)
					return err == nil && n == 0
				})
			}
			for i, ev := range events[:6] {
				if n := e.traced("slow", ev.ID); n != 1 {
					t.Errorf("event %d, before the one that hung: applied %d times, want 1", i+1, n)
				}
			}
			if err := admin.Skip(e.ctx, projection.ShardID{Consumer: "slow"}); err != nil {
				t.Fatal(err)
			}
			eventually(t, time.Minute, "the events after the skipped one", func() bool { return e.traced("slow", events[9].ID) == 1 })
			dead := e.deadLettered("slow")
			for i, ev := range events {
				applied, lettered := e.traced("slow", ev.ID), dead[ev.ID.String()] != ""
				switch {
				case i == 6 && (applied != 0 || !lettered):
					t.Errorf("the hung 7th event: applied %d, dead-lettered %v; want only dead-lettered", applied, lettered)
				case i != 6 && (applied != 1 || lettered):
					t.Errorf("event %d: applied %d, dead-lettered %v; want applied once", i+1, applied, lettered)
				}
			}
			if len(dead) != 1 {
				t.Errorf("%d dead letters, want the skipped event only: %v", len(dead), dead)
			}
		})
	}
}

// Continuous mode: handlers that are each quick but together outlast the
// batch timeout (a slow call before the first write, as the docs advise)
// must all be applied, with nothing dead-lettered: a timed-out batch is
// retried, never dead-lettered, and events whose handlers succeeded are
// never blamed. Before, all were dead-lettered and none applied. 120
// events: three full batches, each of which outlasts the timeout (40 ×
// 10 ms against 200 ms: twice over, and one event is a twentieth of it),
// without seconds of waiting that prove nothing more.
func TestContinuousModeBatchTimeoutDeadLettersNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.traceTable()
	trace := e.table("trace")
	p := projection.NewAsync("patient", projection.AsyncConfig{ErrorMode: projection.SkipApplyErrors, BatchSize: 40,
		BatchTimeout: 200 * time.Millisecond, RetryBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
	h := func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		select {
		case <-time.After(10 * time.Millisecond): // a call to a slow service
		case <-ctx.Done():
			return ctx.Err()
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+trace+` (consumer, event_id) VALUES ('patient', $1)`, ev.ID)
		return err
	}
	must(projection.OnEvent(p, e.types.Opened, h))
	must(projection.OnEvent(p, e.types.Commented, h))
	var events []projector.Event
	for i := range 12 {
		events = append(events, e.tenEvents(fmt.Sprintf("s%02d", i))...)
	}
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if dead := e.deadLettered("patient"); len(dead) != 0 {
		t.Fatalf("%d of %d events dead-lettered, want none", len(dead), len(events))
	}
	for i, ev := range events {
		if n := e.traced("patient", ev.ID); n != 1 {
			t.Fatalf("event %d of %d applied %d times, want 1", i+1, len(events), n)
		}
	}
	st := e.status(projection.NewAdmin(e.store), "patient")
	if st.Status != projection.StatusIdle || st.Processed != int64(len(events)) {
		t.Fatalf("shard after catching up: status %s, processed %d; want idle, %d", st.Status, st.Processed, len(events))
	}
}

// A batch handler that needs more than the deadline for a full batch gets
// smaller batches until they fit, and applies everything once.
func TestBatchHandlerTimeoutHalvesTheBatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.traceTable()
	trace := e.table("trace")
	p := projection.NewAsync("halving", projection.AsyncConfig{ErrorMode: projection.SkipApplyErrors, BatchSize: 100,
		BatchTimeout: 300 * time.Millisecond, RetryBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
	must(projection.OnBatch(p, func(ctx context.Context, tx pgx.Tx, b projection.Batch) error {
		select {
		case <-time.After(time.Duration(b.Len()) * 5 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
		for _, s := range b.Streams {
			for _, ev := range s.Events {
				if _, err := tx.Exec(ctx, `INSERT INTO `+trace+` (consumer, event_id) VALUES ('halving', $1)`, ev.ID); err != nil {
					return err
				}
			}
		}
		return nil
	}, e.types.Opened, e.types.Commented))
	var events []projector.Event
	for i := range 20 {
		events = append(events, e.tenEvents(fmt.Sprintf("s%02d", i))...)
	}
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if dead := e.deadLettered("halving"); len(dead) != 0 {
		t.Fatalf("%d events dead-lettered, want none", len(dead))
	}
	for i, ev := range events {
		if n := e.traced("halving", ev.ID); n != 1 {
			t.Fatalf("event %d applied %d times, want 1", i+1, n)
		}
	}
}

// Skip refuses to pass events that were never applied: a failure recorded
// with the cursor further back than the failing event (as an older version
// recorded batch timeouts) is refused with a clear transition error, and
// nothing changes.
func TestSkipRefusesToPassUnappliedEvents(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	events := e.tenEvents("t1")
	c := e.store.Table("projector_consumers")
	e.exec(`INSERT INTO `+c+` (name, instance_id, status, attempts, last_error, last_error_at, failed_tx_id, failed_seq, failed_event_id)
		VALUES ('old', $1, 'dead', 3, 'batch timeout', now(), $2, $3, $4)`,
		projection.SharedInstance, events[6].Position.TxID, events[6].Position.Seq, events[6].ID)
	admin := projection.NewAdmin(e.store)
	err := admin.Skip(e.ctx, projection.ShardID{Consumer: "old"})
	if !errors.Is(err, projector.ErrInvalidTransition) || !strings.Contains(err.Error(), "were not applied") {
		t.Fatalf("skip over unapplied events: %v, want a refused transition saying why", err)
	}
	st := e.status(admin, "old")
	if st.Status != projection.StatusDead || st.Cursor != projector.Start {
		t.Fatalf("refused skip changed the shard: %+v", st)
	}
	if dead := e.deadLettered("old"); len(dead) != 0 {
		t.Fatalf("refused skip wrote dead letters: %v", dead)
	}
}

// Skip still works when events of types the consumer does not handle lie
// between its last applied event and the failing one.
func TestSkipPastEventsOfOtherTypes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := projection.NewAsync("closer", projection.AsyncConfig{MaxAttempts: 1})
	must(projection.On(p, e.types.Closed, func(ctx context.Context, tx pgx.Tx, ev projector.Event, c testevents.TicketClosed) error {
		return errors.New("cannot close")
	}))
	events := e.tenEvents("t1")
	closed := e.appendOne("t1", projector.ExactVersion(int64(len(events))), testevents.TicketClosed{})
	e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	admin := projection.NewAdmin(e.store)
	eventually(t, time.Minute, "the shard to die", func() bool { return e.status(admin, "closer").Status == projection.StatusDead })
	if err := admin.Skip(e.ctx, projection.ShardID{Consumer: "closer"}); err != nil {
		t.Fatalf("skip past events of other types: %v", err)
	}
	if dead := e.deadLettered("closer"); len(dead) != 1 || dead[closed[0].ID.String()] == "" {
		t.Fatalf("dead letters %v, want the closed event", dead)
	}
}
