package search_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	meili "github.com/meilisearch/meilisearch-go"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/search"
	"github.com/projectorhq/projector/stores/meilisearch"
	"github.com/projectorhq/projector/stores/meilisearch/meilisearchtest"
	"github.com/projectorhq/projector/stores/pgsearch"
	"github.com/projectorhq/projector/stores/postgres"
)

// benchEvents is the backlog: 100,000 ticket.opened events (one document
// each) by default, PROJECTOR_BENCH_EVENTS to change it.
func benchEvents() int {
	if n, err := strconv.Atoi(os.Getenv("PROJECTOR_BENCH_EVENTS")); err == nil && n > 0 {
		return n
	}
	return 100_000
}

var benchWords = []string{"printer", "jammed", "laptop", "battery", "network", "slow", "invoice", "wrong", "password", "reset", "screen", "broken"}

// seedBacklog inserts n ticket.opened events over n streams of two tenants
// straight into the events table (the store's append is not what is
// measured).
func seedBacklog(b *testing.B, store *postgres.Store, n int) {
	b.Helper()
	ctx := context.Background()
	_, err := store.Pool().Exec(ctx, `INSERT INTO `+store.Table("projector_events")+` (id, tenant_id, stream_type, stream_id, version, type, schema_version, data, correlation_id)
		SELECT gen_random_uuid(), CASE WHEN g % 2 = 0 THEN 'acme' ELSE 'globex' END, 'ticket', 'T-' || g, 1, 'ticket.opened', 1,
			jsonb_build_object('title', ($2::text[])[1 + g % 12] || ' ' || ($2::text[])[1 + (g / 12) % 12] || ' ' || ($2::text[])[1 + (g / 144) % 12], 'customer', 'c' || (g % 97)),
			gen_random_uuid()
		FROM generate_series(0, $1::int - 1) g`, n, benchWords)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := store.Pool().Exec(ctx, `ANALYZE `+store.Table("projector_events")); err != nil {
		b.Fatal(err)
	}
	// The horizon is cluster-wide: another session's open transaction
	// keeps the backlog invisible to gap-safe readers until it ends.
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var visible int
		if err := store.Pool().QueryRow(ctx, `SELECT count(*) FROM `+store.Table("projector_events")+
			` WHERE tx_id < pg_snapshot_xmin(pg_current_snapshot())`).Scan(&visible); err != nil {
			b.Fatal(err)
		}
		if visible == n {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("only %d of %d backlog events below the horizon after 5 minutes", visible, n)
		}
		time.Sleep(10 * time.Millisecond) // polling the horizon
	}
}

// rawPages reads the backlog in pages of size below the horizon, as a
// hand-written indexer would, and hands each page's documents to write
// inside the page's transaction.
func rawPages(ctx context.Context, store *postgres.Store, size int, write func(tx pgx.Tx, tenants, ids []string, docs [][]byte) error) (int, error) {
	after := projector.Start
	total := 0
	read := `SELECT tx_id, seq, tenant_id, stream_id, data FROM ` + store.Table("projector_events") + `
		WHERE (tx_id, seq) > ($1::xid8, $2::bigint) AND tx_id < pg_snapshot_xmin(pg_current_snapshot()) AND type = 'ticket.opened'
		ORDER BY tx_id, seq LIMIT $3`
	for {
		n := 0
		err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, read, after.TxID, after.Seq, size)
			if err != nil {
				return err
			}
			var tenants, ids []string
			var docs [][]byte
			var tenant, id string
			var data []byte
			_, err = pgx.ForEachRow(rows, []any{&after.TxID, &after.Seq, &tenant, &id, &data}, func() error {
				var o testevents.TicketOpened
				if err := json.Unmarshal(data, &o); err != nil {
					return err
				}
				doc, err := json.Marshal(ticketDoc{ID: id, Title: o.Title, Customer: o.Customer, Status: "open"})
				tenants, ids, docs = append(tenants, tenant), append(ids, id), append(docs, doc)
				return err
			})
			if err != nil {
				return err
			}
			n = len(ids)
			if n == 0 {
				return nil
			}
			return write(tx, tenants, ids, docs)
		})
		if err != nil {
			return total, err
		}
		total += n
		if n < size {
			return total, nil
		}
	}
}

