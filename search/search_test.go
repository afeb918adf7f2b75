package search_test

import (
	"errors"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
	"github.com/projectorhq/projector/search"
	"github.com/projectorhq/projector/stores/meilisearch"
	"github.com/projectorhq/projector/stores/meilisearch/meilisearchtest"
	"github.com/projectorhq/projector/stores/pgsearch"
)

// backendCase makes a backend for one test; every behaviour test runs on
// each.
type backendCase struct {
	name string
	make func(e *env) search.Backend
}

func backends() []backendCase {
	return []backendCase{
		{"pgsearch", func(e *env) search.Backend {
			b, err := pgsearch.New(e.store, pgsearch.Config{})
			if err != nil {
				e.t.Fatal(err)
			}
			return b
		}},
		{"meilisearch-fake", func(e *env) search.Backend {
			return meiliBackend(e, meilisearchtest.New(e.t).URL(), "")
		}},
		{"meilisearch-real", func(e *env) search.Backend {
			url := os.Getenv("MEILISEARCH_URL")
			if url == "" {
				e.t.Skip("MEILISEARCH_URL is not set: the real-server variant is skipped (the same test ran against meilisearchtest)")
			}
			return meiliBackend(e, url, os.Getenv("MEILISEARCH_API_KEY"))
		}},
	}
}

// meiliBackend returns a Meilisearch backend whose index uids are unique
// to the test (the test's schema as prefix), deleted when it ends.
func meiliBackend(e *env, url, apiKey string) *meilisearch.Backend {
	b, err := meilisearch.New(meilisearch.Config{URL: url, APIKey: apiKey, IndexPrefix: e.store.Schema() + "_", PollInterval: 5 * time.Millisecond})
	if err != nil {
		e.t.Fatal(err)
	}
	return b
}

func ids(docs []ticketDoc) []string {
	out := make([]string, len(docs))
	for i, d := range docs {
		out[i] = d.ID
	}
	slices.Sort(out)
	return out
}

