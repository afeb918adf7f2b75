package projection

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the dispatcher's Prometheus series, all labelled by consumer
// and instance_id except the horizon age, which is the database's.
type metrics struct {
	lagEvents  *prometheus.GaugeVec
	lagSeconds *prometheus.GaugeVec
	// inRate and skew are a partition's load (partition_load.go).
	inRate, skew *prometheus.GaugeVec
	status       *prometheus.GaugeVec
	processed    *prometheus.CounterVec
	failed       *prometheus.CounterVec
	deadLetters  *prometheus.CounterVec
	sharedReads  *prometheus.CounterVec
	// conflicts counts passes rolled back because a handler lost a
	// conflict with another transaction (handlerLostConflict).
	conflicts  *prometheus.CounterVec
	batchApply *prometheus.HistogramVec
	// applyDelay is append-to-applied per event, with trace exemplars
	// (exemplar.go).
	applyDelay *prometheus.HistogramVec
	horizonAge prometheus.Gauge
	// horizonHolder names the transaction holding the horizon (Horizon):
	// one series at a time, its labels the holder's, its value its age.
	horizonHolder *prometheus.GaugeVec
	// openDeadLetters counts each consumer's open dead letters, all its
	// instances together (the table's, not this process's).
	openDeadLetters *prometheus.GaugeVec
	// parkedStreams and parkedAge count each consumer's open parks and the
	// age of its oldest, all instances together (park.go).
	parkedStreams, parkedAge *prometheus.GaugeVec
	rebuilds                 *rebuildGauges

	// lagged holds the shards whose last published lag was not zero.
	mu     sync.Mutex
	lagged map[ShardID]bool
}

// lagging reports whether the shard's last published lag was not zero.
func (m *metrics) lagging(id ShardID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lagged[id]
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	labels := []string{"consumer", "instance_id"}
	m := &metrics{
		lagEvents: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "projector_consumer_lag_events",
			Help: "Events after the consumer shard's cursor (all types, capped at 10M), refreshed periodically.",
		}, labels),
		lagSeconds: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "projector_consumer_lag_seconds",
			Help: "Age of the oldest event after the consumer shard's cursor; 0 when caught up.",
		}, labels),
		inRate: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "projector_partition_in_events_per_second",
			Help: "Events per second appended to a partition's streams over the log's latest events (projection.LoadWindow), refreshed with the lag.",
		}, labels),
		skew: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "projector_partition_skew",
			Help: "A partition's share of the log's latest events over an even share: 1 even, 2 or more hot (one stream far busier than the rest); 0 below 100 events.",
		}, labels),
		status: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "projector_consumer_status",
			Help: "1 for the consumer shard's current status (idle, processing, dead, disabled), 0 for the others.",
		}, append(labels, "status")),
		processed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "projector_events_processed_total",
			Help: "Events applied and committed by this process.",
		}, labels),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "projector_events_failed_total",
			Help: "Handler failures (each failed attempt counts once).",
		}, labels),
		conflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "projector_handler_conflicts_total",
			Help: "Passes rolled back and run again because a handler lost a conflict with another transaction (a deadlock's victim, a serialization failure): not counted as failures.",
		}, labels),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "projector_dead_letters_total",
			Help: "Events this process wrote to the dead-letter table in continuous mode.",
		}, labels),
		sharedReads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "projector_shared_reads_total",
			Help: "Batches the shard took from another shard's read of the same full log batch in this process, instead of reading them itself.",
		}, labels),
		batchApply: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "projector_batch_apply_duration_seconds",
			Help:    "Time to apply one batch, from the first handler call to commit.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, labels),
		applyDelay: newApplyDelay(labels),
		horizonAge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "projector_horizon_age_seconds",
			Help: "Age of the oldest transaction holding a transaction id in the cluster: how long delivery of later events may be held back.",
		}),
		horizonHolder: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "projector_horizon_holder_age_seconds",
			Help: "The transaction holding the horizon, by its labels (a session's pid, database, user and application, or a prepared transaction's gid), valued its age; absent when none holds it.",
		}, []string{"kind", "pid", "gid", "database", "user", "application_name"}),
		openDeadLetters: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "projector_dead_letters_open",
			Help: "Open dead letters of the consumer (neither retried successfully nor discarded), all instances; the same from every dispatcher that runs it.",
		}, []string{"consumer"}),
		parkedStreams: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "projector_parked_streams",
			Help: "Streams the consumer has parked (ParkStream) and no retry or discard has resolved yet, all instances.",
		}, []string{"consumer"}),
		parkedAge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "projector_parked_oldest_age_seconds",
			Help: "Age of the consumer's oldest open park, 0 when none: how long a stream's read model has been held back.",
		}, []string{"consumer"}),
		lagged:   map[ShardID]bool{},
		rebuilds: newRebuildGauges(),
	}
	for _, c := range append([]prometheus.Collector{m.lagEvents, m.lagSeconds, m.inRate, m.skew, m.status, m.processed, m.failed, m.conflicts, m.deadLetters, m.sharedReads, m.batchApply, m.applyDelay, m.horizonAge, m.horizonHolder, m.openDeadLetters, m.parkedStreams, m.parkedAge}, m.rebuilds.collectors()...) {
		if err := reg.Register(c); err != nil {
			var already prometheus.AlreadyRegisteredError
			if errors.As(err, &already) {
				return nil, errors.New("a projector dispatcher's metrics are already registered on this Registerer; give each dispatcher its own (prometheus.WrapRegistererWith)")
			}
			return nil, err
		}
	}
	return m, nil
}

