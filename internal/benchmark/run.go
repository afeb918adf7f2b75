package benchmark

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// Config sizes a full [Run]. Zero fields take the defaults of the
// measurement they belong to.
type Config struct {
	// EventsPerTx lists the append sizes measured; default 1 and 100
	// ([DefaultEventsPerTxCounts]).
	EventsPerTx []int
	// Writers lists the concurrent appender counts measured, each with
	// every size of EventsPerTx; default 1, 4 and 16 ([DefaultWriterCounts]).
	Writers []int
	// AppendDuration is the measuring time of each append size, both sides
	// together; default [DefaultAppendDuration].
	AppendDuration time.Duration
	// Backlog is the catch-up backlog in events; default [DefaultBacklog].
	Backlog int
	// BatchSize is the catch-up batch size; default
	// [projection.DefaultBatchSize].
	BatchSize int
	// Rate is the latency measurement's append rate in events per second;
	// default [DefaultRate].
	Rate int
	// LatencyDuration is how long each latency side appends; default
	// [DefaultLatencyDuration].
	LatencyDuration time.Duration
	// RebuildEvents is the log the rebuild measurement replays; default
	// [DefaultRebuildEvents]. Its live side and raw loop use BatchSize.
	RebuildEvents int
	// RebuildBatchSize is the shadow shard's batch; zero leaves the
	// projection's default ([projection.AsyncConfig.RebuildBatchSize]).
	RebuildBatchSize int
	// Tracing adds the tracing figures ([MeasureTracing]): appends and a
	// catch-up with every span recorded, each beside the same work
	// untraced, in a schema of their own.
	Tracing bool
	// TracingPairs is how many untraced/traced pairs of catch-ups each
	// traced mode runs; default [TracingCatchUpPairs]. Odd, so the median
	// is one pair's ratio; the suite's tests of the median run the fewest
	// a median of pairs needs (3), the others one.
	TracingPairs int
	// Progress, when set, is told what is about to be measured, so a
	// person watching a long run knows where it is.
	Progress func(msg string)
}

// WithDefaults returns c with every zero field set to its default, so a
// caller can print what will run.
func (c Config) WithDefaults() Config {
	if len(c.EventsPerTx) == 0 {
		c.EventsPerTx = DefaultEventsPerTxCounts()
	}
	if len(c.Writers) == 0 {
		c.Writers = DefaultWriterCounts()
	}
	c.AppendDuration = cmp.Or(c.AppendDuration, DefaultAppendDuration)
	c.Backlog = cmp.Or(c.Backlog, DefaultBacklog)
	c.BatchSize = cmp.Or(c.BatchSize, projection.DefaultBatchSize)
	c.Rate = cmp.Or(c.Rate, DefaultRate)
	c.LatencyDuration = cmp.Or(c.LatencyDuration, DefaultLatencyDuration)
	c.RebuildEvents = cmp.Or(c.RebuildEvents, DefaultRebuildEvents)
	c.TracingPairs = cmp.Or(c.TracingPairs, TracingCatchUpPairs)
	if c.Progress == nil {
		c.Progress = func(string) {}
	}
	return c
}

func (c Config) appendConfig(n, writers int) AppendConfig {
	return AppendConfig{EventsPerTx: n, Writers: writers, Duration: c.AppendDuration}
}

func (c Config) catchUpConfig() CatchUpConfig {
	return CatchUpConfig{Events: c.Backlog, BatchSize: c.BatchSize}
}

func (c Config) rebuildConfig() RebuildConfig {
	return RebuildConfig{Events: c.RebuildEvents, BatchSize: c.BatchSize, RebuildBatchSize: c.RebuildBatchSize}
}

func (c Config) latencyConfig() LatencyConfig {
	return LatencyConfig{Rate: c.Rate, Duration: c.LatencyDuration}
}

// Validate reports a size out of range, before anything connects. Zero
// fields are valid: they mean the default.
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	for _, n := range c.EventsPerTx {
		for _, w := range c.Writers {
			errs = append(errs, c.appendConfig(n, w).validate())
		}
	}
	errs = append(errs, c.catchUpConfig().withDefaults().validate(), c.latencyConfig().validate(),
		c.rebuildConfig().withDefaults().validate(), within("tracing pairs", c.TracingPairs, 1, maxTracingPairs))
	if c.TracingPairs%2 == 0 {
		errs = append(errs, fmt.Errorf("tracing pairs %d: want an odd count, so the median is one pair's ratio", c.TracingPairs))
	}
	return errors.Join(errs...)
}