// TestSearchSeesOnlyTheContextsTenant: two tenants with the same ticket ids
// and words; every search sees only its context's tenant's documents,
// filters and sorting work, and a search without a tenant fails closed.
func TestSearchSeesOnlyTheContextsTenant(t *testing.T) {
	for _, bc := range backends() {
		t.Run(bc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			p := e.ticketProjection("ticket_search", bc.make(e), projection.AsyncConfig{})
			d := e.dispatcher(p)
			e.append("acme", "T-1", testevents.TicketOpened{Title: "Printer jammed", Customer: "c1"})
			e.append("acme", "T-2", testevents.TicketOpened{Title: "Laptop battery", Customer: "c2"}, testevents.TicketCommented{Body: "printer too", N: 5})
			e.append("acme", "T-3", testevents.TicketOpened{Title: "Printers offline", Customer: "c1"}, testevents.TicketClosed{})
			e.append("globex", "T-1", testevents.TicketOpened{Title: "Printer on fire", Customer: "c9"})
			e.append("globex", "T-9", testevents.TicketOpened{Title: "Network slow", Customer: "c9"})
			e.catchUp(d)

			acme, globex := search.WithTenant(e.ctx, "acme"), search.WithTenant(e.ctx, "globex")
			got, err := search.Search[ticketDoc](acme, p, "printer")
			must(t, err)
			if want := []string{"T-1", "T-2", "T-3"}; !slices.Equal(ids(got), want) {
				t.Fatalf("acme printer: got %v, want %v", ids(got), want)
			}
			for _, doc := range got {
				if doc.Customer == "c9" {
					t.Fatalf("acme's search returned globex's document %+v", doc)
				}
			}
			got, err = search.Search[ticketDoc](globex, p, "printer")
			must(t, err)
			if len(got) != 1 || got[0].Title != "Printer on fire" {
				t.Fatalf("globex printer: got %+v, want only its own T-1", got)
			}
			got, err = search.Search[ticketDoc](acme, p, "printer", search.Eq("status", "open"))
			must(t, err)
			if want := []string{"T-1", "T-2"}; !slices.Equal(ids(got), want) {
				t.Fatalf("acme printer status=open: got %v, want %v", ids(got), want)
			}
			got, err = search.Search[ticketDoc](acme, p, "", search.Eq("customer", "c1"))
			must(t, err)
			if want := []string{"T-1", "T-3"}; !slices.Equal(ids(got), want) {
				t.Fatalf("acme customer=c1: got %v, want %v", ids(got), want)
			}
			got, err = search.SearchQuery[ticketDoc](acme, p, search.Query{Sort: []search.Sort{{Attr: "comments", Desc: true}}, Limit: 1})
			must(t, err)
			if len(got) != 1 || got[0].ID != "T-2" || got[0].Comments != 5 {
				t.Fatalf("acme by comments desc, limit 1: got %+v, want T-2 with 5", got)
			}

			if _, err := search.Search[ticketDoc](e.ctx, p, "printer"); !errors.Is(err, search.ErrNoTenant) {
				t.Fatalf("search without a tenant: err %v, want ErrNoTenant", err)
			}
			if _, err := search.SearchQuery[ticketDoc](acme, p, search.Query{Limit: -1}); err == nil {
				t.Fatal("a negative limit was accepted")
			}
			if _, err := search.Search[ticketDoc](acme, p, "", search.Eq("title", "x")); !errors.Is(err, search.ErrInvalidFilter) {
				t.Fatalf("filter on a non-filterable attribute: err %v, want ErrInvalidFilter", err)
			}
			if _, err := search.Search[ticketDoc](search.WithTenant(e.ctx, "initech"), p, "printer"); err != nil {
				t.Fatal(err)
			} else if got, _ := search.Search[ticketDoc](search.WithTenant(e.ctx, "initech"), p, ""); len(got) != 0 {
				t.Fatalf("a tenant with no documents sees %+v", got)
			}
		})
	}
}

// TestBadDocumentHaltsOrDeadLetters: a handler producing a document
// without its primary key fails its event. In halt mode the shard stops
// with the reason in its status and nothing after the event is indexed; in
// continuous mode the event is dead-lettered and the rest is indexed.
func TestBadDocumentHaltsOrDeadLetters(t *testing.T) {
	for _, bc := range backends() {
		for _, mode := range []projection.ErrorMode{projection.HaltOnError, projection.SkipApplyErrors} {
			t.Run(bc.name+"/"+mode.String(), func(t *testing.T) {
				t.Parallel()
				e := newEnv(t)
				p := e.ticketProjection("ticket_search", bc.make(e), projection.AsyncConfig{ErrorMode: mode, MaxAttempts: 1})
				e.append("acme", "T-1", testevents.TicketOpened{Title: "before"})
				e.append("acme", "T-2", testevents.TicketOpened{Title: "poisoned"}, testevents.TicketCommented{Body: "poison"})
				e.append("acme", "T-3", testevents.TicketOpened{Title: "after"})
				d := e.dispatcher(p)
				id := projection.ShardID{Consumer: "ticket_search", Instance: projection.SharedInstance}
				admin := projection.NewAdmin(e.store)
				if mode == projection.HaltOnError {
					var st projection.ShardState
					eventually(t, 30*time.Second, "the shard to halt", func() bool {
						var err error
						st, err = admin.Status(e.ctx, id)
						must(t, err)
						return st.Status == projection.StatusDead
					})
					if !strings.Contains(st.LastError, "invalid document") {
						t.Fatalf("dead shard's last error %q does not say why", st.LastError)
					}
					sameIndex(t, "after the halt", []string{
						`acme/T-1 {"id":"T-1","status":"open","title":"before"}`,
						`acme/T-2 {"id":"T-2","status":"open","title":"poisoned"}`,
					}, indexed(t, e.ctx, p.SearchBackend()))
					return
				}
				e.catchUp(d)
				var n int
				must(t, e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+e.store.Table("projector_dead_letters")+
					` WHERE consumer = 'ticket_search' AND event_type = 'ticket.commented'`).Scan(&n))
				if n != 1 {
					t.Fatalf("%d dead letters for the poison event, want 1", n)
				}
				sameIndex(t, "continuous mode", []string{
					`acme/T-1 {"id":"T-1","status":"open","title":"before"}`,
					`acme/T-2 {"id":"T-2","status":"open","title":"poisoned"}`,
					`acme/T-3 {"id":"T-3","status":"open","title":"after"}`,
				}, indexed(t, e.ctx, p.SearchBackend()))
			})
		}
	}
}

