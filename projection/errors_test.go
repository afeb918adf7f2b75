package projection_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
)

// poisoned is an async projection whose handler fails on opened events
// titled "poison" while failing is set, after writing a row (which must not
// survive the failure), and records every other event in the counting table.
func poisoned(e *env, name string, cfg projection.AsyncConfig, failing *atomic.Bool) *projection.Async {
	p := projection.NewAsync(name, cfg)
	count := countingHandler(e.schema, name)
	trace := e.table("trace")
	must(projection.On(p, e.types.Opened, func(ctx context.Context, tx pgx.Tx, ev projector.Event, o testevents.TicketOpened) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+trace+` (consumer, event_id) VALUES ($1, $2)`, name, ev.ID); err != nil {
			return err
		}
		if o.Title == "poison" && failing.Load() {
			return errors.New("cannot digest poison")
		}
		if o.Title == "panic" && failing.Load() {
			panic("handler panicked on purpose")
		}
		return count(ctx, tx, ev)
	}))
	must(projection.OnEvent(p, e.types.Commented, count))
	return p
}

func (e *env) traceTable() {
	e.exec(`CREATE TABLE ` + e.table("trace") + ` (consumer text NOT NULL, event_id uuid NOT NULL)`)
}

func (e *env) appendOne(stream string, exp projector.ExpectedVersion, payloads ...any) []projector.Event {
	e.t.Helper()
	var out []projector.Event
	err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		res, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", stream), exp, payloads...)
		out = res.Events
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

func (e *env) status(admin *projection.Admin, consumer string) projection.ShardState {
	e.t.Helper()
	st, err := admin.Status(e.ctx, projection.ShardID{Consumer: consumer})
	if err != nil {
		e.t.Fatal(err)
	}
	return st
}

func (e *env) traced(consumer string, id fmt.Stringer) int {
	e.t.Helper()
	var n int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+e.table("trace")+` WHERE consumer = $1 AND event_id = $2`, consumer, id.String()).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// Promise 7: a handler failing on one event is retried with backoff and
// after MaxAttempts the shard is dead and stays so; other consumers carry
// on; Restart retries the event; Skip moves past it and records the dead
// letter. Nothing is dropped silently.
func TestPromise7_PoisonHalts(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.traceTable()
	var failing atomic.Bool
	failing.Store(true)
	cfg := projection.AsyncConfig{MaxAttempts: 3, RetryBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}
	poison := poisoned(e, "fragile", cfg, &failing)
	healthy := counting(e.schema, e.types, "healthy", projection.AsyncConfig{})
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{poison, healthy}})
	admin := projection.NewAdmin(e.store)

	before := e.appendOne("a", projector.NoStream, testevents.TicketOpened{Title: "fine"}, testevents.TicketCommented{Body: "1"})
	bad := e.appendOne("b", projector.NoStream, testevents.TicketOpened{Title: "poison"})[0]
	after := e.appendOne("c", projector.NoStream, testevents.TicketOpened{Title: "fine"}, testevents.TicketCommented{Body: "2"})

	eventually(t, time.Minute, "the fragile shard to die", func() bool { return e.status(admin, "fragile").Status == projection.StatusDead })
	st := e.status(admin, "fragile")
	if st.Attempts != 3 || st.FailedEventID != bad.ID || st.FailedAt != bad.Position || st.LastError == "" || st.LastErrorAt.IsZero() {
		t.Fatalf("dead shard state: %+v", st)
	}
	// Events before the poison were committed; the poison's own write and
	// everything after it were not.
	if st.Cursor.Less(before[1].Position) || !st.Cursor.Less(bad.Position) {
		t.Fatalf("cursor %v, want at or after %v (the last event before the poison) and before the poison at %v", st.Cursor, before[1].Position, bad.Position)
	}
	if n := e.traced("fragile", bad.ID); n != 0 {
		t.Fatalf("the failing handler's write survived %d times", n)
	}
	if n, _ := e.counts("fragile"); n["a"] != 2 || n["c"] != 0 {
		t.Fatalf("fragile applied %v; want stream a only", n)
	}
	// The healthy consumer kept going.
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err == nil || !strings.Contains(err.Error(), "fragile") {
		t.Fatalf("catch up with a dead shard: %v, want an error naming it", err)
	}
	e.checkCounts("healthy", map[string]int64{"a": 2, "b": 1, "c": 2})
	// Dead stays dead: no further attempts while nobody acts.
	time.Sleep(50 * time.Millisecond) // several rechecks; asserting that nothing happens needs a wait
	if st2 := e.status(admin, "fragile"); st2.Attempts != 3 || st2.Status != projection.StatusDead {
		t.Fatalf("dead shard moved on its own: %+v", st2)
	}

	// Restart retries the same event: still poisonous, it dies again.
	if err := admin.Restart(e.ctx, projection.ShardID{Consumer: "fragile"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the restarted shard to die again", func() bool {
		st := e.status(admin, "fragile")
		return st.Status == projection.StatusDead && st.Attempts == 3
	})
	// Skip moves past it and records the dead letter.
	if err := admin.Skip(e.ctx, projection.ShardID{Consumer: "fragile"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the skipped shard to catch up", func() bool {
		n, _ := e.counts("fragile")
		return n["c"] == 2
	})
	var reason, errText string
	var attempts int
	err := e.store.Pool().QueryRow(e.ctx, `SELECT reason, error, attempts FROM `+e.store.Table("projector_dead_letters")+` WHERE consumer = 'fragile' AND event_id = $1`, bad.ID).Scan(&reason, &errText, &attempts)
	if err != nil || reason != "skipped" || attempts != 3 || errText == "" {
		t.Fatalf("dead letter: %q %q %d %v", reason, errText, attempts, err)
	}
	if st := e.status(admin, "fragile"); st.Status == projection.StatusDead || st.Attempts != 0 || st.LastError != "" {
		t.Fatalf("after skip: %+v", st)
	}
	e.checkCounts("fragile", map[string]int64{"a": 2, "c": 2})
	_ = after

	// A poison that heals: restart applies it.
	bad2 := e.appendOne("d", projector.NoStream, testevents.TicketOpened{Title: "poison"})[0]
	eventually(t, time.Minute, "the second poison to kill the shard", func() bool { return e.status(admin, "fragile").Status == projection.StatusDead })
	failing.Store(false)
	if err := admin.Restart(e.ctx, projection.ShardID{Consumer: "fragile"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the healed event to be applied", func() bool { return e.traced("fragile", bad2.ID) == 1 })
}

// A panicking handler is an error, not a crash.
func TestHandlerPanicIsAnError(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.traceTable()
	var failing atomic.Bool
	failing.Store(true)
	p := poisoned(e, "jumpy", projection.AsyncConfig{MaxAttempts: 2, RetryBackoff: time.Millisecond, MaxBackoff: time.Millisecond}, &failing)
	e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	admin := projection.NewAdmin(e.store)
	e.appendOne("p", projector.NoStream, testevents.TicketOpened{Title: "panic"})
	eventually(t, time.Minute, "the panicking shard to die", func() bool { return e.status(admin, "jumpy").Status == projection.StatusDead })
	if st := e.status(admin, "jumpy"); st.LastError == "" || !strings.Contains(st.LastError, "panic") {
		t.Fatalf("last error %q does not mention the panic", st.LastError)
	}
}

// Continuous mode: failing events go to the dead-letter table with their
// effects rolled back, and the shard carries on; never dead.
func TestContinuousModeDeadLettersAndContinues(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.traceTable()
	var failing atomic.Bool
	failing.Store(true)
	p := poisoned(e, "tolerant", projection.AsyncConfig{ErrorMode: projection.SkipApplyErrors, MaxAttempts: 1}, &failing)
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	var poisons []projector.Event
	want := map[string]int64{}
	for i := range 30 {
		id := fmt.Sprintf("s%d", i)
		if i%7 == 3 {
			poisons = append(poisons, e.appendOne(id, projector.NoStream, testevents.TicketOpened{Title: "poison"})...)
			continue
		}
		e.appendOne(id, projector.NoStream, testevents.TicketOpened{Title: "ok"}, testevents.TicketCommented{Body: "x"})
		want[id] = 2
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	e.checkCounts("tolerant", want)
	for _, ev := range poisons {
		var reason string
		if err := e.store.Pool().QueryRow(e.ctx, `SELECT reason FROM `+e.store.Table("projector_dead_letters")+` WHERE event_id = $1`, ev.ID).Scan(&reason); err != nil || reason != "apply-error" {
			t.Fatalf("poison %s: dead letter %q, %v", ev.ID, reason, err)
		}
		if n := e.traced("tolerant", ev.ID); n != 0 {
			t.Fatalf("poison %s: its write survived", ev.ID)
		}
	}
	if st := e.status(projection.NewAdmin(e.store), "tolerant"); st.Status == projection.StatusDead || st.Attempts != 0 {
		t.Fatalf("continuous shard state: %+v", st)
	}
}

// A batch handler's failing event is found by bisection: in continuous mode
// only it is dead-lettered; in halt mode the events before it commit.
func TestBatchHandlerIsolatesFailingEvent(t *testing.T) {
	t.Parallel()
	for _, mode := range []projection.ErrorMode{projection.SkipApplyErrors, projection.HaltOnError} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			name := "batchy"
			p := projection.NewAsync(name, projection.AsyncConfig{ErrorMode: mode, MaxAttempts: 1, BatchSize: 64})
			counts := e.table("counts")
			must(projection.OnBatch(p, func(ctx context.Context, tx pgx.Tx, b projection.Batch) error {
				for _, s := range b.Streams {
					for _, ev := range s.Events {
						if o, ok := ev.Payload.(testevents.TicketOpened); ok && o.Title == "poison" {
							return errors.New("poison in batch")
						}
					}
					_, err := tx.Exec(ctx, `INSERT INTO `+counts+` (consumer, stream_id, n, last_version) VALUES ($1, $2, $3, $4)
						ON CONFLICT (consumer, stream_id) DO UPDATE SET n = `+counts+`.n + $3, last_version = $4`,
						name, s.Stream.ID, len(s.Events), s.Events[len(s.Events)-1].Version)
					if err != nil {
						return err
					}
				}
				return nil
			}, e.types.Opened, e.types.Commented))
			want := map[string]int64{}
			var poison projector.Event
			for i := range 40 {
				id := fmt.Sprintf("s%02d", i)
				if i == 23 {
					poison = e.appendOne(id, projector.NoStream, testevents.TicketOpened{Title: "poison"})[0]
					continue
				}
				e.appendOne(id, projector.NoStream, testevents.TicketOpened{Title: "ok"}, testevents.TicketCommented{Body: "x"})
				want[id] = 2
			}
			d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
			admin := projection.NewAdmin(e.store)
			if mode == projection.SkipApplyErrors {
				ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
				defer cancel()
				if err := d.CatchUp(ctx); err != nil {
					t.Fatal(err)
				}
				e.checkCounts(name, want)
				return
			}
			eventually(t, time.Minute, "the batch shard to die", func() bool { return e.status(admin, name).Status == projection.StatusDead })
			if st := e.status(admin, name); st.FailedEventID != poison.ID {
				t.Fatalf("failing event %s, want the poison %s", st.FailedEventID, poison.ID)
			}
			got, _ := e.counts(name)
			for i := range 23 {
				if id := fmt.Sprintf("s%02d", i); got[id] != 2 {
					t.Errorf("stream %s before the poison: %d applied, want 2", id, got[id])
				}
			}
			if len(got) != 23 {
				t.Errorf("%d streams applied, want the 23 before the poison", len(got))
			}
		})
	}
}

