package projection_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// shardState reads one shard through Admin.Status.
func (e *env) shardState(consumer, instance string) projection.ShardState {
	e.t.Helper()
	st, err := projection.NewAdmin(e.store).Status(e.ctx, projection.ShardID{Consumer: consumer, Instance: instance})
	if err != nil {
		e.t.Fatal(err)
	}
	return st
}

// ageInstance makes instance look unseen for d, as a process killed that
// long ago would.
func (e *env) ageInstance(instance string, d time.Duration) {
	e.t.Helper()
	e.exec(`UPDATE `+e.store.Table("projector_instances")+` SET last_seen_at = now() - make_interval(secs => $2) WHERE instance_id = $1`,
		instance, d.Seconds())
}

// pruneAll prunes every ticket event the guard lets go.
func (e *env) pruneAll() postgres.PruneResult {
	e.t.Helper()
	res, err := e.store.Prune(e.ctx, postgres.PruneOptions{OlderThan: time.Nanosecond, StreamTypes: []string{"ticket"}, IncludeAggregates: true})
	if err != nil {
		e.t.Fatal(err)
	}
	return res
}

func (e *env) eventCount() int {
	e.t.Helper()
	var n int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+e.store.Table("projector_events")).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// A per-instance shard left behind by a process that died without a
// graceful stop holds retention back only until its instance expires: then
// prune passes it (removing a random id's shard, which nothing can resume),
// status shows it stale, and a live instance's shard still holds prune back.
func TestExpiredInstanceShardsStopHoldingRetention(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.appendMany(2, 100, 10)
	consumers, instances := e.store.Table("projector_consumers"), e.store.Table("projector_instances")
	// What a SIGKILLed dispatcher with a random id leaves: its shard at the
	// start of the log and its instance row, last seen when it died.
	e.exec(`INSERT INTO ` + consumers + ` (name, instance_id) VALUES ('cache', 'killed-random'), ('cache', 'live-pod')`)
	e.exec(`INSERT INTO ` + instances + ` (instance_id, random_id, consumers) VALUES ('killed-random', true, '{cache}'), ('live-pod', false, '{cache}')`)

	// Both seen just now: both hold retention back.
	if res := e.pruneAll(); res.Deleted != 0 || res.Blocker == nil {
		t.Fatalf("prune with two fresh shards at the start: %+v", res)
	}
	if st := e.shardState("cache", "live-pod"); st.Dispatcher != projection.DispatcherLive {
		t.Errorf("shard with a fresh heartbeat: dispatcher %q, want live", st.Dispatcher)
	}

	// The killed one expires (default expiry a day); the live one keeps
	// heartbeating and still holds everything back.
	e.ageInstance("killed-random", 25*time.Hour)
	if st := e.shardState("cache", "killed-random"); st.Dispatcher != projection.DispatcherStale {
		t.Errorf("expired shard: dispatcher %q, want stale", st.Dispatcher)
	}
	res := e.pruneAll()
	if res.Deleted != 0 || res.Blocker == nil || res.Blocker.Instance != "live-pod" || res.Blocker.Dispatcher != "live" {
		t.Fatalf("prune passed a live shard, or blamed the wrong one: %+v %+v", res, res.Blocker)
	}
	if st, _ := projection.NewAdmin(e.store).List(e.ctx, "cache"); len(st) != 1 || st[0].Instance != "live-pod" {
		t.Fatalf("expired random-id shard not removed by prune: %+v", st)
	}

	// Once the live one expires too (and is a fixed id), prune deletes
	// everything and halts it, saying why.
	e.ageInstance("live-pod", 25*time.Hour)
	if res := e.pruneAll(); res.Deleted == 0 || res.Blocker != nil {
		t.Fatalf("prune with only an expired shard: %+v", res)
	}
	if n := e.eventCount(); n != 0 {
		t.Fatalf("%d events left", n)
	}
	st := e.shardState("cache", "live-pod")
	if st.Status != projection.StatusDead || !strings.Contains(st.LastError, "pruned while instance live-pod was away") || st.Dispatcher != projection.DispatcherStale {
		t.Fatalf("fixed-id shard pruned past: %+v", st)
	}
}

