package postgres_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/internal/benchmark"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/stores/postgres"
)

// BenchmarkAppend compares Projector's append with two baselines, one
// transaction per op, 1 and 100 events per transaction, each transaction
// also inserting one business row: a raw INSERT of rows of the same shape
// into a table with the same columns and indexes (the cost of our code),
// and the same payloads into the cheapest gap-safe outbox table (the cost
// of our schema too). Each iteration runs one op of each side back to
// back, so drift on a shared machine (disk flushes, neighbours) hits all
// alike; the benchmark reports the rates and both ratios, the figures in
// docs/performance.md. The work itself is benchmark.Appender, shared with
// `projector bench`.
func BenchmarkAppend(b *testing.B) {
	for _, n := range []int{1, 100} {
		b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) { benchAppend(b, n) })
	}
}

// BenchmarkAppendNoFlush is BenchmarkAppend with synchronous_commit off on
// every side, so no commit waits for its WAL flush: what is left is the
// statements, the round trips and our code, the part of an append that
// Projector can change. On a shared machine the flush's time varies more
// than the difference between the sides; this is the figure to compare a
// change to the append by, and BenchmarkAppend the one to report.
func BenchmarkAppendNoFlush(b *testing.B) {
	for _, n := range []int{1, 4, 100} {
		b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) {
			cfg := pgtest.PoolConfig(b)
			cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
			store, err := postgres.New(context.Background(), pgtest.PoolFromConfig(b, cfg),
				postgres.Config{Schema: pgtest.Schema(b), Registry: benchmark.NewRegistry()})
			if err != nil {
				b.Fatal(err)
			}
			benchAppendOn(b, store, n)
		})
	}
}

func benchAppend(b *testing.B, n int) {
	benchAppendOn(b, pgtest.Store(b, benchmark.NewRegistry()), n)
}

func benchAppendOn(b *testing.B, store *postgres.Store, n int) {
	benchAppendCtx(b, context.Background(), store, n)
}

// benchAppendCtx is benchAppendOn with the appends' context: a traced one
// for BenchmarkAppendTracing.
func benchAppendCtx(b *testing.B, ctx context.Context, store *postgres.Store, n int) {
	a, err := benchmark.NewAppender(ctx, store, n)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = a.Close(ctx) })
	w := a.Writer(0)
	var t benchmark.Throughput
	var floor benchmark.Throughput // Raw* is the outbox floor
	var pairs []float64            // raw ÷ Projector, op by op
	var raws, projs []time.Duration
	for b.Loop() {
		raw, fl, proj, err := w.Triple(ctx)
		if err != nil {
			b.Fatal(err)
		}
		t.Add(benchmark.Throughput{RawEvents: int64(n), ProjectorEvents: int64(n), RawTime: raw, ProjectorTime: proj})
		floor.Add(benchmark.Throughput{RawEvents: int64(n), ProjectorEvents: int64(n), RawTime: fl, ProjectorTime: proj})
		pairs = append(pairs, float64(raw)/float64(proj))
		raws, projs = append(raws, raw), append(projs, proj)
	}
	t.Report(b)
	// The median of the op-by-op ratios: on a loaded machine one stalled
	// transaction moves the ratio of the sums by points, the median not.
	slices.Sort(pairs)
	slices.Sort(raws)
	slices.Sort(projs)
	if len(pairs) > 0 {
		b.ReportMetric(100*pairs[len(pairs)/2], "median-%-of-raw")
		b.ReportMetric(float64(raws[len(raws)/2].Microseconds()), "median-raw-µs/tx")
		b.ReportMetric(float64(projs[len(projs)/2].Microseconds()), "median-projector-µs/tx")
	}
	b.ReportMetric(floor.RawRate(), "floor-events/s")
	b.ReportMetric(100*floor.Ratio(), "%-of-floor")
}

