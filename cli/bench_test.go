package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/projectorhq/projector/internal/benchmark"
)

// TestBenchTracing: `bench --tracing` adds the tracing figures, each
// beside its untraced baseline with the pairs its ratio is the median of,
// and says so in the JSON configuration. That a run without the flag has
// none is cmd/projector's TestBenchJSON (its exact figure count and
// configuration): a second whole bench run here would only repeat it.
func TestBenchTracing(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	args := []string{"bench", "-o", "json", "--writers", "1", "--events-per-tx", "1", "--append-duration", "200ms",
		"--events", "1000", "--batch-size", "100", "--rate", "200", "--latency-duration", "300ms", "--rebuild-events", "1500", "--tracing",
		"--tracing-pairs", "3"}
	out, code := e.run(Config{}, args...)
	if code != ExitOK {
		t.Fatalf("%v: exit %d:\n%s", args, code, out)
	}
	var rep BenchJSON
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out)
	}
	var figs []BenchFigureJSON
	for _, f := range rep.Figures {
		if strings.HasPrefix(f.Figure, "tracing ") {
			figs = append(figs, f)
		}
	}
	// Each work with the no-op provider, an SDK that samples nothing
	// and every span sampled, each in pairs with the work untraced.
	var want []string
	for _, work := range []string{"append, 1 event/tx, 1 writer", "catch-up, batch handler, batches of 100"} {
		for _, mode := range []string{"no-op", "sampled-out", "on"} {
			want = append(want, "tracing "+mode+", "+work)
		}
	}
	if !rep.Config.Tracing || len(figs) != len(want) {
		t.Fatalf("--tracing: tracing %v, figures %+v, want %q", rep.Config.Tracing, figs, want)
	}
	for i, f := range figs {
		if f.Figure != want[i] || f.Unit != "events/s" || f.Baseline != "untraced" || f.Projector <= 0 || f.Raw <= 0 || f.Ratio <= 0 {
			t.Errorf("tracing figure %+v, want %q beside its untraced baseline", f, want[i])
		}
		// The ratio is the median of the pairs, inside their spread.
		if len(f.Pairs) < 3 || (strings.Contains(f.Figure, "catch-up") && len(f.Pairs) != 3) || f.RatioMin <= 0 || f.RatioMin > f.Ratio || f.Ratio > f.RatioMax {
			t.Errorf("%s: pairs %v, ratio %v, spread %v–%v: want the median of at least 3 pairs", f.Figure, f.Pairs, f.Ratio, f.RatioMin, f.RatioMax)
		}
	}
}

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
