package benchmark

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
	"github.com/projectorhq/projector/stores/postgres"
)

// DefaultRebuildEvents is the log a rebuild measurement replays by default:
// the million events issue 9 sets the target on.
const DefaultRebuildEvents = 1_000_000

// RebuildConfig sizes a rebuild measurement. Zero fields take the defaults.
type RebuildConfig struct {
	// Events is the log to replay; default [DefaultRebuildEvents].
	Events int
	// Streams is how many streams the log is spread over; default
	// [DefaultStreams].
	Streams int
	// BatchSize is the live shard's (and the raw loop's) events per
	// transaction; default [projection.DefaultBatchSize].
	BatchSize int
	// RebuildBatchSize is the shadow shard's; zero leaves the projection's
	// default ([projection.AsyncConfig.RebuildBatchSize]).
	RebuildBatchSize int
	// Form is the projection's handler shape; default [Batched].
	Form Form
}

func (c RebuildConfig) withDefaults() RebuildConfig {
	c.Events = cmp.Or(c.Events, DefaultRebuildEvents)
	c.Streams = cmp.Or(c.Streams, DefaultStreams)
	c.BatchSize = cmp.Or(c.BatchSize, projection.DefaultBatchSize)
	c.Form = cmp.Or(c.Form, Batched)
	return c
}

func (c RebuildConfig) validate() error {
	errs := []error{
		within("rebuild events", c.Events, 1, math.MaxInt32),
		within("streams", c.Streams, 1, math.MaxInt32), within("batch size", c.BatchSize, 1, projection.MaxBatchSize),
	}
	if c.RebuildBatchSize != 0 {
		errs = append(errs, within("rebuild batch size", c.RebuildBatchSize, 1, projection.MaxBatchSize))
	}
	switch c.Form {
	case PerEvent, Pipelined, Batched, BatchedRawPayloads:
	default:
		errs = append(errs, fmt.Errorf("unknown form %q", c.Form))
	}
	return errors.Join(errs...)
}

// RebuildResult is one rebuild figure: the same log applied three ways,
// back to back, each from an empty model to every event counted once.
type RebuildResult struct {
	Form   Form
	Events int
	// BatchSize is the live shard's and the raw loop's batch, and
	// RebuildBatchSize the shadow shard's.
	BatchSize, RebuildBatchSize int
	// RawTime is the hand-written loop's ([CatchUp]'s), LiveTime the
	// dispatcher catching the projection up from scratch (New to Stop),
	// RebuildTime the blue/green rebuild of the same projection on a live
	// model that had caught up: from rebuild.Request to the switch's
	// commit, dispatcher start included.
	RawTime, LiveTime, RebuildTime time.Duration
	// SwitchLock is how long the switch held the live tables (ACCESS
	// EXCLUSIVE), as the rebuild recorded it.
	SwitchLock time.Duration
	// LivePeakHeap and RebuildPeakHeap are the most Go heap in use while
	// each ran, in bytes: both stream batches, so neither may grow with the
	// log.
	LivePeakHeap, RebuildPeakHeap uint64
}

// RawRate returns the raw loop's events per second.
func (r RebuildResult) RawRate() float64 { return rate(int64(r.Events), r.RawTime) }

// LiveRate returns the live catch-up's events per second.
func (r RebuildResult) LiveRate() float64 { return rate(int64(r.Events), r.LiveTime) }

// RebuildRate returns the rebuild's events per second.
func (r RebuildResult) RebuildRate() float64 { return rate(int64(r.Events), r.RebuildTime) }

// Speedup returns the rebuild's rate over the live catch-up's: issue 9's
// target is at least 1.5.
func (r RebuildResult) Speedup() float64 {
	if r.LiveRate() == 0 {
		return 0
	}
	return r.RebuildRate() / r.LiveRate()
}

// Report sends the Go benchmark metrics of a rebuild figure.
func (r RebuildResult) Report(m MetricReporter) {
	m.ReportMetric(r.RawRate(), "raw-events/s")
	m.ReportMetric(r.LiveRate(), "live-events/s")
	m.ReportMetric(r.RebuildRate(), "rebuild-events/s")
	m.ReportMetric(r.Speedup(), "×-live")
	m.ReportMetric(ms(r.SwitchLock), "switch-lock-ms")
	m.ReportMetric(float64(max(r.LivePeakHeap, r.RebuildPeakHeap))/(1<<20), "peak-heap-MiB")
}

