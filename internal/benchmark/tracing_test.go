package benchmark_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/projectorhq/projector/internal/benchmark"
	"github.com/projectorhq/projector/internal/pgtest"
)

// TestMeasureTracing: the tracing mode measures each append size and a
// catch-up both ways, and its traced side really traced (spans ended:
// an append span and a request span per transaction, batch spans for the
// catch-up) while the untraced side ran as many events.
func TestMeasureTracing(t *testing.T) {
	t.Parallel()
	ctx, store := setup(t)
	cfg := benchmark.Config{EventsPerTx: []int{1, 10}, AppendDuration: 400 * time.Millisecond, Backlog: 1000, BatchSize: 100}
	res, err := benchmark.MeasureTracing(ctx, store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"append, 1 event/tx, 1 writer", "append, 10 events/tx, 1 writer", "catch-up, batch handler, batches of 100"}
	if len(res) != len(want) {
		t.Fatalf("%d figures, want %d: %+v", len(res), len(want), res)
	}
	for i, r := range res {
		if r.Name != want[i] || r.RawRate() <= 0 || r.ProjectorRate() <= 0 {
			t.Errorf("figure %d: %+v, want %q with both sides measured", i, r, want[i])
		}
	}
	for i, r := range res[:2] {
		// Every traced transaction ended its request span and its append span.
		if tx := r.ProjectorEvents / int64(cfg.EventsPerTx[i]); r.Spans < 2*tx {
			t.Errorf("%s: %d spans for %d traced transactions", r.Name, r.Spans, tx)
		}
	}
	if c := res[2]; c.Spans < 3*int64(cfg.Backlog/cfg.BatchSize) || c.RawEvents != 3*int64(cfg.Backlog) {
		t.Errorf("catch-up: %d spans, %d untraced events; want a span per batch of 3 rounds of %d events", c.Spans, c.RawEvents, cfg.Backlog)
	}
}

// TestRunTracing: Config.Tracing adds the tracing figures to a run, each
// beside its untraced baseline, and drops their schema too.
func TestRunTracing(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	cfg := tiny
	cfg.EventsPerTx, cfg.Tracing = []int{1}, true
	var progress []string
	cfg.Progress = func(msg string) { progress = append(progress, msg) }
	rep, err := benchmark.Run(context.Background(), pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var traced []benchmark.Figure
	for _, f := range rep.Figures() {
		if strings.HasPrefix(f.Name, "tracing on, ") {
			traced = append(traced, f)
		}
	}
	if len(traced) != 2 || traced[0].Baseline != "untraced" || traced[0].Ratio() <= 0 || traced[1].Ratio() <= 0 {
		t.Fatalf("tracing figures %+v", traced)
	}
	var schemas []string
	for _, p := range progress {
		if _, after, ok := strings.Cut(p, "schema "); ok {
			schemas = append(schemas, strings.Fields(after)[0])
		}
	}
	for _, s := range append(schemas, rep.Schema) {
		if pgtest.SchemaExists(t, strings.TrimSuffix(s, ";")) {
			t.Errorf("schema %s left behind", s)
		}
	}
}
