// Package pgtest gives tests a real PostgreSQL: one lazily created pool per
// test binary and a fresh, migrated schema per test, so tests run in
// parallel without seeing each other's rows.
//
// The database comes from PROJECTOR_TEST_DATABASE_URL when it is set.
// Otherwise pgtest starts a throwaway cluster from the local PostgreSQL
// binaries for the life of the test binary. With CI=true and neither
// available, tests fail (never skip) with a message that says what to start.
//
// Every package's TestMain calls [Main], which also checks for leaked
// goroutines after the tests ran.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgserver"
	"github.com/projectorhq/projector/stores/postgres"
)

// EnvURL names the variable that points tests at a database.
const EnvURL = "PROJECTOR_TEST_DATABASE_URL"

// schemaPrefix marks schemas made by tests; stale ones (from a killed run)
// are dropped when a test binary starts.
const schemaPrefix = "pt_"

// benchSchemaPrefix marks the schemas `projector bench` makes
// (internal/benchmark.SchemaPrefix, repeated rather than imported so that
// pgtest does not depend on the projection package benchmark pulls in); the
// cmd/projector tests run `projector bench` against the test database.
const benchSchemaPrefix = "projector_bench_"

// Stale-schema ages: a test schema is an hour old only if its run died; a
// bench schema is given a day because a long catch-up run may take hours.
const (
	staleTestSchemaAge  = time.Hour
	staleBenchSchemaAge = 24 * time.Hour
)

// dropTimeout bounds a clean-up drop, which runs under its own context: the
// test's is already cancelled when cleanups run.
const dropTimeout = 30 * time.Second

// connectTimeout bounds opening the shared pool (or starting a throwaway
// server): a binary that waited for its slot of the budget still has all
// of it.
const connectTimeout = 2 * time.Minute

// sharedDB is the database every test of a binary shares.
type sharedDB struct {
	once          sync.Once
	url           string
	server        *pgserver.Server
	stopContainer func() error
	pool          *pgxpool.Pool
	slot          *pgx.Conn // holds this binary's slot of the connection budget
	err           error
}

var shared sharedDB

// startContainer starts PostgreSQL in a container; set by the
// testcontainers build tag (container.go), nil otherwise.
var startContainer func(ctx context.Context) (url string, stop func() error, err error)

