package cli

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/projectorhq/projector/internal/benchmark"
	"github.com/projectorhq/projector/projection"
)

func (a *App) benchCmd() *cobra.Command {
	var cfg benchmark.Config
	var format string
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure append, catch-up, latency and rebuild on this database, each beside its raw-PostgreSQL baseline",
		Long: `bench measures Projector on the configured database and prints each figure beside
the raw-PostgreSQL baseline of the same work, measured in the same run:

  append        Store.Append, with a business row in the same transaction,
                against two baselines with the same business row: one
                INSERT … SELECT FROM unnest of rows of the same shape into a
                table of the same shape (our code), and the same payloads into
                the cheapest gap-safe outbox table (identity id, xid8, stream
                key, payload, one index: our schema); 1 and 100 events per
                transaction by default (--events-per-tx, a list), with each
                count of --writers (1,4,16)
  catch-up      a dispatcher catching up a --events backlog with a counting
                projection (one upsert per stream) against two hand-written
                loops: the floor, reading the one column the upsert needs, and
                a decoding loop reading the columns a handler uses and decoding
                each payload into its Go type; per-event handlers (plain and
                queued writes), and the batch (OnBatch + unnest) form with
                payloads decoded and without (RawPayloads)
  latency       append commit to AfterCommit at --rate events/s, p50 and p99,
                against LISTEN/NOTIFY from the same commit (the floor): a
                dispatcher on the appenders' Store (woken in memory by their
                appends) and, "polled", one on a Store of its own (as in
                another process: it finds appends by polling)
  rebuild       a blue/green rebuild of the batch-form counting projection over
                a log of --rebuild-events events (default 1,000,000), beside the
                live catch-up of the same projection and the raw loop, with the
                switch's lock time; shadow batches of --rebuild-batch-size
                (default 10× --batch-size)

With --tracing it also measures what tracing costs: appends (each size of
--events-per-tx, one writer, each transaction under an application span) and the
batch catch-up, each three ways beside the same work with tracing off: "tracing
no-op" with the OpenTelemetry API's default no-op provider (no SDK), "tracing
sampled-out" with the SDK sampling nothing, "tracing on" with every span sampled and
recorded by the SDK (batch span processor, an exporter that discards). Each runs in
pairs with the untraced work, the two back to back (untraced first, then traced
first, alternately), and its "% of untraced" is the median of the pairs' ratios,
printed with their lowest and highest, so a load spike on a shared machine moves
one pair, not the figure. The catch-up runs --tracing-pairs pairs per mode
(default 7, odd so the median is one pair's).

It works in schemas of its own (projector_bench_<random>, one for the rebuild, one for --tracing),
created and migrated at the start and dropped at the end, also on failure or Ctrl-C; --schema is not
used. It loads the database while it runs: do not point it at a busy production
primary. See docs/performance.md for what each line means.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			asJSON, err := outputFormat(format)
			if err != nil {
				return err
			}
			for _, f := range []struct {
				name     string
				positive bool
			}{
				{"writers", len(cfg.Writers) > 0 && slices.Min(cfg.Writers) > 0}, {"append-duration", cfg.AppendDuration > 0},
				{"events-per-tx", len(cfg.EventsPerTx) > 0 && slices.Min(cfg.EventsPerTx) > 0},
				{"events", cfg.Backlog > 0}, {"batch-size", cfg.BatchSize > 0},
				{"rate", cfg.Rate > 0}, {"latency-duration", cfg.LatencyDuration > 0},
				{"rebuild-events", cfg.RebuildEvents > 0}, {"tracing-pairs", cfg.TracingPairs > 0},
			} {
				if !f.positive {
					return usageError{fmt.Errorf("--%s must be positive", f.name)}
				}
			}
			if cmd.Flags().Changed("tracing-pairs") && !cfg.Tracing {
				return usageError{errors.New("--tracing-pairs counts the pairs of --tracing: add --tracing, or drop --tracing-pairs")}
			}
			if cfg.RebuildBatchSize < 0 {
				return usageError{errors.New("--rebuild-batch-size must not be negative (0 is the projection's default)")}
			}
			for _, d := range []struct {
				name string
				v    time.Duration
			}{{"append-duration", cfg.AppendDuration}, {"latency-duration", cfg.LatencyDuration}} {
				if d.v > maxBenchDuration {
					return usageError{fmt.Errorf("--%s %v: want more than 0 and at most %v", d.name, d.v, maxBenchDuration)}
				}
			}
			if err := cfg.Validate(); err != nil {
				return usageError{benchFlagError(err)}
			}
			pool, err := a.Pool(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			cfg.Progress = func(msg string) { fmt.Fprintf(a.errOut, "bench: %s\n", msg) }
			rep, err := benchmark.Run(cmd.Context(), pool, cfg)
			if err != nil && cmd.Context().Err() != nil {
				// Ctrl-C: say so, not just "context canceled".
				return fmt.Errorf("bench: interrupted: no figures (its schema was dropped): %w", err)
			}
			if err != nil {
				return fmt.Errorf("bench: %w", err)
			}
			return writeBench(a.out, rep, asJSON)
		},
	}
	f := cmd.Flags()
	f.IntSliceVar(&cfg.Writers, "writers", benchmark.DefaultWriterCounts(), "concurrent appenders in the append figures, a list: each count is measured")
	f.IntSliceVar(&cfg.EventsPerTx, "events-per-tx", benchmark.DefaultEventsPerTxCounts(), "events each append transaction writes, a list: each size is measured with each count of --writers")
	f.DurationVar(&cfg.AppendDuration, "append-duration", benchmark.DefaultAppendDuration, "measuring time of each append figure, both sides together")
	f.IntVar(&cfg.Backlog, "events", benchmark.DefaultBacklog, "catch-up backlog in events")
	f.IntVar(&cfg.BatchSize, "batch-size", projection.DefaultBatchSize, "catch-up events per transaction, both sides")
	f.IntVar(&cfg.Rate, "rate", benchmark.DefaultRate, "latency figures: events appended per second")
	f.DurationVar(&cfg.LatencyDuration, "latency-duration", benchmark.DefaultLatencyDuration, "latency figures: how long each side appends")
	f.IntVar(&cfg.RebuildEvents, "rebuild-events", benchmark.DefaultRebuildEvents, "rebuild figures: events in the replayed log")
	f.IntVar(&cfg.RebuildBatchSize, "rebuild-batch-size", 0, "rebuild figures: events per shadow transaction (0: the projection's default, 10× --batch-size)")
	f.BoolVar(&cfg.Tracing, "tracing", false, "also measure appends and a catch-up with the no-op provider, an SDK sampling nothing and every span recorded, each beside the same work untraced")
	f.IntVar(&cfg.TracingPairs, "tracing-pairs", benchmark.TracingCatchUpPairs, "with --tracing: untraced/traced pairs of catch-ups per mode, odd (the figure is their median)")
	f.StringVarP(&format, "output", "o", "table", "output format: table or json")
	return cmd
}

// maxBenchDuration bounds --append-duration and --latency-duration: each
// is measured several times over, so a mistyped unit (1000000h) would load
// the database for longer than anyone means.
const maxBenchDuration = time.Hour

// benchFlagNames maps the names benchmark.Config.Validate gives its
// sizes to the flags that set them, longest first ("rebuild batch size"
// before "batch size").
var benchFlagNames = []struct{ what, flag string }{
	{"events per transaction", "--events-per-tx"}, {"rebuild batch size", "--rebuild-batch-size"},
	{"rebuild events", "--rebuild-events"}, {"backlog events", "--events"}, {"batch size", "--batch-size"},
	{"writers", "--writers"}, {"rate", "--rate"}, {"tracing pairs", "--tracing-pairs"},
}

// benchFlagError is benchmark.Config.Validate's error naming the flags:
// it checks each append figure and each phase on its own, so a bad
// --writers or --batch-size came back once per figure, under the
// internal name of the size.
func benchFlagError(err error) error {
	var lines []string
	for _, l := range strings.Split(err.Error(), "\n") {
		for _, n := range benchFlagNames {
			if rest, ok := strings.CutPrefix(l, n.what+" "); ok {
				l = n.flag + " " + strings.Replace(rest, " outside ", ": want ", 1)
				break
			}
		}
		if l != "" && !slices.Contains(lines, l) {
			lines = append(lines, l)
		}
	}
	return &hiddenError{msg: strings.Join(lines, "; "), err: err}
}

// BenchJSON is the output of `bench -o json`.
type BenchJSON struct {
	Schema        string            `json:"schema"`
	ServerVersion string            `json:"server_version"`
	Config        BenchConfigJSON   `json:"config"`
	Figures       []BenchFigureJSON `json:"figures"`
	Rebuild       BenchRebuildJSON  `json:"rebuild"`
}

// BenchRebuildJSON is the rebuild measurement beyond its two figures: the
// batches each side used, the rebuild's rate over the live catch-up's
// (issue 9's target is at least 1.5) and how long the switch held the live
// tables.
type BenchRebuildJSON struct {
	Events           int     `json:"events"`
	BatchSize        int     `json:"batch_size"`
	RebuildBatchSize int     `json:"rebuild_batch_size"`
	RawRate          float64 `json:"raw_events_per_second"`
	LiveRate         float64 `json:"live_events_per_second"`
	RebuildRate      float64 `json:"rebuild_events_per_second"`
	SpeedupVsLive    float64 `json:"speedup_vs_live"`
	SwitchLockMS     float64 `json:"switch_lock_ms"`
}

// BenchConfigJSON is the configuration a bench run used, defaults filled
// in, so a figure can be reproduced.
type BenchConfigJSON struct {
	EventsPerTx []int `json:"events_per_tx"`
	// Writers lists the writer counts each append size was measured with.
	Writers        []int   `json:"writers"`
	AppendSeconds  float64 `json:"append_seconds"`
	Backlog        int     `json:"backlog_events"`
	BatchSize      int     `json:"batch_size"`
	Rate           int     `json:"rate_events_per_second"`
	LatencySeconds float64 `json:"latency_seconds"`
	RebuildEvents  int     `json:"rebuild_events"`
	// RebuildBatchSize is 0 when the projection's default was used; the
	// batch used is in BenchRebuildJSON.
	RebuildBatchSize int `json:"rebuild_batch_size"`
	// Tracing is set when the run measured the tracing figures.
	Tracing bool `json:"tracing,omitempty"`
}

// BenchFigureJSON is one figure: Projector beside its raw baseline, in
// Unit. Ratio is projector / raw (0 when raw is 0): a fraction of raw for
// throughput, a multiple of the floor for latency. The catch-up figures
// also carry the decoding baseline (the raw loop reading the columns a
// handler uses and decoding payloads as the form does) and Projector's
// ratio to it; the others leave both out.
type BenchFigureJSON struct {
	Figure    string  `json:"figure"`
	Unit      string  `json:"unit"`
	Projector float64 `json:"projector"`
	Raw       float64 `json:"raw"`
	// Baseline is what Raw measured: "raw" (the same work in plain SQL),
	// "floor" (the append's outbox floor) or "untraced" (the same work
	// with tracing off, for the --tracing figures).
	Baseline      string  `json:"baseline"`
	Ratio         float64 `json:"ratio"`
	RawDecoding   float64 `json:"raw_decoding,omitempty"`
	RatioDecoding float64 `json:"ratio_decoding,omitempty"`
	LowerIsBetter bool    `json:"lower_is_better"`
	PeakHeapMiB   float64 `json:"peak_heap_mib,omitempty"`
	// Pairs is set on the tracing figures: each pair's traced rate over
	// its untraced rate, the two run back to back, in the order they ran;
	// Ratio is then their median, RatioMin and RatioMax their spread.
	Pairs    []float64 `json:"pairs,omitempty"`
	RatioMin float64   `json:"ratio_min,omitempty"`
	RatioMax float64   `json:"ratio_max,omitempty"`
}

func writeBench(w io.Writer, rep benchmark.Report, asJSON bool) error {
	figs := rep.Figures()
	rb := rep.Rebuild
	if asJSON {
		c := rep.Config
		out := BenchJSON{
			Schema: rep.Schema, ServerVersion: rep.ServerVersion,
			Config: BenchConfigJSON{
				EventsPerTx: c.EventsPerTx, Writers: c.Writers, AppendSeconds: c.AppendDuration.Seconds(),
				Backlog: c.Backlog, BatchSize: c.BatchSize, Rate: c.Rate, LatencySeconds: c.LatencyDuration.Seconds(),
				RebuildEvents: c.RebuildEvents, RebuildBatchSize: c.RebuildBatchSize, Tracing: c.Tracing,
			},
			Rebuild: BenchRebuildJSON{
				Events: rb.Events, BatchSize: rb.BatchSize, RebuildBatchSize: rb.RebuildBatchSize,
				RawRate: rb.RawRate(), LiveRate: rb.LiveRate(), RebuildRate: rb.RebuildRate(),
				SpeedupVsLive: rb.Speedup(), SwitchLockMS: float64(rb.SwitchLock.Microseconds()) / 1000,
			},
			Figures: make([]BenchFigureJSON, len(figs)),
		}
		for i, f := range figs {
			out.Figures[i] = BenchFigureJSON{
				Figure: f.Name, Unit: f.Unit, Projector: f.Projector, Raw: f.Raw, Ratio: f.Ratio(),
				RawDecoding: f.RawDecoding, RatioDecoding: f.DecodingRatio(), Baseline: cmp.Or(f.Baseline, "raw"),
				LowerIsBetter: f.LowerIsBetter, PeakHeapMiB: f.PeakHeapMiB,
			}
			if len(f.PairRatios) > 0 {
				out.Figures[i].Pairs = f.PairRatios
				out.Figures[i].RatioMin, out.Figures[i].RatioMax = f.RatioSpread()
			}
		}
		return writeJSON(w, out)
	}
	fmt.Fprintf(w, "PostgreSQL %s, schema %s (dropped)\n\n", rep.ServerVersion, rep.Schema)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FIGURE\tPROJECTOR\tRAW BASELINE\tRATIO\tDECODING BASELINE\tRATIO")
	for _, f := range figs {
		dec, decRatio := "-", "-"
		if f.RawDecoding > 0 {
			dec, decRatio = value(f.RawDecoding, f.Unit), fmt.Sprintf("%.0f%% of decoding", 100*f.DecodingRatio())
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", f.Name, value(f.Projector, f.Unit), value(f.Raw, f.Unit), ratio(f), dec, decRatio)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	heap := ""
	for i, c := range rep.CatchUp {
		if i > 0 {
			heap += ", "
		}
		heap += fmt.Sprintf("%.1f MiB (%s)", float64(c.PeakHeap)/(1<<20), c.Form)
	}
	fmt.Fprintf(w, "\ndispatcher's peak Go heap during catch-up: %s\n", heap)
	fmt.Fprintf(w, "catch-up backlog: %s events over %s streams, batches of %d\n",
		thousands(int64(rep.Config.Backlog)), thousands(benchmark.DefaultStreams), rep.Config.BatchSize)
	_, err := fmt.Fprintf(w, "blue/green rebuild: %.2f× the live catch-up rate (target ≥ 1.5×); the switch held the live tables %.1f ms\n"+
		"rebuild log: %s events over %s streams, live batches of %s, shadow batches of %s; peak Go heap %.1f MiB (live), %.1f MiB (rebuild)\n",
		rb.Speedup(), float64(rb.SwitchLock.Microseconds())/1000,
		thousands(int64(rb.Events)), thousands(benchmark.DefaultStreams), thousands(int64(rb.BatchSize)), thousands(int64(rb.RebuildBatchSize)),
		float64(rb.LivePeakHeap)/(1<<20), float64(rb.RebuildPeakHeap)/(1<<20))
	return err
}

func value(v float64, unit string) string {
	if unit == "ms" {
		return fmt.Sprintf("%.2f ms", v)
	}
	return thousands(int64(v+0.5)) + " " + unit
}

func ratio(f benchmark.Figure) string {
	r, of := f.Ratio(), cmp.Or(f.Baseline, "raw")
	switch {
	case r == 0:
		return "-"
	case f.LowerIsBetter && r >= 10:
		return fmt.Sprintf("%.0f× %s", r, of)
	case f.LowerIsBetter:
		return fmt.Sprintf("%.1f× %s", r, of)
	case len(f.PairRatios) > 0:
		lo, hi := f.RatioSpread()
		return fmt.Sprintf("%.0f%% of %s (median of %d pairs, %.0f–%.0f%%)", 100*r, of, len(f.PairRatios), 100*lo, 100*hi)
	default:
		return fmt.Sprintf("%.0f%% of %s", 100*r, of)
	}
}

// thousands renders a count with thousands separators, as the docs print
// rates.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
