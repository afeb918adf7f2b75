package projection_test

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// A child is this test binary run as a dispatcher process, so tests can
// kill a real process (SIGKILL) or run several side by side.
const (
	childEnv           = "PROJECTOR_TEST_CHILD"
	childURLEnv        = "PROJECTOR_TEST_CHILD_URL"
	childSchemaEnv     = "PROJECTOR_TEST_CHILD_SCHEMA"
	childBatchEnv      = "PROJECTOR_TEST_CHILD_BATCH"
	childKillAfterEmit = "PROJECTOR_TEST_CHILD_KILL_AFTER_EMIT"
	// childPartitions > 0 makes the child run only "parted", a counting
	// projection with that many partitions that also records, in the
	// handler's transaction, which process applied each event (table
	// workers), for the partition tests.
	childPartitions = "PROJECTOR_TEST_CHILD_PARTITIONS"
	// childPark makes the child run parkChaos instead (promise18_test.go):
	// "failing" before the deploy, "deployed" after.
	childPark = "PROJECTOR_TEST_CHILD_PARK"
	// childRetry makes the child retry that dead letter of the "tolerant"
	// consumer (deadLetterEnv, its poison digestible now) in its own
	// process, as `dead-letters retry --here` does, instead of running a
	// dispatcher.
	childRetry = "PROJECTOR_TEST_CHILD_RETRY"
	// childCounting names the consumer a child runs alone: BenchmarkPartitions'
	// counting projection, with childPartitions partitions, run as that
	// benchmark runs it (BenchmarkPartitionsProcesses).
	childCounting = "PROJECTOR_TEST_CHILD_COUNTING"
)

// childProjections are what a child runs: "counting" (opened and commented
// events, shared) and "emitter", which appends one ticket.closed event to
// stream emitted/x-<id> for every ticket.opened it handles, in the
// dispatcher's transaction. killAfterEmit > 0 makes the emitter SIGKILL its
// own process right after its killAfterEmit-th append: a crash between
// handler and commit.
func childProjections(store *postgres.Store, types testevents.Types, batch int, killAfterEmit int64) []*projection.Async {
	count := projection.NewAsync("counting", projection.AsyncConfig{BatchSize: batch})
	h := countingHandler(store.Schema(), "counting")
	must(projection.OnEvent(count, types.Opened, h))
	must(projection.OnEvent(count, types.Commented, h))

	var emitted atomic.Int64
	emit := projection.NewAsync("emitter", projection.AsyncConfig{BatchSize: batch})
	must(projection.On(emit, types.Opened, func(ctx context.Context, tx pgx.Tx, ev projector.Event, e testevents.TicketOpened) error {
		if _, err := store.Append(ctx, tx, projector.Stream("emitted", "x-"+ev.Stream.ID), projector.AnyVersion, testevents.TicketClosed{Reason: "auto"}); err != nil {
			return err
		}
		if killAfterEmit > 0 && emitted.Add(1) == killAfterEmit {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // never returns: the process is gone
		}
		return nil
	}))
	return []*projection.Async{count, emit}
}

