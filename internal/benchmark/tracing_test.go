package benchmark_test

import (
	"slices"
	"testing"
	"time"

	"github.com/projectorhq/projector/internal/benchmark"
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
	// Three catch-up pairs, the fewest a median of pairs needs; 5
	// batches each.
	cfg := benchmark.Config{EventsPerTx: []int{1, 10}, AppendDuration: 800 * time.Millisecond, Backlog: 500, BatchSize: 100, TracingPairs: 3}
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
	pairs := int64(cfg.TracingPairs)
	if c := res[len(res)-1]; c.Spans < pairs*int64(cfg.Backlog/cfg.BatchSize) || c.RawEvents != pairs*int64(cfg.Backlog) ||
		len(c.Pairs) != int(pairs) {
		t.Errorf("catch-up: %d spans, %d untraced events, %d pairs; want a span per batch of %d pairs of %d events", c.Spans, c.RawEvents, len(c.Pairs), pairs, cfg.Backlog)
	}
}
