package saga_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/postgres"
)

// BenchmarkSagaPartitions catches a saga (a step per event on one of 2,000
// instances) up on 10,000 events with 1, 2, 4 and 8 partitions in one
// process, beside a raw loop of the same run on one connection (read a
// batch below the horizon, one keyed upsert per event). A partitioned saga
// is partitioned by correlation key, which SQL cannot filter by: every
// partition reads every event and finds its key, decoding its payload:
// key-calls/event counts the correlation key function's calls per event
// handled (the batch's own routing takes two; each partition's filter
// one more), which is the Go-side price of partitioning by a key SQL cannot
// compute.
func BenchmarkSagaPartitions(b *testing.B) {
	for _, n := range []int{1, 2, 4, 8} {
		b.Run(fmt.Sprintf("partitions=%d", n), func(b *testing.B) {
			var ours, raw time.Duration
			var calls atomic.Int64
			const instances, events = 2_000, 10_000
			iters := 0
			for b.Loop() {
				ty := testevents.New()
				store := pgtest.Store(b, ty.Registry)
				ids := make([]string, instances)
				for i := range ids {
					ids[i] = fmt.Sprintf("s-%05d", i)
				}
				benchAppend(b, store, ids, func(int) any { return testevents.TicketOpened{Title: "t"} })
				rng := rand.New(rand.NewPCG(1, 2))
				picks := make([]string, events)
				for i := range picks {
					picks[i] = ids[rng.IntN(len(ids))]
				}
				benchAppend(b, store, picks, func(int) any { return testevents.TicketCommented{Body: "c"} })

				started := time.Now()
				rawSagaLoop(b, store, 500)
				raw += time.Since(started)

				type state struct{ N int }
				s := saga.New[state]("bench_saga", saga.Config{Async: projection.AsyncConfig{Partitions: n}})
				byStream := func(ev projector.Event, _ testevents.TicketOpened) string { calls.Add(1); return ev.Stream.ID }
				byStreamC := func(ev projector.Event, _ testevents.TicketCommented) string { calls.Add(1); return ev.Stream.ID }
				must(saga.StartOn(s, ty.Opened, byStream, func(context.Context, *saga.Instance[state], projector.Event, testevents.TicketOpened) error {
					return nil
				}))
				must(saga.On(s, ty.Commented, byStreamC, func(_ context.Context, in *saga.Instance[state], _ projector.Event, _ testevents.TicketCommented) error {
					in.State.N++
					return nil
				}))
				p, err := s.Projection(store)
				if err != nil {
					b.Fatal(err)
				}
				ours += catchUpTimed(b, store, p)
				iters++
			}
			b.ReportMetric(float64(instances+events)*float64(iters)/ours.Seconds(), "saga-events/s")
			b.ReportMetric(float64(instances+events)*float64(iters)/raw.Seconds(), "raw-events/s")
			b.ReportMetric(float64(calls.Load())/float64((instances+events)*iters), "key-calls/event")
		})
	}
}

// rawSagaLoop is the baseline: one transaction per batch of the log read
// below the horizon, one keyed upsert per event, on one connection.
func rawSagaLoop(b *testing.B, store *postgres.Store, size int) {
	b.Helper()
	ctx := context.Background()
	table := pgx.Identifier{store.Schema(), "raw_counts"}.Sanitize()
	if _, err := store.Pool().Exec(ctx, `CREATE TABLE IF NOT EXISTS `+table+` (key text PRIMARY KEY, n bigint NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	upsert := `INSERT INTO ` + table + ` AS c (key, n) VALUES ($1, 1) ON CONFLICT (key) DO UPDATE SET n = c.n + 1`
	read := `SELECT tx_id, seq, stream_id FROM ` + store.Table("projector_events") + `
		WHERE (tx_id, seq) > ($1::xid8, $2::bigint) AND tx_id < pg_snapshot_xmin(pg_current_snapshot())
		ORDER BY tx_id, seq LIMIT $3`
	conn, err := store.Pool().Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	var cur projector.Position
	for {
		tx, err := conn.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		rows, err := tx.Query(ctx, read, cur.TxID, cur.Seq, size)
		if err != nil {
			b.Fatal(err)
		}
		var keys []string
		var pos projector.Position
		var key string
		if _, err := pgx.ForEachRow(rows, []any{&pos.TxID, &pos.Seq, &key}, func() error { keys = append(keys, key); cur = pos; return nil }); err != nil {
			b.Fatal(err)
		}
		for _, k := range keys {
			if _, err := tx.Exec(ctx, upsert, k); err != nil {
				b.Fatal(err)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
		if len(keys) < size {
			return
		}
	}
}
