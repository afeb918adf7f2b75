package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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
// figures in docs/performance.md. wire splits decode's gap: the same
// reads beside their statements alone, rows drained unopened and
// undecoded, which tells the sealed rows' cost on the server and the wire
// (longer payloads, the key epoch row) from the opening's.
func BenchmarkPersonalFields(b *testing.B) {
	ctx := context.Background()
	types := testevents.NewPersonal()
	cfg := pgtest.PoolConfig(b)
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	pool := pgtest.PoolFromConfig(b, cfg)
	schema := pgtest.Schema(b)
	master := masterKey(b, "bench", "bench")
	store, plainStore := sealedAndPlainStores(b, pool, schema, types, master)
	kt, err := postgres.NewKeyTable(schema, master)
	if err != nil {
		b.Fatal(err)
	}
	uncached, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: types.Registry, Keys: otherKeyStore{kt}})
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
	b.Run("wire", func(b *testing.B) {
		runs++
		read := fmt.Sprintf("read-%d", runs)
		sealed, clear := projector.Stream("customer", read), projector.Stream("plain", read)
		for i := range 100 {
			p, q := payloads(i)
			appendOne(store, sealed, p)
			appendOne(plainStore, clear, q)
		}
		full := func(s *postgres.Store, stream projector.StreamRef) time.Duration {
			start := time.Now()
			if evs, err := s.ReadStream(ctx, stream, postgres.StreamQuery{}); err != nil || len(evs) != 100 {
				b.Fatalf("read %d events: %v", len(evs), err)
			}
			return time.Since(start)
		}
		var personal, plain, personalWire, plainWire time.Duration
		var personalBytes, plainBytes, n int
		for b.Loop() {
			personal += full(store, sealed)
			plain += full(plainStore, clear)
			d, size := drainStream(b, store, sealed)
			personalWire, personalBytes = personalWire+d, size
			d, size = drainStream(b, plainStore, clear)
			plainWire, plainBytes = plainWire+d, size
			n += 100
		}
		reportWire(b, n, personal, plain, personalWire, plainWire, personalBytes, plainBytes)
	})
}

// drainStream sends the statement ReadStream sends for stream and reads
// its rows without scanning, opening or decoding them: the server's and the
// wire's share of a read. It returns the time and the bytes of the rows'
// values.
func drainStream(b *testing.B, s *postgres.Store, stream projector.StreamRef) (time.Duration, int) {
	sql, args := s.StreamReadSQL(stream)
	start := time.Now()
	rows, err := s.Pool().Query(context.Background(), sql, args...)
	if err != nil {
		b.Fatal(err)
	}
	size := 0
	for rows.Next() {
		for _, v := range rows.RawValues() {
			size += len(v)
		}
	}
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	return time.Since(start), size
}

// reportWire reports the wire sub-benchmark: the whole reads' rates and
// ratio as decode does, the drained reads' microseconds per event and bytes
// per event, and the ceiling: the ratio the whole read would reach if
// opening cost nothing and only the sealed rows' extra time on the server
// and the wire were left (plain / (plain + personal wire − plain wire)).
func reportWire(b *testing.B, n int, personal, plain, personalWire, plainWire time.Duration, personalBytes, plainBytes int) {
	if n == 0 || personal <= 0 || plain <= 0 {
		return
	}
	perEvent := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(n) }
	b.ReportMetric(float64(n)/personal.Seconds(), "personal-events/s")
	b.ReportMetric(float64(n)/plain.Seconds(), "plain-events/s")
	b.ReportMetric(plain.Seconds()/personal.Seconds(), "ratio")
	b.ReportMetric(perEvent(personalWire), "personal-wire-µs/event")
	b.ReportMetric(perEvent(plainWire), "plain-wire-µs/event")
	b.ReportMetric(float64(personalBytes)/100, "personal-bytes/event")
	b.ReportMetric(float64(plainBytes)/100, "plain-bytes/event")
	b.ReportMetric(plain.Seconds()/(plain+personalWire-plainWire).Seconds(), "ceiling-ratio")
}

// sealedAndPlainStores returns two stores of schema: one whose registry
// declares CustomerRegistered's personal fields (sealed under master), and
// one whose registry defines the same fields as the plain
// CustomerPlain — the baseline the personal benchmarks compare against.
func sealedAndPlainStores(b *testing.B, pool *pgxpool.Pool, schema string, types testevents.PersonalTypes, master *postgres.MasterKey) (sealed, plain *postgres.Store) {
	b.Helper()
	ctx := context.Background()
	sealed, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: types.Registry, MasterKey: master})
	if err != nil {
		b.Fatal(err)
	}
	clearTypes := projector.NewRegistry()
	projector.MustDefine[testevents.CustomerPlain](clearTypes, types.Plain.Name())
	if plain, err = postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: clearTypes}); err != nil {
		b.Fatal(err)
	}
	return sealed, plain
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
