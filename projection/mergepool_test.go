package projection_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// A merge holds a connection of its pool for its claims while it runs, so
// whatever it does after a refusal or a timeout (lifting holds, waking the
// dispatchers) must go through that connection too: on a pool of one
// connection, a second acquire would wait for the merge's own, for ever.
// Here the merge is refused (a disabled half) by an admin whose pool has a
// single connection, and must return the refusal, not hang.
func TestMergeOnAOneConnectionPoolReturns(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	p := countingThrough(e.schema, e.types, "single", projection.AsyncConfig{Partitions: 2, BatchSize: 50}, nil)
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	appendWith(t, e.ctx, e.store, 1, 40, 20, "a")
	e.catchUp(d)
	if err := d.Stop(e.ctx); err != nil {
		t.Fatal(err)
	}
	cfg := pgtest.PoolConfig(t)
	cfg.MaxConns = 1
	// Closed only once the merge returned: closing a pool waits for its
	// acquired connection, which a hung merge never gives back (the test
	// then fails at its deadline rather than hanging in its cleanup).
	pool, err := pgxpool.NewWithConfig(e.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	one, err := postgres.New(e.ctx, pool, postgres.Config{Schema: e.schema, Registry: e.types.Registry})
	if err != nil {
		pool.Close()
		t.Fatal(err)
	}
	admin := projection.NewAdmin(one)
	half := projection.ShardID{Consumer: "single", Instance: projection.PartitionInstance(1, 2)}
	if err := admin.Disable(e.ctx, half); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := admin.Merge(ctx, "single", time.Second)
		done <- err
	}()
	select {
	case err := <-done:
		pool.Close()
		if !errors.Is(err, projector.ErrInvalidTransition) {
			t.Fatalf("merge with a disabled half on a one-connection pool: %v, want ErrInvalidTransition", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("merge on a one-connection pool did not return within 30 s (its own connection held while it waits for another)")
	}
}