// runChild is the child's main: run the dispatcher until SIGTERM, then stop
// gracefully.
func runChild() int {
	ctx, stop := pgtest.ChildContext()
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	pool, err := pgxpool.New(ctx, os.Getenv(childURLEnv))
	if err != nil {
		return pgtest.ChildFailed(ctx, logger, "child: pool", err)
	}
	defer pool.Close()
	types := testevents.New()
	schema := os.Getenv(childSchemaEnv)
	batch, _ := strconv.Atoi(os.Getenv(childBatchEnv))
	kill, _ := strconv.ParseInt(os.Getenv(childKillAfterEmit), 10, 64)
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: types.Registry, Logger: logger})
	if err != nil {
		return pgtest.ChildFailed(ctx, logger, "child: store", err)
	}
	if id, _ := strconv.ParseInt(os.Getenv(childRetry), 10, 64); id > 0 {
		p := poisoned(&env{ctx: ctx, types: types, schema: schema, store: store}, "tolerant",
			projection.AsyncConfig{ErrorMode: projection.SkipApplyErrors, MaxAttempts: 1}, new(atomic.Bool))
		if _, err := projection.RetryDeadLetter(ctx, store, p, id, logger); err != nil {
			return pgtest.ChildFailed(ctx, logger, "child: retry", err)
		}
		return 0
	}
	projs := childProjections(store, types, batch, kill)
	concurrency := 0
	if name := os.Getenv(childCounting); name != "" {
		n, _ := strconv.Atoi(os.Getenv(childPartitions))
		projs = []*projection.Async{counting(schema, types, name, projection.AsyncConfig{Partitions: n})}
		concurrency = max(n, 4)
	} else if n, _ := strconv.Atoi(os.Getenv(childPartitions)); n > 0 {
		projs = []*projection.Async{partedProjection(store, types, batch, n, os.Getenv(projection.EnvInstanceID))}
	} else if mode := os.Getenv(childPark); mode != "" {
		projs = []*projection.Async{parkChaos(store.Schema(), types, batch, mode == "deployed")}
	}
	d, err := projection.New(projection.Config{Store: store, Projections: projs, Logger: logger,
		PollMax: 20 * time.Millisecond, Recheck: 20 * time.Millisecond, Concurrency: concurrency})
	if err != nil {
		return pgtest.ChildFailed(ctx, logger, "child: dispatcher", err)
	}
	if err := d.Start(ctx); err != nil {
		return pgtest.ChildFailed(ctx, logger, "child: start", err)
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := d.Stop(sctx); err != nil {
		logger.Error("child: stop", "error", err)
		return 1
	}
	return 0
}

// startChild runs this test binary as a dispatcher process on e's schema.
func (e *env) startChild(url string, batch int, extraEnv ...string) *pgtest.Child {
	e.t.Helper()
	return pgtest.StartChild(e.t, append([]string{childEnv + "=1", childURLEnv + "=" + url, childSchemaEnv + "=" + e.schema,
		childBatchEnv + "=" + strconv.Itoa(batch)}, extraEnv...)...)
}

// checkEmitted fails unless every ticket.opened event caused exactly one
// emitted event, with the right causation id.
func (e *env) checkEmitted(wantOpened int) {
	e.t.Helper()
	var emitted, distinct, orphans int
	err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*), count(DISTINCT causation_id),
		count(*) FILTER (WHERE causation_id NOT IN (SELECT id FROM `+e.store.Table("projector_events")+` WHERE type = 'ticket.opened'))
		FROM `+e.store.Table("projector_events")+` WHERE stream_type = 'emitted'`).Scan(&emitted, &distinct, &orphans)
	if err != nil {
		e.t.Fatal(err)
	}
	if emitted != wantOpened || distinct != wantOpened || orphans != 0 {
		e.t.Fatalf("emitted %d events for %d distinct causes (%d orphans); want exactly one for each of %d opened events",
			emitted, distinct, orphans, wantOpened)
	}
}

func openedCount(versions map[string]int64) int {
	n := 0
	for _, v := range versions {
		if v > 0 {
			n++
		}
	}
	return n
}

// partedProjection is the partitioned child's projection: the counting
// model, plus a count per process of the events it applied.
func partedProjection(store *postgres.Store, types testevents.Types, batch, partitions int, instance string) *projection.Async {
	p := projection.NewAsync("parted", projection.AsyncConfig{BatchSize: batch, Partitions: partitions})
	count := countingHandler(store.Schema(), "parted")
	workers := pgx.Identifier{store.Schema(), "workers"}.Sanitize()
	h := func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		if err := count(ctx, tx, ev); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+workers+` AS w (instance, n) VALUES ($1, 1) ON CONFLICT (instance) DO UPDATE SET n = w.n + 1`, instance)
		return err
	}
	must(projection.OnEvent(p, types.Opened, h))
	must(projection.OnEvent(p, types.Commented, h))
	return p
}
