package postgres_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/benchmark"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/stores/postgres"
)

// BenchmarkPruneStall measures what an `events prune` costs the
// dispatchers: while it deletes, every pass's cursor write waits for its
// SHARE lock on projector_consumers. On a log of N aggregate events
// (PROJECTOR_BENCH_PRUNE_EVENTS, default 100000,1000000,5000000) plus a
// slice of old session events per iteration (PROJECTOR_BENCH_PRUNE_BATCH,
// default 10000: what accumulates between two prunes), a goroutine writes
// a consumer's cursor in a loop, as passes do, and the benchmark reports
// the longest such write during Store.Prune (stall-ms), beside the same
// during a raw-PostgreSQL baseline that deletes the same number of old
// session events under the same lock by hand (raw-stall-ms), and the
// longest write with nothing running (idle-ms). Building the log takes
// minutes at 5M, so it runs only with PROJECTOR_BENCH_PRUNE=1.
func BenchmarkPruneStall(b *testing.B) {
	if os.Getenv("PROJECTOR_BENCH_PRUNE") == "" {
		b.Skip("set PROJECTOR_BENCH_PRUNE=1 to build the logs (minutes at 5M events)")
	}
	sizes := []int{100_000, 1_000_000, 5_000_000}
	if s := os.Getenv("PROJECTOR_BENCH_PRUNE_EVENTS"); s != "" {
		sizes = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				b.Fatalf("PROJECTOR_BENCH_PRUNE_EVENTS: %q", s)
			}
			sizes = append(sizes, n)
		}
	}
	slice := 10_000
	if n, err := strconv.Atoi(os.Getenv("PROJECTOR_BENCH_PRUNE_BATCH")); err == nil && n > 0 {
		slice = n
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) { benchPruneStall(b, n, slice) })
	}
}

func benchPruneStall(b *testing.B, size, slice int) {
	ctx := context.Background()
	store := pgtest.Store(b, benchmark.NewRegistry())
	events := store.Table("projector_events")
	fill := func(from, to int, streamType string, age string) {
		b.Helper()
		for lo := from; lo < to; lo += 250_000 {
			hi := min(to, lo+250_000)
			if _, err := store.Pool().Exec(ctx, `INSERT INTO `+events+`
				(id, tenant_id, stream_type, stream_id, version, type, schema_version, data, correlation_id, recorded_at)
				SELECT gen_random_uuid(), $1, $2, (g / 100)::text, g % 100 + 1, 'ticket.commented', 1, '{"body":"c"}', gen_random_uuid(), now() - $5::interval
				FROM generate_series($3::bigint, $4::bigint - 1) g`, projector.SystemTenant, streamType, lo, hi, age); err != nil {
				b.Fatal(err)
			}
		}
	}
	fill(0, size, "ticket", "30 days")
	next := size
	// A consumer that has passed everything, moved to the end before
	// each prune: the guard lets every old session event go.
	if _, err := store.Pool().Exec(ctx, `INSERT INTO `+store.Table("projector_consumers")+` (name, instance_id) VALUES ('bench', '__shared__')`); err != nil {
		b.Fatal(err)
	}
	toEnd := func() {
		b.Helper()
		if _, err := store.Pool().Exec(ctx, `UPDATE `+store.Table("projector_consumers")+` c SET (cursor_tx_id, cursor_seq) =
			(SELECT tx_id, seq FROM `+events+` ORDER BY tx_id DESC, seq DESC LIMIT 1) WHERE name = 'bench'`); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := store.Pool().Exec(ctx, `VACUUM ANALYZE `+events); err != nil {
		b.Fatal(err)
	}
	// stall runs op while a writer updates the cursor of another consumer
	// in a loop, as every pass ends, and returns the longest update.
	if _, err := store.Pool().Exec(ctx, `INSERT INTO `+store.Table("projector_consumers")+` (name, instance_id, status) VALUES ('writer', '__shared__', 'disabled')`); err != nil {
		b.Fatal(err)
	}
	stall := func(op func()) time.Duration {
		b.Helper()
		stop := make(chan struct{})
		var worst time.Duration
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				if _, err := store.Pool().Exec(ctx, `UPDATE `+store.Table("projector_consumers")+` SET updated_at = now() WHERE name = 'writer'`); err != nil {
					b.Error(err)
					return
				}
				worst = max(worst, time.Since(start))
			}
		})
		op()
		close(stop)
		wg.Wait()
		return worst
	}
	var pruneStalls, rawStalls, idle []time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		fill(next, next+slice, "session", "2 hours")
		next += slice
		toEnd()
		b.StartTimer()
		pruneStalls = append(pruneStalls, stall(func() {
			res, err := store.Prune(ctx, postgres.PruneOptions{OlderThan: time.Hour, StreamTypes: []string{"session"}, IncludeAggregates: true})
			if err != nil || res.Deleted != int64(slice) {
				b.Fatalf("prune: %+v, %v", res, err)
			}
		}))
		b.StopTimer()
		fill(next, next+slice, "session", "2 hours")
		next += slice
		rawStalls = append(rawStalls, stall(func() {
			err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `LOCK TABLE `+store.Table("projector_consumers")+` IN SHARE MODE`); err != nil {
					return err
				}
				tag, err := tx.Exec(ctx, `DELETE FROM `+events+` WHERE stream_type = 'session' AND recorded_at < now() - interval '1 hour'`)
				if err == nil && tag.RowsAffected() != int64(slice) {
					err = fmt.Errorf("raw delete: %d rows", tag.RowsAffected())
				}
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
		}))
		idle = append(idle, stall(func() { time.Sleep(200 * time.Millisecond) })) // a window of the same order, nothing running
		b.StartTimer()
	}
	med := func(ds []time.Duration) float64 {
		s := slices.Clone(ds)
		slices.Sort(s)
		return float64(s[len(s)/2].Microseconds()) / 1000
	}
	b.ReportMetric(med(pruneStalls), "stall-ms")
	b.ReportMetric(med(rawStalls), "raw-stall-ms")
	b.ReportMetric(med(idle), "idle-ms")
}