// BenchmarkAppendWriters is the append against both baselines with 1, 4
// and 16 concurrent writers (benchmark.MeasureAppend: the sides take turns
// in 200ms slices, all writers on one side at once), 1 and 100 events per
// transaction: the points issue 15 sets its ≥ 90 %-of-floor target at.
// Each iteration measures for PROJECTOR_BENCH_APPEND_SECONDS seconds
// (default 3), all three sides together.
func BenchmarkAppendWriters(b *testing.B) {
	d := appendSeconds()
	for _, n := range []int{1, 100} {
		for _, writers := range benchmark.DefaultWriterCounts() {
			b.Run(fmt.Sprintf("events=%d/writers=%d", n, writers), func(b *testing.B) {
				sum := measureAppendLoop(b, pgtest.Store(b, benchmark.NewRegistry()), n, writers, d)
				sum.Report(b)
				b.ReportMetric(sum.FloorRate(), "floor-events/s")
				b.ReportMetric(100*sum.FloorRatio(), "%-of-floor")
			})
		}
	}
}

// BenchmarkAppendSchemaCosts measures what each index and row of the append
// costs, by taking it away in a scratch schema and measuring the append
// against the outbox floor of the same run (benchmark.MeasureAppend, 16
// and 4 writers, 1 and 100 events per transaction). The same-shape raw
// baseline follows each variant (its table is created LIKE the events
// table after the change), so raw ÷ floor is what the schema costs and
// Projector ÷ raw what the code and the stream head row cost. Run with
// -benchtime 1x; docs/performance.md has the table.
func BenchmarkAppendSchemaCosts(b *testing.B) {
	d := appendSeconds()
	const (
		dropType = `DROP INDEX {{s}}.projector_events_type`
		// The partition index is opt-in (Store.CreatePartitionIndex):
		// what it costs the appends of a schema that carries it.
		addPart      = `CREATE INDEX projector_events_partition ON {{s}}.projector_events ({{s}}.projector_stream_bucket(tenant_id, stream_type, stream_id), tx_id, seq)`
		dropID       = `ALTER TABLE {{s}}.projector_events DROP CONSTRAINT projector_events_id_key`
		dropVersion  = `ALTER TABLE {{s}}.projector_events DROP CONSTRAINT projector_events_tenant_id_stream_type_stream_id_version_key`
		headsFill100 = `ALTER TABLE {{s}}.projector_streams SET (fillfactor = 100)`
		// A bigint stream number in the per-stream key instead of the three
		// texts. Stored generated from the stream's texts, so the raw
		// insert (its table LIKE this one INCLUDING ALL) and the append
		// write it without a change to either: a stand-in, at the cost of
		// one hash per row, for a number the head row would hand out.
		streamNumber = `ALTER TABLE {{s}}.projector_events ADD COLUMN stream_no bigint NOT NULL
			GENERATED ALWAYS AS (hashtextextended(tenant_id || '/' || stream_type || '/' || stream_id, 0)) STORED`
		streamNumberKey = `CREATE UNIQUE INDEX projector_events_stream_no ON {{s}}.projector_events (stream_no, version)`
	)
	variants := []struct {
		name string
		ddl  []string
	}{
		{"as-is", nil},
		{"no-type-index", []string{dropType}},
		{"with-partition-index", []string{addPart}},
		{"no-event-id-unique", []string{dropID}},
		{"no-stream-version-unique", []string{dropVersion}},
		{"primary-key-only", []string{dropType, dropID, dropVersion}},
		{"stream-heads-fillfactor-100", []string{headsFill100}},
		{"stream-number-key", []string{dropVersion, streamNumber, streamNumberKey}},
	}
	for _, v := range variants {
		for _, n := range []int{1, 100} {
			for _, writers := range []int{4, 16} {
				b.Run(fmt.Sprintf("%s/events=%d/writers=%d", v.name, n, writers), func(b *testing.B) {
					ctx := context.Background()
					store := pgtest.Store(b, benchmark.NewRegistry())
					for _, ddl := range v.ddl {
						if _, err := store.Pool().Exec(ctx, strings.ReplaceAll(ddl, "{{s}}", pgx.Identifier{store.Schema()}.Sanitize())); err != nil {
							b.Fatal(err)
						}
					}
					sum := measureAppendLoop(b, store, n, writers, d)
					b.ReportMetric(100*sum.FloorRatio(), "%-of-floor")
					b.ReportMetric(100*sum.RawRate()/sum.FloorRate(), "raw-%-of-floor")
					b.ReportMetric(100*sum.Ratio(), "%-of-raw")
				})
			}
		}
	}
}

