package main_test

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/projectorhq/projector/cli"
	"github.com/projectorhq/projector/internal/pgtest"
)

// tinyBench sizes a bench run to a few seconds under the race detector.
var tinyBench = []string{"bench", "--writers", "2", "--append-duration", "200ms", "--events", "1000",
	"--batch-size", "100", "--rate", "200", "--latency-duration", "300ms", "--rebuild-events", "1500", "--rebuild-batch-size", "400"}

func benchEnv(t *testing.T) []string {
	return []string{"PROJECTOR_DATABASE_URL=" + pgtest.URL(t)}
}

func TestBenchTable(t *testing.T) {
	t.Parallel()
	r := run(t, benchEnv(t), append(tinyBench, "--events-per-tx", "1,4,100")...)
	if r.code != 0 {
		t.Fatalf("bench: %+v", r)
	}
	for _, row := range []string{
		"FIGURE", "DECODING BASELINE", "append, 1 event/tx, 2 writers", "append, 4 events/tx, 2 writers", "append, 100 events/tx, 2 writers",
		"append vs outbox floor, 1 event/tx, 2 writers", "append vs outbox floor, 4 events/tx, 2 writers", "append vs outbox floor, 100 events/tx, 2 writers",
		"catch-up, per-event handler", "catch-up, per-event handler, queued writes", "catch-up, batch handler (unnest)", "catch-up, batch handler, raw payloads", "latency p50 at 200 events/s", "latency p99 at 200 events/s",
		"latency p50 at 200 events/s, polled", "latency p99 at 200 events/s, polled",
		"rebuild log, live catch-up (batches of 100)", "rebuild log, blue/green rebuild (batches of 400)",
		"× the live catch-up rate", "the switch held the live tables", "shadow batches of 400",
		"% of raw", "% of floor", "events/s", " ms ", "peak Go heap",
	} {
		if !strings.Contains(r.stdout, row) {
			t.Errorf("table lacks %q:\n%s", row, r.stdout)
		}
	}
	_, after, _ := strings.Cut(r.stdout, "schema ")
	schema, _, _ := strings.Cut(after, " ")
	if !strings.HasPrefix(schema, "projector_bench_") || pgtest.SchemaExists(t, schema) {
		t.Errorf("schema %q: want a projector_bench_ schema, dropped", schema)
	}
	if !strings.Contains(r.stderr, "bench: latency") {
		t.Errorf("no progress on stderr: %q", r.stderr)
	}
	// Without --tracing, no tracing line (TestBenchJSON's run has them).
	if strings.Contains(r.stdout, "tracing ") || strings.Contains(r.stderr, "tracing:") {
		t.Errorf("tracing figures without --tracing:\n%s\n%s", r.stdout, r.stderr)
	}
}

// TestBenchJSON: `bench -o json --tracing` prints the whole run as JSON,
// the tracing figures after the 14 of a run without the flag, each beside
// its untraced baseline with the pairs its ratio is the median of, and
// says so in the configuration. That a run without --tracing has no
// tracing figures is TestBenchTable's: one whole bench run, not two, for
// what used to be this test and cli's TestBenchTracing. Its logs are half
// TestBenchTable's (a backlog and a rebuild log of 500 events: 5 batches
// of 100, 2 shadow batches of 400): the tracing run repeats the catch-up
// 18 times (3 pairs × 3 modes × 2 halves), and nothing here depends on
// the size of a log.
func TestBenchJSON(t *testing.T) {
	t.Parallel()
	args := slices.Clone(tinyBench)
	for i, a := range args {
		if a == "--events" || a == "--rebuild-events" {
			args[i+1] = "500"
		}
	}
	r := run(t, benchEnv(t), append(args, "-o", "json", "--tracing", "--tracing-pairs", "3")...)
	if r.code != 0 {
		t.Fatalf("bench -o json: %+v", r)
	}
	var out cli.BenchJSON
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, r.stdout)
	}
	if rb := out.Rebuild; rb.Events != 500 || rb.RebuildBatchSize != 400 || rb.BatchSize != 100 || rb.RebuildRate <= 0 ||
		rb.LiveRate <= 0 || rb.RawRate <= 0 || rb.SpeedupVsLive <= 0 || rb.SwitchLockMS <= 0 || out.Config.RebuildEvents != 500 {
		t.Errorf("rebuild %+v, config %+v", rb, out.Config)
	}
	figs := out.Figures
	var traced []cli.BenchFigureJSON
	for i, f := range figs {
		if strings.HasPrefix(f.Figure, "tracing ") {
			figs, traced = figs[:i], figs[i:]
			break
		}
	}
	// Exactly 14 figures before the tracing ones, as a run without
	// --tracing has: 2 sizes (the default 1,100) × raw and floor append,
	// 4 catch-up, 4 latency, 2 rebuild.
	if len(figs) != 14 || !out.Config.Tracing || len(out.Config.Writers) != 1 || out.Config.Writers[0] != 2 || out.Config.Backlog != 500 || out.Config.Rate != 200 || out.ServerVersion == "" {
		t.Errorf("output %+v", out)
	}
	for _, f := range figs {
		if f.Projector <= 0 || (!f.LowerIsBetter && f.Ratio <= 0) || (f.Baseline == "floor") != strings.HasPrefix(f.Figure, "append vs outbox floor") {
			t.Errorf("figure %+v", f)
		}
		if catchUp := strings.HasPrefix(f.Figure, "catch-up"); catchUp != (f.RawDecoding > 0 && f.RatioDecoding > 0) {
			t.Errorf("figure %+v: decoding baseline on the catch-up figures only", f)
		}
	}
	// Each work with the no-op provider, an SDK that samples nothing and
	// every span sampled, each in pairs with the work untraced.
	var want []string
	for _, work := range []string{"append, 1 event/tx, 1 writer", "append, 100 events/tx, 1 writer", "catch-up, batch handler, batches of 100"} {
		for _, mode := range []string{"no-op", "sampled-out", "on"} {
			want = append(want, "tracing "+mode+", "+work)
		}
	}
	if len(traced) != len(want) {
		t.Fatalf("--tracing: figures %+v, want %q", traced, want)
	}
	for i, f := range traced {
		if f.Figure != want[i] || f.Unit != "events/s" || f.Baseline != "untraced" || f.Projector <= 0 || f.Raw <= 0 || f.Ratio <= 0 ||
			f.RawDecoding != 0 || f.LowerIsBetter {
			t.Errorf("tracing figure %+v, want %q beside its untraced baseline", f, want[i])
		}
		// The ratio is the median of the pairs, inside their spread; the
		// catch-up runs --tracing-pairs of them.
		if len(f.Pairs) < 3 || (strings.Contains(f.Figure, "catch-up") && len(f.Pairs) != 3) || f.RatioMin <= 0 || f.RatioMin > f.Ratio || f.Ratio > f.RatioMax {
			t.Errorf("%s: pairs %v, ratio %v, spread %v–%v: want the median of at least 3 pairs", f.Figure, f.Pairs, f.Ratio, f.RatioMin, f.RatioMax)
		}
	}
	if !strings.HasPrefix(out.Schema, "projector_bench_") || pgtest.SchemaExists(t, out.Schema) {
		t.Errorf("schema %q: want a projector_bench_ schema, dropped", out.Schema)
	}
}