// Main runs a package's tests, then closes the shared pool, stops a
// throwaway server if one was started and fails the run if goroutines leaked.
func Main(m *testing.M) {
	capParallel()
	code := m.Run()
	if shared.pool != nil {
		dropExampleSchemas()
		shared.pool.Close()
	}
	if shared.slot != nil {
		_ = shared.slot.Close(context.Background())
	}
	if shared.server != nil {
		if err := shared.server.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
		}
	}
	if shared.stopContainer != nil {
		if err := shared.stopContainer(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
		}
	}
	// Docker's client keeps goroutines of its own after a container run;
	// the leak check speaks for Projector's code on the other paths.
	if code == 0 && shared.stopContainer == nil {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest: goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// setup connects the shared database.
func setup() {
	shared.setup(os.Getenv(EnvURL), isChild(), connectTimeout)
	if shared.slot != nil {
		// Child processes inherit the slot (and so never wait for one).
		os.Setenv(EnvSlotHeld, "1")
	}
}

// setup connects s to the server at url (or a throwaway one if url is
// empty) for a test binary, or for a child process of one (child), and
// records why not in s.err.
func (s *sharedDB) setup(url string, child bool, timeout time.Duration) {
	s.url = url
	if s.url != "" && !child {
		// A server other binaries share: wait for this binary's turn. The
		// wait has no deadline of its own; go test's -timeout bounds it.
		slot, err := acquireSlot(context.Background(), s.url)
		if err != nil {
			s.err = fmt.Errorf("connect to test database: %w", err)
			return
		}
		s.slot = slot
	}
	// From here, not before the wait: a binary that waited for its slot
	// longer than timeout must still connect.
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if s.url == "" {
		srv, err := pgserver.Start(ctx)
		switch {
		case err == nil:
			s.server, s.url = srv, srv.URL
		case errors.Is(err, pgserver.ErrNoBinaries) && startContainer != nil:
			url, stop, cerr := startContainer(ctx)
			if cerr != nil {
				s.err = fmt.Errorf("no test database: %s is not set, no local PostgreSQL binaries, and %w", EnvURL, cerr)
				return
			}
			s.url, s.stopContainer = url, stop
		default:
			hint := ""
			if startContainer == nil {
				hint = "; where Docker runs, `go test -tags testcontainers ./...` starts one in a container"
			}
			s.err = fmt.Errorf("no test database: %s is not set and a throwaway cluster could not be started: %w\n"+
				"Start PostgreSQL and set %s=postgres://user@127.0.0.1:5432/db (or run `make test`, which finds or starts one)%s", EnvURL, err, EnvURL, hint)
			return
		}
	}
	s.url = withoutFlushWait(s.url)
	cfg, err := pgxpool.ParseConfig(s.url)
	if err != nil {
		s.err = fmt.Errorf("parse %s: %w", EnvURL, err)
		return
	}
	if child {
		tunePool(cfg, childPoolConns)
	} else {
		tunePool(cfg, sharedPoolConns)
	}
	s.pool, s.err = pgxpool.NewWithConfig(ctx, cfg)
	if s.err == nil {
		s.err = s.pool.Ping(ctx)
	}
	if s.err != nil {
		s.err = fmt.Errorf("connect to test database: %w", s.err)
		return
	}
	dropStale(ctx, s.pool)
}

func ready(t testing.TB) {
	t.Helper()
	shared.once.Do(setup)
	if shared.err != nil {
		// A missing database is a failure, never a skip: in CI a skipped
		// suite would read as a green one.
		t.Fatal(shared.err)
	}
}

// URL returns the test database's URL for a process a test starts (the
// projector binary, say): it carries pool_max_conns, so the process keeps
// to the connection budget. pgx.Connect does not take that parameter: open
// single connections with [ConnConfig].
func URL(t testing.TB) string {
	ready(t)
	return withPoolMaxConns(shared.url, childPoolConns)
}

// ConnConfig returns a configuration for one connection to the test
// database, for a test that needs a connection of its own (LISTEN, say).
func ConnConfig(t testing.TB) *pgx.ConnConfig {
	t.Helper()
	ready(t)
	cfg, err := pgx.ParseConfig(shared.url)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// Pool returns the pool every test of the binary shares. Do not close it.
func Pool(t testing.TB) *pgxpool.Pool {
	ready(t)
	return shared.pool
}

// NewPool returns a pool of its own, closed when the test ends, for tests
// that need several independent clients (several dispatchers, say).
func NewPool(t testing.TB, maxConns int32) *pgxpool.Pool {
	cfg := PoolConfig(t)
	cfg.MaxConns = maxConns
	return PoolFromConfig(t, cfg)
}

// PoolConfig returns a pool configuration for the test database, to adjust
// (an application_name to find the pool's backends by, say) before
// [PoolFromConfig]. It is sized for a child process's share of the
// connection budget; set MaxConns for more.
func PoolConfig(t testing.TB) *pgxpool.Config {
	t.Helper()
	ready(t)
	cfg, err := pgxpool.ParseConfig(shared.url)
	if err != nil {
		t.Fatal(err)
	}
	tunePool(cfg, childPoolConns)
	return cfg
}

// PoolFromConfig opens a pool closed when the test ends.
func PoolFromConfig(t testing.TB, cfg *pgxpool.Config) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Schema creates a new schema with every migration applied and drops it
// when the test ends (kept, and named in the log, when the test failed and
// PROJECTOR_TEST_KEEP is set).
func Schema(t testing.TB) string {
	t.Helper()
	pool := Pool(t)
	name := newSchemaName("")
	if _, err := postgres.Migrate(context.Background(), pool, name); err != nil {
		t.Fatalf("migrate test schema %s: %v", name, err)
	}
	t.Cleanup(func() { dropSchema(t, name) })
	return name
}

// SchemaName reserves a name for a schema the code under test creates
// itself (a `projector migrate --schema` run, say) and drops that schema, if
// it exists, when the test ends. The name is pt_<kind>_<unix time>_<random>,
// so the stale-schema sweeper knows its age even when a killed run never
// got to drop it. kind is a short lower-case word saying which test made it.
func SchemaName(t testing.TB, kind string) string {
	t.Helper()
	ready(t)
	name := newSchemaName(kind)
	t.Cleanup(func() { dropSchema(t, name) })
	return name
}

// newSchemaName returns pt_[kind_]<unix time>_<random>: the time lets
// [dropStale] tell a leftover from a schema a running test still uses.
func newSchemaName(kind string) string {
	if kind != "" {
		kind += "_"
	}
	return schemaPrefix + kind + strconv.FormatInt(time.Now().Unix(), 10) + "_" + randomHex(4)
}

// dropSchema drops a test's schema in a cleanup, under a context of its own
// (t.Context() is already cancelled when cleanups run, and a drop under it
// silently leaks the schema), unless the test failed and PROJECTOR_TEST_KEEP
// asks to keep it.
func dropSchema(t testing.TB, name string) {
	if t.Failed() && os.Getenv("PROJECTOR_TEST_KEEP") != "" {
		t.Logf("kept schema %s for inspection", name)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), dropTimeout)
	defer cancel()
	if _, err := shared.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{name}.Sanitize()+` CASCADE`); err != nil {
		t.Logf("drop test schema %s: %v", name, err)
		return
	}
	afterDrop()
}

