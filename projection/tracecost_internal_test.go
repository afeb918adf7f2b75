package projection

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/tracing"
)

// tracingBatch returns n events as a batch read hands them to a pass, each
// carrying a distinct sampled traceparent when traced.
func tracingBatch(n int, traced bool) []projector.Event {
	events := make([]projector.Event, n)
	for i := range events {
		events[i] = projector.Event{ID: uuid.New(), Type: "TicketOpened", Stream: projector.Stream("ticket", fmt.Sprint(i)),
			Version: 1, Position: projector.Position{TxID: 1000, Seq: int64(i + 1)}, RecordedAt: time.Now()}
		if traced {
			events[i].Metadata.Headers = map[string]string{tracing.HeaderTraceParent: fmt.Sprintf("00-%032x-%016x-01", i+1, i+1)}
		}
	}
	return events
}

// BenchmarkBatchTracingWork is the Go-side work tracing adds to one
// dispatcher batch of 500 events, without the database: the batch span's
// start and end, and per event what a pass does for tracing around each
// handler call (the per-event span check and the handler context under
// the batch span). ns/op and allocs/op are per batch.
func BenchmarkBatchTracingWork(b *testing.B) {
	for _, traced := range []bool{false, true} {
		events := tracingBatch(500, traced)
		for _, m := range []struct {
			name string
			tp   trace.TracerProvider
		}{
			{"off", noop.NewTracerProvider()},
			{"global-no-op", nil},
			{"sampled-out", sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))},
			{"sampled", sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))},
		} {
			b.Run(fmt.Sprintf("traced-events=%t/tracing=%s", traced, m.name), func(b *testing.B) {
				d := &Dispatcher{tracer: tracing.Tracer(m.tp)}
				sh := &shard{id: ShardID{Consumer: "bench", Instance: SharedInstance}}
				ctx := context.Background()
				b.ReportAllocs()
				for b.Loop() {
					spanCtx, span := d.startBatchSpan(ctx, sh, 0, events, false)
					for i := range events { // as run.applyUntil does around each handler
						var es trace.Span
						if d.cfg.EventSpans {
							_, es = d.startEventSpan(spanCtx, sh, &events[i])
						}
						endEventSpan(es, nil)
					}
					span.End()
				}
			})
		}
	}
}

// BenchmarkApplyDelayObserve is the apply-delay histogram's observation of
// a batch of 500 events, whose exemplar check parses each traced event's
// traceparent: work every consumer does on traced events, whatever its
// own provider.
func BenchmarkApplyDelayObserve(b *testing.B) {
	for _, traced := range []bool{false, true} {
		b.Run(fmt.Sprintf("traced-events=%t", traced), func(b *testing.B) {
			m, err := newMetrics(prometheus.NewRegistry())
			if err != nil {
				b.Fatal(err)
			}
			events := tracingBatch(500, traced)
			id := ShardID{Consumer: "bench", Instance: SharedInstance}
			now := time.Now()
			b.ReportAllocs()
			for b.Loop() {
				m.applied(id, events, now)
			}
		})
	}
}

// With tracing off or a provider that records nothing, a batch's tracing
// work is the span's start and end, allocation-free beyond what the
// provider does for the handlers' context (one context and, for an SDK or
// the global delegate, the non-recording span): no span name or option
// per batch, nothing per event.
func TestBatchTracingWork_Allocations(t *testing.T) {
	// Not parallel: testing.AllocsPerRun refuses to run in a parallel test.
	events := tracingBatch(500, true)
	for _, m := range []struct {
		name string
		tp   trace.TracerProvider
		max  float64
	}{
		{"off", noop.NewTracerProvider(), 1},
		{"sampled-out", sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample())), 2},
	} {
		d := &Dispatcher{tracer: tracing.Tracer(m.tp)}
		sh := &shard{id: ShardID{Consumer: "bench", Instance: SharedInstance}}
		got := testing.AllocsPerRun(100, func() {
			spanCtx, span := d.startBatchSpan(context.Background(), sh, 0, events, false)
			for i := range events {
				var es trace.Span
				if d.cfg.EventSpans {
					_, es = d.startEventSpan(spanCtx, sh, &events[i])
				}
				endEventSpan(es, nil)
			}
			span.End()
		})
		if got > m.max {
			t.Errorf("%s: a batch of %d events allocates %v times for tracing, want at most %v", m.name, len(events), got, m.max)
		}
	}
}

