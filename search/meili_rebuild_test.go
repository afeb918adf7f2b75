package search_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
	"github.com/projectorhq/projector/search"
	"github.com/projectorhq/projector/stores/meilisearch/meilisearchtest"
)

// searchLoop searches tenant's documents in b until stop is closed and
// counts the searches and the empty answers; an error fails the test.
func searchLoop(t *testing.T, b search.Backend, tenant string, stop <-chan struct{}) (searches, empty *atomic.Int64, done <-chan struct{}) {
	searches, empty = new(atomic.Int64), new(atomic.Int64)
	ch := make(chan struct{})
	ctx := search.WithTenant(context.Background(), tenant)
	go func() {
		defer close(ch)
		for {
			select {
			case <-stop:
				return
			default:
			}
			docs, err := search.Search[ticketDoc](ctx, search.Target(b, ticketIndex), "")
			if err != nil {
				t.Errorf("a search during the rebuild failed: %v", err)
				return
			}
			searches.Add(1)
			if len(docs) == 0 {
				empty.Add(1)
			}
		}
	}()
	return searches, empty, ch
}

// TestPromise13_MeiliBlueGreenRebuildKeepsAnswering: `projector rebuild`
// (rebuild.Request) of a search projection on Meilisearch: version 2's
// dispatcher builds a shadow index (uid + "__rebuild_<id>") from the log
// while version 1's serves and keeps indexing; events keep arriving
// meanwhile; the switch commits and the shadow is swapped in. A searcher
// looping through all of it always gets an answer with documents, never
// an error; afterwards the live index equals the fold of the log and the
// old index is gone.
func TestPromise13_MeiliBlueGreenRebuildKeepsAnswering(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	fake := meilisearchtest.New(t)
	b := meiliBackend(e, fake.URL(), "")
	v1 := e.ticketProjection("ticket_search", b, projection.AsyncConfig{Version: 1})
	rng := rand.New(rand.NewPCG(1332, uint64(time.Now().UnixNano())))
	tenants := []string{"acme", "globex"}
	e.catchUp(e.dispatcher(v1))
	m := e.history(rng, model{}, tenants, 40, 400)
	if len(m["acme"]) == 0 {
		t.Skip("the random history left acme without documents; nothing to search for")
	}
	stop := make(chan struct{})
	searches, empty, done := searchLoop(t, b, "acme", stop)
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-done
	}()
	eventually(t, time.Minute, "version 1 to answer", func() bool { return searches.Load() > 0 && empty.Load() < searches.Load() })
	empty.Store(0) // before version 1 caught up, empty answers were right

	v2 := e.ticketProjection("ticket_search", b, projection.AsyncConfig{Version: 2, BatchSize: 50, RebuildBatchSize: 50})
	d2 := e.dispatcher(v2)
	rb, err := rebuild.Request(e.ctx, e.store, "ticket_search", rebuild.Options{})
	must(t, err)
	shadowUID := b.UID(ticketIndex) + "__rebuild_" + itoa(rb.ID)
	m = e.history(rng, m, tenants, 40, 200) // while it builds
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	final, err := rebuild.Wait(ctx, e.store, "ticket_search", 20*time.Millisecond, nil)
	must(t, err)
	if final.Status != rebuild.Switched {
		t.Fatalf("rebuild ended %+v", final)
	}
	if fake.Requests("POST /swap-indexes") != 1 {
		t.Fatalf("%d swap requests, want 1", fake.Requests("POST /swap-indexes"))
	}
	before := searches.Load()
	eventually(t, time.Minute, "searches after the switch", func() bool { return searches.Load() > before })
	close(stop)
	<-done
	if n := empty.Load(); n > 0 {
		t.Fatalf("%d of %d searches during the rebuild came back empty", n, searches.Load())
	}
	must(t, d2.CatchUp(ctx))
	sameIndex(t, "after the blue/green rebuild", m.canonical(t), indexed(t, e.ctx, b))
	if exists, _ := fake.Index(shadowUID); exists {
		t.Fatalf("index %s (the old index after the swap) was not deleted", shadowUID)
	}
	// Version 2 keeps indexing into the swapped-in index.
	m = e.history(rng, m, tenants, 40, 50)
	must(t, d2.CatchUp(ctx))
	sameIndex(t, "after more events", m.canonical(t), indexed(t, e.ctx, b))
	t.Logf("%d searches during the rebuild, none empty", searches.Load())
}

