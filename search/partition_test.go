package search_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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

// opCounter counts, per document, the operations that reached the backend
// in a batch that committed: it writes the count in the dispatcher's
// transaction, so a batch rolled back (and retried) is not counted, and
// an event indexed by two partitions, or twice by one, is.
type opCounter struct{ table string }

func (c opCounter) count(ctx context.Context, tx pgx.Tx, ops []search.Op) error {
	tenants, ids := make([]string, 0, len(ops)), make([]string, 0, len(ops))
	for _, op := range ops {
		tenants, ids = append(tenants, op.Tenant), append(ids, op.ID)
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+c.table+` (tenant_id, id, n)
		SELECT t, i, count(*) FROM unnest($1::text[], $2::text[]) AS u(t, i) GROUP BY t, i
		ON CONFLICT (tenant_id, id) DO UPDATE SET n = `+c.table+`.n + excluded.n`, tenants, ids)
	return err
}

// countedPG and countedMeili are the two backends with their operations
// counted; embedding keeps every other interface of the backend (the
// Meilisearch one stays a RebuildSwapper, so its projection has an
// External target, as in production).
type countedPG struct {
	*pgsearch.Backend
	c opCounter
}

func (b countedPG) Apply(ctx context.Context, tx pgx.Tx, idx search.Index, ops []search.Op) error {
	if err := b.c.count(ctx, tx, ops); err != nil {
		return err
	}
	return b.Backend.Apply(ctx, tx, idx, ops)
}

type countedMeili struct {
	*meilisearch.Backend
	c opCounter
}

func (b countedMeili) Apply(ctx context.Context, tx pgx.Tx, idx search.Index, ops []search.Op) error {
	if err := b.c.count(ctx, tx, ops); err != nil {
		return err
	}
	return b.Backend.Apply(ctx, tx, idx, ops)
}

// TestSearchPartitionsIndexEachDocumentOnce: a search projection with four
// partitions run by two dispatchers (each its own pool and instance id),
// while two writers append: every event's operation reaches the backend in
// exactly one committed batch (so no document is indexed twice or missed),
// the index equals the fold of the log, the two dispatchers share the
// partitions and every partition indexed its streams.
//
// The history has no delete-by-filter: its effect spans streams, and
// partitions keep no order across streams (docs/search.md).
func TestSearchPartitionsIndexEachDocumentOnce(t *testing.T) {
	for _, bc := range backends() {
		t.Run(bc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			must(t, e.store.CreatePartitionIndex(e.ctx))
			c := opCounter{table: e.store.Schema() + ".op_counts"}
			_, err := e.store.Pool().Exec(e.ctx, `CREATE TABLE `+c.table+` (tenant_id text, id text, n int NOT NULL, PRIMARY KEY (tenant_id, id))`)
			must(t, err)
			var b search.Backend
			switch base := bc.make(e).(type) {
			case *pgsearch.Backend:
				b = countedPG{Backend: base, c: c}
			case *meilisearch.Backend:
				b = countedMeili{Backend: base, c: c}
			default:
				t.Fatalf("backend %T", base)
			}
			cfg := projection.AsyncConfig{BatchSize: 25, Partitions: 4}
			p1 := e.ticketProjection("ticket_search", b, cfg)
			p2, err := newTicketProjection(e.types, "ticket_search", b, cfg)
			must(t, err)
			storeOn := func(n int32) *postgres.Store {
				s, err := postgres.New(e.ctx, pgtest.NewPool(t, n), postgres.Config{Schema: e.store.Schema(), Registry: e.types.Registry})
				must(t, err)
				return s
			}
			d1 := e.dispatcherOn(storeOn(3), "indexer-1", p1)
			d2 := e.dispatcherOn(storeOn(3), "indexer-2", p2)

			// Two writers, each on its own streams (so each stream's order
			// is its writer's), over two tenants with the same ids.
			models := make([]model, 2)
			events := make([]map[string]int, 2)
			var wg sync.WaitGroup
			errs := make(chan error, 2)
			for w := range 2 {
				models[w], events[w] = model{}, map[string]int{}
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
					for range 100 {
						tenant := []string{"acme", "globex"}[rng.IntN(2)]
						id := fmt.Sprintf("T-%d", 2*rng.IntN(60)+w)
						payloads := []any{testevents.TicketOpened{Title: "printer " + id, Customer: "acme"}}
						for range rng.IntN(3) {
							switch rng.IntN(6) {
							case 0:
								payloads = append(payloads, testevents.TicketClosed{})
							case 1:
								payloads = append(payloads, testevents.TicketClosed{Reason: "delete"})
							default:
								payloads = append(payloads, testevents.TicketCommented{Body: "jammed", N: rng.IntN(50)})
							}
						}
						err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
							_, err := e.store.Append(e.ctx, tx, projector.TenantStream(tenant, "ticket", id), projector.AnyVersion, payloads...)
							return err
						})
						if err != nil {
							errs <- err
							return
						}
						for _, pl := range payloads {
							models[w].apply(tenant, id, pl)
						}
						events[w][tenant+"/"+id] += len(payloads)
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			want := model{}
			for _, m := range models {
				for tenant, docs := range m {
					if want[tenant] == nil {
						want[tenant] = map[string]map[string]any{}
					}
					for id, d := range docs {
						want[tenant][id] = d
					}
				}
			}
			total := 0
			for _, ev := range events {
				for _, n := range ev {
					total += n
				}
			}
			eventually(t, 60*time.Second, "every event's operation indexed", func() bool { return opsIndexed(t, e, c) >= total })
			for _, d := range []*projection.Dispatcher{d1, d2} {
				e.catchUp(d)
			}
			got := opCounts(t, e, c)
			for w := range events {
				for k, n := range events[w] {
					if got[k] != n {
						t.Errorf("%s: %d operations indexed, want %d (one per event)", k, got[k], n)
					}
				}
			}
			if sum := opsIndexed(t, e, c); sum != total {
				t.Errorf("%d operations indexed in all, want %d", sum, total)
			}
			sameIndex(t, "after the history", want.canonical(t), indexed(t, e.ctx, b))

			owners := map[string]int{}
			admin := projection.NewAdmin(e.store)
			states, err := admin.List(e.ctx, "ticket_search")
			must(t, err)
			parts := 0
			for _, s := range states {
				if s.Partitions == 0 {
					continue
				}
				parts++
				owners[s.Owner]++
				if s.Processed == 0 {
					t.Errorf("partition %d indexed nothing", s.Partition)
				}
			}
			if parts != 4 || owners["indexer-1"] == 0 || owners["indexer-2"] == 0 {
				t.Errorf("%d partitions owned %v: want 4 shared by both dispatchers", parts, owners)
			}

			// Verify compares, and Reindex builds, each document as of its
			// partition's cursor (TestVerifyPartitioned,
			// TestReindexPartitioned); pgsearch reindexes by rebuild.
			if r, err := search.Verify(e.ctx, e.store, p1, search.VerifyOptions{}); err != nil || !r.OK() || len(r.Partitions) != 4 {
				t.Errorf("verify a partitioned projection: %+v, %v", r, err)
			}
			if _, err := search.Reindex(e.ctx, e.store, p1, 0); err != nil && !errors.Is(err, search.ErrNotReindexable) {
				t.Errorf("reindex a partitioned projection: %v", err)
			}
		})
	}
}