// Add accumulates another round of the same configuration (times add up;
// the switch lock and the heaps keep their worst).
func (r *RebuildResult) Add(o RebuildResult) {
	r.Form, r.BatchSize, r.RebuildBatchSize = o.Form, o.BatchSize, o.RebuildBatchSize
	r.Events += o.Events
	r.RawTime += o.RawTime
	r.LiveTime += o.LiveTime
	r.RebuildTime += o.RebuildTime
	r.SwitchLock = max(r.SwitchLock, o.SwitchLock)
	r.LivePeakHeap = max(r.LivePeakHeap, o.LivePeakHeap)
	r.RebuildPeakHeap = max(r.RebuildPeakHeap, o.RebuildPeakHeap)
}

// rebuildConsumer is the projection the rebuild measurement builds.
const rebuildConsumer = "bench-rebuild"

// Rebuild is a log and a counting projection (one row per stream, the
// [CatchUp] read model) declared with its table, so it can be rebuilt blue/
// green. [MeasureRebuild] and BenchmarkRebuild drive it.
type Rebuild struct {
	c     *CatchUp
	cfg   RebuildConfig
	table string // the declared table, schema.bench_counts
}

// NewRebuild fills store's schema with a log of cfg.Events events and the
// tables of a [CatchUp]. The schema must be fresh (its log must hold no
// backlog) and must not be shared with another rebuild measurement; Close
// cleans up.
func NewRebuild(ctx context.Context, store *postgres.Store, cfg RebuildConfig) (*Rebuild, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("rebuild: %w", err)
	}
	c, err := NewCatchUp(ctx, store, CatchUpConfig{Events: cfg.Events, Streams: cfg.Streams, BatchSize: cfg.BatchSize})
	if err != nil {
		return nil, fmt.Errorf("rebuild: %w", err)
	}
	// The first pass over freshly inserted rows sets their hint bits,
	// writing every page: whichever side ran first would pay for that. A
	// vacuum pays it up front, as on a log that has been read before.
	if _, err := store.Pool().Exec(ctx, `VACUUM (ANALYZE) `+store.Table("projector_events")); err != nil {
		return nil, errors.Join(fmt.Errorf("rebuild: vacuum the log: %w", err), c.Close(ctx))
	}
	return &Rebuild{c: c, cfg: cfg, table: store.Schema() + ".bench_counts"}, nil
}

// Close cancels a rebuild left active by a failed measurement, drops the
// shadow and old tables rebuilds left, then the [CatchUp] tables; it runs
// even when ctx is cancelled.
func (r *Rebuild) Close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	store := r.c.store
	var errs []error
	// A measurement that never ran (a benchmark filtered out) left no
	// projection registered: nothing to cancel or drop then.
	if err := rebuild.Cancel(ctx, store, rebuildConsumer); err != nil && !errors.Is(err, rebuild.ErrNotActive) && !errors.Is(err, rebuild.ErrUnknownProjection) {
		errs = append(errs, err)
	}
	if _, err := rebuild.DropOld(ctx, store, rebuildConsumer); err != nil && !errors.Is(err, rebuild.ErrUnknownProjection) {
		errs = append(errs, err)
	}
	return errors.Join(append(errs, r.c.Close(ctx))...)
}