// BenchmarkAppendRowShapes measures candidate layouts of the event log
// (benchmark.RowShapes: a narrow row with a stream number, the same in one
// statement with the stream head, the narrow row with two indexes, one row
// per commit) as hand-written inserts, beside the outbox floor and
// Projector's append on today's schema, all in one run taking turns
// (benchmark.MeasureRowShapes). It answers what a migration to each layout
// could buy before any code is written: each side is reported as a
// percentage of the floor. Run with -benchtime 1x; docs/performance.md has
// the table.
func BenchmarkAppendRowShapes(b *testing.B) {
	d := 4 * appendSeconds()
	for _, n := range []int{1, 100} {
		for _, writers := range []int{4, 16} {
			b.Run(fmt.Sprintf("events=%d/writers=%d", n, writers), func(b *testing.B) {
				ctx := context.Background()
				store := pgtest.Store(b, benchmark.NewRegistry())
				sums := map[string]*benchmark.ShapeResult{}
				var names []string
				for b.Loop() {
					res, err := benchmark.MeasureRowShapes(ctx, store, benchmark.AppendConfig{EventsPerTx: n, Writers: writers, Duration: d})
					if err != nil {
						b.Fatal(err)
					}
					for _, r := range res {
						if sums[r.Name] == nil {
							sums[r.Name] = &benchmark.ShapeResult{Name: r.Name}
							names = append(names, r.Name)
						}
						sums[r.Name].Events += r.Events
						sums[r.Name].Time += r.Time
					}
				}
				floor := sums["outbox-floor"].Rate()
				b.ReportMetric(floor, "floor-events/s")
				for _, name := range names[1:] {
					b.ReportMetric(100*sums[name].Rate()/floor, "%-floor:"+name)
				}
			})
		}
	}
}

// appendSeconds is how long each iteration of the multi-writer append
// benchmarks measures: PROJECTOR_BENCH_APPEND_SECONDS, default 3.
func appendSeconds() time.Duration {
	if s, err := strconv.Atoi(os.Getenv("PROJECTOR_BENCH_APPEND_SECONDS")); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	return 3 * time.Second
}

// measureAppendLoop runs benchmark.MeasureAppend on store once per
// iteration and sums the three sides' figures.
func measureAppendLoop(b *testing.B, store *postgres.Store, n, writers int, d time.Duration) benchmark.AppendResult {
	ctx := context.Background()
	var sum benchmark.AppendResult
	for b.Loop() {
		r, err := benchmark.MeasureAppend(ctx, store, benchmark.AppendConfig{EventsPerTx: n, Writers: writers, Duration: d})
		if err != nil {
			b.Fatal(err)
		}
		sum.Add(r.Throughput)
		sum.FloorEvents += r.FloorEvents
		sum.FloorTime += r.FloorTime
	}
	return sum
}

