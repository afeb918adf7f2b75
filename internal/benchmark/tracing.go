package benchmark

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/projectorhq/projector/stores/postgres"
)

// TracingResult is one figure of the tracing mode: the same work with
// tracing off and with every span recorded, measured in turn in the same
// run.
type TracingResult struct {
	// Name says what was measured ("append, 1 event/tx, 1 writer").
	Name string
	// Throughput's raw side is the work untraced (no span anywhere, the
	// library's no-op tracer), its Projector side the same work traced.
	Throughput
	// Spans counts the spans the traced side ended: proof it traced.
	Spans int64
}

// tracingRounds is how many times each side of a tracing figure runs, in
// turn (untraced, traced, untraced, …), so drift hits both alike.
const tracingRounds = 3

// discardExporter is a span exporter that counts what it is given and
// sends it nowhere: the SDK does all its work (sampling, recording,
// batching), the network none.
type discardExporter struct{ spans atomic.Int64 }

func (e *discardExporter) ExportSpans(_ context.Context, spans []trace.ReadOnlySpan) error {
	e.spans.Add(int64(len(spans)))
	return nil
}

func (e *discardExporter) Shutdown(context.Context) error { return nil }

// newTracedProvider is an SDK provider sampling every span, exporting
// through a batch processor to e: what an application with tracing on
// runs, minus the collector.
func newTracedProvider(e *discardExporter) *trace.TracerProvider {
	return trace.NewTracerProvider(trace.WithSampler(trace.AlwaysSample()), trace.WithBatcher(e))
}

var _ trace.SpanExporter = (*discardExporter)(nil)

// MeasureTracing measures what tracing costs, each figure its work with
// tracing off beside the same work with every span sampled and recorded
// (an SDK provider, a batch span processor, an exporter that discards):
// appends of each of cfg.EventsPerTx events by one writer, each
// transaction under an application span as a traced request's would be,
// and a catch-up of cfg.Backlog events in batches of cfg.BatchSize with
// the batch form, every event carrying a traceparent (one link per event
// to the batch span, up to the cap). store's schema must be fresh (the
// catch-up's backlog goes into it).
func MeasureTracing(ctx context.Context, store *postgres.Store, cfg Config) (res []TracingResult, err error) {
	cfg = cfg.WithDefaults()
	exp := &discardExporter{}
	tp := newTracedProvider(exp)
	defer func() { err = errors.Join(err, tp.Shutdown(context.WithoutCancel(ctx))) }()
	counted := func() (int64, error) {
		err := tp.ForceFlush(ctx)
		return exp.spans.Swap(0), err
	}

	for _, n := range cfg.EventsPerTx {
		cfg.Progress(fmt.Sprintf("tracing: append, %d event%s per transaction, 1 writer, off and on, %v", n, plural(n), cfg.AppendDuration))
		r, err := measureAppendTracing(ctx, store, cfg.appendConfig(n, 1), tp)
		if err != nil {
			return res, err
		}
		if r.Spans, err = counted(); err != nil {
			return res, err
		}
		res = append(res, r)
	}

	cfg.Progress(fmt.Sprintf("tracing: catch-up of %d events, batches of %d, off and on", cfg.Backlog, cfg.BatchSize))
	c, err := NewCatchUp(ctx, store, cfg.catchUpConfig())
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, c.Close(ctx)) }()
	// What a traced application's events carry: a sampled traceparent
	// each, so every batch span links its producers.
	if _, err := store.Pool().Exec(ctx, `UPDATE `+store.Table("projector_events")+
		` SET headers = jsonb_build_object('traceparent', '00-' || md5(id::text) || '-' || left(md5(id::text || 's'), 16) || '-01')`); err != nil {
		return res, fmt.Errorf("tracing: traceparents for the backlog: %w", err)
	}
	off, on := c.WithTracerProvider(noop.NewTracerProvider()), c.WithTracerProvider(tp)
	r := TracingResult{Name: fmt.Sprintf("catch-up, batch handler, batches of %d", cfg.BatchSize)}
	for range tracingRounds {
		for _, side := range []*CatchUp{off, on} {
			took, err := side.timeDispatcher(ctx, Batched)
			if err != nil {
				return res, fmt.Errorf("tracing: %w", err)
			}
			if side == off {
				r.RawEvents, r.RawTime = r.RawEvents+int64(cfg.Backlog), r.RawTime+took
			} else {
				r.ProjectorEvents, r.ProjectorTime = r.ProjectorEvents+int64(cfg.Backlog), r.ProjectorTime+took
			}
		}
	}
	if r.Spans, err = counted(); err != nil {
		return res, err
	}
	return append(res, r), nil
}

// measureAppendTracing runs one writer's appends in slices, untraced and
// traced in turn: the untraced side through a store with the no-op
// provider and no span in its context, the traced one through a store
// with tp, each transaction under an application span of tp's.
func measureAppendTracing(ctx context.Context, store *postgres.Store, cfg AppendConfig, tp *trace.TracerProvider) (TracingResult, error) {
	r := TracingResult{Name: fmt.Sprintf("append, %d event%s/tx, 1 writer", cfg.EventsPerTx, plural(cfg.EventsPerTx))}
	untraced, err := postgres.New(ctx, store.Pool(), postgres.Config{Schema: store.Schema(), Registry: store.Registry(), Logger: quiet,
		TracerProvider: noop.NewTracerProvider()})
	if err != nil {
		return r, err
	}
	traced, err := postgres.New(ctx, store.Pool(), postgres.Config{Schema: store.Schema(), Registry: store.Registry(), Logger: quiet,
		TracerProvider: tp})
	if err != nil {
		return r, err
	}
	a, err := NewAppender(ctx, untraced, cfg.EventsPerTx)
	if err != nil {
		return r, err
	}
	defer func() { _ = a.Close(ctx) }()
	off, on := a.Writer(0), a.withStore(traced, "t").Writer(0)
	request := tp.Tracer("projector-bench")
	tracedOp := func(w *AppendWriter, ctx context.Context) error {
		ctx, span := request.Start(ctx, "request")
		defer span.End()
		return w.Projector(ctx)
	}
	rounds := max(1, int(cfg.Duration/(2*appendSlice)))
	slice := cfg.Duration / time.Duration(2*rounds)
	for range rounds {
		runtime.GC()
		ops, took, err := appendPhase(ctx, []*AppendWriter{off}, (*AppendWriter).Projector, slice)
		if err != nil {
			return r, fmt.Errorf("tracing: untraced append: %w", err)
		}
		r.RawEvents, r.RawTime = r.RawEvents+ops*int64(cfg.EventsPerTx), r.RawTime+took
		runtime.GC()
		ops, took, err = appendPhase(ctx, []*AppendWriter{on}, tracedOp, slice)
		if err != nil {
			return r, fmt.Errorf("tracing: traced append: %w", err)
		}
		r.ProjectorEvents, r.ProjectorTime = r.ProjectorEvents+ops*int64(cfg.EventsPerTx), r.ProjectorTime+took
	}
	return r, nil
}

// withStore returns a copy of a appending through store, its streams named
// apart by suffix; the baseline tables stay a's.
func (a *Appender) withStore(store *postgres.Store, suffix string) *Appender {
	cp := *a
	cp.store, cp.prefix = store, a.prefix+suffix
	return &cp
}