// TestRetryBackoffCountsFromTheFailure: the backoff before a failed event's
// next attempt runs from when the failure is recorded, not from when its
// pass began. It was now() + backoff, now() being the transaction's start:
// a pass that spent most of the backoff before the handler failed (a long
// batch ahead of the event, a slow handler) left next_retry_at almost
// passed at its commit, and another dispatcher's wake-up retried it at
// once — with a low MaxAttempts, a stream parked or a shard dead sooner
// than configured.
func TestRetryBackoffCountsFromTheFailure(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const backoff, slow = time.Second, 500 * time.Millisecond
	p := projection.NewAsync("slowfail", projection.AsyncConfig{MaxAttempts: 3, RetryBackoff: backoff, MaxBackoff: backoff})
	var failedAt atomic.Int64
	must(projection.On(p, e.types.Opened, func(ctx context.Context, tx pgx.Tx, ev projector.Event, o testevents.TicketOpened) error {
		time.Sleep(slow)                                  // the pass's work before the failure, not a synchronisation
		failedAt.CompareAndSwap(0, time.Now().UnixNano()) // the first attempt's
		return errors.New("fails after a while")
	}))
	e.appendOne("a", projector.NoStream, testevents.TicketOpened{Title: "slow"})
	e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	admin := projection.NewAdmin(e.store)
	eventually(t, time.Minute, "the first failure recorded", func() bool { return e.status(admin, "slowfail").Attempts >= 1 })
	st := e.status(admin, "slowfail")
	if st.Attempts != 1 {
		t.Fatalf("read the state after attempt %d, want the first's", st.Attempts)
	}
	// The backoff is jittered to 0.8-1.2 of itself; counted from the pass's
	// start it ends at most 1.2 s - 0.5 s = 0.7 s after the failure.
	failed := time.Unix(0, failedAt.Load())
	if gap := st.NextRetryAt.Sub(failed); gap < backoff*8/10-50*time.Millisecond {
		t.Fatalf("next attempt %v after the failure (attempts %d, next at %v), want at least 0.8 × the %v backoff", gap, st.Attempts, st.NextRetryAt, backoff)
	}
}