// start creates the shard's counters and histogram at zero, so series that
// alerts use (increase(projector_events_failed_total[15m])) exist from the
// start rather than from the first failure, which increase() would not
// count. Gauges are left to the first measurement: a zero lag published
// before it would be a lie.
func (m *metrics) start(id ShardID) {
	l := prometheus.Labels{"consumer": id.Consumer, "instance_id": id.Instance}
	m.processed.With(l).Add(0)
	m.failed.With(l).Add(0)
	m.conflicts.With(l).Add(0)
	m.deadLetters.With(l).Add(0)
	m.sharedReads.With(l).Add(0)
	m.batchApply.With(l)
	m.applyDelay.With(l)
}

// forget deletes the series of a shard that no longer exists (a partition
// split or merged away), so its last lag and status are not shown for ever
// beside its halves' or parent's.
func (m *metrics) forget(id ShardID) {
	l := prometheus.Labels{"consumer": id.Consumer, "instance_id": id.Instance}
	for _, v := range []*prometheus.GaugeVec{m.lagEvents, m.lagSeconds, m.inRate, m.skew} {
		v.Delete(l)
	}
	m.status.DeletePartialMatch(l)
	for _, v := range []*prometheus.CounterVec{m.processed, m.failed, m.conflicts, m.deadLetters, m.sharedReads} {
		v.Delete(l)
	}
	m.batchApply.Delete(l)
	m.applyDelay.Delete(l)
	m.mu.Lock()
	delete(m.lagged, id)
	m.mu.Unlock()
}

func (m *metrics) batch(id ShardID, applied, failed, deadLetters int, started time.Time) {
	l := prometheus.Labels{"consumer": id.Consumer, "instance_id": id.Instance}
	m.processed.With(l).Add(float64(applied))
	if failed > 0 {
		m.failed.With(l).Add(float64(failed))
	}
	if deadLetters > 0 {
		m.deadLetters.With(l).Add(float64(deadLetters))
	}
	if !started.IsZero() {
		m.batchApply.With(l).Observe(time.Since(started).Seconds())
	}
}

// conflict counts a pass of id rolled back because a handler lost a
// conflict (conflictError).
func (m *metrics) conflict(id ShardID) {
	m.conflicts.With(prometheus.Labels{"consumer": id.Consumer, "instance_id": id.Instance}).Inc()
}

const horizonAgeSQL = `SELECT coalesce(extract(epoch FROM now() - least(
	(SELECT min(xact_start) FROM pg_stat_activity WHERE backend_xid IS NOT NULL),
	(SELECT min(prepared) FROM pg_prepared_xacts))), 0)::float8`

// minRemeasure spaces the refreshes a catch-up asks for: a shard whose
// lag is events held back by a long transaction is caught up on every pass.
const minRemeasure = time.Second

// metricsLoop refreshes the gauges that need a query: at start (gauges do
// not exist until then, rather than report a lag nobody measured), every
// MetricsEvery, and soon after a shard whose published lag is not zero
// catches up, so the backlog found at start-up is not reported for a whole
// period after it is gone.
func (d *Dispatcher) metricsLoop(ctx context.Context) {
	tick := time.NewTicker(d.cfg.MetricsEvery)
	defer tick.Stop()
	for {
		last := time.Now()
		d.refreshGauges(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-d.remeasure:
			if wait := minRemeasure - time.Since(last); wait > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(wait):
				}
			}
		}
	}
}

