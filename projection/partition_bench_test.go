package projection_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// BenchmarkPartitions catches one consumer with a per-event handler (one
// upsert per event, the counting model) up on the same backlog with 1, 2, 4
// and 8 partitions in one process, beside a raw-PostgreSQL loop doing the
// same per-event upserts in batches of the same size on one connection in
// the same run (%-of-raw). A per-event handler is bound by round trips, so
// partitions applied at once overlap them. Each run also reports the rows a
// partition's read takes from the log per event it returns (EXPLAIN
// ANALYZE of one full batch read): 1 means it never walks another
// partition's rows.
func BenchmarkPartitions(b *testing.B) {
	e := partitioned(b)
	events := 20_000
	if n, err := strconv.Atoi(os.Getenv("PROJECTOR_BENCH_PARTITION_EVENTS")); err == nil && n > 0 {
		events = n
	}
	versions := appendWith(b, e.ctx, e.store, 4, events, 1000, "s")
	want := total(versions)
	pool := newBenchPool(b, e.store.Pool(), 20)
	store := e.storeOn(pool.Pool)
	run := 0
	for _, n := range []int{1, 2, 4, 8} {
		b.Run(fmt.Sprintf("partitions=%d", n), func(b *testing.B) {
			var ours, raw window
			for b.Loop() {
				run++
				raw = raw.add(pool.measure(b, e.ctx, func() { rawCatchUp(b, e, pool, fmt.Sprintf("raw-%d", run), 500) }))
				name := fmt.Sprintf("bench-%d", run)
				ours = ours.add(catchUp(b, e, pool, store, counting(e.schema, e.types, name, projection.AsyncConfig{Partitions: n}), name, n, want))
			}
			events := float64(want) * float64(b.N)
			b.ReportMetric(events/ours.wall.Seconds(), "events/s")
			b.ReportMetric(events/raw.wall.Seconds(), "raw-events/s")
			b.ReportMetric(100*raw.wall.Seconds()/ours.wall.Seconds(), "%-of-raw")
			b.ReportMetric(rowsReadPerEvent(b, e, n), "log-rows-read/event")
			ours.report(b, events, "")
			raw.report(b, events, "raw-")
		})
	}
}

// BenchmarkPartitionsBatch is BenchmarkPartitions with a batch handler (one
// unnest upsert per batch, a row per stream), unpartitioned (partitions=0)
// beside 1, 2, 4 and 8 partitions in the same run: one partition must cost
// nothing against the unpartitioned consumer (issue 21: >= 0.95x), and the
// probes say what more partitions gain when the server's CPU is the bound.
// Run it with -count to interleave the variants.
func BenchmarkPartitionsBatch(b *testing.B) {
	e := partitioned(b)
	events := 20_000
	if n, err := strconv.Atoi(os.Getenv("PROJECTOR_BENCH_PARTITION_EVENTS")); err == nil && n > 0 {
		events = n
	}
	want := total(appendWith(b, e.ctx, e.store, 4, events, 1000, "s"))
	pool := newBenchPool(b, e.store.Pool(), 20)
	store := e.storeOn(pool.Pool)
	upsert := `INSERT INTO ` + e.table("counts") + ` AS c (consumer, stream_id, n, last_version)
		SELECT $1, s, n, v FROM unnest($2::text[], $3::int[], $4::bigint[]) AS u(s, n, v)
		ON CONFLICT (consumer, stream_id) DO UPDATE SET n = c.n + excluded.n, last_version = excluded.last_version`
	run := 0
	consumer := func(n int) (*projection.Async, string) {
		run++
		name := fmt.Sprintf("batch-%d", run)
		p := projection.NewAsync(name, projection.AsyncConfig{Partitions: n})
		must(projection.OnBatch(p, func(ctx context.Context, tx pgx.Tx, batch projection.Batch) error {
			ids, ns, vs := make([]string, 0, len(batch.Streams)), make([]int, 0, len(batch.Streams)), make([]int64, 0, len(batch.Streams))
			for _, s := range batch.Streams {
				ids, ns, vs = append(ids, s.Stream.ID), append(ns, len(s.Events)), append(vs, s.Events[len(s.Events)-1].Version)
			}
			_, err := tx.Exec(ctx, upsert, name, ids, ns, vs)
			return err
		}, e.types.Opened, e.types.Commented, e.types.Closed))
		return p, name
	}
	// One catch-up unmeasured first: the first sub-benchmark would
	// otherwise pay alone for the new log's first reads, its statements'
	// preparation and the table's first analyze.
	warm, warmName := consumer(0)
	catchUp(b, e, pool, store, warm, warmName, 0, want)
	for _, n := range []int{0, 1, 2, 4, 8} {
		b.Run(fmt.Sprintf("partitions=%d", n), func(b *testing.B) {
			var ours window
			for b.Loop() {
				p, name := consumer(n)
				ours = ours.add(catchUp(b, e, pool, store, p, name, n, want))
			}
			events := float64(want) * float64(b.N)
			b.ReportMetric(events/ours.wall.Seconds(), "events/s")
			ours.report(b, events, "")
		})
	}
}