// A fixed instance id that comes back after its expiry gets its old cursor
// when its events are still there, and a clear halt when a prune deleted
// events it had not applied.
func TestReturningFixedInstance(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	perInstance := func() *projection.Async {
		return counting(e.schema, e.types, "local", projection.AsyncConfig{Delivery: projection.PerInstance})
	}
	run := func(id string) *projection.Dispatcher {
		d, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{perInstance()}, InstanceID: id,
			Logger: testLogger(t), PollMax: 50 * time.Millisecond, Recheck: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Start(e.ctx); err != nil {
			t.Fatal(err)
		}
		return d
	}
	stop := func(d *projection.Dispatcher) {
		ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
		defer cancel()
		if err := d.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	catchUp := func(d *projection.Dispatcher) error {
		ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
		defer cancel()
		return d.CatchUp(ctx)
	}

	// pod-a and pod-b both run and stop; pod-b is away past its expiry but
	// nothing is pruned, so it resumes at its cursor and applies everything.
	first := e.appendMany(1, 20, 4)
	for _, id := range []string{"pod-a", "pod-b"} {
		d := run(id)
		if err := catchUp(d); err != nil {
			t.Fatal(err)
		}
		stop(d)
		if st := e.shardState("local", id); st.Dispatcher != projection.DispatcherNone {
			t.Errorf("%s after a graceful stop: dispatcher %q, want none", id, st.Dispatcher)
		}
	}
	appendWith(t, e.ctx, e.store, 1, 10, 2, "second")
	e.ageInstance("pod-b", 48*time.Hour)
	d := run("pod-b")
	if err := catchUp(d); err != nil {
		t.Fatalf("pod-b returning with its events still there: %v", err)
	}
	if st := e.shardState("local", "pod-b"); st.Status != projection.StatusIdle || st.Dispatcher != projection.DispatcherLive {
		t.Fatalf("pod-b after returning: %+v", st)
	}
	stop(d)

	// pod-a is away past its expiry and a prune deletes what it had not
	// applied: when it returns, it halts with the reason instead of
	// resuming past the gap.
	appendWith(t, e.ctx, e.store, 1, 10, 2, "third")
	e.exec(`UPDATE ` + e.store.Table("projector_consumers") + ` SET status = 'disabled' WHERE instance_id = 'pod-b'`)
	e.ageInstance("pod-a", 48*time.Hour)
	before := e.applied("local")
	if res := e.pruneAll(); res.Deleted == 0 {
		t.Fatalf("prune deleted nothing past the expired pod-a: %+v", res)
	}
	d = run("pod-a")
	err := catchUp(d)
	if err == nil || !strings.Contains(err.Error(), "dead") {
		t.Fatalf("pod-a returning after its events were pruned: catch up gave %v, want its shard dead", err)
	}
	st := e.shardState("local", "pod-a")
	if st.Status != projection.StatusDead || !strings.Contains(st.LastError, "were pruned while instance pod-a was away") {
		t.Fatalf("pod-a after returning: %+v", st)
	}
	if got := e.applied("local"); got != before {
		t.Fatalf("pod-a applied %d events past the gap", got-before)
	}
	stop(d)
	_ = first
}

// Metrics that alerts use exist from Start at zero, and lag gauges report
// only measured values: none before the first measurement, and not the
// start-up backlog after the shard caught up, whether the backlog waited on
// a slow handler or on a transaction holding the horizon back (then the
// shard's passes find nothing to read before the one that applies it all).
func TestMetricsFromStart(t *testing.T) {
	t.Parallel()
	for _, held := range []string{"handler", "horizon"} {
		t.Run(held, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			release := make(chan struct{})
			if held == "horizon" {
				holder, err := e.store.Pool().Begin(e.ctx)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := holder.Exec(e.ctx, `SELECT pg_current_xact_id()`); err != nil {
					t.Fatal(err)
				}
				// Released by the test or, if it fails first, by the cleanup:
				// once, since a transaction is not safe for concurrent use.
				rollback := sync.OnceFunc(func() { _ = holder.Rollback(context.Background()) })
				go func() {
					<-release
					rollback()
				}()
				t.Cleanup(rollback)
			}
			versions := e.appendMany(1, 50, 5)
			p := projection.NewAsync("gated", projection.AsyncConfig{})
			h := countingHandler(e.schema, "gated")
			gate := func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
				return h(ctx, tx, ev)
			}
			must(projection.OnEvent(p, e.types.Opened, gate))
			must(projection.OnEvent(p, e.types.Commented, gate))
			reg := prometheus.NewRegistry()
			// A long period: any refresh seen below comes from Start or from
			// the catch-up, not from the ticker.
			d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}, Registerer: reg, MetricsEvery: time.Hour})
			for _, name := range []string{"projector_events_processed_total", "projector_events_failed_total", "projector_dead_letters_total"} {
				if n := seriesCount(t, reg, name); n != 1 {
					t.Errorf("%s: %d series at start, want 1 (zero-valued)", name, n)
				}
			}
			lag := func() (float64, bool) {
				mfs, err := reg.Gather()
				if err != nil {
					t.Fatal(err)
				}
				for _, mf := range mfs {
					if mf.GetName() == "projector_consumer_lag_events" {
						return mf.GetMetric()[0].GetGauge().GetValue(), true
					}
				}
				return 0, false
			}
			if v, ok := lag(); ok && v != float64(total(versions)) {
				t.Fatalf("lag gauge %v at start with %d events waiting", v, total(versions))
			}
			eventually(t, time.Minute, "the start-up lag to be measured", func() bool { v, ok := lag(); return ok && v == float64(total(versions)) })
			close(release)
			ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
			defer cancel()
			if err := d.CatchUp(ctx); err != nil {
				t.Fatal(err)
			}
			eventually(t, time.Minute, "the lag gauge to drop to 0 after the catch-up", func() bool { v, ok := lag(); return ok && v == 0 })
		})
	}
}