// TestPromise13_MeiliRebuildSIGKILLBetweenCommitAndSwap: the dispatcher
// that switches a Meilisearch search projection's rebuild is a child
// process; its swap requests are refused (503), so it commits the switch
// ('swapping') and cannot swap; it is SIGKILLed there. Meanwhile version 1
// stands aside (superseded), and nobody writes the old live index: searches
// keep answering from it. A new dispatcher of version 2 then finds the
// rebuild swapping, swaps once, and the index ends switched and equal to
// the fold of the log, events appended while nobody indexed included.
func TestPromise13_MeiliRebuildSIGKILLBetweenCommitAndSwap(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	fake := meilisearchtest.New(t)
	b := meiliBackend(e, fake.URL(), "")
	v1 := e.ticketProjection("ticket_search", b, projection.AsyncConfig{Version: 1})
	d1 := e.dispatcher(v1)
	e.catchUp(d1)
	rng := rand.New(rand.NewPCG(1333, uint64(time.Now().UnixNano())))
	tenants := []string{"acme", "globex"}
	m := e.history(rng, model{}, tenants, 30, 300)
	// Version 1 has indexed the history before the rebuild supersedes it:
	// the live index then has what the searches below expect to find
	// (else a quick switch could leave it empty, which is not the point).
	e.catchUp(d1)
	var refuse atomic.Bool
	refuse.Store(true)
	fake.Refuse("POST /swap-indexes", refuse.Load)

	child := pgtest.StartChild(t, childEnv+"=1", childURLEnv+"="+pgtest.URL(t), childSchemaEnv+"="+e.store.Schema(),
		childMeiliEnv+"="+fake.URL(), childVersion+"=2")
	var rb rebuild.Rebuild
	eventually(t, time.Minute, "the child to register version 2", func() bool {
		var err error
		rb, err = rebuild.Request(e.ctx, e.store, "ticket_search", rebuild.Options{Version: 2})
		if err != nil && !errors.Is(err, rebuild.ErrUnknownProjection) {
			t.Fatal(err)
		}
		return err == nil
	})
	eventually(t, time.Minute, "the child to commit the switch and fail to swap", func() bool {
		r, err := rebuild.Current(e.ctx, e.store, "ticket_search")
		must(t, err)
		return r.Status == rebuild.Swapping && fake.Requests("POST /swap-indexes") >= 2
	})
	child.Kill(t)
	if r, err := rebuild.Current(e.ctx, e.store, "ticket_search"); err != nil || r.Status != rebuild.Swapping || !r.Active() {
		t.Fatalf("after the kill: %+v, %v", r, err)
	}
	// `projector status` lists it among the rebuilds in progress.
	if rs, err := rebuild.InProgress(e.ctx, e.store); err != nil || len(rs) != 1 || rs[0].Status != rebuild.Swapping {
		t.Fatalf("in progress while swapping: %+v, %v", rs, err)
	}
	// Nobody indexes now: v1 is superseded, v2's only dispatcher is dead.
	// The old index still answers.
	m = e.history(rng, m, tenants, 30, 100)
	if len(m["acme"]) > 0 {
		docs, err := search.Search[ticketDoc](search.WithTenant(e.ctx, "acme"), search.Target(b, ticketIndex), "")
		must(t, err)
		if len(docs) == 0 {
			t.Fatal("while swapping, the live index answered nothing")
		}
	}
	refuse.Store(false)
	v2 := e.ticketProjection("ticket_search", b, projection.AsyncConfig{Version: 2})
	d2 := e.dispatcher(v2)
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	final, err := rebuild.Wait(ctx, e.store, "ticket_search", 20*time.Millisecond, nil)
	must(t, err)
	if final.Status != rebuild.Switched || final.ID != rb.ID {
		t.Fatalf("rebuild ended %+v", final)
	}
	must(t, d2.CatchUp(ctx))
	sameIndex(t, "after the resumed swap", m.canonical(t), indexed(t, e.ctx, b))
	if exists, _ := fake.Index(b.UID(ticketIndex) + "__rebuild_" + itoa(rb.ID)); exists {
		t.Fatal("the old index (under the shadow's uid after the swap) was not deleted")
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
