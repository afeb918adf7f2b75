package postgres_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/benchmark"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/stores/postgres"
)

// BenchmarkCatchUpArchive measures what the live feed's catch-up batch
// pays for reading the archive too (LogQuery.IncludeArchived, which the
// feed always sets): a batch of 500 events read after a cursor 500 events
// behind the head, the way the feed reads it (raw), from a log of N events
// of which 90 % are archived, with and without the archive, beside the
// same read of a log whose archive is empty. The archived events are the
// older ones, as `streams archive` leaves them. Sub-benchmarks read every
// type (a client without a filter) and one type. Runs only with
// PROJECTOR_BENCH_ARCHIVE=N (events, e.g. 1000000).
func BenchmarkCatchUpArchive(b *testing.B) {
	n, err := strconv.Atoi(os.Getenv("PROJECTOR_BENCH_ARCHIVE"))
	if err != nil || n < 10_000 {
		b.Skip("set PROJECTOR_BENCH_ARCHIVE to the log size (at least 10000 events) to build the logs")
	}
	ctx := context.Background()
	fill := func(store *postgres.Store, table string, from, to int) {
		fillArchiveBenchLog(ctx, b, store, table, from, to)
	}
	hot := n / 10
	emptyArchive := pgtest.Store(b, benchmark.NewRegistry())
	fill(emptyArchive, "projector_events", n-hot, n)
	archived := pgtest.Store(b, benchmark.NewRegistry())
	fill(archived, "projector_events_archive", 0, n-hot) // older: written first
	fill(archived, "projector_events", n-hot, n)
	const batch = 500
	cursor := func(store *postgres.Store) projector.Position {
		var p projector.Position
		if err := store.Pool().QueryRow(ctx, `SELECT tx_id, seq FROM `+store.Table("projector_events")+`
			ORDER BY tx_id DESC, seq DESC OFFSET $1 LIMIT 1`, batch).Scan(&p.TxID, &p.Seq); err != nil {
			b.Fatal(err)
		}
		return p
	}
	at := map[*postgres.Store]projector.Position{emptyArchive: cursor(emptyArchive), archived: cursor(archived)}
	for _, c := range []struct {
		name  string
		types []string
	}{{"all-types", nil}, {"one-type", []string{"ticket.commented"}}} {
		b.Run(c.name, func(b *testing.B) {
			read := func(store *postgres.Store, withArchive bool) time.Duration {
				start := time.Now()
				got, err := store.ReadLog(ctx, postgres.LogQuery{After: at[store], Limit: batch, EventTypes: c.types, Raw: true, IncludeArchived: withArchive})
				if err != nil || len(got.Events) != batch {
					b.Fatalf("read %d events: %v", len(got.Events), err)
				}
				return time.Since(start)
			}
			var big, hotOnly, empty time.Duration
			for b.Loop() {
				big += read(archived, true)
				hotOnly += read(archived, false)
				empty += read(emptyArchive, true)
			}
			per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(b.N) }
			b.ReportMetric(per(big), "archived90-us/batch")
			b.ReportMetric(per(hotOnly), "no-archive-read-us/batch")
			b.ReportMetric(per(empty), "empty-archive-us/batch")
			b.ReportMetric(float64(big)/float64(hotOnly), "ratio")
		})
	}
}
