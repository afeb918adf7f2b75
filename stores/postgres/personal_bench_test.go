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
// hits all: append (one event per transaction, 100 subjects whose keys
// exist — the steady state), and decode (reading a 100-event stream of
// each back through ReadStream, which opens every field). Commits do not
// wait for the WAL flush, so the figures are the statements and our code.
//
// Three stores share the schema: the default one (keys cached per process,
// fetched with the rows); one whose key store is the key table behind
// another KeyStore, which takes the path of a KMS or of Projector before
// the cache — a key statement per append and per read; and, as the
// baseline, one whose registry declares nothing personal, so its reads
// carry no key join at all. It reports the rates and the ratios to the
// baseline (ratio: the default store; uncached-ratio: the other), the
// figures in docs/performance.md.
func BenchmarkPersonalFields(b *testing.B) {
	ctx := context.Background()
	types := testevents.NewPersonal()
	cfg := pgtest.PoolConfig(b)
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	pool := pgtest.PoolFromConfig(b, cfg)
	schema := pgtest.Schema(b)
	master := masterKey(b, "bench", "bench")
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: types.Registry, MasterKey: master})
	if err != nil {
		b.Fatal(err)
	}
	kt, err := postgres.NewKeyTable(schema, master)
	if err != nil {
		b.Fatal(err)
	}
	uncached, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: types.Registry, Keys: otherKeyStore{kt}})
	if err != nil {
		b.Fatal(err)
	}
	clearTypes := projector.NewRegistry()
	projector.MustDefine[testevents.CustomerPlain](clearTypes, types.Plain.Name())
	plainStore, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: clearTypes})
	if err != nil {
		b.Fatal(err)
	}
	appendOne := func(s *postgres.Store, stream projector.StreamRef, payload any) time.Duration {
		start := time.Now()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := s.Append(ctx, tx, stream, projector.AnyVersion, payload)
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
		appendOne(store, projector.Stream("customer", p.Customer), p)
	}
	b.Run("append", func(b *testing.B) {
		var personal, slow, plain time.Duration
		n := 0
		for b.Loop() {
			p, q := payloads(n)
			personal += appendOne(store, projector.Stream("customer", p.Customer), p)
			slow += appendOne(uncached, projector.Stream("customer", p.Customer), p)
			plain += appendOne(plainStore, projector.Stream("plain", q.Customer), q)
			n++
		}
		report(b, n, personal, slow, plain)
	})
	runs := 0
	b.Run("decode", func(b *testing.B) {
		runs++ // the framework may call this more than once: a fresh stream each time
		read := fmt.Sprintf("read-%d", runs)
		sealed, clear := projector.Stream("customer", read), projector.Stream("plain", read)
		for i := range 100 {
			p, q := payloads(i)
			appendOne(store, sealed, p)
			appendOne(plainStore, clear, q)
		}
		readSealed := func(s *postgres.Store) time.Duration {
			start := time.Now()
			evs, err := s.ReadStream(ctx, sealed, postgres.StreamQuery{})
			if err != nil || len(evs) != 100 || evs[99].Payload.(testevents.CustomerRegistered).Name == "" {
				b.Fatalf("read %d events: %v", len(evs), err)
			}
			return time.Since(start)
		}
		var personal, slow, plain time.Duration
		n := 0
		for b.Loop() {
			personal += readSealed(store)
			slow += readSealed(uncached)
			start := time.Now()
			if evs, err := plainStore.ReadStream(ctx, clear, postgres.StreamQuery{}); err != nil || len(evs) != 100 {
				b.Fatal(err)
			}
			plain += time.Since(start)
			n += 100
		}
		report(b, n, personal, slow, plain)
	})
}

// otherKeyStore hides the key table behind another KeyStore: the store
// then fetches keys as it would from a KMS, a statement of their own.
type otherKeyStore struct{ postgres.KeyStore }

func report(b *testing.B, n int, personal, slow, plain time.Duration) {
	if personal <= 0 || slow <= 0 || plain <= 0 {
		return
	}
	pr, sr, cr := float64(n)/personal.Seconds(), float64(n)/slow.Seconds(), float64(n)/plain.Seconds()
	b.ReportMetric(pr, "personal-events/s")
	b.ReportMetric(sr, "uncached-events/s")
	b.ReportMetric(cr, "plain-events/s")
	b.ReportMetric(pr/cr, "ratio")
	b.ReportMetric(sr/cr, "uncached-ratio")
}
