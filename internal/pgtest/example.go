package pgtest

import (
	"context"
	"fmt"
	"os"
	"sync"

	"github.com/jackc/pgx/v5"
)

// exampleSchemas are the schema names ExampleDatabase handed out, dropped by
// Main after the run: examples have no testing.T to clean up after them.
var exampleSchemas struct {
	mu    sync.Mutex
	names []string
}

// ExampleDatabase returns the test database's URL and a fresh schema name,
// for Example functions, which have no testing.T: they open their own pool
// on the URL and migrate the schema themselves, exactly as an application
// does with PROJECTOR_DATABASE_URL and its schema, so the setup a reader
// copies is in the example and not hidden here. It panics when there is no
// test database; [Main] drops the schema when the package's tests are done.
func ExampleDatabase() (url, schema string) {
	shared.once.Do(setup)
	if shared.err != nil {
		panic(shared.err)
	}
	schema = newSchemaName("")
	exampleSchemas.mu.Lock()
	exampleSchemas.names = append(exampleSchemas.names, schema)
	exampleSchemas.mu.Unlock()
	return withPoolMaxConns(shared.url, childPoolConns), schema
}

// dropExampleSchemas drops the schemas examples made.
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