// Report is what a [Run] measured.
type Report struct {
	// Schema is the throwaway schema the run worked in, dropped since.
	Schema string
	// ServerVersion is PostgreSQL's server_version, for reproducing figures.
	ServerVersion string
	// Config is the run's configuration with defaults filled in.
	Config  Config
	Append  []AppendResult
	CatchUp []CatchUpResult
	Latency LatencyResult
	Rebuild RebuildResult
	// Tracing is empty unless Config.Tracing.
	Tracing []TracingResult
}

// Run measures everything, in a schema of its own made with [NewSchema]
// and dropped afterwards whether the run succeeded, failed or was
// cancelled: append throughput for each size, catch-up for each [Form],
// then latency, then a blue/green rebuild beside the live catch-up of the
// same projection (in a second schema of its own, also dropped), then,
// with cfg.Tracing, the tracing figures (in a third).
func Run(ctx context.Context, pool *pgxpool.Pool, cfg Config) (rep Report, err error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return rep, err
	}
	rep.Config = cfg
	if err := pool.QueryRow(ctx, `SHOW server_version`).Scan(&rep.ServerVersion); err != nil {
		return rep, fmt.Errorf("read server version: %w", err)
	}
	store, err := NewSchema(ctx, pool)
	if err != nil {
		return rep, err
	}
	rep.Schema = store.Schema()
	defer func() { err = errors.Join(err, DropSchema(ctx, store)) }()
	cfg.Progress(fmt.Sprintf("working in schema %s (dropped at the end)", rep.Schema))

	for _, n := range cfg.EventsPerTx {
		for _, w := range cfg.Writers {
			cfg.Progress(fmt.Sprintf("append: %d event%s per transaction, %d writer%s, %v", n, plural(n), w, plural(w), cfg.AppendDuration))
			r, err := MeasureAppend(ctx, store, cfg.appendConfig(n, w))
			if err != nil {
				return rep, err
			}
			rep.Append = append(rep.Append, r)
		}
	}
	cfg.Progress(fmt.Sprintf("catch-up: backlog of %d events, batches of %d, per-event and batch handlers", cfg.Backlog, cfg.BatchSize))
	if rep.CatchUp, err = MeasureCatchUp(ctx, store, cfg.catchUpConfig()); err != nil {
		return rep, err
	}
	cfg.Progress(fmt.Sprintf("latency: %d events/s for %v per side", cfg.Rate, cfg.LatencyDuration))
	if rep.Latency, err = MeasureLatency(ctx, store, cfg.latencyConfig()); err != nil {
		return rep, err
	}
	// The rebuild replays a log of its own, in a schema of its own: the
	// catch-up backlog is another size, and a rebuild reads the whole log.
	rstore, err := NewSchema(ctx, pool)
	if err != nil {
		return rep, err
	}
	defer func() { err = errors.Join(err, DropSchema(ctx, rstore)) }()
	cfg.Progress(fmt.Sprintf("rebuild: log of %d events in schema %s; raw loop, live catch-up, then a blue/green rebuild of the same projection",
		cfg.RebuildEvents, rstore.Schema()))
	if rep.Rebuild, err = MeasureRebuild(ctx, rstore, cfg.rebuildConfig()); err != nil {
		return rep, err
	}
	if cfg.Tracing {
		// Assigned, not declared: the deferred drop must join its error
		// into the named result (a := here shadowed it, and a failed drop
		// of the tracing schema went unreported).
		var tstore *postgres.Store
		if tstore, err = NewSchema(ctx, pool); err != nil {
			return rep, err
		}
		defer func() { err = errors.Join(err, DropSchema(ctx, tstore)) }()
		cfg.Progress(fmt.Sprintf("tracing: in schema %s (dropped at the end)", tstore.Schema()))
		if rep.Tracing, err = MeasureTracing(ctx, tstore, cfg); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// Figure is one line of the report: Projector beside its baseline.
type Figure struct {
	// Name says what was measured ("append, 1 event/tx, 4 writers").
	Name string
	// Unit is "events/s" or "ms".
	Unit string
	// Projector and Raw are the two sides' values in Unit.
	Projector, Raw float64
	// RawDecoding is the second baseline of the catch-up figures, zero on
	// the others: the raw loop that reads the columns a handler uses and
	// decodes payloads as the form does (see [CatchUpResult].Decoding).
	// Raw is the floor, this the fair comparison; both are printed so the
	// cost of what a handler asks for is told apart from Projector's.
	RawDecoding float64
	// LowerIsBetter is set for latencies.
	LowerIsBetter bool
	// PeakHeapMiB is the dispatcher's peak Go heap, catch-up and rebuild
	// figures only.
	PeakHeapMiB float64
	// Baseline names what Raw is, for the ratio's label: "raw" (the same
	// work in plain SQL) unless set; "floor" for the outbox floor.
	Baseline string
	// PairRatios is set on the tracing figures: each pair's Projector
	// rate over its baseline's, the two measured back to back. Ratio is
	// then their median, not the ratio of the totals.
	PairRatios []float64
}

// Ratio returns Projector's value over the baseline's: the fraction of raw
// throughput, or how many times the raw latency; the median of
// PairRatios when there are any. Zero when the baseline is zero.
func (f Figure) Ratio() float64 {
	if len(f.PairRatios) > 0 {
		return median(f.PairRatios)
	}
	if f.Raw == 0 {
		return 0
	}
	return f.Projector / f.Raw
}

// RatioSpread returns the lowest and the highest of PairRatios, or Ratio
// twice when there are none.
func (f Figure) RatioSpread() (lo, hi float64) {
	if len(f.PairRatios) == 0 {
		return f.Ratio(), f.Ratio()
	}
	return slices.Min(f.PairRatios), slices.Max(f.PairRatios)
}

// DecodingRatio returns Projector's value over the decoding baseline's,
// zero when there is none.
func (f Figure) DecodingRatio() float64 {
	if f.RawDecoding == 0 {
		return 0
	}
	return f.Projector / f.RawDecoding
}

// Figures flattens the report into its lines, in the order measured.
func (r Report) Figures() []Figure {
	var out []Figure
	for _, a := range r.Append {
		out = append(out, Figure{
			Name: fmt.Sprintf("append, %d event%s/tx, %d writer%s", a.EventsPerTx, plural(a.EventsPerTx), a.Writers, plural(a.Writers)),
			Unit: "events/s", Projector: a.ProjectorRate(), Raw: a.RawRate(),
		}, Figure{
			Name: fmt.Sprintf("append vs outbox floor, %d event%s/tx, %d writer%s", a.EventsPerTx, plural(a.EventsPerTx), a.Writers, plural(a.Writers)),
			Unit: "events/s", Projector: a.ProjectorRate(), Raw: a.FloorRate(), Baseline: "floor",
		})
	}
	for _, c := range r.CatchUp {
		name := "catch-up, per-event handler"
		switch c.Form {
		case Pipelined:
			name = "catch-up, per-event handler, queued writes"
		case Batched:
			name = "catch-up, batch handler (unnest)"
		case BatchedRawPayloads:
			name = "catch-up, batch handler, raw payloads"
		}
		out = append(out, Figure{
			Name: name, Unit: "events/s", Projector: c.ProjectorRate(), Raw: c.RawRate(), RawDecoding: c.Decoding.RawRate(),
			PeakHeapMiB: float64(c.PeakHeap) / (1 << 20),
		})
	}
	l := r.Latency
	out = append(out,
		Figure{Name: fmt.Sprintf("latency p50 at %d events/s", l.Rate), Unit: "ms", Projector: ms(l.Projector.P50), Raw: ms(l.Raw.P50), LowerIsBetter: true},
		Figure{Name: fmt.Sprintf("latency p99 at %d events/s", l.Rate), Unit: "ms", Projector: ms(l.Projector.P99), Raw: ms(l.Raw.P99), LowerIsBetter: true},
		Figure{Name: fmt.Sprintf("latency p50 at %d events/s, polled", l.Rate), Unit: "ms", Projector: ms(l.Polled.P50), Raw: ms(l.Raw.P50), LowerIsBetter: true},
		Figure{Name: fmt.Sprintf("latency p99 at %d events/s, polled", l.Rate), Unit: "ms", Projector: ms(l.Polled.P99), Raw: ms(l.Raw.P99), LowerIsBetter: true},
	)
	if b := r.Rebuild; b.Events > 0 {
		out = append(out,
			Figure{Name: fmt.Sprintf("rebuild log, live catch-up (batches of %d)", b.BatchSize), Unit: "events/s",
				Projector: b.LiveRate(), Raw: b.RawRate(), PeakHeapMiB: float64(b.LivePeakHeap) / (1 << 20)},
			Figure{Name: fmt.Sprintf("rebuild log, blue/green rebuild (batches of %d)", b.RebuildBatchSize), Unit: "events/s",
				Projector: b.RebuildRate(), Raw: b.RawRate(), PeakHeapMiB: float64(b.RebuildPeakHeap) / (1 << 20)},
		)
	}
	for _, t := range r.Tracing {
		out = append(out, t.Figure())
	}
	return out
}

// within reports a size outside lo..hi; the Config validations are lists
// of these.
func within(what string, v, lo, hi int) error {
	if v < lo || v > hi {
		return fmt.Errorf("%s %d outside %d..%d", what, v, lo, hi)
	}
	return nil
}

func notNegative(what string, d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("negative %s %v", what, d)
	}
	return nil
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
