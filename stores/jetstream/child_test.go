package jetstream_test

import (
	"context"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/projectorhq/projector/internal/pgtest"
	pjs "github.com/projectorhq/projector/stores/jetstream"
	"github.com/projectorhq/projector/stores/postgres"
)

// childFailed reports why a child process of these tests could not run
// and returns its exit code.
func childFailed(err error) int {
	fmt.Fprintln(os.Stderr, "child:", err)
	return 1
}

// openChild connects a child process of these tests as its parent said:
// a store on the parent's schema (childURLEnv, childSchemaEnv) configured
// by cfg, and a NATS connection (childNATSEnv). closeAll releases both.
func openChild(ctx context.Context, cfg postgres.Config) (store *postgres.Store, nc *nats.Conn, closeAll func(), err error) {
	pool, err := pgxpool.New(ctx, os.Getenv(childURLEnv))
	if err != nil {
		return nil, nil, nil, err
	}
	cfg.Schema = os.Getenv(childSchemaEnv)
	if store, err = postgres.New(ctx, pool, cfg); err == nil {
		nc, err = nats.Connect(os.Getenv(childNATSEnv))
	}
	if err != nil {
		pool.Close()
		return nil, nil, nil, err
	}
	return store, nc, func() { nc.Close(); pool.Close() }, nil
}

// consumeInChild runs, as a child process, the claims consumer consumer
// configures on the child's store (storeCfg, see openChild; the consumer's
// Store is set here), consuming the parent's durable JetStream consumer
// (childStreamEnv, childConsumerEnv) until the parent kills the process.
// It returns only if the consumer could not start.
func consumeInChild(ctx context.Context, storeCfg postgres.Config, consumer func(*postgres.Store) pjs.ConsumerConfig) int {
	store, nc, closeAll, err := openChild(ctx, storeCfg)
	if err != nil {
		return childFailed(err)
	}
	defer closeAll()
	js, err := jetstream.New(nc)
	if err != nil {
		return childFailed(err)
	}
	jc, err := js.Consumer(ctx, os.Getenv(childStreamEnv), os.Getenv(childConsumerEnv))
	if err != nil {
		return childFailed(err)
	}
	cfg := consumer(store)
	cfg.Store = store
	c, err := pjs.NewConsumer(cfg)
	if err != nil {
		return childFailed(err)
	}
	cc, err := c.Consume(ctx, jc)
	if err != nil {
		return childFailed(err)
	}
	defer cc.Stop()
	select {} // the parent kills us
}

// claimsChildEnv is the environment of a claims child of kind (the
// TestMain switch) consuming the durable consumer of e's stream for
// subscription into schema.
func claimsChildEnv(e *env, kind, schema, consumer string) []string {
	return []string{childEnv + "=" + kind, childURLEnv + "=" + pgtest.URL(e.t), childSchemaEnv + "=" + schema,
		childStreamEnv + "=" + e.stream, childNATSEnv + "=" + e.url, childConsumerEnv + "=" + consumer}
}
