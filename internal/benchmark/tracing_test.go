package benchmark_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/projectorhq/projector/internal/benchmark"
	"github.com/projectorhq/projector/internal/pgtest"
)

// TestMeasureTracing: the tracing mode measures each append size and a
// catch-up with the no-op provider, with an SDK that samples nothing and
// with every span sampled, each in pairs with the same work untraced, the
// figure's ratio the median of the pairs'. Only the sampled side records
// (spans ended: an append span and a request span per transaction, batch
// spans for the catch-up); the SDK that samples nothing ends none.
func TestMeasureTracing(t *testing.T) {
	t.Parallel()
	ctx, store := setup(t)
	cfg := benchmark.Config{EventsPerTx: []int{1, 10}, AppendDuration: 800 * time.Millisecond, Backlog: 1000, BatchSize: 100}
	res, err := benchmark.MeasureTracing(ctx, store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	works := []string{"append, 1 event/tx, 1 writer", "append, 10 events/tx, 1 writer", "catch-up, batch handler, batches of 100"}
	modes := []benchmark.TracingMode{benchmark.TracingNoop, benchmark.TracingSampledOut, benchmark.TracingSampled}
	if len(res) != len(works)*len(modes) {
		t.Fatalf("%d figures, want %d: %+v", len(res), len(works)*len(modes), res)
	}
	for w, name := range works {
		for m, mode := range modes {
			r := res[w*len(modes)+m]
			if r.Name != name || r.Mode != mode || r.RawRate() <= 0 || r.ProjectorRate() <= 0 {
				t.Errorf("figure %d: %+v, want %q %s with both sides measured", w*len(modes)+m, r, name, mode)
			}
			// At least three pairs, each with both halves measured; the
			// figure's ratio is their median, inside their spread.
			lo, hi := r.Figure().RatioSpread()
			if len(r.Pairs) < 3 || slices.Contains(r.Pairs, 0) || r.Figure().Ratio() != r.Median() || r.Median() < lo || r.Median() > hi {
				t.Errorf("%s %s: pairs %v, median %.2f, spread %.2f–%.2f", name, mode, r.Pairs, r.Median(), lo, hi)
			}
			if mode != benchmark.TracingSampled && r.Spans != 0 {
				t.Errorf("%s %s: %d spans recorded, want none", name, mode, r.Spans)
			}
		}
	}
	for i, n := range cfg.EventsPerTx {
		// Every sampled transaction ended its request span and its append span.
		r := res[i*len(modes)+2]
		if tx := r.ProjectorEvents / int64(n); r.Spans < 2*tx {
			t.Errorf("%s: %d spans for %d traced transactions", r.Name, r.Spans, tx)
		}
	}
	pairs := int64(benchmark.TracingCatchUpPairs)
	if c := res[len(res)-1]; c.Spans < pairs*int64(cfg.Backlog/cfg.BatchSize) || c.RawEvents != pairs*int64(cfg.Backlog) ||
		len(c.Pairs) != int(pairs) {
		t.Errorf("catch-up: %d spans, %d untraced events, %d pairs; want a span per batch of %d pairs of %d events", c.Spans, c.RawEvents, len(c.Pairs), pairs, cfg.Backlog)
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
		if strings.HasPrefix(f.Name, "tracing ") {
			traced = append(traced, f)
		}
	}
	want := []string{"tracing no-op, append, 1 event/tx, 1 writer", "tracing sampled-out, append, 1 event/tx, 1 writer",
		"tracing on, append, 1 event/tx, 1 writer"}
	for _, mode := range []string{"no-op", "sampled-out", "on"} {
		want = append(want, fmt.Sprintf("tracing %s, catch-up, batch handler, batches of %d", mode, cfg.BatchSize))
	}
	if len(traced) != len(want) {
		t.Fatalf("tracing figures %+v, want %q", traced, want)
	}
	for i, f := range traced {
		if f.Name != want[i] || f.Baseline != "untraced" || f.Ratio() <= 0 {
			t.Errorf("tracing figure %+v, want %q beside its untraced baseline", f, want[i])
		}
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
