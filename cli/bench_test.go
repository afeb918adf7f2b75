package cli

import (
	"testing"

	"github.com/projectorhq/projector/internal/benchmark"
)

// TestBenchRatioPairs: a tracing line's ratio column is the median of its
// pairs with their lowest and highest, not the ratio of its totals.
func TestBenchRatioPairs(t *testing.T) {
	f := benchmark.Figure{Name: "tracing no-op, catch-up", Unit: "events/s", Projector: 40752, Raw: 7467, Baseline: "untraced",
		PairRatios: []float64{1.09, 0.9, 71.19, 1.12, 0.97, 1.2, 1.01}}
	if got, want := ratio(f), "109% of untraced (median of 7 pairs, 90–7119%)"; got != want {
		t.Errorf("ratio %q, want %q", got, want)
	}
	f.PairRatios = nil
	if got, want := ratio(f), "546% of untraced"; got != want {
		t.Errorf("without pairs: ratio %q, want %q", got, want)
	}
}
