package postgres_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/projectorhq/projector/internal/benchmark"
	"github.com/projectorhq/projector/internal/pgtest"
)

// BenchmarkAppend compares Projector's append with a raw INSERT of rows of
// the same shape into a table with the same columns and indexes: one
// transaction per op, 1 and 100 events per transaction. Each iteration runs
// one raw op and one Projector op back to back, so drift on a shared machine
// (disk flushes, neighbours) hits both alike; the benchmark reports both
// rates and their ratio, the figure in docs/performance.md. The work itself
// is benchmark.Appender, shared with `projector bench`.
func BenchmarkAppend(b *testing.B) {
	for _, n := range []int{1, 100} {
		b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) { benchAppend(b, n) })
	}
}

func benchAppend(b *testing.B, n int) {
	ctx := context.Background()
	a, err := benchmark.NewAppender(ctx, pgtest.Store(b, benchmark.NewRegistry()), n)
	if err != nil {
		b.Fatal(err)
	}
	w := a.Writer(0)
	var t benchmark.Throughput
	for b.Loop() {
		raw, proj, err := w.Pair(ctx)
		if err != nil {
			b.Fatal(err)
		}
		t.Add(benchmark.Throughput{RawEvents: int64(n), ProjectorEvents: int64(n), RawTime: raw, ProjectorTime: proj})
	}
	t.Report(b)
}
