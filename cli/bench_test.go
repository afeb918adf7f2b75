package cli

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestBenchTracing: `bench --tracing` adds the tracing figures, each
// beside its untraced baseline, and says so in the JSON configuration;
// without the flag there are none.
func TestBenchTracing(t *testing.T) {
	t.Parallel()
	e := newRelayEnv(t)
	tiny := []string{"bench", "-o", "json", "--writers", "1", "--events-per-tx", "1", "--append-duration", "200ms",
		"--events", "1000", "--batch-size", "100", "--rate", "200", "--latency-duration", "300ms", "--rebuild-events", "1500"}
	for _, traced := range []bool{true, false} {
		args := tiny
		if traced {
			args = append(args[:len(args):len(args)], "--tracing")
		}
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
			if strings.HasPrefix(f.Figure, "tracing on, ") {
				figs = append(figs, f)
			}
		}
		if !traced {
			if len(figs) != 0 || rep.Config.Tracing {
				t.Errorf("without --tracing: tracing %v, figures %+v", rep.Config.Tracing, figs)
			}
			continue
		}
		if !rep.Config.Tracing || len(figs) != 2 {
			t.Fatalf("--tracing: tracing %v, figures %+v", rep.Config.Tracing, figs)
		}
		for _, f := range figs {
			if f.Baseline != "untraced" || f.Projector <= 0 || f.Raw <= 0 || f.Ratio <= 0 {
				t.Errorf("tracing figure %+v", f)
			}
		}
	}
}