// CatchUp on a dispatcher that was never started returns at once.
func TestCatchUpBeforeStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{counting(e.schema, e.types, "c", projection.AsyncConfig{})}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
	defer cancel()
	if err := d.CatchUp(ctx); !errors.Is(err, projection.ErrNotStarted) {
		t.Fatalf("CatchUp before Start: %v, want ErrNotStarted", err)
	}
}

func TestHeartbeatConfigRange(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := counting(e.schema, e.types, "c", projection.AsyncConfig{})
	for _, cfg := range []projection.Config{
		{HeartbeatEvery: time.Millisecond},
		{HeartbeatEvery: time.Hour},
		{HeartbeatEvery: -time.Second},
		{InstanceExpiry: time.Second},
		{InstanceExpiry: -time.Hour},
		{InstanceExpiry: 10 * 365 * 24 * time.Hour},
		{HeartbeatEvery: time.Minute, InstanceExpiry: 5 * time.Minute},
	} {
		cfg.Store, cfg.Projections = e.store, []*projection.Async{p}
		if _, err := projection.New(cfg); err == nil {
			t.Errorf("heartbeat %v, expiry %v accepted", cfg.HeartbeatEvery, cfg.InstanceExpiry)
		}
	}
	if _, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{p}, HeartbeatEvery: time.Second, InstanceExpiry: 10 * time.Second}); err != nil {
		t.Errorf("in-range heartbeat and expiry refused: %v", err)
	}
}

// Every duration and the concurrency of a dispatcher's config is range
// checked: a negative concurrency used to panic sizing the pass semaphore,
// and a poll or recheck of a nanosecond would spin on the database.
func TestConfigRange(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := counting(e.schema, e.types, "c", projection.AsyncConfig{})
	for _, c := range []struct {
		field string
		cfg   projection.Config
	}{
		{"PollMin", projection.Config{PollMin: -time.Millisecond}},
		{"PollMin", projection.Config{PollMin: time.Microsecond}},
		{"PollMin", projection.Config{PollMin: 2 * time.Hour}},
		{"PollMax", projection.Config{PollMax: -time.Second}},
		{"PollMax", projection.Config{PollMin: 50 * time.Millisecond, PollMax: 20 * time.Millisecond}},
		{"PollMax", projection.Config{PollMax: 2 * time.Hour}},
		{"Recheck", projection.Config{Recheck: -time.Second}},
		{"Recheck", projection.Config{Recheck: time.Nanosecond}},
		{"MetricsEvery", projection.Config{MetricsEvery: -time.Second}},
		{"MetricsEvery", projection.Config{MetricsEvery: time.Millisecond}},
		{"Concurrency", projection.Config{Concurrency: -1}},
		{"Concurrency", projection.Config{Concurrency: projection.MaxConcurrency + 1}},
	} {
		c.cfg.Store, c.cfg.Projections = e.store, []*projection.Async{p}
		_, err := projection.New(c.cfg)
		if !errors.Is(err, projection.ErrInvalidConfig) || !strings.Contains(err.Error(), "Config."+c.field) {
			t.Errorf("%s out of range (%+v): %v, want ErrInvalidConfig naming it", c.field, c.cfg, err)
		}
	}
	// The bounds themselves, and a PollMin above the default PollMax (which
	// then follows it), are accepted.
	for _, cfg := range []projection.Config{
		{PollMin: projection.MinPoll, PollMax: projection.MinPoll, Recheck: projection.MinPoll, MetricsEvery: projection.MinMetricsEvery, Concurrency: 1},
		{PollMin: projection.MaxPoll, Recheck: projection.MaxPoll, MetricsEvery: projection.MaxMetricsEvery, Concurrency: projection.MaxConcurrency},
		{PollMin: time.Second},
	} {
		cfg.Store, cfg.Projections = e.store, []*projection.Async{p}
		if _, err := projection.New(cfg); err != nil {
			t.Errorf("in-range config %+v refused: %v", cfg, err)
		}
	}
}