// TestPromise13_IndexConvergesOnLog: after a random history of creates,
// patches, deletes and deletes-by-filter over many streams of two tenants,
// each backend's index equals the documents folded from the same events;
// and again after the log is replayed from the start into the same index
// by a second consumer (every operation is idempotent).
func TestPromise13_IndexConvergesOnLog(t *testing.T) {
	for _, bc := range backends() {
		t.Run(bc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			b := bc.make(e)
			p := e.ticketProjection("ticket_search", b, projection.AsyncConfig{BatchSize: 37})
			d := e.dispatcher(p)
			rng := rand.New(rand.NewPCG(13, uint64(time.Now().UnixNano())))
			want := e.history(rng, model{}, []string{"acme", "globex"}, 60, 800).canonical(t)
			e.catchUp(d)
			sameIndex(t, "after the history", want, indexed(t, e.ctx, b))

			replay := e.ticketProjection("ticket_search_replay", b, projection.AsyncConfig{BatchSize: 101})
			e.catchUp(e.dispatcher(replay))
			sameIndex(t, "after a replay from the start", want, indexed(t, e.ctx, b))
		})
	}
}

// TestPromise13_PGSearchRebuildInPlace: the PostgreSQL index is a declared
// table of the consumer, so an in-place rebuild clears it and replays the
// log into it; the result equals the fold of the log.
func TestPromise13_PGSearchRebuildInPlace(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	b, err := pgsearch.New(e.store, pgsearch.Config{})
	must(t, err)
	p := e.ticketProjection("ticket_search", b, projection.AsyncConfig{})
	d := e.dispatcher(p)
	rng := rand.New(rand.NewPCG(1313, uint64(time.Now().UnixNano())))
	want := e.history(rng, model{}, []string{"acme", "globex"}, 30, 300).canonical(t)
	e.catchUp(d)
	sameIndex(t, "before the rebuild", want, indexed(t, e.ctx, b))
	// A planted document the log does not explain: the rebuild must drop it.
	_, err = e.store.Pool().Exec(e.ctx, `INSERT INTO `+e.store.Schema()+`.`+pgsearch.TableName(ticketIndex)+` (tenant_id, id, doc) VALUES ('acme', 'planted', '{"id":"planted"}')`)
	must(t, err)
	if _, err := rebuild.Request(e.ctx, e.store, "ticket_search", rebuild.Options{Mode: rebuild.InPlace}); err != nil {
		t.Fatal(err)
	}
	admin := projection.NewAdmin(e.store)
	eventually(t, 60*time.Second, "the in-place rebuild to finish", func() bool {
		rs, err := rebuild.List(e.ctx, e.store, "ticket_search")
		must(t, err)
		return len(rs) > 0 && !rs[0].Active()
	})
	e.catchUp(d)
	st, err := admin.Status(e.ctx, projection.ShardID{Consumer: "ticket_search", Instance: projection.SharedInstance})
	must(t, err)
	if st.Status == projection.StatusDead {
		t.Fatalf("shard dead after the rebuild: %s", st.LastError)
	}
	sameIndex(t, "after the in-place rebuild", want, indexed(t, e.ctx, b))
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