// The apply-delay histogram keeps one exemplar per bucket, the latest:
// observing a batch of traced events parses only the traceparents whose
// trace id could become a bucket's exemplar, not one per event.
func TestApplyDelayObserve_Allocations(t *testing.T) {
	// Not parallel: testing.AllocsPerRun refuses to run in a parallel test.
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	events := tracingBatch(500, true)
	id := ShardID{Consumer: "bench", Instance: SharedInstance}
	now := time.Now()
	got := testing.AllocsPerRun(20, func() { m.applied(id, events, now) })
	// The labels lookup, and per bucket that gets an exemplar its parse,
	// labels and exemplar.
	if limit := float64(2 + 12*len(applyDelayBuckets)); got > limit {
		t.Errorf("observing %d traced events allocates %v times, want at most %v", len(events), got, limit)
	}
}

// Observing a batch gives the histogram what one ObserveWithExemplar per
// sampled event would: every event counted in its bucket, and each
// bucket's exemplar the trace id of the last sampled event in it; events
// without a traceparent, unsampled or malformed ones give none.
func TestApplyDelayObserve_LastSampledPerBucket(t *testing.T) {
	t.Parallel()
	now := time.Now()
	type ev struct {
		delay time.Duration
		tp    string
	}
	tp := func(i int, flags string) string { return fmt.Sprintf("00-%032x-%016x-%s", i, i, flags) }
	in := []ev{
		{500 * time.Microsecond, tp(1, "01")},  // bucket 0
		{500 * time.Microsecond, tp(2, "01")},  // bucket 0: the exemplar
		{500 * time.Microsecond, tp(3, "00")},  // bucket 0, unsampled
		{500 * time.Microsecond, ""},           // bucket 0, untraced
		{3 * time.Millisecond, tp(4, "01")},    // bucket 1: the exemplar
		{3 * time.Millisecond, "00-zz-bad-01"}, // bucket 1, malformed
		{20 * time.Millisecond, tp(5, "00")},   // bucket 3: none sampled
		{time.Hour, tp(6, "01")},               // +Inf
	}
	events := make([]projector.Event, len(in))
	for i, e := range in {
		events[i] = projector.Event{ID: uuid.New(), RecordedAt: now.Add(-e.delay)}
		if e.tp != "" {
			events[i].Metadata.Headers = map[string]string{tracing.HeaderTraceParent: e.tp}
		}
	}
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.applied(ShardID{Consumer: "c", Instance: SharedInstance}, events, now)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[float64]string{ // upper bound → exemplar trace id
		applyDelayBuckets[0]: fmt.Sprintf("%032x", 2),
		applyDelayBuckets[1]: fmt.Sprintf("%032x", 4),
		math.Inf(1):          fmt.Sprintf("%032x", 6),
	}
	found := false
	for _, f := range families {
		if f.GetName() != "projector_event_apply_delay_seconds" {
			continue
		}
		found = true
		h := f.GetMetric()[0].GetHistogram()
		if h.GetSampleCount() != uint64(len(events)) {
			t.Errorf("count %d, want %d", h.GetSampleCount(), len(events))
		}
		got := map[float64]string{}
		for _, b := range h.GetBucket() {
			if ex := b.GetExemplar(); ex != nil {
				got[b.GetUpperBound()] = ex.GetLabel()[0].GetValue()
			}
		}
		for bound, id := range want {
			if got[bound] != id {
				t.Errorf("bucket ≤ %v: exemplar %q, want %q", bound, got[bound], id)
			}
		}
		for bound := range got {
			if _, ok := want[bound]; !ok {
				t.Errorf("bucket ≤ %v: exemplar %q, want none", bound, got[bound])
			}
		}
	}
	if !found {
		t.Fatal("no apply-delay histogram gathered")
	}
}
