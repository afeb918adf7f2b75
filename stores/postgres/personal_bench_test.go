package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// BenchmarkPersonalFields compares an event with two personal fields (name
// and email, sealed under the subject's key) with the same event
// unencrypted, side by side in each iteration so a shared machine's drift
// hits both: append (one event per transaction, 100 subjects whose keys
// exist — the steady state), and decode (reading a 100-event stream of
// each back through ReadStream, which opens every field). Commits do not
// wait for the WAL flush, so the figures are the statements and our code.
// It reports both rates and their ratio (personal/plain), the figures in
// docs/performance.md.
func BenchmarkPersonalFields(b *testing.B) {
	ctx := context.Background()
	types := testevents.NewPersonal()
	cfg := pgtest.PoolConfig(b)
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	store, err := postgres.New(ctx, pgtest.PoolFromConfig(b, cfg), postgres.Config{Schema: pgtest.Schema(b), Registry: types.Registry,
		MasterKey: masterKey(b, "bench", "bench")})
	if err != nil {
		b.Fatal(err)
	}
	appendOne := func(stream projector.StreamRef, payload any) time.Duration {
		start := time.Now()
		err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
			_, err := store.Append(ctx, tx, stream, projector.AnyVersion, payload)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	payloads := func(i int) (testevents.CustomerRegistered, testevents.CustomerPlain) {
		id := fmt.Sprintf("c-%d", i%100)
		name, email := "Ada Lovelace "+id, "ada."+id+"@example.com"
		return testevents.CustomerRegistered{Customer: id, Name: name, Email: email, Plan: "pro"},
			testevents.CustomerPlain{Customer: id, Name: name, Email: email, Plan: "pro"}
	}
	for i := range 100 { // every subject's key exists before timing
		p, _ := payloads(i)
		appendOne(projector.Stream("customer", p.Customer), p)
	}
	b.Run("append", func(b *testing.B) {
		var personal, plain time.Duration
		n := 0
		for b.Loop() {
			p, q := payloads(n)
			personal += appendOne(projector.Stream("customer", p.Customer), p)
			plain += appendOne(projector.Stream("plain", q.Customer), q)
			n++
		}
		report(b, n, personal, plain)
	})
	runs := 0
	b.Run("decode", func(b *testing.B) {
		runs++ // the framework may call this more than once: a fresh stream each time
		read := fmt.Sprintf("read-%d", runs)
		sealed, clear := projector.Stream("customer", read), projector.Stream("plain", read)
		for i := range 100 {
			p, q := payloads(i)
			appendOne(sealed, p)
			appendOne(clear, q)
		}
		var personal, plain time.Duration
		n := 0
		for b.Loop() {
			start := time.Now()
			evs, err := store.ReadStream(ctx, sealed, postgres.StreamQuery{})
			if err != nil || len(evs) != 100 || evs[99].Payload.(testevents.CustomerRegistered).Name == "" {
				b.Fatalf("read %d events: %v", len(evs), err)
			}
			personal += time.Since(start)
			start = time.Now()
			if evs, err = store.ReadStream(ctx, clear, postgres.StreamQuery{}); err != nil || len(evs) != 100 {
				b.Fatal(err)
			}
			plain += time.Since(start)
			n += 100
		}
		report(b, n, personal, plain)
	})
}

func report(b *testing.B, n int, personal, plain time.Duration) {
	if personal <= 0 || plain <= 0 {
		return
	}
	pr, cr := float64(n)/personal.Seconds(), float64(n)/plain.Seconds()
	b.ReportMetric(pr, "personal-events/s")
	b.ReportMetric(cr, "plain-events/s")
	b.ReportMetric(pr/cr, "ratio")
}
