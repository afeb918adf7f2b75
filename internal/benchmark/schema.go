package benchmark

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// Event type names of the measurements. Each measurement appends its own
// type, so measurements sharing one schema never count each other's events.
const (
	AppendedType   = "bench.appended"
	BackloggedType = "bench.backlogged"
	TimedType      = "bench.timed"
)

// Appended is the payload the append measurement writes: about the size of
// a short comment event.
type Appended struct {
	Body string `json:"body"`
	N    int    `json:"n"`
}

// Backlogged is the payload of the catch-up backlog. The backlog is
// inserted in SQL; the type is defined so the projections that read it
// pass the dispatcher's validation.
type Backlogged struct {
	Body string `json:"body"`
	N    int    `json:"n"`
}

// Timed is the payload the latency measurement writes, one per stream.
type Timed struct {
	Title string `json:"title"`
}

// NewRegistry returns a registry holding this package's event types and
// nothing else: the registry a store handed to a Measure function must have.
func NewRegistry() *projector.Registry {
	r := projector.NewRegistry()
	projector.MustDefine[Appended](r, AppendedType)
	projector.MustDefine[Backlogged](r, BackloggedType)
	projector.MustDefine[Timed](r, TimedType)
	return r
}

// checkRegistry fails early, with a message that says what to do, when a
// store was built without this package's event types.
func checkRegistry(store *postgres.Store, name string, payload any) error {
	info, ok := store.Registry().Lookup(name)
	if !ok || info.GoType != reflect.TypeOf(payload) {
		return fmt.Errorf("store registry lacks %q with payload %T: build the store with benchmark.NewRegistry()", name, payload)
	}
	return nil
}

// typeName names an event type for projection.OnEvent and OnBatch, which
// only need the name.
type typeName string

func (t typeName) Name() string { return string(t) }

// SchemaPrefix starts the name of every schema [NewSchema] makes;
// [DropSchema] refuses any other, so a mix-up cannot drop real data.
const SchemaPrefix = "projector_bench_"

// cleanupTimeout bounds the clean-up work done after a cancelled context,
// so an interrupted run still ends.
const cleanupTimeout = 30 * time.Second

// NewSchema creates and migrates a schema named SchemaPrefix plus a random
// suffix and returns a store on it with [NewRegistry]'s event types. Drop it
// with [DropSchema] when done.
func NewSchema(ctx context.Context, pool *pgxpool.Pool) (*postgres.Store, error) {
	name := SchemaPrefix + randomHex(4)
	if _, err := postgres.Migrate(ctx, pool, name); err != nil {
		return nil, fmt.Errorf("create bench schema: %w", err)
	}
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: name, Registry: NewRegistry(), Logger: quiet})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("open bench schema %s: %w", name, err), dropSchema(ctx, pool, name))
	}
	return store, nil
}

// DropSchema drops a schema [NewSchema] made, with everything in it. It
// runs even when ctx is already cancelled (an interrupted run must still
// clean up), bounded by its own timeout.
func DropSchema(ctx context.Context, store *postgres.Store) error {
	if !strings.HasPrefix(store.Schema(), SchemaPrefix) {
		return fmt.Errorf("drop bench schema: %q was not made by benchmark.NewSchema; refusing to drop it", store.Schema())
	}
	return dropSchema(ctx, store.Pool(), store.Schema())
}

func dropSchema(ctx context.Context, pool *pgxpool.Pool, name string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{name}.Sanitize()+` CASCADE`); err != nil {
		return fmt.Errorf("drop bench schema %s: %w", name, err)
	}
	return nil
}

// quiet discards the log lines of the stores and dispatchers a measurement
// builds: a benchmark's output is its figures.
var quiet = slog.New(slog.DiscardHandler)

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand panics instead)
	return hex.EncodeToString(b)
}
