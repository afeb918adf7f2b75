package benchmark

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/projectorhq/projector/stores/postgres"
)

// TracingMode is what the traced side of a tracing figure runs.
type TracingMode string

// The tracing modes, each measured in pairs with the untraced side.
const (
	// TracingNoop is the no-op provider an application has when it uses
	// the OpenTelemetry API and installs no SDK: the global default,
	// which the library takes when given none, with each append under an
	// application span of the same provider.
	TracingNoop TracingMode = "no-op"
	// TracingSampledOut is the SDK with a sampler that samples nothing
	// (batch span processor, an exporter that discards): every span is
	// started and none recorded.
	TracingSampledOut TracingMode = "sampled-out"
	// TracingSampled is the SDK sampling and recording every span.
	TracingSampled TracingMode = "on"
)

// TracingResult is one figure of the tracing mode: the same work with
// tracing off and traced as Mode says, measured in interleaved pairs in
// the same run.
type TracingResult struct {
	// Name says what was measured ("append, 1 event/tx, 1 writer").
	Name string
	// Mode is what the traced side ran.
	Mode TracingMode
	// Throughput's raw side is the work untraced (no span anywhere, an
	// explicit no-op provider), its Projector side the same work traced
	// as Mode says, each added up over the pairs.
	Throughput
	// Pairs holds, in the order they ran, each pair's traced rate over
	// its untraced rate: the two halves of a pair run back to back
	// (untraced first in even pairs, traced first in odd ones), so a
	// load spike moves both halves of the pair it hits and one pair's
	// ratio out of many. The figure is their median ([TracingResult.Median]).
	Pairs []float64
	// Spans counts the spans the traced side ended: proof it traced, and
	// zero unless Mode is [TracingSampled].
	Spans int64
}

// Median returns the median of the per-pair ratios (0.98 is 98 % of
// untraced), or the ratio of the totals when there are no pairs.
func (r TracingResult) Median() float64 {
	if len(r.Pairs) == 0 {
		return r.Ratio()
	}
	return median(r.Pairs)
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Figure returns r as a line of the report: the rates are the totals of
// the pairs, the ratio the median of the pairs'.
func (r TracingResult) Figure() Figure {
	return Figure{Name: "tracing " + string(r.Mode) + ", " + r.Name, Unit: "events/s",
		Projector: r.ProjectorRate(), Raw: r.RawRate(), Baseline: "untraced", PairRatios: slices.Clone(r.Pairs)}
}

// TracingCatchUpPairs is how many untraced/traced pairs of catch-ups each
// traced mode runs by default ([Config].TracingPairs): odd, so the median
// is one pair's ratio.
const TracingCatchUpPairs = 7

// maxTracingPairs bounds [Config].TracingPairs: each pair is two whole
// catch-ups of the backlog per traced mode.
const maxTracingPairs = 99

// tracingSlice is the shortest half of a pair of appends: short, so a
// stall of the database longer than a pair hits both its halves alike
// rather than one, and a run holds many pairs.
const tracingSlice = 50 * time.Millisecond

// minAppendPairs is the fewest pairs of append slices a traced mode runs,
// however short the append duration.
const minAppendPairs = 3

// discardExporter is a span exporter that counts what it is given and
// sends it nowhere: the SDK does all its work (sampling, recording,
// batching), the network none.
type discardExporter struct{ spans atomic.Int64 }

func (e *discardExporter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.spans.Add(int64(len(spans)))
	return nil
}

func (e *discardExporter) Shutdown(context.Context) error { return nil }

var _ sdktrace.SpanExporter = (*discardExporter)(nil)

// tracingSide is one side of the tracing figures: the provider the store
// and the dispatcher are given, and the application's.
type tracingSide struct {
	mode TracingMode // "" for the untraced side
	// tp goes into the configs; nil leaves the library's default (the
	// global provider).
	tp trace.TracerProvider
	// request starts the application span each append runs under; nil
	// for none.
	request trace.Tracer
	// sdk and exp are set on the SDK sides, to flush and count.
	sdk *sdktrace.TracerProvider
	exp *discardExporter
}

// newSDKSide is an SDK provider with sampler, exporting through a batch
// processor to an exporter that discards: what an application with
// tracing on runs, minus the collector.
func newSDKSide(mode TracingMode, sampler sdktrace.Sampler) tracingSide {
	exp := &discardExporter{}
	sdk := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler), sdktrace.WithBatcher(exp))
	return tracingSide{mode: mode, tp: sdk, request: sdk.Tracer(requestScope), sdk: sdk, exp: exp}
}

