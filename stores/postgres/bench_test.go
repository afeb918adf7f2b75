package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
)

// BenchmarkAppend compares Projector's append with a raw INSERT of rows of
// the same shape into a table with the same columns and indexes: one
// transaction per op, 1 and 100 events per transaction. Each iteration runs
// one raw op and one Projector op back to back, so drift on a shared machine
// (disk flushes, neighbours) hits both alike; the benchmark reports both
// rates and their ratio, the figure in docs/performance.md.
func BenchmarkAppend(b *testing.B) {
	for _, n := range []int{1, 100} {
		b.Run(fmt.Sprintf("events=%d", n), func(b *testing.B) { benchAppend(b, n) })
	}
}

func benchAppend(b *testing.B, n int) {
	types := testevents.New()
	store := pgtest.Store(b, types.Registry)
	ctx := context.Background()
	pool := store.Pool()
	raw := store.Table("raw_events")
	if _, err := pool.Exec(ctx, `CREATE TABLE `+raw+` (LIKE `+store.Table("projector_events")+` INCLUDING ALL)`); err != nil {
		b.Fatal(err)
	}
	rawSQL := `INSERT INTO ` + raw + ` (id, tenant_id, stream_type, stream_id, version, type, schema_version, data, correlation_id, causation_id, actor, headers)
		SELECT ev.id, $1, $2, $3, ev.v, ev.type, ev.sv, ev.data, $8, NULL, '', NULL
		FROM unnest($4::uuid[], $5::text[], $6::int[], $7::jsonb[], $9::bigint[]) AS ev(id, type, sv, data, v)`

	payloads := make([]any, n)
	for i := range payloads {
		payloads[i] = testevents.TicketCommented{Body: "the printer is on fire again", N: i}
	}
	// The raw side gets its JSON and ids ready-made: it is the floor.
	ids := make([][16]byte, n)
	typs := make([]string, n)
	svs := make([]int32, n)
	datas := make([]string, n)
	vers := make([]int64, n)
	for j := range n {
		typs[j], svs[j], datas[j] = "ticket.commented", 1, fmt.Sprintf(`{"body":"the printer is on fire again","n":%d}`, j)
	}

	var rawTime, projTime time.Duration
	for i := 0; b.Loop(); i++ {
		// A new stream every ten ops, like requests creating aggregates
		// and then working on them.
		streamID := fmt.Sprintf("t-%d", i-i%10)

		start := time.Now()
		for j := range n {
			ids[j], vers[j] = uuid.Must(uuid.NewV7()), int64(i*n+j+1)
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, rawSQL, projector.SystemTenant, "ticket", streamID, ids, typs, svs, datas, [16]byte(uuid.Must(uuid.NewV7())), vers)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		rawTime += time.Since(start)

		start = time.Now()
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := store.Append(ctx, tx, projector.Stream("ticket", streamID), projector.AnyVersion, payloads...)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		projTime += time.Since(start)
	}
	events := float64(b.N * n)
	b.ReportMetric(events/rawTime.Seconds(), "raw-events/s")
	b.ReportMetric(events/projTime.Seconds(), "projector-events/s")
	b.ReportMetric(100*rawTime.Seconds()/projTime.Seconds(), "%-of-raw")
}
