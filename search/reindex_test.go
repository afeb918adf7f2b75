package search_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/search"
	"github.com/projectorhq/projector/stores/meilisearch/meilisearchtest"
	"github.com/projectorhq/projector/stores/pgsearch"
)

// TestPromise13_MeiliReindexKeepsAnswering: a Meilisearch index is rebuilt
// from the log with search.Reindex (a new index beside the live one, live
// indexing held at a position, the new index brought to it, swap, resume)
// while a searcher loops and a writer keeps appending. Every search gets an
// answer with documents in it; afterwards a document planted in the old
// index is gone, the index equals the log (the events appended during the
// reindex included), verify finds nothing, the shadow index is deleted and
// the consumer runs again.
func TestPromise13_MeiliReindexKeepsAnswering(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	fake := meilisearchtest.New(t)
	b := meiliBackend(e, fake.URL(), "")
	p := e.ticketProjection("ticket_search", b, projection.AsyncConfig{BatchSize: 50})
	d := e.dispatcher(p)
	rng := rand.New(rand.NewPCG(1330, uint64(time.Now().UnixNano())))
	m := e.history(rng, model{}, []string{"acme", "globex"}, 40, 400)
	e.append("acme", "always-there", testevents.TicketOpened{Title: "never deleted"}) // a document every search finds
	m.apply("acme", "always-there", testevents.TicketOpened{Title: "never deleted"})
	e.catchUp(d)
	planted := []search.Op{{Kind: search.OpUpsert, Tenant: "acme", ID: "planted", Doc: map[string]json.RawMessage{"id": json.RawMessage(`"planted"`)}}}
	must(t, b.Apply(e.ctx, nil, ticketIndex, planted))

	var searches, empty atomic.Int64
	stop, searcherDone, writerDone := make(chan struct{}), make(chan struct{}), make(chan []string)
	acme := search.WithTenant(context.Background(), "acme")
	go func() {
		defer close(searcherDone)
		for {
			select {
			case <-stop:
				return
			default:
			}
			docs, err := search.Search[ticketDoc](acme, p, "")
			if err != nil {
				t.Errorf("a search during the reindex failed: %v", err)
				return
			}
			searches.Add(1)
			if len(docs) == 0 {
				empty.Add(1)
			}
		}
	}()
	go func() {
		var ids []string
		defer func() { writerDone <- ids }()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id := fmt.Sprintf("R-%d", i)
			err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
				_, err := e.store.Append(e.ctx, tx, projector.TenantStream("acme", "ticket", id), projector.NoStream, testevents.TicketOpened{Title: "during the reindex"})
				return err
			})
			if err != nil {
				t.Errorf("append during the reindex: %v", err)
				return
			}
			ids = append(ids, id)
		}
	}()
	r, err := search.Reindex(e.ctx, e.store, p, 100)
	close(stop)
	<-searcherDone
	written := <-writerDone
	must(t, err)
	for _, id := range written {
		m.apply("acme", id, testevents.TicketOpened{Title: "during the reindex"})
	}
	if n := empty.Load(); n > 0 || searches.Load() == 0 {
		t.Fatalf("%d of %d searches during the reindex came back empty", n, searches.Load())
	}
	e.catchUp(d)
	sameIndex(t, "after the reindex", m.canonical(t), indexed(t, e.ctx, b))
	report, err := search.Verify(e.ctx, e.store, p, search.VerifyOptions{})
	must(t, err)
	if !report.OK() {
		t.Fatalf("verify after the reindex: %+v", report.Differences)
	}
	if docs := fake.Documents(b.UID(ticketIndex) + "__reindex"); docs != nil {
		t.Fatalf("the shadow index is still there with %d documents", len(docs))
	}
	st, err := projection.NewAdmin(e.store).Status(e.ctx, projection.ShardID{Consumer: "ticket_search", Instance: projection.SharedInstance})
	must(t, err)
	if st.Status == projection.StatusDisabled {
		t.Fatal("the consumer is still held after the reindex")
	}
	t.Logf("reindex replayed %d events (built to %s, swapped at %s); %d searches, %d appends during it", r.Events, r.Built, r.Swapped, searches.Load(), len(written))
}

// TestReindexRefusals: PostgreSQL is reindexed by a rebuild, not a swap;
// a consumer an operator stopped is not taken over.
func TestReindexRefusals(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pg, err := pgsearch.New(e.store, pgsearch.Config{})
	must(t, err)
	p := e.ticketProjection("ticket_search", pg, projection.AsyncConfig{})
	if _, err := search.Reindex(e.ctx, e.store, p, 0); !errors.Is(err, search.ErrNotReindexable) {
		t.Fatalf("reindex on pgsearch: %v, want ErrNotReindexable", err)
	}
	fake := meilisearchtest.New(t)
	mp := e.ticketProjection("ticket_search_meili", meiliBackend(e, fake.URL(), ""), projection.AsyncConfig{})
	e.append("acme", "T-1", testevents.TicketOpened{Title: "x"})
	e.catchUp(e.dispatcher(mp))
	admin := projection.NewAdmin(e.store)
	id := projection.ShardID{Consumer: "ticket_search_meili", Instance: projection.SharedInstance}
	must(t, admin.Disable(e.ctx, id))
	if _, err := search.Reindex(e.ctx, e.store, mp, 0); !errors.Is(err, projector.ErrInvalidTransition) {
		t.Fatalf("reindex of a disabled consumer: %v, want ErrInvalidTransition", err)
	}
}