// indexWithProjector runs a dispatcher with a fresh consumer over the
// backlog and returns how long it took to catch up.
func indexWithProjector(b *testing.B, store *postgres.Store, types testevents.Types, name string, backend search.Backend) time.Duration {
	b.Helper()
	ctx := context.Background()
	p, err := newTicketProjection(types, name, backend, projection.AsyncConfig{BatchSize: 1000})
	if err != nil {
		b.Fatal(err)
	}
	a, err := p.Async()
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	d, err := projection.New(projection.Config{Store: store, Projections: []*projection.Async{a}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	if err := d.Start(ctx); err != nil {
		b.Fatal(err)
	}
	if err := d.CatchUp(ctx); err != nil {
		b.Fatal(err)
	}
	took := time.Since(start)
	if err := d.Stop(ctx); err != nil {
		b.Fatal(err)
	}
	return took
}

// BenchmarkSearchIndexing indexes a backlog of ticket.opened events (one
// document each, two tenants) into each backend with a search projection,
// beside a hand-written loop writing the same documents in the same run:
// on PostgreSQL one unnest upsert per page of 1,000 events in the page's
// transaction; on the Meilisearch fake one add-documents request per page,
// waiting for its task. Then search latency on PostgreSQL over the indexed
// documents: one word as a prefix, a status filter and the tenant filter,
// 300 searches, p50 and p99.
func BenchmarkSearchIndexing(b *testing.B) {
	n := benchEvents()
	ctx := context.Background()
	types := testevents.New()
	store := pgtest.Store(b, types.Registry)
	seedBacklog(b, store, n)
	pg, err := pgsearch.New(store, pgsearch.Config{})
	if err != nil {
		b.Fatal(err)
	}
	if err := pg.Ensure(ctx, ticketIndex); err != nil {
		b.Fatal(err)
	}
	table := store.Schema() + "." + pgsearch.TableName(ticketIndex)
	// raw and proj add up every iteration's time.
	report := func(b *testing.B, raw, proj time.Duration) {
		b.ReportMetric(float64(n*b.N)/raw.Seconds(), "raw-events/s")
		b.ReportMetric(float64(n*b.N)/proj.Seconds(), "projector-events/s")
		b.ReportMetric(proj.Seconds()/raw.Seconds(), "projector/raw-time")
	}
	b.Run(fmt.Sprintf("pgsearch/events=%d", n), func(b *testing.B) {
		// The backlog is vacuumed first, so neither side pays for setting
		// the fresh rows' hint bits, and the sides take turns going first
		// (a loaded machine drifts within a run). Besides the end-to-end
		// rates, the time in the index statement is measured on both
		// sides: the raw loop's upsert, and pgsearch's Apply under the
		// dispatcher (a wrapper timing it); their ratio is what the
		// indexing path itself costs beside the hand-written statement.
		if _, err := store.Pool().Exec(ctx, `VACUUM ANALYZE `+store.Table("projector_events")); err != nil {
			b.Fatal(err)
		}
		var raw, proj, insert time.Duration
		timed := &timedApply{Backend: pg}
		for i := 0; b.Loop(); i++ {
			rawSide := func() {
				if _, err := store.Pool().Exec(ctx, `TRUNCATE `+table); err != nil {
					b.Fatal(err)
				}
				start := time.Now()
				got, err := rawPages(ctx, store, 1000, func(tx pgx.Tx, tenants, ids []string, docs [][]byte) error {
					bodies := make([]string, len(docs))
					for i, d := range docs {
						bodies[i] = string(d)
					}
					s := time.Now()
					_, err := tx.Exec(ctx, `INSERT INTO `+table+` AS d (tenant_id, id, doc) SELECT * FROM unnest($1::text[], $2::text[], $3::text[]::jsonb[])
					ON CONFLICT (tenant_id, id) DO UPDATE SET doc = EXCLUDED.doc`, tenants, ids, bodies)
					insert += time.Since(s)
					return err
				})
				if err != nil || got != n {
					b.Fatalf("raw loop indexed %d of %d: %v", got, n, err)
				}
				raw += time.Since(start)
			}
			projSide := func() {
				if _, err := store.Pool().Exec(ctx, `TRUNCATE `+table); err != nil {
					b.Fatal(err)
				}
				proj += indexWithProjector(b, store, types, "bench_pg_"+strconv.Itoa(i), timed)
				var docs int
				if err := store.Pool().QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&docs); err != nil || docs != n {
					b.Fatalf("projector indexed %d of %d documents: %v", docs, n, err)
				}
			}
			if i%2 == 0 {
				rawSide()
				projSide()
			} else {
				projSide()
				rawSide()
			}
		}
		report(b, raw, proj)
		b.ReportMetric(time.Duration(timed.ns.Load()).Seconds()/insert.Seconds(), "apply/raw-upsert-time")
	})
	b.Run(fmt.Sprintf("pgsearch-query/documents=%d", n), func(b *testing.B) {
		src := search.Target(pg, ticketIndex)
		rng := rand.New(rand.NewPCG(1, 2))
		var lat []time.Duration
		for b.Loop() {
			for range 300 {
				tctx := search.WithTenant(ctx, []string{"acme", "globex"}[rng.IntN(2)])
				word := benchWords[rng.IntN(len(benchWords))][:4]
				start := time.Now()
				docs, err := search.Search[ticketDoc](tctx, src, word, search.Eq("status", "open"))
				if err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
				if len(docs) == 0 {
					b.Fatalf("no hits for %q: the index is empty", word)
				}
			}
		}
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	})
	b.Run(fmt.Sprintf("meilisearch-fake/events=%d", n), func(b *testing.B) {
		var raw, proj time.Duration
		for i := 0; b.Loop(); i++ {
			fake := meilisearchtest.New(b)
			client := meili.New(fake.URL(), meili.DisableRetries())
			ms, err := meilisearch.New(meilisearch.Config{URL: fake.URL(), PollInterval: time.Millisecond})
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			got, err := rawPages(ctx, store, 1000, func(_ pgx.Tx, tenants, ids []string, docs [][]byte) error {
				batch := make([]map[string]json.RawMessage, len(docs))
				for i, d := range docs {
					if err := json.Unmarshal(d, &batch[i]); err != nil {
						return err
					}
					batch[i]["projector_key"], _ = json.Marshal("t" + hex.EncodeToString([]byte(tenants[i])) + "-" + hex.EncodeToString([]byte(ids[i])))
					batch[i]["projector_tenant"], _ = json.Marshal(tenants[i])
				}
				info, err := client.Index("raw").AddDocuments(ctx, batch, &meili.DocumentOptions{PrimaryKey: ptrTo("projector_key")})
				if err != nil {
					return err
				}
				t, err := client.WaitForTask(ctx, info.TaskUID, time.Millisecond)
				if err == nil && t.Status != meili.TaskStatusSucceeded {
					err = fmt.Errorf("task %d %s", t.TaskUID, t.Status)
				}
				return err
			})
			if err != nil || got != n {
				b.Fatalf("raw loop indexed %d of %d: %v", got, n, err)
			}
			raw += time.Since(start)
			if err := ms.Ensure(ctx, ticketIndex); err != nil {
				b.Fatal(err)
			}
			proj += indexWithProjector(b, store, types, "bench_meili_"+strconv.Itoa(i), ms)
			if docs := len(fake.Documents(ticketIndex.Name)); docs != n {
				b.Fatalf("projector indexed %d of %d documents", docs, n)
			}
		}
		report(b, raw, proj)
	})
}

func ptrTo[T any](v T) *T { return &v }

// timedApply adds up the time a backend's Apply takes.
type timedApply struct {
	search.Backend
	ns atomic.Int64
}

func (b *timedApply) Apply(ctx context.Context, tx pgx.Tx, idx search.Index, ops []search.Op) error {
	start := time.Now()
	err := b.Backend.Apply(ctx, tx, idx, ops)
	b.ns.Add(int64(time.Since(start)))
	return err
}

// BenchmarkSearchVerify measures what search.Verify costs on an index of
// the backlog's documents (indexed on PostgreSQL by a search projection
// first): its time, and the peak Go heap in use while it runs beside the
// size of the index's JSON, in one page (both sides of every document in
// memory at once) and in the default pages (docs/search.md).
func BenchmarkSearchVerify(b *testing.B) {
	n := benchEvents()
	ctx := context.Background()
	types := testevents.New()
	store := pgtest.Store(b, types.Registry)
	seedBacklog(b, store, n)
	pg, err := pgsearch.New(store, pgsearch.Config{})
	if err != nil {
		b.Fatal(err)
	}
	if err := pg.Ensure(ctx, ticketIndex); err != nil {
		b.Fatal(err)
	}
	indexWithProjector(b, store, types, "bench_verify_index", pg)
	var jsonBytes int64
	if err := store.Pool().QueryRow(ctx, `SELECT coalesce(sum(octet_length(doc::text)), 0) FROM `+store.Schema()+`.`+pgsearch.TableName(ticketIndex)).Scan(&jsonBytes); err != nil {
		b.Fatal(err)
	}
	// Verify replays up to the cursor of the consumer it is given: the one
	// that indexed.
	p, err := newTicketProjection(types, "bench_verify_index", pg, projection.AsyncConfig{BatchSize: 1000})
	if err != nil {
		b.Fatal(err)
	}
	// One page (PageSize n: everything in memory at once, as before verify
	// paged) beside the default pages, same run.
	for _, page := range []int{n, search.DefaultVerifyPage} {
		b.Run(fmt.Sprintf("page=%d", page), func(b *testing.B) {
			var peak uint64
			for b.Loop() {
				runtime.GC()
				var base runtime.MemStats
				runtime.ReadMemStats(&base)
				peak = base.HeapInuse
				stop := sampleHeap(&peak)
				r, err := search.Verify(ctx, store, p, search.VerifyOptions{PageSize: page})
				stop()
				if err != nil || !r.OK() || r.Compared != n {
					b.Fatalf("verify: compared %d of %d, %d differences: %v", r.Compared, n, len(r.Differences), err)
				}
				peak -= min(peak, base.HeapInuse)
			}
			b.ReportMetric(float64(jsonBytes)/(1<<20), "index-json-MiB")
			b.ReportMetric(float64(peak)/(1<<20), "peak-heap-growth-MiB")
		})
	}
}

// sampleHeap records the peak Go heap in use into peak until the returned
// stop is called.
func sampleHeap(peak *uint64) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			*peak = max(*peak, ms.HeapInuse)
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	})
	return func() { close(done); wg.Wait() }
}
