package projection

import (
	"context"
	"log/slog"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// rebuildGauges publish the progress of the rebuilds of a dispatcher's
// projections, so a long replay can be watched and alerted on from
// Prometheus like a consumer's lag. A series exists while its rebuild is
// active (building, or ready and held for a switch) and is removed when it
// switches, finishes or is cancelled: a finished rebuild has no progress to
// report, and a stale 0.4 would look like a stalled one.
type rebuildGauges struct {
	progress  *prometheus.GaugeVec
	remaining *prometheus.GaugeVec
	total     *prometheus.GaugeVec

	mu        sync.Mutex
	published map[rebuildSeries]bool
}

// rebuildSeries is one rebuild's label values.
type rebuildSeries struct{ consumer, version string }

func newRebuildGauges() *rebuildGauges {
	labels := []string{"consumer", "version"}
	return &rebuildGauges{
		progress: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "projector_rebuild_progress",
			Help: "Share (0 to 1) of the events up to a rebuild's target (the log's end when it was requested) that it has replayed; present while the rebuild is active.",
		}, labels),
		remaining: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "projector_rebuild_remaining_events",
			Help: "Events up to an active rebuild's target that it has still to replay.",
		}, labels),
		total: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "projector_rebuild_target_events",
			Help: "Events in the log when an active rebuild was requested: what progress is measured against.",
		}, labels),
		published: map[rebuildSeries]bool{},
	}
}

func (g *rebuildGauges) collectors() []prometheus.Collector {
	return []prometheus.Collector{g.progress, g.remaining, g.total}
}

// rebuildProgressSQL measures the active rebuilds of the given projections
// the way rebuild.List does: the events after the rebuilding cursor (the
// shadow shard's blue/green, the live shard's in place) up to the target.
// An in-place rebuild whose replay mark is gone has replayed everything.
func rebuildProgressSQL(c, e, r string) string {
	return `SELECT r.name, r.version, r.total_events,
			CASE WHEN s.name IS NULL AND r.mode = 'blue-green' THEN r.total_events
			WHEN s.name IS NULL OR (r.mode = 'in-place' AND s.replayed) THEN 0
			ELSE (SELECT count(*) FROM ` + e + ` e WHERE (e.tx_id, e.seq) > (s.cursor_tx_id, s.cursor_seq)
				AND (e.tx_id, e.seq) <= (r.target_tx_id, r.target_seq)) END
		FROM ` + r + ` r
		` + RebuildShardSQL(c) + `
		WHERE r.status IN ('building', 'ready') AND r.name = ANY($1)`
}

// rebuildShare is the progress a rebuild reports: the same as the CLI's
// (rebuild.Rebuild.Progress), 0 before a replay of an empty log has moved.
func rebuildShare(total, remaining int64) float64 {
	if total <= 0 {
		return 0
	}
	return min(1, max(0, float64(total-remaining)/float64(total)))
}

// refreshRebuildGauges publishes the progress of the active rebuilds of this
// dispatcher's projections (whatever version this binary runs: an operator
// watches a rebuild from any process that knows the projection) and removes
// the series of rebuilds that ended.
func (d *Dispatcher) refreshRebuildGauges(ctx context.Context) {
	g := d.metrics.rebuilds
	names := make([]string, 0)
	for _, sh := range d.allShards() {
		names = append(names, sh.id.Consumer)
	}
	// Inline projections' rebuilds (recorded as blue/green, cursor on the
	// shadow shard's row) run in processes with their code: this one's
	// store's.
	names = append(names, d.store.InlineNames()...)
	rows, err := d.store.Pool().Query(ctx, rebuildProgressSQL(d.store.Table("projector_consumers"),
		d.store.Table("projector_events"), d.store.Table("projector_rebuilds")), names)
	if err != nil {
		if ctx.Err() == nil {
			d.logger.DebugContext(ctx, "projection dispatcher: refresh rebuild metrics", slog.Any("error", err))
		}
		return
	}
	seen := map[rebuildSeries]bool{}
	for rows.Next() {
		var name string
		var version int
		var total, remaining int64
		if err := rows.Scan(&name, &version, &total, &remaining); err != nil {
			rows.Close()
			d.logger.DebugContext(ctx, "projection dispatcher: refresh rebuild metrics", slog.Any("error", err))
			return
		}
		s := rebuildSeries{consumer: name, version: strconv.Itoa(version)}
		seen[s] = true
		l := prometheus.Labels{"consumer": s.consumer, "version": s.version}
		g.progress.With(l).Set(rebuildShare(total, remaining))
		g.remaining.With(l).Set(float64(remaining))
		g.total.With(l).Set(float64(total))
	}
	if err := rows.Err(); err != nil {
		if ctx.Err() == nil {
			d.logger.DebugContext(ctx, "projection dispatcher: refresh rebuild metrics", slog.Any("error", err))
		}
		return // keep what was published rather than drop series on a failed read
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for s := range g.published {
		if !seen[s] {
			l := prometheus.Labels{"consumer": s.consumer, "version": s.version}
			g.progress.Delete(l)
			g.remaining.Delete(l)
			g.total.Delete(l)
		}
	}
	g.published = seen
}
