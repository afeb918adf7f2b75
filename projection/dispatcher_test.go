package projection_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
)

// TestDispatcherAppliesEverything: a dispatcher catches up a log of 1,500
// events over 60 streams (enough for 15 batches and many cursor updates:
// the size is no part of what is checked), then follows appends.
func TestDispatcherAppliesEverything(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	versions := e.appendMany(4, 1500, 60)
	p := counting(e.schema, e.types, "counting", projection.AsyncConfig{BatchSize: 100})
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	e.checkCounts("counting", versions)

	// Events appended while it runs arrive too.
	more := appendWith(t, e.ctx, e.store, 2, 500, 10, "late")
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	got, _ := e.counts("counting")
	for id, v := range more {
		if got[id] != v {
			t.Errorf("late stream %s: %d applied, want %d", id, got[id], v)
		}
	}

	// Cursor updates stay HOT: only the primary key is indexed and the
	// fillfactor leaves room, so a busy dispatcher does not bloat the table.
	var upd, hot int64
	eventually(t, time.Minute, "table statistics", func() bool {
		err := e.store.Pool().QueryRow(e.ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = $1::regclass`,
			e.store.Table("projector_consumers")).Scan(&upd, &hot)
		return err == nil && upd >= 10
	})
	if float64(hot) < 0.9*float64(upd) {
		t.Fatalf("%d of %d consumer-state updates were HOT; want at least 90%%", hot, upd)
	}
}

// A consumer stuck in a slow handler holds only its own shard: the others
// catch up meanwhile.
func TestSlowConsumerDoesNotHoldOthers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	release := make(chan struct{})
	defer close(release)
	slow := projection.NewAsync("slow", projection.AsyncConfig{})
	must(projection.OnEvent(slow, e.types.Opened, func(ctx context.Context, _ pgx.Tx, _ projector.Event) error {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}))
	var fast []*projection.Async
	for i := range 5 {
		fast = append(fast, counting(e.schema, e.types, fmt.Sprintf("fast%d", i), projection.AsyncConfig{}))
	}
	e.dispatcher(projection.Config{Projections: append([]*projection.Async{slow}, fast...), Concurrency: 2})
	versions := e.appendMany(2, 300, 10)
	for i := range fast {
		eventually(t, time.Minute, fmt.Sprintf("fast%d to catch up while slow is stuck", i), func() bool {
			return e.applied(fmt.Sprintf("fast%d", i)) >= total(versions)
		})
	}
}

// A handler that hangs is cancelled at the batch timeout and fails like any
// other: retried, then dead, with an error that says so.
func TestBatchTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.traceTable()
	hung := projection.NewAsync("hung", projection.AsyncConfig{BatchTimeout: 200 * time.Millisecond, MaxAttempts: 2,
		RetryBackoff: time.Millisecond, MaxBackoff: time.Millisecond})
	trace := e.table("trace")
	must(projection.OnEvent(hung, e.types.Opened, func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		// A write first, so the transaction holds an id, then a statement
		// that outlives the deadline.
		if _, err := tx.Exec(ctx, `INSERT INTO `+trace+` (consumer, event_id) VALUES ('hung', $1)`, ev.ID); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `SELECT pg_sleep(30)`)
		return err
	}))
	healthy := counting(e.schema, e.types, "healthy", projection.AsyncConfig{})
	e.dispatcher(projection.Config{Projections: []*projection.Async{hung, healthy}})
	versions := e.appendMany(1, 20, 2)
	admin := projection.NewAdmin(e.store)
	eventually(t, time.Minute, "the hung shard to die", func() bool { return e.status(admin, "hung").Status == projection.StatusDead })
	st := e.status(admin, "hung")
	if st.Attempts != 2 || !strings.Contains(st.LastError, "batch timeout") {
		t.Fatalf("hung shard: %+v", st)
	}
	if n := e.traced("hung", st.FailedEventID); n != 0 {
		t.Fatalf("the timed-out batch's write survived")
	}
	eventually(t, time.Minute, "the healthy consumer to catch up", func() bool { return e.applied("healthy") >= total(versions) })
}

// A dispatcher on the Store the application appends through is woken by
// those appends (postgres.Store.WatchAppends) rather than by its poll: with
// the poll and the recheck an hour apart, appends from writers in this
// process still reach the handler, each exactly once and in stream order.
// Without the in-process hint nothing would look at the log for an hour.
func TestDispatcherWokenByOwnStoreAppends(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := counting(e.schema, e.types, "hinted", projection.AsyncConfig{BatchSize: 50})
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}, PollMin: time.Hour, PollMax: time.Hour, Recheck: time.Hour})
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil { // the empty log: the poll's first look
		t.Fatal(err)
	}
	versions := e.appendMany(3, 300, 12)
	var total int64
	for _, v := range versions {
		total += v
	}
	pgtest.Eventually(t, 30*time.Second, "every appended event applied", func() bool {
		got, _ := e.counts("hinted")
		var n int64
		for _, c := range got {
			n += c
		}
		return n == total
	})
	e.checkCounts("hinted", versions)
}
