package saga_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/postgres"
)

var quiet = slog.New(slog.DiscardHandler)

const benchInstances = 10_000

// benchAppend appends payloads in transactions of up to 500 events, each
// payload to stream ids[i].
func benchAppend(b *testing.B, store *postgres.Store, ids []string, payload func(i int) any) {
	b.Helper()
	ctx := context.Background()
	for lo := 0; lo < len(ids); lo += 500 {
		err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
			for i := lo; i < min(lo+500, len(ids)); i++ {
				if _, err := store.Append(ctx, tx, projector.Stream("ticket", ids[i]), projector.AnyVersion, payload(i)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

// catchUpTimed runs a dispatcher with p until it caught up and returns how
// long that took.
func catchUpTimed(b *testing.B, store *postgres.Store, p *projection.Async) time.Duration {
	b.Helper()
	ctx := context.Background()
	d, err := projection.New(projection.Config{Store: store, Projections: []*projection.Async{p}, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	started := time.Now()
	if err := d.Start(ctx); err != nil {
		b.Fatal(err)
	}
	if err := d.CatchUp(ctx); err != nil {
		b.Fatal(err)
	}
	took := time.Since(started)
	if err := d.Stop(ctx); err != nil {
		b.Fatal(err)
	}
	return took
}

// BenchmarkSagaThroughput measures events/s handled by one saga type with
// 10,000 live instances (a step per event: lock the instance, decide, save
// the state and the step) beside the same work hand-written as a plain
// async handler doing a keyed upsert, in the same run on the same log.
func BenchmarkSagaThroughput(b *testing.B) {
	ty := testevents.New()
	store := pgtest.Store(b, ty.Registry)
	ctx := context.Background()
	table := pgx.Identifier{store.Schema(), "bench_counts"}.Sanitize()
	if _, err := store.Pool().Exec(ctx, `CREATE TABLE `+table+` (key text PRIMARY KEY, n bigint NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	type state struct{ N int }
	s := saga.New[state]("bench_saga", saga.Config{})
	must(saga.StartOn(s, ty.Opened, saga.ByStream, func(_ context.Context, in *saga.Instance[state], _ projector.Event, _ testevents.TicketOpened) error {
		return nil
	}))
	must(saga.On(s, ty.Commented, saga.ByStream, func(_ context.Context, in *saga.Instance[state], _ projector.Event, _ testevents.TicketCommented) error {
		in.State.N++
		return nil
	}))
	sagaProj, err := s.Projection(store)
	if err != nil {
		b.Fatal(err)
	}
	upsert := `INSERT INTO ` + table + ` AS c (key, n) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET n = c.n + excluded.n`
	plain := projection.NewAsync("bench_plain", projection.AsyncConfig{})
	must(projection.OnEvent(plain, ty.Opened, func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		_, err := tx.Exec(ctx, upsert, ev.Stream.ID, 0)
		return err
	}))
	must(projection.OnEvent(plain, ty.Commented, func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		_, err := tx.Exec(ctx, upsert, ev.Stream.ID, 1)
		return err
	}))

	ids := make([]string, benchInstances)
	for i := range ids {
		ids[i] = fmt.Sprintf("s-%05d", i)
	}
	benchAppend(b, store, ids, func(int) any { return testevents.TicketOpened{Title: "t"} })
	catchUpTimed(b, store, plain)
	catchUpTimed(b, store, sagaProj)

	const events = 20_000
	rng := rand.New(rand.NewPCG(1, 2))
	for b.Loop() {
		picks := make([]string, events)
		for i := range picks {
			picks[i] = ids[rng.IntN(len(ids))]
		}
		benchAppend(b, store, picks, func(int) any { return testevents.TicketCommented{Body: "c"} })
		p := catchUpTimed(b, store, plain)
		sg := catchUpTimed(b, store, sagaProj)
		b.ReportMetric(events/p.Seconds(), "plain-events/s")
		b.ReportMetric(events/sg.Seconds(), "saga-events/s")
		b.ReportMetric(100*(sg.Seconds()/p.Seconds()-1), "saga-overhead-%")
	}
}

// BenchmarkSagaTimeouts fires 10,000 timeouts of 10,000 instances with a
// runner on the real clock and reports the lateness from due time to the
// step's decision (p50, p99, max) and the firing rate: "spread" has them
// due at 2,000/s, "burst" all due at once (the drain rate).
func BenchmarkSagaTimeouts(b *testing.B) {
	for _, mode := range []string{"spread", "burst"} {
		b.Run(mode, func(b *testing.B) {
			for b.Loop() {
				benchTimeouts(b, mode == "burst")
			}
		})
	}
}

func benchTimeouts(b *testing.B, burst bool) {
	ty := testevents.New()
	store := pgtest.Store(b, ty.Registry)
	ctx := context.Background()
	type state struct {
		Due   time.Time
		Fired time.Time
	}
	var base time.Time
	spacing := 500 * time.Microsecond
	if burst {
		spacing = 0
	}
	s := saga.New[state]("bench_timeouts", saga.Config{})
	must(saga.StartOn(s, ty.Opened, saga.ByStream, func(_ context.Context, in *saga.Instance[state], _ projector.Event, _ testevents.TicketOpened) error {
		i, _ := strconv.Atoi(strings.TrimPrefix(in.Key(), "s-"))
		in.State.Due = base.Add(time.Duration(i) * spacing)
		in.Schedule("due", in.State.Due)
		return nil
	}))
	must(saga.OnTimeout(s, "due", func(_ context.Context, in *saga.Instance[state], _ saga.Timeout) error {
		in.State.Fired = in.Now()
		in.Complete()
		return nil
	}))
	p, err := s.Projection(store)
	if err != nil {
		b.Fatal(err)
	}
	ids := make([]string, benchInstances)
	for i := range ids {
		ids[i] = fmt.Sprintf("s-%05d", i)
	}
	benchAppend(b, store, ids, func(int) any { return testevents.TicketOpened{Title: "t"} })
	base = time.Now().Add(24 * time.Hour) // far enough for the catch-up
	catchUpTimed(b, store, p)
	// Move every due time to start a moment from now.
	shift := time.Until(base) - 500*time.Millisecond
	if _, err := store.Pool().Exec(ctx, `UPDATE `+store.Table("projector_saga_timeouts")+` SET due_at = due_at - make_interval(secs => $1)`, shift.Seconds()); err != nil {
		b.Fatal(err)
	}
	if _, err := store.Pool().Exec(ctx, `UPDATE `+store.Table("projector_saga_instances")+
		` SET state = jsonb_set(state, '{Due}', to_jsonb(((state->>'Due')::timestamptz - make_interval(secs => $1)))) `, shift.Seconds()); err != nil {
		b.Fatal(err)
	}
	r, err := saga.NewRunner(saga.RunnerConfig{Store: store, Sagas: []saga.Definition{s}, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		b.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var left int
		if err := store.Pool().QueryRow(ctx, `SELECT count(*) FROM `+store.Table("projector_saga_timeouts")).Scan(&left); err != nil {
			b.Fatal(err)
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d timeouts still pending", left)
		}
		time.Sleep(50 * time.Millisecond) // polling a benchmark's progress, not synchronising
	}
	if err := r.Stop(ctx); err != nil {
		b.Fatal(err)
	}
	rows, err := store.Pool().Query(ctx, `SELECT (state->>'Due')::timestamptz, (state->>'Fired')::timestamptz FROM `+store.Table("projector_saga_instances"))
	if err != nil {
		b.Fatal(err)
	}
	var late []time.Duration
	var first, last time.Time
	var due, fired time.Time
	_, err = pgx.ForEachRow(rows, []any{&due, &fired}, func() error {
		if fired.Before(due) {
			b.Errorf("a timeout fired %v early", due.Sub(fired))
		}
		late = append(late, fired.Sub(due))
		if first.IsZero() || due.Before(first) {
			first = due
		}
		if fired.After(last) {
			last = fired
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	slices.Sort(late)
	pct := func(q float64) time.Duration { return late[min(len(late)-1, int(q*float64(len(late))))] }
	b.ReportMetric(float64(pct(0.50).Milliseconds()), "p50-late-ms")
	b.ReportMetric(float64(pct(0.99).Milliseconds()), "p99-late-ms")
	b.ReportMetric(float64(late[len(late)-1].Milliseconds()), "max-late-ms")
	b.ReportMetric(float64(len(late))/last.Sub(first).Seconds(), "fired/s")
}
