package pgtest

import (
	"context"
	"fmt"
	"os"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// exampleSchemas are the schemas ExampleStore made, dropped by Main after
// the run: examples have no testing.T to clean up after them.
var exampleSchemas struct {
	mu    sync.Mutex
	names []string
}

// ExampleStore returns a store with reg's event types on a fresh migrated
// schema of the shared test database, for Example functions, which have no
// testing.T: it panics on error, and [Main] drops the schema when the
// package's tests are done. cfg, if given, supplies the store's other
// settings (inline projections, say); its Schema and Registry are replaced.
func ExampleStore(reg *projector.Registry, cfg ...postgres.Config) *postgres.Store {
	shared.once.Do(setup)
	if shared.err != nil {
		panic(shared.err)
	}
	ctx := context.Background()
	name := newSchemaName("")
	exampleSchemas.mu.Lock()
	exampleSchemas.names = append(exampleSchemas.names, name)
	exampleSchemas.mu.Unlock()
	if _, err := postgres.Migrate(ctx, shared.pool, name); err != nil {
		panic(fmt.Errorf("pgtest: migrate example schema %s: %w", name, err))
	}
	var c postgres.Config
	if len(cfg) > 0 {
		c = cfg[0]
	}
	c.Schema, c.Registry = name, reg
	s, err := postgres.New(ctx, shared.pool, c)
	if err != nil {
		panic(fmt.Errorf("pgtest: example store: %w", err))
	}
	return s
}

// dropExampleSchemas drops what ExampleStore made.
func dropExampleSchemas() {
	exampleSchemas.mu.Lock()
	defer exampleSchemas.mu.Unlock()
	for _, name := range exampleSchemas.names {
		if _, err := shared.pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{name}.Sanitize()+` CASCADE`); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest: drop example schema", name+":", err)
		}
	}
	exampleSchemas.names = nil
}