// BenchmarkAppendHeadShapes measures issue 22's "no separate head row"
// avenue before any migration (benchmark.HeadShapes): today's events table
// written with the head upsert of today's append, without a head row (the
// version and promise 4's order checked against the stream's last event
// through the per-stream unique key), the same with an advisory lock per
// append, and with a hash index on the event id — beside the outbox floor
// and Projector's append, all taking turns in one run. Run with
// -benchtime 1x; docs/performance.md has the table.
//
// With PROJECTOR_BENCH_NO_FLUSH=1 every side runs with synchronous_commit
// off, as BenchmarkAppendNoFlush: what is left is the statements, which is
// what the layouts change, without the commit's flush that swamps them on a
// shared machine.
func BenchmarkAppendHeadShapes(b *testing.B) {
	d := 2 * appendSeconds()
	noFlush := os.Getenv("PROJECTOR_BENCH_NO_FLUSH") == "1"
	for _, n := range []int{1, 4, 100} {
		for _, writers := range benchmark.DefaultWriterCounts() {
			b.Run(fmt.Sprintf("events=%d/writers=%d", n, writers), func(b *testing.B) {
				ctx := context.Background()
				cfg := pgtest.PoolConfig(b)
				if noFlush {
					cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
				}
				store, err := postgres.New(ctx, pgtest.PoolFromConfig(b, cfg), postgres.Config{Schema: pgtest.Schema(b), Registry: benchmark.NewRegistry()})
				if err != nil {
					b.Fatal(err)
				}
				sums := map[string]*benchmark.ShapeResult{}
				var names []string
				for b.Loop() {
					res, err := benchmark.MeasureShapes(ctx, store, benchmark.AppendConfig{EventsPerTx: n, Writers: writers, Duration: d}, benchmark.HeadShapes())
					if err != nil {
						b.Fatal(err)
					}
					for _, r := range res {
						if sums[r.Name] == nil {
							sums[r.Name] = &benchmark.ShapeResult{Name: r.Name}
							names = append(names, r.Name)
						}
						sums[r.Name].Events += r.Events
						sums[r.Name].Time += r.Time
					}
				}
				floor := sums["outbox-floor"].Rate()
				b.ReportMetric(floor, "floor-events/s")
				for _, name := range names[1:] {
					b.ReportMetric(100*sums[name].Rate()/floor, "%-floor:"+name)
				}
			})
		}
	}
}

// BenchmarkAppendHeadShapesInterleaved is BenchmarkAppendHeadShapes op by
// op with one writer (benchmark.MeasureShapesInterleaved), each side's
// median transaction reported as a percentage of the floor's median
// (floor ÷ side: higher is faster). With PROJECTOR_BENCH_NO_FLUSH=1
// synchronous_commit is off on every side.
func BenchmarkAppendHeadShapesInterleaved(b *testing.B) {
	benchShapesInterleaved(b, benchmark.HeadShapes())
}

// BenchmarkAppendIndexShapesInterleaved is BenchmarkAppendHeadShapesInterleaved
// over benchmark.IndexShapes: today's events table with each secondary index
// taken away in turn, what each costs an append of 1, 4 and 100 events.
func BenchmarkAppendIndexShapesInterleaved(b *testing.B) {
	benchShapesInterleaved(b, benchmark.IndexShapes())
}

func benchShapesInterleaved(b *testing.B, shapes []benchmark.RowShape) {
	d := 2 * appendSeconds()
	noFlush := os.Getenv("PROJECTOR_BENCH_NO_FLUSH") == "1"
	for _, n := range []int{1, 4, 100} {
		b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) {
			ctx := context.Background()
			cfg := pgtest.PoolConfig(b)
			if noFlush {
				cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
			}
			store, err := postgres.New(ctx, pgtest.PoolFromConfig(b, cfg), postgres.Config{Schema: pgtest.Schema(b), Registry: benchmark.NewRegistry()})
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				res, err := benchmark.MeasureShapesInterleaved(ctx, store, benchmark.AppendConfig{EventsPerTx: n, Duration: d}, shapes)
				if err != nil {
					b.Fatal(err)
				}
				floor := res[0].Median
				b.ReportMetric(float64(floor.Microseconds()), "floor-median-µs")
				for _, r := range res[1:] {
					b.ReportMetric(100*float64(floor)/float64(r.Median), "%-floor:"+r.Name)
				}
			}
		})
	}
}
