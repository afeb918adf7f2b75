package search_test

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/search"
	"github.com/projectorhq/projector/stores/meilisearch"
	"github.com/projectorhq/projector/stores/meilisearch/meilisearchtest"
	"github.com/projectorhq/projector/stores/pgsearch"
	"github.com/projectorhq/projector/stores/postgres"
)

// A child is this test binary run as a dispatcher of the ticket search
// projection, so a test can SIGKILL a real indexing process.
const (
	childEnv       = "PROJECTOR_TEST_SEARCH_CHILD"
	childURLEnv    = "PROJECTOR_TEST_SEARCH_CHILD_URL"
	childSchemaEnv = "PROJECTOR_TEST_SEARCH_CHILD_SCHEMA"
	childMeiliEnv  = "PROJECTOR_TEST_SEARCH_CHILD_MEILI"   // the fake's URL; empty: pgsearch
	childVersion   = "PROJECTOR_TEST_SEARCH_CHILD_VERSION" // the projection's version; empty: 1
	childBatch     = 20
)

// runChild is the child's main: index until SIGTERM (or SIGKILL).
func runChild() int {
	ctx, stop := pgtest.ChildContext()
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	fail := func(what string, err error) int {
		logger.Error("search child: "+what, "error", err)
		return 1
	}
	pool, err := pgxpool.New(ctx, os.Getenv(childURLEnv))
	if err != nil {
		return fail("pool", err)
	}
	defer pool.Close()
	types := testevents.New()
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: os.Getenv(childSchemaEnv), Registry: types.Registry, Logger: logger})
	if err != nil {
		return fail("store", err)
	}
	var b search.Backend
	if url := os.Getenv(childMeiliEnv); url != "" {
		b, err = meilisearch.New(meilisearch.Config{URL: url, IndexPrefix: store.Schema() + "_", PollInterval: 2 * time.Millisecond})
	} else {
		b, err = pgsearch.New(store, pgsearch.Config{})
	}
	if err != nil {
		return fail("backend", err)
	}
	version, _ := strconv.Atoi(os.Getenv(childVersion))
	p, err := newTicketProjection(types, "ticket_search", b, projection.AsyncConfig{Version: version, BatchSize: childBatch, RetryBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, MaxAttempts: 1000})
	if err != nil {
		return fail("projection", err)
	}
	a, err := p.Async()
	if err != nil {
		return fail("async", err)
	}
	d, err := projection.New(projection.Config{Store: store, Projections: []*projection.Async{a}, Logger: logger,
		PollMax: 20 * time.Millisecond, Recheck: 20 * time.Millisecond})
	if err != nil {
		return fail("dispatcher", err)
	}
	if err := d.Start(ctx); err != nil {
		return fail("start", err)
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := d.Stop(sctx); err != nil {
		return fail("stop", err)
	}
	return 0
}

// TestPromise13_SIGKILLedIndexerConverges: a child process indexing the
// log (batches of 20) is SIGKILLed again and again while it catches up —
// between a batch's writes and its commit on PostgreSQL, between
// Meilisearch's tasks and the cursor on Meilisearch — and each time a new
// one takes over from the cursor. After at least six kills mid-catch-up,
// the index equals the fold of the log: nothing lost, nothing left over.
func TestPromise13_SIGKILLedIndexerConverges(t *testing.T) {
	for _, backend := range []string{"pgsearch", "meilisearch-fake"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			var b search.Backend
			var meiliURL string
			if backend == "pgsearch" {
				var err error
				b, err = pgsearch.New(e.store, pgsearch.Config{})
				must(t, err)
			} else {
				meiliURL = meilisearchtest.New(t).URL()
				b = meiliBackend(e, meiliURL, "")
			}
			e.ticketProjection("ticket_search", b, projection.AsyncConfig{}) // creates the index
			rng := rand.New(rand.NewPCG(1300, uint64(time.Now().UnixNano())))
			tenants := []string{"acme", "globex"}
			m := e.history(rng, model{}, tenants, 50, 1500)

			admin := projection.NewAdmin(e.store)
			id := projection.ShardID{Consumer: "ticket_search", Instance: projection.SharedInstance}
			status := func() projection.ShardState {
				st, err := admin.Status(e.ctx, id)
				if err != nil {
					return projection.ShardState{} // not registered yet
				}
				return st
			}
			kills := 0
			for round := 0; kills < 6; round++ {
				if round == 60 {
					t.Fatalf("only %d kills landed mid-catch-up in 60 rounds", kills)
				}
				before := status().Processed
				child := pgtest.StartChild(t, childEnv+"=1", childURLEnv+"="+pgtest.URL(t), childSchemaEnv+"="+e.store.Schema(), childMeiliEnv+"="+meiliURL)
				// Kill once the child has committed a batch or two: it is
				// then, most likely, in the middle of the next.
				target := before + int64(childBatch*(1+rng.IntN(3)))
				deadline := time.Now().Add(30 * time.Second)
				for status().Processed < target && time.Now().Before(deadline) {
					time.Sleep(time.Millisecond) // polling the child's progress
				}
				child.Kill(t)
				if time.Now().After(deadline) {
					t.Fatalf("child made no progress in 30s:\n%s", child.Output())
				}
				if status().LagEvents > 0 {
					kills++
				} else {
					m = e.history(rng, m, tenants, 50, 400) // caught up: give the next one work
				}
			}
			e.catchUp(e.dispatcher(e.ticketProjection("ticket_search", b, projection.AsyncConfig{})))
			sameIndex(t, "after the kills", m.canonical(t), indexed(t, e.ctx, b))
		})
	}
}