// Measure applies the whole log three times from an empty model, back to
// back so drift on a shared machine hits all alike: the raw loop, a
// dispatcher catching the projection up live, then a blue/green rebuild of
// the projection over the caught-up (and deliberately spoiled) live model,
// to its switch. Each must count every event exactly once, or Measure
// fails. rebuildBatch overrides the config's RebuildBatchSize when not zero.
func (r *Rebuild) Measure(ctx context.Context, rebuildBatch int) (RebuildResult, error) {
	cfg := r.cfg
	cfg.RebuildBatchSize = cmp.Or(rebuildBatch, cfg.RebuildBatchSize)
	if err := cfg.validate(); err != nil {
		return RebuildResult{}, fmt.Errorf("rebuild: %w", err)
	}
	p := r.projection(cfg)
	res := RebuildResult{Form: cfg.Form, Events: cfg.Events, BatchSize: cfg.BatchSize, RebuildBatchSize: p.Config().RebuildBatchSize}

	if err := r.reset(ctx); err != nil {
		return res, err
	}
	start := time.Now()
	if err := r.c.rawLoop(ctx, cfg.Form, false); err != nil {
		return res, fmt.Errorf("rebuild, raw loop: %w", err)
	}
	res.RawTime = time.Since(start)
	if err := r.c.checkApplied(ctx); err != nil {
		return res, fmt.Errorf("rebuild, raw loop: %w", err)
	}

	if err := r.reset(ctx); err != nil {
		return res, err
	}
	runtime.GC()
	stopHeap := sampleHeap(&res.LivePeakHeap)
	start = time.Now()
	err := r.c.dispatch(ctx, p)
	res.LiveTime = time.Since(start)
	stopHeap()
	if err != nil {
		return res, fmt.Errorf("rebuild, live catch-up: %w", err)
	}
	if err := r.c.checkApplied(ctx); err != nil {
		return res, fmt.Errorf("rebuild, live catch-up: %w", err)
	}

	// Spoil the live model: only a replay of the whole log into the
	// shadow table, switched in, makes it count every event again.
	if _, err := r.c.store.Pool().Exec(ctx, `UPDATE `+r.c.counts+` SET n = 0`); err != nil {
		return res, fmt.Errorf("rebuild: spoil the live model: %w", err)
	}
	runtime.GC()
	stopHeap = sampleHeap(&res.RebuildPeakHeap)
	start = time.Now()
	res.SwitchLock, err = r.rebuild(ctx, p)
	res.RebuildTime = time.Since(start)
	stopHeap()
	if err != nil {
		return res, fmt.Errorf("rebuild, blue/green: %w", err)
	}
	if err := r.c.checkApplied(ctx); err != nil {
		return res, fmt.Errorf("rebuild, blue/green: %w", err)
	}
	if _, err := rebuild.DropOld(ctx, r.c.store, rebuildConsumer); err != nil {
		return res, err
	}
	return res, nil
}

// LiveCatchUp catches the projection up from scratch with a dispatcher, as
// Measure's live side does, with the shadow batch's commit setting when
// syncCommitOff is set: the dispatcher's sessions run with
// synchronous_commit=off. A shadow pass always sets it, so this is how
// what the setting buys is measured: on the same passes, same log, same
// run. It returns the time taken; the model must count every event once.
func (r *Rebuild) LiveCatchUp(ctx context.Context, syncCommitOff bool) (took time.Duration, err error) {
	store := r.c.store
	if syncCommitOff {
		cfg := store.Pool().Config()
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return 0, fmt.Errorf("rebuild: pool with synchronous_commit=off: %w", err)
		}
		defer pool.Close()
		if store, err = postgres.New(ctx, pool, postgres.Config{Schema: store.Schema(), Registry: store.Registry(), Logger: quiet}); err != nil {
			return 0, fmt.Errorf("rebuild: store with synchronous_commit=off: %w", err)
		}
	}
	if err := r.reset(ctx); err != nil {
		return 0, err
	}
	p := r.projection(r.cfg)
	start := time.Now()
	d, err := startDispatcher(ctx, store, p, 1)
	if err != nil {
		return 0, err
	}
	err = errors.Join(d.CatchUp(ctx), stopDispatcher(ctx, d))
	took = time.Since(start)
	if err != nil {
		return took, fmt.Errorf("rebuild, live catch-up: %w", err)
	}
	return took, r.c.checkApplied(ctx)
}

// rebuild requests a blue/green rebuild, runs a dispatcher until the
// rebuild has switched and returns the switch's lock time.
func (r *Rebuild) rebuild(ctx context.Context, p *projection.Async) (time.Duration, error) {
	store := r.c.store
	rb, err := rebuild.Request(ctx, store, rebuildConsumer, rebuild.Options{})
	if err != nil {
		return 0, err
	}
	d, err := startDispatcher(ctx, store, p, 1)
	if err != nil {
		return 0, err
	}
	lock, err := r.waitSwitched(ctx, rb.ID)
	return lock, errors.Join(err, stopDispatcher(ctx, d))
}