// Ctrl-C in the middle of a run still drops the schema, and the error says
// the run was interrupted.
func TestBenchInterrupted(t *testing.T) {
	t.Parallel()
	// One append figure before the catch-up, not the default six (three
	// writer counts × two sizes): what is interrupted is the catch-up.
	cmd := exec.Command(binary, "bench", "--writers", "1", "--events-per-tx", "1", "--append-duration", "200ms", "--events", "200000")
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir()}, benchEnv(t)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	pgtest.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var schema string
	lines := bufio.NewScanner(stderr)
	for lines.Scan() {
		if s, ok := strings.CutPrefix(lines.Text(), "bench: working in schema "); ok {
			schema, _, _ = strings.Cut(s, " ")
		}
		if strings.HasPrefix(lines.Text(), "bench: catch-up") {
			break // filling the backlog, then the first raw loop
		}
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	var rest strings.Builder
	for lines.Scan() {
		rest.WriteString(lines.Text() + "\n")
	}
	err = cmd.Wait()
	if cmd.ProcessState.ExitCode() != cli.ExitError || !strings.Contains(rest.String(), "bench: interrupted") {
		t.Errorf("interrupted bench: %v, stderr %q", err, rest.String())
	}
	if schema == "" || pgtest.SchemaExists(t, schema) {
		t.Errorf("schema %q left behind", schema)
	}
}

func TestBenchBadFlags(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		args []string
		msg  string
	}{
		{"zero writers", []string{"--writers", "0"}, "--writers must be positive"},
		{"zero among writer counts", []string{"--writers", "1,0,16"}, "--writers must be positive"},
		{"writers out of range", []string{"--writers", "4,5000"}, "--writers 5000: want 1..1000"},
		{"negative rate", []string{"--rate", "-5"}, "--rate must be positive"},
		{"rate out of range", []string{"--rate", "1000000"}, "--rate 1000000: want 1..100000"},
		{"not a number", []string{"--events", "lots"}, "--events"},
		{"duration without unit", []string{"--latency-duration", "5"}, "--latency-duration"},
		{"unknown format", []string{"-o", "yaml"}, "--output"},
		{"zero events per transaction", []string{"--events-per-tx", "1,0"}, "--events-per-tx must be positive"},
		{"events per transaction out of range", []string{"--events-per-tx", "4,20000"}, "--events-per-tx 20000: want 1..10000"},
		{"zero rebuild log", []string{"--rebuild-events", "0"}, "--rebuild-events must be positive"},
		{"negative rebuild batch", []string{"--rebuild-batch-size", "-1"}, "--rebuild-batch-size must not be negative"},
		{"rebuild batch out of range", []string{"--rebuild-batch-size", "1000000"}, "--rebuild-batch-size 1000000: want 1..100000"},
		{"zero tracing pairs", []string{"--tracing", "--tracing-pairs", "0"}, "--tracing-pairs must be positive"},
		{"even tracing pairs", []string{"--tracing", "--tracing-pairs", "4"}, "--tracing-pairs 4: want an odd count"},
		{"tracing pairs out of range", []string{"--tracing", "--tracing-pairs", "101"}, "--tracing-pairs 101: want 1..99"},
		{"tracing pairs without tracing", []string{"--tracing-pairs", "3"}, "--tracing-pairs counts the pairs of --tracing"},
		{"extra argument", []string{"now"}, "unknown command"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			wantError(t, run(t, benchEnv(t), append([]string{"bench"}, tc.args...)...), cli.ExitUsage, tc.msg)
		})
	}
}