// Remove unregisters a consumer no dispatcher runs, keeps its dead letters,
// and refuses, changing nothing, while one does.
func TestRemoveConsumer(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	admin := projection.NewAdmin(e.store)
	ev := e.appendOne("r", projector.NoStream, testevents.TicketOpened{Title: "r"})[0]
	p := counting(e.schema, e.types, "gone", projection.AsyncConfig{Delivery: projection.PerInstance})
	d, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{p}, InstanceID: "pod-r", Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.exec(`INSERT INTO `+e.store.Table("projector_dead_letters")+` (consumer, instance_id, event_id, event_tx_id, event_seq, event_type, tenant_id, stream_type, stream_id, version, error, attempts, reason)
		VALUES ('gone', 'pod-r', $1, $2, $3, $4, $5, 'ticket', 'r', 1, 'x', 1, 'skipped')`, ev.ID, ev.Position.TxID, ev.Position.Seq, ev.Type, ev.Stream.Tenant)
	_, err = admin.Remove(e.ctx, "gone", "")
	var inUse *projection.InUseError
	if !errors.As(err, &inUse) || !errors.Is(err, projector.ErrInvalidTransition) || !strings.Contains(err.Error(), "gone@pod-r has a live dispatcher") {
		t.Fatalf("remove while running: %v", err)
	}
	if st, _ := admin.List(e.ctx, "gone"); len(st) != 1 {
		t.Fatalf("refused remove changed the shards: %+v", st)
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	removed, err := admin.Remove(e.ctx, "gone", "")
	if err != nil || len(removed) != 1 || removed[0] != (projection.ShardID{Consumer: "gone", Instance: "pod-r"}) {
		t.Fatalf("remove after stop: %v %v", removed, err)
	}
	if st, _ := admin.List(e.ctx, "gone"); len(st) != 0 {
		t.Fatalf("shards left after remove: %+v", st)
	}
	var letters int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+e.store.Table("projector_dead_letters")+` WHERE consumer = 'gone'`).Scan(&letters); err != nil || letters != 1 {
		t.Fatalf("dead letters after remove: %d %v", letters, err)
	}
	if _, err := admin.Remove(e.ctx, "gone", ""); !errors.Is(err, projector.ErrNotFound) {
		t.Fatalf("remove of an unknown consumer: %v", err)
	}
}

// seriesCount counts the series of the metric name in reg.
func seriesCount(t *testing.T, reg *prometheus.Registry, name string) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return len(mf.GetMetric())
		}
	}
	return 0
}

// An expired shard that a pass is applying after all (its instance alive
// but its heartbeats lost) is neither passed over nor halted: prune only
// skips an expired shard whose lock it holds.
func TestExpiredShardBeingAppliedStillHoldsRetention(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.appendMany(1, 20, 2)
	e.exec(`INSERT INTO ` + e.store.Table("projector_consumers") + ` (name, instance_id) VALUES ('cache', 'pod-busy')`)
	e.exec(`INSERT INTO ` + e.store.Table("projector_instances") + ` (instance_id, consumers, last_seen_at) VALUES ('pod-busy', '{cache}', now() - interval '3 days')`)
	// What a running pass holds: the shard's transaction-scoped lock.
	pass, err := e.store.Pool().Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pass.Rollback(e.ctx) }()
	if _, err := pass.Exec(e.ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1::text, 0))`,
		"projector.shard\x1f"+e.schema+"\x1fcache\x1fpod-busy"); err != nil {
		t.Fatal(err)
	}
	if res := e.pruneAll(); res.Deleted != 0 || res.Blocker == nil || res.Blocker.Instance != "pod-busy" {
		t.Fatalf("prune passed an expired shard a pass holds: %+v", res)
	}
	if st := e.shardState("cache", "pod-busy"); st.Status != projection.StatusIdle {
		t.Fatalf("a shard a pass holds was halted: %+v", st)
	}
	if err := pass.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	if res := e.pruneAll(); res.Deleted == 0 {
		t.Fatalf("prune after the pass ended: %+v", res)
	}
	if st := e.shardState("cache", "pod-busy"); st.Status != projection.StatusDead {
		t.Fatalf("expired shard pruned past, not halted: %+v", st)
	}
}