// A handler error is recorded cut at MaxErrorBytes, its length noted, on the
// shard and on the dead letter alike: stored whole, a 500 kB error made every
// console page and state.json carry it once a second (an HTTP audit).
func TestHandlerErrorStoredCut(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	huge := strings.Repeat("é", 250_000) // 500,000 bytes, cut on a rune boundary
	fail := func(context.Context, pgx.Tx, projector.Event) error { return errors.New(huge) }
	halt := projection.NewAsync("halt", projection.AsyncConfig{MaxAttempts: 1})
	must(projection.OnEvent(halt, e.types.Opened, fail))
	skip := projection.NewAsync("skip", projection.AsyncConfig{ErrorMode: projection.SkipApplyErrors})
	must(projection.OnEvent(skip, e.types.Opened, fail))
	e.dispatcher(projection.Config{Projections: []*projection.Async{halt, skip}})
	admin := projection.NewAdmin(e.store)
	e.appendOne("a", projector.NoStream, testevents.TicketOpened{Title: "x"})
	eventually(t, time.Minute, "the halting shard to die", func() bool { return e.status(admin, "halt").Status == projection.StatusDead })
	var dls []projection.DeadLetter
	eventually(t, time.Minute, "the dead letter", func() bool {
		var err error
		dls, err = projection.ListDeadLetters(e.ctx, e.store, projection.DeadLetterFilter{Consumer: "skip"})
		return err == nil && len(dls) == 1
	})
	for what, text := range map[string]string{"shard": e.status(admin, "halt").LastError, "dead letter": dls[0].Error} {
		if len(text) > projection.MaxErrorBytes+32 || !strings.Contains(text, "…(5000") || !strings.HasSuffix(text, " bytes)") || !utf8.ValidString(text) {
			t.Errorf("%s error: %d bytes, ends %q; want it cut at %d with the length noted", what, len(text), text[max(0, len(text)-20):], projection.MaxErrorBytes)
		}
	}
}