// catchUp runs a dispatcher of p (n partitions) until it has applied want
// events, and returns what that cost; the dispatcher's stop is not counted.
func catchUp(b *testing.B, e *env, pool *benchPool, store *postgres.Store, p *projection.Async, name string, n int, want int64) window {
	b.Helper()
	d, err := projection.New(projection.Config{Store: store, Projections: []*projection.Async{p}, Logger: quiet,
		Concurrency: max(n, 4), Recheck: 20 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	w := pool.measure(b, e.ctx, func() {
		if err := d.Start(e.ctx); err != nil {
			b.Fatal(err)
		}
		for e.applied(name) < want {
			time.Sleep(5 * time.Millisecond) // polling the model: the measured run is the dispatcher's
		}
	})
	if err := d.Stop(e.ctx); err != nil {
		b.Fatal(err)
	}
	return w
}

// rawCatchUp is the baseline: one transaction per batch that reads the
// batch in (tx_id, seq) order below the horizon, upserts per event (the
// counting model's statement) and moves on, on one connection.
func rawCatchUp(b *testing.B, e *env, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, consumer string, size int) {
	b.Helper()
	counts := e.table("counts")
	upsert := `INSERT INTO ` + counts + ` AS c (consumer, stream_id, n, last_version) VALUES ($1, $2, 1, $3)
		ON CONFLICT (consumer, stream_id) DO UPDATE SET n = c.n + 1, last_version = $3`
	read := `SELECT tx_id, seq, stream_id, version FROM ` + e.store.Table("projector_events") + `
		WHERE (tx_id, seq) > ($1::xid8, $2::bigint) AND tx_id < pg_snapshot_xmin(pg_current_snapshot())
		ORDER BY tx_id, seq LIMIT $3`
	var cur projector.Position
	for {
		tx, err := pool.Begin(e.ctx)
		if err != nil {
			b.Fatal(err)
		}
		rows, err := tx.Query(e.ctx, read, cur.TxID, cur.Seq, size)
		if err != nil {
			b.Fatal(err)
		}
		type ev struct {
			pos     projector.Position
			stream  string
			version int64
		}
		var batch []ev
		var x ev
		if _, err := pgx.ForEachRow(rows, []any{&x.pos.TxID, &x.pos.Seq, &x.stream, &x.version}, func() error { batch = append(batch, x); return nil }); err != nil {
			b.Fatal(err)
		}
		for _, ev := range batch {
			if _, err := tx.Exec(e.ctx, upsert, consumer, ev.stream, ev.version); err != nil {
				b.Fatal(err)
			}
		}
		if err := tx.Commit(e.ctx); err != nil {
			b.Fatal(err)
		}
		if len(batch) < size {
			return
		}
		cur = batch[len(batch)-1].pos
	}
}

// rowsReadPerEvent reads one full batch of partition 0 of n from the start
// of the log under EXPLAIN ANALYZE and returns the rows its scans took per
// row it returned.
func rowsReadPerEvent(b *testing.B, e *env, n int) float64 {
	b.Helper()
	seg, err := postgres.SegmentOf(0, n)
	if err != nil {
		b.Fatal(err)
	}
	table := e.store.Table("projector_events")
	sql := `SELECT * FROM ` + table + ` e WHERE (e.tx_id, e.seq) > ('0'::xid8, 0::bigint) AND e.tx_id < pg_snapshot_xmin(pg_current_snapshot()) ORDER BY e.tx_id, e.seq LIMIT 500`
	if n > 1 {
		branches := ""
		for i, bucket := range seg.Buckets() {
			if i > 0 {
				branches += " UNION ALL "
			}
			branches += fmt.Sprintf(`(SELECT * FROM %s e WHERE %s.projector_stream_bucket(e.tenant_id, e.stream_type, e.stream_id) = %d::smallint
				AND (e.tx_id, e.seq) > ('0'::xid8, 0::bigint) AND e.tx_id < pg_snapshot_xmin(pg_current_snapshot()) ORDER BY e.tx_id, e.seq LIMIT 500)`, table, e.store.Schema(), bucket)
		}
		sql = `SELECT * FROM (` + branches + `) u ORDER BY u.tx_id, u.seq LIMIT 500`
	}
	var plan []map[string]any
	// A partition's read runs with sorts and bitmap scans off for its own
	// statement (stores/postgres, readPartition): so does its copy here.
	explain := func(format string, dest any) {
		err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
			if n > 1 {
				if _, err := tx.Exec(e.ctx, `SET LOCAL enable_sort = off; SET LOCAL enable_bitmapscan = off`); err != nil {
					return err
				}
			}
			if text, ok := dest.(*[]string); ok {
				rows, _ := tx.Query(e.ctx, `EXPLAIN (ANALYZE, COSTS OFF) `+sql)
				var err error
				*text, err = pgx.CollectRows(rows, pgx.RowTo[string])
				return err
			}
			return tx.QueryRow(e.ctx, `EXPLAIN (ANALYZE, FORMAT `+format+`) `+sql).Scan(dest)
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	if os.Getenv("PROJECTOR_BENCH_SHOW_PLAN") != "" {
		var text []string
		explain("TEXT", &text)
		b.Log(strings.Join(text, "\n"))
	}
	explain("JSON", &plan)
	top := plan[0]["Plan"].(map[string]any)
	var scanned float64
	var walk func(node map[string]any)
	walk = func(node map[string]any) {
		if t, _ := node["Node Type"].(string); t == "Index Scan" || t == "Seq Scan" || t == "Index Only Scan" || t == "Bitmap Heap Scan" {
			scanned += node["Actual Rows"].(float64) + asFloat(node["Rows Removed by Filter"])
		}
		children, _ := node["Plans"].([]any)
		for _, c := range children {
			walk(c.(map[string]any))
		}
	}
	walk(top)
	returned := top["Actual Rows"].(float64)
	if returned == 0 {
		return 0
	}
	return scanned / returned
}

func asFloat(v any) float64 {
	f, _ := v.(float64)
	return f
}
