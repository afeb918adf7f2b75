package main_test

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
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
}

func TestBenchJSON(t *testing.T) {
	t.Parallel()
	r := run(t, benchEnv(t), append(tinyBench, "-o", "json")...)
	if r.code != 0 {
		t.Fatalf("bench -o json: %+v", r)
	}
	var out cli.BenchJSON
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, r.stdout)
	}
	if rb := out.Rebuild; rb.Events != 1500 || rb.RebuildBatchSize != 400 || rb.BatchSize != 100 || rb.RebuildRate <= 0 ||
		rb.LiveRate <= 0 || rb.RawRate <= 0 || rb.SpeedupVsLive <= 0 || rb.SwitchLockMS <= 0 || out.Config.RebuildEvents != 1500 {
		t.Errorf("rebuild %+v, config %+v", rb, out.Config)
	}
	// Exactly the 14 figures of a run without --tracing: cli's
	// TestBenchTracing relies on this test for "no tracing figures without
	// the flag".
	if len(out.Figures) != 14 || out.Config.Tracing || len(out.Config.Writers) != 1 || out.Config.Writers[0] != 2 || out.Config.Backlog != 1000 || out.Config.Rate != 200 || out.ServerVersion == "" {
		t.Errorf("output %+v", out)
	}
	for _, f := range out.Figures {
		if f.Projector <= 0 || (!f.LowerIsBetter && f.Ratio <= 0) || (f.Baseline == "floor") != strings.HasPrefix(f.Figure, "append vs outbox floor") {
			t.Errorf("figure %+v", f)
		}
		if catchUp := strings.HasPrefix(f.Figure, "catch-up"); catchUp != (f.RawDecoding > 0 && f.RatioDecoding > 0) {
			t.Errorf("figure %+v: decoding baseline on the catch-up figures only", f)
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
	cmd := exec.Command(binary, "bench", "--append-duration", "200ms", "--events", "200000")
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir()}, benchEnv(t)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
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
		{"extra argument", []string{"now"}, "unknown command"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			wantError(t, run(t, benchEnv(t), append([]string{"bench"}, tc.args...)...), cli.ExitUsage, tc.msg)
		})
	}
}
