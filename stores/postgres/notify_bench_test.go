package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
)

// BenchmarkAppendNotify measures what NOTIFY in the append transaction costs
// with many concurrent writers: PostgreSQL takes a cluster-wide lock from
// the notification's queueing until the commit is flushed, so notifying
// transactions commit one at a time instead of sharing WAL flushes. Each
// writer appends one event per transaction to its own streams; the figure
// is committed events per second, beside the same run without NOTIFY.
func BenchmarkAppendNotify(b *testing.B) {
	for _, writers := range []int{1, 4, 16} {
		for _, notify := range []bool{false, true} {
			b.Run(fmt.Sprintf("writers=%d/notify=%v", writers, notify), func(b *testing.B) {
				benchNotify(b, writers, notify)
			})
		}
	}
}

func benchNotify(b *testing.B, writers int, notify bool) {
	types := testevents.New()
	store := pgtest.Store(b, types.Registry)
	pool := pgtest.NewPool(b, int32(writers))
	ctx := context.Background()
	const perOp = 1
	var next atomic.Int64
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	total := int64(b.N)
	for w := range writers {
		wg.Go(func() {
			for i := next.Add(1); i <= total; i = next.Add(1) {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if _, err := store.Append(ctx, tx, projector.Stream("ticket", fmt.Sprintf("w%d-%d", w, i/10)), projector.AnyVersion,
						testevents.TicketCommented{Body: "x"}); err != nil {
						return err
					}
					if notify {
						_, err := tx.Exec(ctx, `SELECT pg_notify('projector_bench', '')`)
						return err
					}
					return nil
				})
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N*perOp)/time.Since(start).Seconds(), "events/s")
}