func (d *Dispatcher) refreshGauges(ctx context.Context) {
	// One listing (each shard's lag counted in the same query) rather than a
	// status query per shard.
	all, err := d.admin.List(ctx, "")
	if err != nil {
		if ctx.Err() == nil {
			d.logger.DebugContext(ctx, "projection dispatcher: refresh metrics", slog.Any("error", err))
		}
		return
	}
	mine := make(map[ShardID]bool)
	for _, sh := range d.allShards() {
		mine[sh.id] = true
	}
	for _, st := range all {
		if !mine[st.ShardID] {
			continue
		}
		l := prometheus.Labels{"consumer": st.Consumer, "instance_id": st.Instance}
		d.metrics.lagEvents.With(l).Set(float64(st.LagEvents))
		d.metrics.mu.Lock()
		d.metrics.lagged[st.ShardID] = st.LagEvents > 0
		d.metrics.mu.Unlock()
		d.metrics.lagSeconds.With(l).Set(st.LagSeconds)
		if st.Partitions > 0 {
			d.metrics.inRate.With(l).Set(st.InRate)
			d.metrics.skew.With(l).Set(st.Skew)
		}
		for _, s := range []Status{StatusIdle, StatusProcessing, StatusDead, StatusDisabled} {
			v := 0.0
			if s == st.Status {
				v = 1
			}
			d.metrics.status.With(prometheus.Labels{"consumer": st.Consumer, "instance_id": st.Instance, "status": string(s)}).Set(v)
		}
	}
	var age float64
	if err := d.store.Pool().QueryRow(ctx, horizonAgeSQL).Scan(&age); err == nil {
		d.metrics.horizonAge.Set(age)
	}
	d.refreshHorizonHolder(ctx)
	d.refreshOpenDeadLetters(ctx)
	d.refreshParks(ctx)
	d.refreshRebuildGauges(ctx)
}

// refreshOpenDeadLetters publishes the open dead letters of each consumer
// this dispatcher runs, 0 included (so an alert on > 0 has a series to
// watch from the start), with one query on the open dead letters' partial
// index.
func (d *Dispatcher) refreshOpenDeadLetters(ctx context.Context) {
	counts := map[string]float64{}
	for _, sh := range d.allShards() {
		counts[sh.id.Consumer] = 0
	}
	names := make([]string, 0, len(counts))
	for name := range counts {
		names = append(names, name)
	}
	var name string
	var n int64
	rows, err := d.store.Pool().Query(ctx, `SELECT consumer, count(*) FROM `+d.store.Table("projector_dead_letters")+`
		WHERE status = 'open' AND consumer = ANY($1) GROUP BY consumer`, names)
	if err == nil {
		_, err = pgx.ForEachRow(rows, []any{&name, &n}, func() error {
			counts[name] = float64(n)
			return nil
		})
	}
	if err != nil {
		if ctx.Err() == nil {
			d.logger.DebugContext(ctx, "projection dispatcher: refresh open dead letters", slog.Any("error", err))
		}
		return
	}
	for name, n := range counts {
		d.metrics.openDeadLetters.With(prometheus.Labels{"consumer": name}).Set(n)
	}
}

// refreshHorizonHolder publishes who holds the horizon: the one series of
// projector_horizon_holder_age_seconds is replaced, or removed when no
// transaction holds it (or the role cannot see which does).
func (d *Dispatcher) refreshHorizonHolder(ctx context.Context) {
	rep, err := Horizon(ctx, d.store.Pool())
	if err != nil {
		if ctx.Err() == nil {
			d.logger.DebugContext(ctx, "projection dispatcher: refresh horizon holder", slog.Any("error", err))
		}
		return
	}
	d.metrics.horizonHolder.Reset()
	if h := rep.Holder; h != nil {
		pid := ""
		if h.PID != 0 {
			pid = strconv.Itoa(int(h.PID))
		}
		age := rep.AgeSeconds
		if !h.Since.IsZero() {
			age = max(time.Since(h.Since).Seconds(), 0)
		}
		d.metrics.horizonHolder.With(prometheus.Labels{"kind": h.Kind, "pid": pid, "gid": h.GID, "database": h.Database,
			"user": h.User, "application_name": h.ApplicationName}).Set(age)
	}
}