// requestScope names the tracer of the application spans.
const requestScope = "projector-bench"

// spans flushes the side's spans and returns how many it ended since the
// last call; zero for a side without an SDK.
func (s tracingSide) spans(ctx context.Context) (int64, error) {
	if s.sdk == nil {
		return 0, nil
	}
	err := s.sdk.ForceFlush(ctx)
	return s.exp.spans.Swap(0), err
}

// runPairs measures one work untraced beside each traced side (sides[0]
// is the untraced one) in pairs: round after round, each traced side in
// turn runs a pair, the untraced work and the traced back to back,
// untraced first in even rounds and traced first in odd ones so neither
// always runs warm; the traced sides take turns at going first in a
// round. run measures side i once. One result per traced side.
func runPairs(ctx context.Context, name string, sides []tracingSide, pairs int,
	run func(ctx context.Context, i int) (events int64, took time.Duration, err error)) ([]TracingResult, error) {
	res := make([]TracingResult, len(sides)-1)
	for i := range res {
		res[i] = TracingResult{Name: name, Mode: sides[i+1].mode}
	}
	for p := range pairs {
		for k := range res {
			i := (k + p) % len(res) // the modes take turns at going first in a round
			order := []int{0, i + 1}
			if p%2 == 1 {
				order = []int{i + 1, 0}
			}
			var pair Throughput
			for _, side := range order {
				events, took, err := run(ctx, side)
				if err != nil {
					return nil, fmt.Errorf("tracing %s: %w", cmp.Or(sides[side].mode, "off"), err)
				}
				if side == 0 {
					pair.RawEvents, pair.RawTime = events, took
				} else {
					pair.ProjectorEvents, pair.ProjectorTime = events, took
				}
			}
			res[i].Add(pair)
			res[i].Pairs = append(res[i].Pairs, pair.Ratio())
		}
	}
	for i := range res {
		var err error
		if res[i].Spans, err = sides[i+1].spans(ctx); err != nil {
			return res, err
		}
	}
	return res, nil
}

