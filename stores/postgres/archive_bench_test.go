package postgres_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/benchmark"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/stores/postgres"
)

// BenchmarkAppendArchived90 measures the target for archiving:
// appends to a log of N events of which 90 % were archived (the 10 % hot
// in projector_events, the rest in projector_events_archive) beside the
// same appends, alternated in the same run, to a log holding only the hot
// 10 % (the baseline). It reports both per-append times and their ratio.
// Runs only with PROJECTOR_BENCH_ARCHIVE=N (events, e.g. 1000000).
func BenchmarkAppendArchived90(b *testing.B) {
	n, err := strconv.Atoi(os.Getenv("PROJECTOR_BENCH_ARCHIVE"))
	if err != nil || n < 1000 {
		b.Skip("set PROJECTOR_BENCH_ARCHIVE to the log size (at least 1000 events) to build the logs")
	}
	ctx := context.Background()
	fill := func(store *postgres.Store, table string, from, to int) {
		fillArchiveBenchLog(ctx, b, store, table, from, to)
	}
	hot := n / 10
	baseline := pgtest.Store(b, benchmark.NewRegistry())
	fill(baseline, "projector_events", 0, hot)
	archived := pgtest.Store(b, benchmark.NewRegistry())
	fill(archived, "projector_events", 0, hot)
	fill(archived, "projector_events_archive", hot, n)
	appendOne := func(store *postgres.Store, i int) time.Duration {
		start := time.Now()
		if err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
			_, err := store.Append(ctx, tx, projector.Stream("ticket", fmt.Sprint("new-", i)), projector.NoStream, benchmark.Appended{})
			return err
		}); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	var ours, base time.Duration
	b.ResetTimer()
	for i := range b.N {
		ours += appendOne(archived, i)
		base += appendOne(baseline, i)
	}
	b.StopTimer()
	b.ReportMetric(float64(ours.Microseconds())/float64(b.N), "archived90-us/append")
	b.ReportMetric(float64(base.Microseconds())/float64(b.N), "hotonly-us/append")
	b.ReportMetric(float64(ours)/float64(base), "ratio")
}

// fillArchiveBenchLog writes events from..to-1 (ten to a stream, all
// ticket.commented, 400 days old) into table of store in 250,000-row
// statements and analyzes it: the logs the archive benchmarks compare.
func fillArchiveBenchLog(ctx context.Context, b *testing.B, store *postgres.Store, table string, from, to int) {
	b.Helper()
	for lo := from; lo < to; lo += 250_000 {
		hi := min(to, lo+250_000)
		if _, err := store.Pool().Exec(ctx, `INSERT INTO `+store.Table(table)+`
			(tx_id, seq, id, tenant_id, stream_type, stream_id, version, type, schema_version, data, correlation_id, actor, recorded_at)
			OVERRIDING SYSTEM VALUE
			SELECT pg_current_xact_id(), g + 1, gen_random_uuid(), $1, 'ticket', (g / 10)::text, g % 10 + 1, 'ticket.commented', 1, '{"body":"c"}',
				gen_random_uuid(), '', now() - interval '400 days'
			FROM generate_series($2::bigint, $3::bigint - 1) g`, projector.SystemTenant, lo, hi); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := store.Pool().Exec(ctx, `VACUUM ANALYZE `+store.Table(table)); err != nil {
		b.Fatal(err)
	}
}