// waitSwitched polls the rebuild's row, a primary-key read (rebuild.Wait
// counts the events left, a scan of the log this measurement should not
// pay for), until it has switched; a shadow shard gone dead fails it.
func (r *Rebuild) waitSwitched(ctx context.Context, id int64) (time.Duration, error) {
	q := `SELECT r.status, coalesce(r.switch_ms, 0), coalesce(s.status, ''), coalesce(s.last_error, '')
		FROM ` + r.c.store.Table("projector_rebuilds") + ` r LEFT JOIN ` + r.c.store.Table("projector_consumers") + ` s
			ON s.name = r.name AND s.instance_id = $2
		WHERE r.id = $1`
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		var status, shard, lastErr string
		var switchMS float64
		if err := r.c.store.Pool().QueryRow(ctx, q, id, projection.RebuildInstance).Scan(&status, &switchMS, &shard, &lastErr); err != nil {
			return 0, fmt.Errorf("read rebuild %d: %w", id, err)
		}
		switch {
		case status == string(rebuild.Switched):
			return time.Duration(switchMS * float64(time.Millisecond)), nil
		case status != string(rebuild.Building):
			return 0, fmt.Errorf("rebuild %d ended %s", id, status)
		case shard == string(projection.StatusDead):
			return 0, fmt.Errorf("rebuild %d: shadow shard dead: %s", id, lastErr)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-tick.C:
		}
	}
}

// reset empties the live model, rewinds the raw cursor and removes the
// projection's consumer, so the next side starts from scratch.
func (r *Rebuild) reset(ctx context.Context) error {
	pool := r.c.store.Pool()
	if _, err := pool.Exec(ctx, `TRUNCATE `+r.c.counts+`, `+r.c.cursor); err != nil {
		return fmt.Errorf("rebuild: reset read model: %w", err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+r.c.cursor+` VALUES ('raw', '0', 0)`); err != nil {
		return fmt.Errorf("rebuild: reset raw cursor: %w", err)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM `+r.c.store.Table("projector_consumers")+` WHERE name = $1`, rebuildConsumer); err != nil {
		return fmt.Errorf("rebuild: reset consumer: %w", err)
	}
	return nil
}

// projection is the counting projection in cfg.Form, declaring its table
// and writing it through projection.Table, so a shadow pass writes the
// shadow copy.
func (r *Rebuild) projection(cfg RebuildConfig) *projection.Async {
	p := projection.NewAsync(rebuildConsumer, projection.AsyncConfig{
		BatchSize: cfg.BatchSize, RebuildBatchSize: cfg.RebuildBatchSize,
		RawPayloads: cfg.Form == BatchedRawPayloads, Tables: []string{r.table},
	})
	upsert := func(ctx context.Context) string {
		return `INSERT INTO ` + projection.Table(ctx, r.table) + ` AS c (stream_id, n) VALUES ($1, 1) ON CONFLICT (stream_id) DO UPDATE SET n = c.n + 1`
	}
	// Registration errors surface from projection.New, which validates.
	switch cfg.Form {
	case PerEvent, Pipelined:
		queued := cfg.Form == Pipelined
		_ = projection.OnEvent(p, typeName(BackloggedType), func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
			if queued {
				return projection.Queue(ctx, upsert(ctx), ev.Stream.ID)
			}
			_, err := tx.Exec(ctx, upsert(ctx), ev.Stream.ID)
			return err
		})
	default:
		_ = projection.OnBatch(p, func(ctx context.Context, tx pgx.Tx, batch projection.Batch) error {
			ids := make([]string, len(batch.Streams))
			counts := make([]int64, len(batch.Streams))
			for i, s := range batch.Streams {
				ids[i], counts[i] = s.Stream.ID, int64(len(s.Events))
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+projection.Table(ctx, r.table)+` AS c (stream_id, n)
				SELECT * FROM unnest($1::text[], $2::bigint[])
				ON CONFLICT (stream_id) DO UPDATE SET n = c.n + excluded.n`, ids, counts)
			return err
		}, typeName(BackloggedType))
	}
	return p
}

// MeasureRebuild fills store with a log of cfg.Events events and measures
// one [Rebuild] round of cfg.Form. The store must be on a fresh schema of
// its own: the rebuild leaves shadow and old schemas named after it, which
// Close (called here) drops.
func MeasureRebuild(ctx context.Context, store *postgres.Store, cfg RebuildConfig) (res RebuildResult, err error) {
	r, err := NewRebuild(ctx, store, cfg)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, r.Close(ctx)) }()
	return r.Measure(ctx, 0)
}
