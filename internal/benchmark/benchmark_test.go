package benchmark_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/benchmark"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/stores/postgres"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// tiny is a full run small enough for a test: a few seconds in all.
var tiny = benchmark.Config{
	EventsPerTx: []int{1, 10}, Writers: []int{2}, AppendDuration: 200 * time.Millisecond,
	Backlog: 1000, BatchSize: 100,
	Rate: 200, LatencyDuration: 300 * time.Millisecond,
	RebuildEvents: 1500, RebuildBatchSize: 400,
}

func setup(t *testing.T) (context.Context, *postgres.Store) {
	t.Helper()
	return context.Background(), pgtest.Store(t, benchmark.NewRegistry())
}

// count runs a count(*) query.
func count(t *testing.T, store *postgres.Store, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := store.Pool().QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func rawTables(t *testing.T, store *postgres.Store) int64 {
	return count(t, store, `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename LIKE 'bench\_raw\_%'`, store.Schema())
}

// baselineRows counts the rows of the one baseline table whose name starts
// with prefix (bench_raw_outbox_, bench_raw_business_).
func baselineRows(t *testing.T, store *postgres.Store, prefix string) int64 {
	t.Helper()
	var name string
	if err := store.Pool().QueryRow(context.Background(), `SELECT tablename FROM pg_tables WHERE schemaname = $1 AND starts_with(tablename, $2)`,
		store.Schema(), prefix).Scan(&name); err != nil {
		t.Fatalf("find %s table: %v", prefix, err)
	}
	return count(t, store, `SELECT count(*) FROM `+store.Table(name))
}

func checkThroughput(t *testing.T, what string, tp benchmark.Throughput) {
	t.Helper()
	if tp.RawEvents <= 0 || tp.ProjectorEvents <= 0 || tp.RawRate() <= 0 || tp.ProjectorRate() <= 0 || tp.Ratio() <= 0 {
		t.Errorf("%s: not a sane figure: %+v (rates %.0f / %.0f, ratio %.2f)", what, tp, tp.ProjectorRate(), tp.RawRate(), tp.Ratio())
	}
}

func TestAppenderWritesBothSides(t *testing.T) {
	t.Parallel()
	ctx, store := setup(t)
	a, err := benchmark.NewAppender(ctx, store, 5)
	if err != nil {
		t.Fatal(err)
	}
	w0, w1 := a.Writer(0), a.Writer(1)
	for range 12 { // past ten ops, so a second stream per writer
		for _, w := range []*benchmark.AppendWriter{w0, w1} {
			if raw, floor, proj, err := w.Triple(ctx); err != nil || raw <= 0 || floor <= 0 || proj <= 0 {
				t.Fatalf("triple: %v, %v, %v, %v", raw, floor, proj, err)
			}
		}
	}
	if n := count(t, store, `SELECT count(*) FROM `+store.Table("projector_events")+` WHERE type = $1`, benchmark.AppendedType); n != 2*12*5 {
		t.Errorf("Projector side appended %d events, want %d", n, 2*12*5)
	}
	if n := count(t, store, `SELECT count(DISTINCT stream_id) FROM `+store.Table("projector_events")); n != 4 {
		t.Errorf("%d streams, want 2 per writer", n)
	}
	if n := baselineRows(t, store, "bench_raw_outbox_"); n != 2*12*5 {
		t.Errorf("outbox floor holds %d events, want %d", n, 2*12*5)
	}
	if n := baselineRows(t, store, "bench_raw_business_"); n != 3*2*12 {
		t.Errorf("%d business rows, want one per transaction of each side: %d", n, 3*2*12)
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := rawTables(t, store); n != 0 {
		t.Errorf("%d baseline tables left after Close", n)
	}
}

func TestMeasureAppend(t *testing.T) {
	t.Parallel()
	ctx, store := setup(t)
	res, err := benchmark.MeasureAppend(ctx, store, benchmark.AppendConfig{EventsPerTx: 3, Writers: 3, Duration: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	checkThroughput(t, "append", res.Throughput)
	if res.FloorEvents <= 0 || res.FloorRate() <= 0 || res.FloorRatio() <= 0 {
		t.Errorf("outbox floor: not a sane figure: %+v", res)
	}
	if res.EventsPerTx != 3 || res.Writers != 3 {
		t.Errorf("result sizes %+v", res)
	}
	if n := count(t, store, `SELECT count(*) FROM `+store.Table("projector_events")+` WHERE type = $1`, benchmark.AppendedType); n != res.ProjectorEvents {
		t.Errorf("log holds %d appended events, result counts %d", n, res.ProjectorEvents)
	}
	if n := rawTables(t, store); n != 0 {
		t.Errorf("%d baseline tables left behind", n)
	}
}

func TestMeasureCatchUp(t *testing.T) {
	t.Parallel()
	ctx, store := setup(t)
	cfg := benchmark.CatchUpConfig{Events: 1234, Streams: 7, BatchSize: 100}
	res, err := benchmark.MeasureCatchUp(ctx, store, cfg)
	if err != nil {
		t.Fatal(err) // includes a side that applied more or fewer events than the backlog
	}
	if len(res) != len(benchmark.Forms()) {
		t.Fatalf("%d results, want one per form", len(res))
	}
	for i, r := range res {
		checkThroughput(t, string(r.Form), r.Throughput)
		checkThroughput(t, string(r.Form)+" decoding", r.Decoding)
		if r.Decoding.ProjectorTime != r.ProjectorTime || r.Decoding.RawEvents != 1234 {
			t.Errorf("result %d: decoding baseline %+v beside %+v", i, r.Decoding, r.Throughput)
		}
		if r.Form != benchmark.Forms()[i] || r.RawEvents != 1234 || r.ProjectorEvents != 1234 || r.BatchSize != 100 || r.PeakHeap == 0 {
			t.Errorf("result %d: %+v", i, r)
		}
	}
	if n := count(t, store, `SELECT count(*) FROM `+store.Table("projector_events")+` WHERE type = $1`, benchmark.BackloggedType); n != 1234 {
		t.Errorf("backlog of %d events, want 1234", n)
	}
	// A second backlog in the same log would be counted with the first.
	if _, err := benchmark.NewCatchUp(ctx, store, cfg); err == nil || !strings.Contains(err.Error(), "already holds a backlog") {
		t.Errorf("second backlog: %v", err)
	}
}

func TestMeasureLatency(t *testing.T) {
	t.Parallel()
	ctx, store := setup(t)
	res, err := benchmark.MeasureLatency(ctx, store, benchmark.LatencyConfig{Rate: 200, Duration: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err) // includes an event that never arrived
	}
	appended := count(t, store, `SELECT count(*) FROM `+store.Table("projector_events")+` WHERE type = $1`, benchmark.TimedType)
	if got := int64(res.Raw.Samples + res.Projector.Samples + res.Polled.Samples); got != appended || res.Raw.Samples == 0 || res.Projector.Samples == 0 || res.Polled.Samples == 0 {
		t.Errorf("samples raw %d + projector %d + polled %d, appended %d", res.Raw.Samples, res.Projector.Samples, res.Polled.Samples, appended)
	}
	if res.Polled.P50 <= 0 || res.Polled.P99 < res.Polled.P50 {
		t.Errorf("polled dispatcher: %+v", res.Polled)
	}
	// The floor may see a notification before the appender sees its own
	// commit (a zero sample), so only its tail must be above zero.
	if res.Projector.P50 <= 0 || res.Projector.P99 < res.Projector.P50 || res.Raw.P99 <= 0 || res.Rate != 200 {
		t.Errorf("latency %+v", res)
	}
}

// TestRunDropsItsSchema: a whole tiny run, with Config.Tracing (the one
// whole run with it in this package: a run costs seconds under -race),
// fills every figure and drops each schema it worked in. Config.Tracing
// adds the tracing figures, each beside its untraced baseline, after the
// others. One catch-up pair per traced mode: that a figure is the median
// of its pairs, and how many catch-up pairs run, is TestMeasureTracing's
// (and, through a whole bench run, cmd/projector's TestBenchJSON's); 3
// pairs here were 12 more catch-ups that nothing below looks at.
func TestRunDropsItsSchema(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	var progress []string
	cfg := tiny
	cfg.Tracing, cfg.TracingPairs = true, 1
	cfg.Progress = func(msg string) { progress = append(progress, msg) }
	rep, err := benchmark.Run(context.Background(), pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(rep.Schema, benchmark.SchemaPrefix) || rep.ServerVersion == "" {
		t.Errorf("report schema %q, server %q", rep.Schema, rep.ServerVersion)
	}
	if pgtest.SchemaExists(t, rep.Schema) {
		t.Errorf("schema %s left behind", rep.Schema)
	}
	figs := rep.Figures()
	var traced []benchmark.Figure
	for i, f := range figs {
		if strings.HasPrefix(f.Name, "tracing ") {
			traced = figs[i:]
			figs = figs[:i]
			break
		}
	}
	if len(figs) != 14 {
		t.Fatalf("%d figures before the tracing ones, want 2×2 append (raw and floor) + 4 catch-up + 2×2 latency (hinted and polled) + 2 rebuild: %+v", len(figs), figs)
	}
	for i, f := range append(figs, traced...) {
		if f.Projector <= 0 || (!f.LowerIsBetter && f.Ratio() <= 0) || (f.Unit == "events/s") == f.LowerIsBetter {
			t.Errorf("figure %+v (ratio %.2f)", f, f.Ratio())
		}
		// The catch-up figures, and only they, carry the decoding baseline.
		if catchUp := strings.HasPrefix(f.Name, "catch-up"); catchUp != (f.RawDecoding > 0 && f.DecodingRatio() > 0) {
			t.Errorf("figure %d %q: decoding baseline %v", i, f.Name, f.RawDecoding)
		}
	}
	var want []string
	for _, work := range []string{"append, 1 event/tx, 1 writer", "append, 10 events/tx, 1 writer", fmt.Sprintf("catch-up, batch handler, batches of %d", cfg.BatchSize)} {
		for _, mode := range []string{"no-op", "sampled-out", "on"} {
			want = append(want, "tracing "+mode+", "+work)
		}
	}
	if len(traced) != len(want) {
		t.Fatalf("tracing figures %+v, want %q", traced, want)
	}
	for i, f := range traced {
		if f.Name != want[i] || f.Baseline != "untraced" || f.Ratio() <= 0 {
			t.Errorf("tracing figure %+v, want %q beside its untraced baseline", f, want[i])
		}
	}
	if r := rep.Rebuild; r.Events != 1500 || r.RebuildBatchSize != 400 || r.SwitchLock <= 0 {
		t.Errorf("rebuild %+v", r)
	}
	var rebuildSchema string
	if i := slices.IndexFunc(progress, func(p string) bool { return strings.HasPrefix(p, "rebuild:") }); i >= 0 {
		_, after, _ := strings.Cut(progress[i], "in schema ")
		rebuildSchema, _, _ = strings.Cut(after, ";")
	}
	if !strings.HasPrefix(rebuildSchema, benchmark.SchemaPrefix) || pgtest.SchemaExists(t, rebuildSchema) {
		t.Errorf("rebuild schema %q: want a bench schema, dropped (progress %q)", rebuildSchema, progress)
	}
	// working in, 2 append sizes, catch-up, latency, rebuild; then tracing:
	// its schema, 2 append sizes, catch-up.
	if len(progress) != 10 || !strings.Contains(progress[0], rep.Schema) || !strings.HasPrefix(progress[6], "tracing: in schema "+benchmark.SchemaPrefix) {
		t.Errorf("progress %q", progress)
	}
	// Every schema a progress line names is dropped.
	for _, p := range progress {
		if _, after, ok := strings.Cut(p, "schema "); ok {
			if s := strings.TrimSuffix(strings.Fields(after)[0], ";"); pgtest.SchemaExists(t, s) {
				t.Errorf("schema %s left behind", s)
			}
		}
	}
}

// Cancelling mid-run, as Ctrl-C does, still drops the schema.
func TestRunCancelledDropsItsSchema(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var schema string
	cfg := tiny
	cfg.Progress = func(msg string) {
		if s, ok := strings.CutPrefix(msg, "working in schema "); ok {
			schema, _, _ = strings.Cut(s, " ")
		}
		if strings.HasPrefix(msg, "catch-up") {
			cancel()
		}
	}
	_, err := benchmark.Run(ctx, pgtest.Pool(t), cfg)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("run: %v, want cancelled", err)
	}
	if schema == "" || pgtest.SchemaExists(t, schema) {
		t.Errorf("schema %q left behind", schema)
	}
}

// Cancelling during the tracing measurement, as Ctrl-C in `bench
// --tracing` does, drops the tracing schema too (and the others). The
// untraced run before it is smaller than tiny (one append size, short
// logs): only the schemas it leaves are looked at, and its figures are
// TestRunDropsItsSchema's.
func TestRunCancelledInTracingDropsItsSchemas(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var schemas []string
	cfg := tiny
	cfg.EventsPerTx, cfg.Backlog, cfg.LatencyDuration, cfg.RebuildEvents = []int{1}, 200, 100*time.Millisecond, 200
	cfg.Tracing, cfg.TracingPairs = true, 1
	cfg.Progress = func(msg string) {
		if _, after, ok := strings.Cut(msg, "schema "); ok {
			schemas = append(schemas, strings.TrimSuffix(strings.Fields(after)[0], ";"))
		}
		if strings.HasPrefix(msg, "tracing: append") {
			cancel()
		}
	}
	_, err := benchmark.Run(ctx, pgtest.Pool(t), cfg)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("run: %v, want cancelled", err)
	}
	if len(schemas) != 3 || !strings.HasPrefix(schemas[2], benchmark.SchemaPrefix) {
		t.Fatalf("schemas named %q: want the run's, the rebuild's and the tracing one", schemas)
	}
	for _, s := range schemas {
		if pgtest.SchemaExists(t, s) {
			t.Errorf("schema %s left behind", s)
		}
	}
}

func TestDropSchemaRefusesOthers(t *testing.T) {
	t.Parallel()
	ctx, store := setup(t)
	if err := benchmark.DropSchema(ctx, store); err == nil {
		t.Fatal("dropped a schema benchmark.NewSchema did not make")
	}
	if !pgtest.SchemaExists(t, store.Schema()) {
		t.Fatal("schema gone")
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		cfg  benchmark.Config
		ok   bool
	}{
		{"zero means defaults", benchmark.Config{}, true},
		{"tiny", tiny, true},
		{"negative writers", benchmark.Config{Writers: []int{-1}}, false},
		{"one writer count too many", benchmark.Config{Writers: []int{1, 4, 5000}}, false},
		{"append size zero", benchmark.Config{EventsPerTx: []int{0}}, false},
		{"negative backlog", benchmark.Config{Backlog: -5}, false},
		{"huge batch", benchmark.Config{BatchSize: 1_000_000}, false},
		{"rate too high", benchmark.Config{Rate: 1_000_000}, false},
		{"negative duration", benchmark.Config{LatencyDuration: -time.Second}, false},
		{"negative rebuild log", benchmark.Config{RebuildEvents: -1}, false},
		{"huge rebuild batch", benchmark.Config{RebuildBatchSize: 1_000_000}, false},
		{"three tracing pairs", benchmark.Config{TracingPairs: 3}, true},
		{"even tracing pairs", benchmark.Config{TracingPairs: 4}, false},
		{"negative tracing pairs", benchmark.Config{TracingPairs: -1}, false},
		{"too many tracing pairs", benchmark.Config{TracingPairs: 101}, false},
	}
	if got := (benchmark.Config{}).WithDefaults().TracingPairs; got != 7 {
		t.Errorf("default tracing pairs %d, want 7 (what bench has always run)", got)
	}
	for _, tc := range cases {
		if err := tc.cfg.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v", tc.name, err)
		}
	}
}

func TestStoreWithoutBenchTypes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := pgtest.Store(t, projector.NewRegistry())
	if _, err := benchmark.NewAppender(ctx, store, 1); err == nil || !strings.Contains(err.Error(), "benchmark.NewRegistry") {
		t.Errorf("appender on a foreign registry: %v", err)
	}
}

// A rebuild measurement applies the log three ways, each counting every
// event once (Measure fails otherwise), reports the shadow batch it used
// and the switch's lock time, and leaves no shadow or old schema behind.
func TestMeasureRebuild(t *testing.T) {
	t.Parallel()
	for _, form := range []benchmark.Form{benchmark.Batched, benchmark.PerEvent} {
		t.Run(string(form), func(t *testing.T) {
			t.Parallel()
			ctx, store := setup(t)
			cfg := benchmark.RebuildConfig{Events: 1234, Streams: 7, BatchSize: 50, RebuildBatchSize: 300, Form: form}
			res, err := benchmark.MeasureRebuild(ctx, store, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if res.Form != form || res.Events != 1234 || res.BatchSize != 50 || res.RebuildBatchSize != 300 ||
				res.RawRate() <= 0 || res.LiveRate() <= 0 || res.RebuildRate() <= 0 || res.Speedup() <= 0 ||
				res.SwitchLock <= 0 || res.LivePeakHeap == 0 || res.RebuildPeakHeap == 0 {
				t.Errorf("result %+v", res)
			}
			// The rebuilt model is live: the counts table of the store's
			// schema counts the whole log (Close dropped the CatchUp tables,
			// so look at the rebuild's record instead).
			var status string
			var switchMS float64
			if err := store.Pool().QueryRow(ctx, `SELECT status, switch_ms FROM `+store.Table("projector_rebuilds")+` ORDER BY id DESC LIMIT 1`).
				Scan(&status, &switchMS); err != nil || status != "switched" || switchMS <= 0 {
				t.Errorf("rebuild record: %s, %v ms, %v", status, switchMS, err)
			}
			if n := count(t, store, `SELECT count(*) FROM pg_namespace WHERE starts_with(nspname, $1)`, store.Schema()+"_rebuild_"); n != 0 {
				t.Errorf("%d shadow or old schemas left behind", n)
			}
		})
	}
}

func TestRebuildConfigValidate(t *testing.T) {
	t.Parallel()
	ctx, store := setup(t)
	for _, cfg := range []benchmark.RebuildConfig{
		{Events: -1}, {RebuildBatchSize: -3}, {BatchSize: 200_000}, {Form: "sideways"},
	} {
		if _, err := benchmark.NewRebuild(ctx, store, cfg); err == nil {
			t.Errorf("NewRebuild(%+v) accepted", cfg)
		}
	}
	if n := count(t, store, `SELECT count(*) FROM `+store.Table("projector_events")); n != 0 {
		t.Errorf("refused configurations wrote %d events", n)
	}
}

func TestMeasureRowShapes(t *testing.T) {
	t.Parallel()
	ctx, store := setup(t)
	// 12 events a transaction and past ten transactions a writer, so every
	// layout's unique keys see several streams and commits per stream.
	res, err := benchmark.MeasureRowShapes(ctx, store, benchmark.AppendConfig{EventsPerTx: 12, Writers: 2, Duration: 1400 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"outbox-floor", "projector"}
	for _, s := range benchmark.RowShapes() {
		want = append(want, s.Name)
	}
	if len(res) != len(want) {
		t.Fatalf("%d sides, want %d: %+v", len(res), len(want), res)
	}
	for i, r := range res {
		if r.Name != want[i] || r.Events <= 0 || r.Events%12 != 0 || r.Rate() <= 0 {
			t.Errorf("side %d: %+v, want %s with whole transactions of events", i, r, want[i])
		}
	}
	if n := count(t, store, `SELECT count(*) FROM `+store.Table("projector_events")+` WHERE type = $1`, benchmark.AppendedType); n != res[1].Events {
		t.Errorf("log holds %d appended events, result counts %d", n, res[1].Events)
	}
	if n := count(t, store, `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND (tablename LIKE 'bench\_shape\_%' OR tablename LIKE 'bench\_raw\_%')`, store.Schema()); n != 0 {
		t.Errorf("%d layout tables left behind", n)
	}
}

// The head-less layouts number a stream's events from its last one, so
// every side must append whole transactions, and no layout's table may be
// left behind.
func TestMeasureHeadShapes(t *testing.T) {
	t.Parallel()
	ctx, store := setup(t)
	want := []string{"outbox-floor", "projector"}
	for _, s := range benchmark.HeadShapes() {
		want = append(want, s.Name)
	}
	// One event and three: the append's copied statements differ by shape.
	for _, n := range []int{1, 3} {
		res, err := benchmark.MeasureShapes(ctx, store, benchmark.AppendConfig{EventsPerTx: n, Writers: 2, Duration: 1200 * time.Millisecond}, benchmark.HeadShapes())
		if err != nil {
			t.Fatal(err)
		}
		if len(res) != len(want) {
			t.Fatalf("%d sides, want %d: %+v", len(res), len(want), res)
		}
		for i, r := range res {
			if r.Name != want[i] || r.Events <= 0 || r.Events%int64(n) != 0 {
				t.Errorf("%d events/tx, side %d: %+v, want %s with whole transactions of events", n, i, r, want[i])
			}
		}
	}
	// Interleaved: every side runs, and each reports its median.
	res, err := benchmark.MeasureShapesInterleaved(ctx, store, benchmark.AppendConfig{EventsPerTx: 2, Duration: 500 * time.Millisecond}, benchmark.HeadShapes())
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Name != want[i] || r.Events <= 0 || r.Median <= 0 || r.Median > r.Time {
			t.Errorf("interleaved side %d: %+v, want %s with a median", i, r, want[i])
		}
	}
	if n := count(t, store, `SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND (tablename LIKE 'bench\_shape\_%' OR tablename LIKE 'bench\_raw\_%')`, store.Schema()); n != 0 {
		t.Errorf("%d layout tables left behind", n)
	}
}

// MeasureLatencyRun counts the dispatcher's batches: at least one, at most
// one per event; none on the raw side. A poll interval out of range is
// refused before anything runs.
func TestMeasureLatencyRunBatches(t *testing.T) {
	t.Parallel()
	ctx, store := setup(t)
	cfg := benchmark.LatencyConfig{Rate: 200, Duration: 300 * time.Millisecond, PollMin: 2 * time.Millisecond}
	run, err := benchmark.MeasureLatencyRun(ctx, store, benchmark.PolledDispatcher, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if n := int64(len(run.Samples)); run.Batches < 1 || run.Batches > n {
		t.Errorf("%d batches for %d events", run.Batches, n)
	}
	raw, err := benchmark.MeasureLatencyRun(ctx, store, benchmark.ListenNotify, cfg)
	if err != nil || raw.Batches != 0 || len(raw.Samples) == 0 {
		t.Errorf("raw side: %d batches, %d samples, %v", raw.Batches, len(raw.Samples), err)
	}
	cfg.PollMin = -time.Millisecond
	if _, err := benchmark.MeasureLatencyRun(ctx, store, benchmark.PolledDispatcher, cfg); err == nil || !strings.Contains(err.Error(), "poll interval") {
		t.Errorf("negative poll interval: %v", err)
	}
}
