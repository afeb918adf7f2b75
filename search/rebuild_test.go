package search_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
	"github.com/projectorhq/projector/search"
	"github.com/projectorhq/projector/stores/pgsearch"
)

// TestPromise13_PGSearchBlueGreenReindexKeepsAnswering: version 2 of a
// search projection on PostgreSQL is built blue/green into a shadow copy of
// the index table while version 1 serves; a searcher looping through the
// whole rebuild always gets an answer with documents in it, never an
// error; afterwards the index equals the fold of the log.
func TestPromise13_PGSearchBlueGreenReindexKeepsAnswering(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	b, err := pgsearch.New(e.store, pgsearch.Config{})
	must(t, err)
	v1 := e.ticketProjection("ticket_search", b, projection.AsyncConfig{Version: 1})
	e.catchUp(e.dispatcher(v1))
	rng := rand.New(rand.NewPCG(1331, uint64(time.Now().UnixNano())))
	m := e.history(rng, model{}, []string{"acme", "globex"}, 40, 400)
	for _, docs := range m {
		if len(docs) == 0 {
			t.Skip("the random history left a tenant without documents; nothing to search for")
		}
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

	v2 := e.ticketProjection("ticket_search", b, projection.AsyncConfig{Version: 2, BatchSize: 50})
	d2 := e.dispatcher(v2)
	if _, err := rebuild.Request(e.ctx, e.store, "ticket_search", rebuild.Options{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	final, err := rebuild.Wait(ctx, e.store, "ticket_search", 20*time.Millisecond, nil)
	must(t, err)
	if final.Status != rebuild.Switched {
		t.Fatalf("rebuild ended %+v", final)
	}
	before := searches.Load()
	eventually(t, time.Minute, "searches after the switch", func() bool { return searches.Load() > before })
	close(stop)
	<-done
	if n := empty.Load(); n > 0 {
		t.Fatalf("%d of %d searches during the rebuild came back empty", n, searches.Load())
	}
	must(t, d2.CatchUp(ctx))
	sameIndex(t, "after the blue/green reindex", m.canonical(t), indexed(t, e.ctx, b))
	// The next start's Ensure finds the switched-in table's settings
	// unchanged (no rewrite of its generated columns), and its filter
	// columns answer.
	attnum := func() (n int) {
		must(t, e.store.Pool().QueryRow(e.ctx, `SELECT attnum FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'search_text'`,
			e.store.Schema()+"."+pgsearch.TableName(ticketIndex)).Scan(&n))
		return n
	}
	was := attnum()
	must(t, b.Ensure(e.ctx, ticketIndex))
	if attnum() != was {
		t.Fatal("Ensure remade the generated columns of the switched-in table: its settings were lost in the switch")
	}
	sameIndex(t, "after Ensure on the switched-in table", m.canonical(t), indexed(t, e.ctx, b))
	open, err := search.Search[ticketDoc](search.WithTenant(context.Background(), "acme"), search.Target(b, ticketIndex), "", search.Eq("status", "open"))
	must(t, err)
	for _, d := range open {
		if d.Status != "open" {
			t.Fatalf("status=open filter returned %+v", d)
		}
	}
	t.Logf("%d searches during the rebuild, none empty; the switch held the tables %v", searches.Load(), final.SwitchTook)
}
