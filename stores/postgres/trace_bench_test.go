package postgres_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

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
	for _, n := range []int{1, 100} {
		for _, m := range appendTracingModes {
			b.Run(fmt.Sprintf("events=%d/tracing=%s", n, m.name), func(b *testing.B) {
				ctx, store := appendTracingStore(b, m)
				benchAppendCtx(b, ctx, store, n)
			})
		}
	}
}

// BenchmarkAppendTracingCPU measures the Go side of the append, in each of
// BenchmarkAppendTracing's modes: only Projector's append (begin, a
// business row, the append, commit; synchronous_commit off), with this
// process's CPU time per event (cpu-ns/event, from getrusage: the client's
// work, which a loaded machine blurs far less than wall time) and
// allocations per append beside the wall time per event (ns/event). The
// context's span is started once, outside the loop, so what differs
// between the modes is the library's tracing work alone, not the
// application's span per request.
//
// Its instruction counts are what the loaded machine cannot blur: run one
// mode under callgrind counting only inside the appends (the whole
// process's count moves with the time spent waiting for a test-database
// slot), as docs/performance.md ("What tracing costs the Go side") does:
//
//	go test -c -o postgres.test ./stores/postgres
//	GOGC=off GOMAXPROCS=1 GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off valgrind --tool=callgrind \
//	  --collect-atstart=no --toggle-collect='*AppendWriter*Projector' ./postgres.test \
//	  -test.run '^$' -test.bench 'AppendTracingCPU/^events=1$/^tracing=off$' -test.benchtime 60x
func BenchmarkAppendTracingCPU(b *testing.B) {
	for _, n := range []int{1, 100} {
		for _, m := range appendTracingModes {
			b.Run(fmt.Sprintf("events=%d/tracing=%s", n, m.name), func(b *testing.B) {
				ctx, store := appendTracingStore(b, m)
				a, err := benchmark.NewAppender(ctx, store, n)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = a.Close(context.Background()) })
				w := a.Writer(0)
				if err := w.Projector(ctx); err != nil { // warm: the statements prepared
					b.Fatal(err)
				}
				b.ReportAllocs()
				c0, t0 := cpuTime(b), time.Now()
				for b.Loop() {
					if err := w.Projector(ctx); err != nil {
						b.Fatal(err)
					}
				}
				events := float64(b.N * n)
				b.ReportMetric(float64(time.Since(t0).Nanoseconds())/events, "ns/event")
				b.ReportMetric(float64((cpuTime(b)-c0).Nanoseconds())/events, "cpu-ns/event")
			})
		}
	}
}

// requestKey keys the value untracedRequest adds.
type requestKey struct{}

// untracedRequest is the untraced side's context: a request's, one value
// over ctx as the traced sides have their span, never context.Background
// itself, which pgx recognises and spares watching for cancellation at
// every statement. Measured from Background, the untraced side was that
// much cheaper than any traced one for a reason no application has.
func untracedRequest(ctx context.Context) context.Context {
	return context.WithValue(ctx, requestKey{}, "request")
}

// cpuTime is this process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// appendTracingMode is one of the append tracing benchmarks' modes.
type appendTracingMode struct {
	name    string
	noop    bool             // a span of the global no-op provider in the context
	sampler sdktrace.Sampler // nil and !noop: no span in the context at all
}

// appendTracingModes are the modes BenchmarkAppendTracing and
// BenchmarkAppendTracingCPU compare.
var appendTracingModes = []appendTracingMode{
	{"off", false, nil},
	{"no-op", true, nil},
	{"sampled-out", false, sdktrace.NeverSample()},
	{"sampled", false, sdktrace.AlwaysSample()},
}

// appendTracingStore returns a request context and a store (on a pool with
// synchronous_commit off) set up for mode m.
func appendTracingStore(b *testing.B, m appendTracingMode) (context.Context, *postgres.Store) {
	b.Helper()
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
	default:
		ctx = untracedRequest(ctx)
	}
	pc := pgtest.PoolConfig(b)
	pc.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	store, err := postgres.New(ctx, pgtest.PoolFromConfig(b, pc), cfg)
	if err != nil {
		b.Fatal(err)
	}
	return ctx, store
}
