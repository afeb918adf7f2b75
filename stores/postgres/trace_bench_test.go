package postgres_test

import (
	"context"
	"fmt"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/projectorhq/projector/internal/benchmark"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/stores/postgres"
)

// BenchmarkAppendTracing is BenchmarkAppendNoFlush (synchronous_commit
// off, beside the same-run raw baseline) with tracing off, with a span in
// the context from the no-op provider (the API's global default, no SDK),
// with a span in the context that the SDK samples out, and with every
// append sampled (spans recorded by the SDK, exported nowhere): what
// tracing adds to an append. Compare the %-of-raw figures of one run.
func BenchmarkAppendTracing(b *testing.B) {
	modes := []struct {
		name    string
		noop    bool             // a span of the global no-op provider in the context
		sampler sdktrace.Sampler // nil and !noop: no span in the context at all
	}{
		{"off", false, nil},
		{"no-op", true, nil},
		{"sampled-out", false, sdktrace.NeverSample()},
		{"sampled", false, sdktrace.AlwaysSample()},
	}
	for _, n := range []int{1, 100} {
		for _, m := range modes {
			b.Run(fmt.Sprintf("events=%d/tracing=%s", n, m.name), func(b *testing.B) {
				ctx := context.Background()
				cfg := postgres.Config{Schema: pgtest.Schema(b), Registry: benchmark.NewRegistry()}
				switch {
				case m.noop:
					ctx, _ = otel.Tracer("bench").Start(ctx, "request")
				case m.sampler != nil:
					tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(m.sampler))
					b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
					cfg.TracerProvider = tp
					ctx, _ = tp.Tracer("bench").Start(ctx, "request")
				}
				pc := pgtest.PoolConfig(b)
				pc.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
				store, err := postgres.New(ctx, pgtest.PoolFromConfig(b, pc), cfg)
				if err != nil {
					b.Fatal(err)
				}
				benchAppendCtx(b, ctx, store, n)
			})
		}
	}
}
