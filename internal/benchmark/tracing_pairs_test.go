package benchmark

import (
	"context"
	"slices"
	"testing"
	"time"
)

// TestRunPairsInterleaves: each traced side runs in pairs with the
// untraced side, the two back to back, untraced first in even rounds and
// traced first in odd ones, round after round, the traced sides taking
// turns at going first in a round.
func TestRunPairsInterleaves(t *testing.T) {
	sides := []tracingSide{{}, {mode: TracingNoop}, {mode: TracingSampledOut}}
	var order []int
	res, err := runPairs(context.Background(), "work", sides, 4, func(_ context.Context, i int) (int64, time.Duration, error) {
		order = append(order, i)
		return 100, time.Second, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []int{0, 1, 0, 2, 2, 0, 1, 0, 0, 1, 0, 2, 2, 0, 1, 0}
	if !slices.Equal(order, want) {
		t.Errorf("sides ran in the order %v, want %v", order, want)
	}
	for _, r := range res {
		if len(r.Pairs) != 4 || r.RawEvents != 400 || r.ProjectorEvents != 400 || r.Median() != 1 {
			t.Errorf("%s: %+v, want 4 pairs of equal work", r.Mode, r)
		}
	}
}

// TestRunPairsLoadSpike: a load spike that slows whatever runs during it
// moves the pair it hits, not the figure. The traced side costs nothing
// here (same time as untraced) except while a spike makes every run take
// four times as long, which hits the two halves of one pair and the
// traced half of the next (a spike does not end on a pair's boundary):
// the median of the pairs' ratios stays 100 %, where the ratio of the
// totals says 77 %.
func TestRunPairsLoadSpike(t *testing.T) {
	sides := []tracingSide{{}, {mode: TracingNoop}}
	runs := 0
	res, err := runPairs(context.Background(), "work", sides, 7, func(context.Context, int) (int64, time.Duration, error) {
		runs++
		took := time.Second
		if runs >= 5 && runs <= 7 { // the third pair (untraced, traced) and the fourth's traced half
			took = 4 * time.Second
		}
		return 1000, took, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	r := res[0]
	if got := r.Median(); got != 1 {
		t.Errorf("median of the pairs %.2f (pairs %v), want 1", got, r.Pairs)
	}
	if got := r.Figure().Ratio(); got != 1 {
		t.Errorf("figure's ratio %.2f, want the median 1", got)
	}
	if lo, hi := r.Figure().RatioSpread(); lo != 0.25 || hi != 1 {
		t.Errorf("spread %.2f–%.2f, want 0.25–1 (the fourth pair's traced half ran in the spike, its untraced half not)", lo, hi)
	}
	if got := r.Ratio(); got >= 0.97 {
		t.Errorf("ratio of the totals %.2f: the spike no longer skews it, so this test shows nothing", got)
	}
}