// MeasureTracing measures what tracing costs, each work with tracing off
// beside the same work with the no-op provider ([TracingNoop]), with an
// SDK that samples nothing ([TracingSampledOut]) and with every span
// sampled and recorded ([TracingSampled]: an SDK provider, a batch span
// processor, an exporter that discards), each traced side in pairs with
// the untraced ([runPairs]; the figure is the pairs' median): appends
// of each of cfg.EventsPerTx events by one writer, each transaction of a
// traced side under an application span as a request's would be, and a
// catch-up of cfg.Backlog events in batches of cfg.BatchSize with the
// batch form (cfg.TracingPairs pairs), every event carrying a sampled traceparent (one link per
// event to a sampled batch span, up to the cap). store's schema must be
// fresh (the catch-up's backlog goes into it).
func MeasureTracing(ctx context.Context, store *postgres.Store, cfg Config) (res []TracingResult, err error) {
	cfg = cfg.WithDefaults()
	sides := []tracingSide{
		{tp: noop.NewTracerProvider()},
		{mode: TracingNoop, request: otel.Tracer(requestScope)},
		newSDKSide(TracingSampledOut, sdktrace.NeverSample()),
		newSDKSide(TracingSampled, sdktrace.AlwaysSample()),
	}
	defer func() {
		for _, s := range sides {
			if s.sdk != nil {
				err = errors.Join(err, s.sdk.Shutdown(context.WithoutCancel(ctx)))
			}
		}
	}()

	for _, n := range cfg.EventsPerTx {
		cfg.Progress(fmt.Sprintf("tracing: append, %d event%s per transaction, 1 writer, off, no-op, sampled out and on, %v", n, plural(n), cfg.AppendDuration))
		r, err := measureAppendTracing(ctx, store, cfg.appendConfig(n, 1), sides)
		if err != nil {
			return res, err
		}
		res = append(res, r...)
	}

	cfg.Progress(fmt.Sprintf("tracing: catch-up of %d events, batches of %d, off, no-op, sampled out and on", cfg.Backlog, cfg.BatchSize))
	c, err := NewCatchUp(ctx, store, cfg.catchUpConfig())
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, c.Close(ctx)) }()
	// What a traced application's events carry: a sampled traceparent
	// each, so every sampled batch span links its producers.
	if _, err := store.Pool().Exec(ctx, `UPDATE `+store.Table("projector_events")+
		` SET headers = jsonb_build_object('traceparent', '00-' || md5(id::text) || '-' || left(md5(id::text || 's'), 16) || '-01')`); err != nil {
		return res, fmt.Errorf("tracing: traceparents for the backlog: %w", err)
	}
	r, err := runPairs(ctx, fmt.Sprintf("catch-up, batch handler, batches of %d", cfg.BatchSize), sides, cfg.TracingPairs,
		func(ctx context.Context, i int) (int64, time.Duration, error) {
			took, err := c.WithTracerProvider(sides[i].tp).timeDispatcher(ctx, Batched)
			return int64(cfg.Backlog), took, err
		})
	return append(res, r...), err
}

// measureAppendTracing runs one writer's appends in slices, in pairs
// ([runPairs]), each side through a store of its own given the side's
// provider; the
// untraced side with no span in its context, the others with each
// transaction under an application span of the side's.
func measureAppendTracing(ctx context.Context, store *postgres.Store, cfg AppendConfig, sides []tracingSide) ([]TracingResult, error) {
	name := fmt.Sprintf("append, %d event%s/tx, 1 writer", cfg.EventsPerTx, plural(cfg.EventsPerTx))
	writers := make([]*AppendWriter, len(sides))
	var a *Appender
	for i, s := range sides {
		st, err := postgres.New(ctx, store.Pool(), postgres.Config{Schema: store.Schema(), Registry: store.Registry(), Logger: quiet,
			TracerProvider: s.tp})
		if err != nil {
			return nil, err
		}
		if a == nil {
			if a, err = NewAppender(ctx, st, cfg.EventsPerTx); err != nil {
				return nil, err
			}
			defer func() { _ = a.Close(ctx) }()
			writers[i] = a.Writer(0)
			continue
		}
		writers[i] = a.withStore(st, fmt.Sprintf("t%d", i)).Writer(0)
	}
	// Each traced side's pairs take 2/len(sides)-1 of the duration, in
	// slices of at least tracingSlice.
	pairs := max(minAppendPairs, int(cfg.Duration/(time.Duration(2*(len(sides)-1))*tracingSlice)))
	slice := max(tracingSlice, cfg.Duration/time.Duration(2*(len(sides)-1)*pairs))
	return runPairs(ctx, name, sides, pairs, func(ctx context.Context, i int) (int64, time.Duration, error) {
		op := (*AppendWriter).Projector
		if s := sides[i]; s.request != nil {
			op = func(w *AppendWriter, ctx context.Context) error {
				ctx, span := s.request.Start(ctx, "request")
				defer span.End()
				return w.Projector(ctx)
			}
		}
		runtime.GC()
		ops, took, err := appendPhase(ctx, writers[i:i+1], op, slice)
		if err != nil {
			return 0, 0, fmt.Errorf("append: %w", err)
		}
		return ops * int64(cfg.EventsPerTx), took, nil
	})
}

// withStore returns a copy of a appending through store, its streams named
// apart by suffix; the baseline tables stay a's.
func (a *Appender) withStore(store *postgres.Store, suffix string) *Appender {
	cp := *a
	cp.store, cp.prefix = store, a.prefix+suffix
	return &cp
}
