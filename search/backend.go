package search

import (
	"context"
	"encoding/json"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/stores/postgres"
)

// Backend is a search engine that holds indexes: stores/pgsearch (PostgreSQL
// full-text search, the embedded default) and stores/meilisearch. It is
// declared here, where it is consumed, and kept small: everything a
// projection and a search need, nothing else.
type Backend interface {
	// Kind names the backend in errors, logs and the CLI ("pgsearch",
	// "meilisearch").
	Kind() string
	// Ensure creates idx if it does not exist and applies its settings.
	// Called once at start, before the dispatcher runs the projection; an
	// error must say what failed (unreachable, refused settings).
	Ensure(ctx context.Context, idx Index) error
	// Apply applies ops to idx in order. tx is the dispatcher's transaction
	// of the batch, scoped to the ops' tenant: a backend in the same
	// database writes through it, so its writes commit with the cursor
	// (exactly once); a backend elsewhere returns only once its engine
	// confirmed the writes, so the cursor never passes unconfirmed work. An
	// error is a handler error: the batch is retried with backoff (halt
	// mode) or the failing event dead-lettered (continuous mode).
	Apply(ctx context.Context, tx pgx.Tx, idx Index, ops []Op) error
	// Query runs q on idx and returns the matching documents as JSON
	// objects, without the backend's own attributes. It filters by
	// q.Tenant exactly as given: callers outside this package go through
	// [Search], which takes the tenant from the context.
	Query(ctx context.Context, idx Index, q Request) ([]json.RawMessage, error)
}

// TableOwner is implemented by backends that keep an index in tables of
// the application's database: the projection declares them
// (projection.AsyncConfig.Tables) so a rebuild can clear or shadow them.
type TableOwner interface {
	Tables(idx Index) []string
}

// Request is a query as a backend receives it: the caller's [Query] with
// the tenant filter [Search] added.
type Request struct {
	Query
	// Tenant restricts the results to one tenant's documents in a
	// tenant-owned index; unused in a shared one.
	Tenant string
}

// Stored is a document as a backend holds it: for comparing an index with
// what the log says it should hold (tests, verify).
type Stored struct {
	Tenant string // "" in a shared index
	ID     string
	Doc    json.RawMessage
}

// Lister is implemented by backends that can list every document of an
// index, ordered by tenant and id.
type Lister interface {
	Documents(ctx context.Context, idx Index) ([]Stored, error)
}

// DBBinder is implemented by backends that keep indexes in the
// application's database and may be built before a pool exists
// (pgsearch.NewForSchema): [Verify] and the CLI hand them the store's pool.
type DBBinder interface {
	BindDB(db postgres.DB)
}
