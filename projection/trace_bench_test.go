package projection_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/projectorhq/projector/internal/benchmark"
	"github.com/projectorhq/projector/internal/pgtest"
)

// BenchmarkCatchUpTracing measures catching up a backlog in batches of 500
// with the batch form, each round beside the raw loop of the same round
// (%-of-raw), with tracing off (the no-op provider), with the library's
// default (the API's global provider, no SDK installed), with an SDK that
// records nothing (a never-sampling sampler), and with every batch
// sampled. For the sampled mode every event carries a traceparent, as a
// traced application's would, so each batch span links 128 producers and
// counts the rest: that is the cost being measured. Spans are recorded,
// exported nowhere.
//
//	go test -run '^$' -bench BenchmarkCatchUpTracing -benchtime 3x ./projection
func BenchmarkCatchUpTracing(b *testing.B) {
	n := benchEvents()
	ctx := context.Background()
	store := pgtest.Store(b, benchmark.NewRegistry())
	modes := []struct {
		name   string
		tp     trace.TracerProvider // nil: the global one
		traced bool                 // the backlog carries traceparents
	}{
		{"off", noop.NewTracerProvider(), false},
		{"global-no-op", nil, false},
		{"never-sampled", sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample())), false},
		{"never-sampled-traced-events", sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample())), true},
		{"sampled", sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample())), true},
	}
	var c *benchmark.CatchUp
	traced := false
	for _, m := range modes {
		if sdk, ok := m.tp.(*sdktrace.TracerProvider); ok {
			b.Cleanup(func() { _ = sdk.Shutdown(context.Background()) })
		}
		cfg := benchmark.CatchUpConfig{Events: n, BatchSize: 500, TracerProvider: m.tp}
		if c == nil {
			var err error
			if c, err = benchmark.NewCatchUp(ctx, store, cfg); err != nil {
				b.Fatal(err)
			}
		} else {
			c = c.WithTracerProvider(m.tp)
		}
		if m.traced && !traced {
			// What a traced application's events carry: a distinct
			// sampled traceparent each.
			if _, err := store.Pool().Exec(ctx, `UPDATE `+store.Table("projector_events")+
				` SET headers = jsonb_build_object('traceparent', '00-' || md5(id::text) || '-' || left(md5(id::text || 's'), 16) || '-01')`); err != nil {
				b.Fatal(err)
			}
			traced = true
		}
		b.Run(fmt.Sprintf("events=%d/batch=500/tracing=%s", n, m.name), func(b *testing.B) {
			var t benchmark.Throughput
			for b.Loop() {
				r, err := c.Measure(ctx, benchmark.Batched)
				if err != nil {
					b.Fatal(err)
				}
				t.Add(r.Throughput)
			}
			t.Report(b)
		})
	}
}

// BenchmarkCatchUpTracingCPU is the dispatcher's side of
// BenchmarkCatchUpTracing alone: each op one catch-up of the backlog
// (PROJECTOR_BENCH_EVENTS, batches of 500, the batch form) by the
// dispatcher, no raw loop, reporting the wall time and this process's CPU
// time per event (ns/event, cpu-ns/event) and the allocations per
// catch-up, for the tracing modes whose cost the issue bounds at 0.97×.
// The backlog carries a sampled traceparent per event when traced-events
// is true (a traced producer's events reaching a consumer that records
// nothing). Its instruction count under callgrind is not stable (the
// dispatcher's other goroutines run while a pass waits for PostgreSQL, more
// or less of them with the load), so the tracing work is counted apart, in
// BenchmarkBatchTracingWork (docs/performance.md, "What tracing costs the
// Go side").
func BenchmarkCatchUpTracingCPU(b *testing.B) {
	n := benchEvents()
	ctx := context.Background()
	store := pgtest.Store(b, benchmark.NewRegistry())
	c, err := benchmark.NewCatchUp(ctx, store, benchmark.CatchUpConfig{Events: n, BatchSize: 500, TracerProvider: noop.NewTracerProvider()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close(context.Background()) })
	traced := false
	for _, tracedEvents := range []bool{false, true} {
		if tracedEvents && !traced {
			if _, err := store.Pool().Exec(ctx, `UPDATE `+store.Table("projector_events")+
				` SET headers = jsonb_build_object('traceparent', '00-' || md5(id::text) || '-' || left(md5(id::text || 's'), 16) || '-01')`); err != nil {
				b.Fatal(err)
			}
			traced = true
		}
		for _, m := range []struct {
			name string
			tp   trace.TracerProvider
		}{
			{"off", noop.NewTracerProvider()},
			{"global-no-op", nil},
			{"sampled-out", sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))},
		} {
			b.Run(fmt.Sprintf("traced-events=%t/tracing=%s", tracedEvents, m.name), func(b *testing.B) {
				c := c.WithTracerProvider(m.tp)
				b.ReportAllocs()
				var wall time.Duration
				c0 := cpuTime(b)
				for b.Loop() {
					took, err := c.Dispatch(ctx, benchmark.Batched)
					if err != nil {
						b.Fatal(err)
					}
					wall += took
				}
				events := float64(b.N * n)
				b.ReportMetric(float64(wall.Nanoseconds())/events, "ns/event")
				b.ReportMetric(float64((cpuTime(b)-c0).Nanoseconds())/events, "cpu-ns/event")
			})
		}
	}
}