// Store returns a store on a new schema of its own with reg's event types.
func Store(t testing.TB, reg *projector.Registry, cfg ...postgres.Config) *postgres.Store {
	t.Helper()
	var c postgres.Config
	if len(cfg) > 0 {
		c = cfg[0]
	}
	c.Schema = Schema(t)
	c.Registry = reg
	s, err := postgres.New(context.Background(), Pool(t), c)
	if err != nil {
		t.Fatalf("new store: %v", err)
	}
	return s
}

// SchemaExists reports whether the test database has a schema called name:
// for tests of code that must clean up the schemas it makes.
func SchemaExists(t testing.TB, name string) bool {
	t.Helper()
	var ok bool
	err := Pool(t).QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, name).Scan(&ok)
	if err != nil {
		t.Fatalf("look up schema %s: %v", name, err)
	}
	return ok
}

// dropStale removes test schemas left behind by runs that were killed
// before their cleanups ran: every schema the suite makes — pt_<unix>_…
// ([Schema], [ExampleDatabase]), pt_<kind>_<unix>_… ([SchemaName]), older
// pt_<name> schemas of tests that chose a fixed name, and the
// projector_bench_… schemas of `projector bench` — once it is older than
// its stale age. The age is the unix time in the name where there is one,
// else when the schema's first migration ran; a schema with neither is left
// alone, as its age cannot be told.
func dropStale(ctx context.Context, pool *pgxpool.Pool) {
	for _, n := range staleSchemas(ctx, pool, time.Now()) {
		_, _ = pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{n}.Sanitize()+` CASCADE`)
	}
}

// stampedSchema matches a test schema name carrying its creation time.
var stampedSchema = regexp.MustCompile(`^pt_(?:[a-z]+_)?([0-9]{9,})_[0-9a-f]+$`)

// staleSchemas lists the test schemas [dropStale] should drop at now.
func staleSchemas(ctx context.Context, pool *pgxpool.Pool, now time.Time) []string {
	rows, err := pool.Query(ctx, `SELECT nspname FROM pg_namespace WHERE nspname LIKE 'pt\_%' OR nspname LIKE 'projector\_bench\_%'`)
	if err != nil {
		return nil
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil
	}
	var stale []string
	for _, n := range names {
		maxAge := staleTestSchemaAge
		if strings.HasPrefix(n, benchSchemaPrefix) {
			maxAge = staleBenchSchemaAge
		}
		var created time.Time
		if m := stampedSchema.FindStringSubmatch(n); m != nil {
			ts, err := strconv.ParseInt(m[1], 10, 64)
			if err != nil {
				continue
			}
			created = time.Unix(ts, 0)
		} else if err := pool.QueryRow(ctx, `SELECT min(applied_at) FROM `+pgx.Identifier{n, "projector_migrations"}.Sanitize()).Scan(&created); err != nil {
			continue // no migrations table (or no rows): age unknown
		}
		if now.Sub(created) > maxAge {
			stale = append(stale, n)
		}
	}
	return stale
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(errors.Join(errors.New("pgtest: random"), err))
	}
	return hex.EncodeToString(b)
}