// opCounts returns the operations counted per "tenant/id".
func opCounts(t *testing.T, e *env, c opCounter) map[string]int {
	t.Helper()
	rows, err := e.store.Pool().Query(e.ctx, `SELECT tenant_id || '/' || id, n FROM `+c.table)
	must(t, err)
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var k string
		var n int
		must(t, rows.Scan(&k, &n))
		out[k] = n
	}
	must(t, rows.Err())
	return out
}

// opsIndexed returns the operations counted in all.
func opsIndexed(t *testing.T, e *env, c opCounter) int {
	t.Helper()
	var n int
	must(t, e.store.Pool().QueryRow(e.ctx, `SELECT coalesce(sum(n), 0) FROM `+c.table).Scan(&n))
	return n
}

// A Meilisearch swap left pending (a rebuild 'swapping') when the
// projection runs partitioned: every partition finds it at its first pass,
// and two swaps at once would swap the indexes back. The first swap request
// is held until another look at the swap tasks arrives (or 3 s pass): that
// look is a second partition deciding whether to swap, in the gap between
// the first's check and its swap. Only the partition holding the
// unpartitioned row's lock swaps; the others stand aside, so there is one
// swap request and the rebuilt documents are live.
func TestSearchPartitionsSwapPendingRebuildOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	must(t, e.store.CreatePartitionIndex(e.ctx))
	fake := meilisearchtest.New(t)
	b := meiliBackend(e, fake.URL(), "")
	p := e.ticketProjection("ticket_search", b, projection.AsyncConfig{Partitions: 4})
	var id int64
	must(t, e.store.Pool().QueryRow(e.ctx, `INSERT INTO `+e.store.Table("projector_rebuilds")+` (name, version, mode, status, tables)
		VALUES ('ticket_search', 1, 'blue-green', 'swapping', '{}') RETURNING id`).Scan(&id))
	shadow := b.RebuildShadow(id)
	must(t, shadow.Ensure(e.ctx, ticketIndex))
	must(t, shadow.Apply(e.ctx, nil, ticketIndex, []search.Op{{Kind: search.OpUpsert, Tenant: "acme", ID: "rebuilt",
		Doc: map[string]json.RawMessage{"id": json.RawMessage(`"rebuilt"`), "title": json.RawMessage(`"rebuilt"`)}}}))

	var held atomic.Bool
	fake.Refuse("POST /swap-indexes", func() bool {
		if held.Swap(true) {
			return false
		}
		looks := fake.Requests("GET /tasks")
		deadline := time.Now().Add(3 * time.Second)
		for fake.Requests("GET /tasks") == looks && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond) // holding the request open: the gap another partition may run in
		}
		return false
	})
	d1 := e.dispatcherOn(e.store, "swap-1", p)
	eventually(t, 30*time.Second, "the swap recorded", func() bool {
		var status string
		must(t, e.store.Pool().QueryRow(e.ctx, `SELECT status FROM `+e.store.Table("projector_rebuilds")+` WHERE id = $1`, id).Scan(&status))
		return status == "switched"
	})
	e.append("acme", "T-1", testevents.TicketOpened{Title: "after"})
	e.catchUp(d1)
	if n := fake.Requests("POST /swap-indexes"); n != 1 {
		t.Errorf("%d swap requests, want 1", n)
	}
	sameIndex(t, "after the swap", []string{
		`acme/T-1 {"id":"T-1","status":"open","title":"after"}`,
		`acme/rebuilt {"id":"rebuilt","title":"rebuilt"}`,
	}, indexed(t, e.ctx, b))
}
