package projectiontest_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection/projectiontest"
)

// BenchmarkSpecs measures specs per second, in parallel: a spec on
// PostgreSQL (begin, two events through the async projection's apply
// path, one query, roll back), beside the raw-PostgreSQL baseline of the
// same work without the kit (begin, the same insert and update, the same
// query, roll back) measured in the same run, and a spec in memory.
//
//	go test -run '^$' -bench Specs ./projection/projectiontest/
func BenchmarkSpecs(b *testing.B) {
	k := setup(b)
	var n atomic.Int64
	query := `SELECT id, comments FROM ` + k.tickets

	b.Run("postgres", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				id := "b-" + strconv.FormatInt(n.Add(1), 10)
				if msg := run(b, func(t testing.TB) {
					projectiontest.New(t, projectiontest.Config{Store: k.store, Async: k.async}).
						Given(projector.Stream("ticket", id), testevents.TicketOpened{Title: "x"}, testevents.TicketCommented{Body: "y"}).
						ThenRows(query, projectiontest.Row{id, 1})
				}); msg != "" {
					b.Error(msg)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "specs/s")
	})

	b.Run("baseline-raw-postgres", func(b *testing.B) {
		ctx := context.Background()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				id := "r-" + strconv.FormatInt(n.Add(1), 10)
				tx, err := k.store.Pool().Begin(ctx)
				if err != nil {
					b.Error(err)
					return
				}
				_, err = tx.Exec(ctx, `INSERT INTO `+k.tickets+` (tenant, id, title, status, replaying, opened_at)
					VALUES ($1, $2, $3, 'open', false, now())`, projector.SystemTenant, id, "x")
				if err == nil {
					_, err = tx.Exec(ctx, `UPDATE `+k.tickets+` SET comments = comments + 1 WHERE tenant = $1 AND id = $2`, projector.SystemTenant, id)
				}
				var got string
				var comments int
				if err == nil {
					err = tx.QueryRow(ctx, query).Scan(&got, &comments)
				}
				if rerr := tx.Rollback(ctx); err == nil {
					err = rerr
				}
				if err != nil || got != id || comments != 1 {
					b.Errorf("baseline: %v (%s, %d)", err, got, comments)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "specs/s")
	})

	b.Run("memory", func(b *testing.B) {
		fold := func(m map[string]int, ev projector.Event) (map[string]int, error) {
			if _, ok := ev.Payload.(testevents.TicketCommented); ok {
				m[ev.Stream.ID]++
			}
			return m, nil
		}
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if msg := run(b, func(t testing.TB) {
					projectiontest.NewMemory(t, projectiontest.MemoryConfig[map[string]int]{Registry: k.ty.Registry, Initial: map[string]int{}, Fold: fold}).
						Given(projector.Stream("ticket", "1"), testevents.TicketOpened{Title: "x"}, testevents.TicketCommented{Body: "y"}).
						ThenModel(map[string]int{"1": 1})
				}); msg != "" {
					b.Error(msg)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "specs/s")
	})
}
