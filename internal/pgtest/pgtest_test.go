package pgtest

import (
	"context"
	"flag"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector/internal/pgserver"
	"github.com/projectorhq/projector/stores/postgres"
)

func TestMain(m *testing.M) {
	if parentDeathChild() {
		return
	}
	Main(m)
}

// The sweeper finds the leftovers of every kind of schema the suite makes —
// not only pgtest.Schema's pt_<unix>_… — once they are old enough, and
// leaves young ones (a running test's) alone.
func TestDropStaleFindsEveryTestSchemaKind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := Pool(t)
	hour := strconv.FormatInt(time.Now().Add(-2*time.Hour).Unix(), 10)
	suffix := randomHex(4)
	old := []string{
		"pt_" + hour + "_" + suffix,         // pgtest.Schema, ExampleDatabase
		"pt_cli_" + hour + "_" + suffix,     // SchemaName(t, "cli")
		"pt_cli_" + suffix[:6] + "123",      // an older fixed-name test: aged by its migrations
		"pt_migrate_" + suffix,              // TestMigrateConcurrently's kind of name
		"projector_bench_" + suffix + "old", // `projector bench`, aged by its migrations
	}
	young := []string{
		"pt_cli_" + strconv.FormatInt(time.Now().Unix(), 10) + "_" + suffix,
		"pt_young_" + suffix,
		"projector_bench_" + suffix + "new",
	}
	for _, name := range append(slices.Clone(old), young...) {
		if _, err := postgres.Migrate(ctx, pool, name); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{name}.Sanitize()+` CASCADE`)
		})
	}
	// Names without a time are aged by their first migration: back-date
	// those of the old ones (the bench one by more than its day).
	for _, name := range old[2:] {
		age := "2 hours"
		if name == old[4] {
			age = "25 hours"
		}
		if _, err := pool.Exec(ctx, `UPDATE `+pgx.Identifier{name, "projector_migrations"}.Sanitize()+` SET applied_at = now() - $1::interval`, age); err != nil {
			t.Fatal(err)
		}
	}
	// A bench schema two hours old is still young: a long run may use it.
	if _, err := pool.Exec(ctx, `UPDATE `+pgx.Identifier{young[2], "projector_migrations"}.Sanitize()+` SET applied_at = now() - interval '2 hours'`); err != nil {
		t.Fatal(err)
	}

	stale := staleSchemas(ctx, pool, time.Now())
	for _, name := range old {
		// Another package's test binary starting meanwhile sweeps the
		// cluster too: a stale schema it already dropped was swept.
		if !slices.Contains(stale, name) && SchemaExists(t, name) {
			t.Errorf("stale schema %s not swept", name)
		}
	}
	for _, name := range young {
		if slices.Contains(stale, name) {
			t.Errorf("young schema %s would be swept", name)
		}
	}

	dropStale(ctx, pool)
	for _, name := range old {
		if SchemaExists(t, name) {
			t.Errorf("stale schema %s still there after dropStale", name)
		}
	}
	for _, name := range young {
		if !SchemaExists(t, name) {
			t.Errorf("young schema %s was dropped", name)
		}
	}
}

// A schema reserved with SchemaName is dropped when its test ends, even
// though the test's context is already cancelled by then.
func TestSchemaNameDroppedAfterTest(t *testing.T) {
	t.Parallel()
	var name string
	t.Run("user", func(t *testing.T) {
		name = SchemaName(t, "cli")
		if !stampedSchema.MatchString(name) {
			t.Errorf("SchemaName %q carries no creation time for the sweeper", name)
		}
		if _, err := postgres.Migrate(t.Context(), Pool(t), name); err != nil {
			t.Fatal(err)
		}
	})
	if SchemaExists(t, name) {
		t.Errorf("schema %s outlived its test", name)
	}
}

// Test binaries sharing a server take turns: on a server with room for one
// binary's budget, a second binary waits for the slot until the first one
// is done, and the URL handed to child processes asks for a small pool.
func TestBudgetSlotsMakeBinariesTakeTurns(t *testing.T) {
	t.Parallel()
	if _, err := pgserver.FindBinaries(); err != nil && os.Getenv("CI") != "true" {
		t.Skip("no local PostgreSQL binaries")
	}
	ctx := t.Context()
	maxConns := reservedConns + binaryBudget + binaryBudget/2 // room for one binary, not two
	if n := slots(maxConns); n != 1 {
		t.Fatalf("slots(%d) = %d, want 1", maxConns, n)
	}
	if n := slots(100); n < 2 || n*binaryBudget+reservedConns > 100 {
		t.Fatalf("slots(100) = %d: a stock server must fit at least two binaries and never more than it has", n)
	}
	srv, err := pgserver.Start(ctx, "max_connections="+strconv.Itoa(maxConns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Error(err)
		}
	})
	first, err := acquireSlot(ctx, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		second, err := acquireSlot(ctx, srv.URL)
		if err == nil {
			err = second.Close(context.Background())
		}
		got <- err
	}()
	// The second binary must be waiting, not through: its connection is
	// there and has asked for the lock, and has not got it.
	admin, err := pgx.Connect(ctx, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	Eventually(t, time.Minute, "a second binary asking for a slot", func() bool {
		var n int
		err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgtest budget slot'`).Scan(&n)
		return err == nil && n == 2
	})
	select {
	case err := <-got:
		t.Fatalf("the second binary got a slot while the first held the only one (err %v)", err)
	case <-time.After(time.Second): // it keeps polling; a wrong grant would come within a poll
	}
	if err := first.Close(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the second binary never got the slot the first released")
	}
}

// The URL a test hands to a process it starts tells pgxpool a small pool,
// and both URL and keyword/value forms keep their other settings.
func TestWithPoolMaxConns(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{"postgres://postgres@127.0.0.1:5432/db?sslmode=disable", "postgres://postgres@127.0.0.1:5432/db?pool_max_conns=4&sslmode=disable"},
		{"postgres://postgres@/postgres?host=%2Ftmp%2Fpg&sslmode=disable", "postgres://postgres@/postgres?host=%2Ftmp%2Fpg&pool_max_conns=4&sslmode=disable"},
		{"host=/tmp dbname=db", "host=/tmp dbname=db pool_max_conns=4"},
	} {
		got := withPoolMaxConns(c.in, 4)
		if got != c.want {
			t.Errorf("withPoolMaxConns(%q) = %q, want %q", c.in, got, c.want)
		}
		cfg, err := pgxpool.ParseConfig(got)
		if err != nil || cfg.MaxConns != 4 {
			t.Errorf("pgxpool.ParseConfig(%q): MaxConns %v, %v", got, cfg.MaxConns, err)
		}
	}
}

// go test's default -parallel (the number of cores) is lowered to the
// budget's when it was not given. On 4 cores or fewer the default is within
// it already; GOMAXPROCS=8 go test -run TestParallelCapped shows the cap.
func TestParallelCapped(t *testing.T) {
	f := flag.Lookup("test.parallel")
	explicit := false
	flag.Visit(func(set *flag.Flag) { explicit = explicit || set.Name == f.Name })
	n, err := strconv.Atoi(f.Value.String())
	if err != nil {
		t.Fatal(err)
	}
	if !explicit && n > maxParallel {
		t.Fatalf("-test.parallel is %d, want at most %d", n, maxParallel)
	}
}

// A binary that took a slot marks its environment for its children; its
// own shared pool keeps the parent's size all the same (it once took the
// child's 4, and a test racing eight transactions on it hung).
func TestSharedPoolHasTheParentsSize(t *testing.T) {
	t.Parallel()
	if got := Pool(t).Config().MaxConns; got != sharedPoolConns {
		t.Fatalf("shared pool MaxConns = %d, want %d", got, sharedPoolConns)
	}
}

// Test sessions run with synchronous_commit off, whatever form the URL has
// and whatever options it carries already.
func TestWithoutFlushWait(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		"postgres://postgres@127.0.0.1:5432/db?sslmode=disable",
		"postgres://postgres@127.0.0.1:5432/db?options=-c%20statement_timeout%3D5s",
		"host=/tmp dbname=db",
		"host=/tmp dbname=db options='-c statement_timeout=5s'",
	} {
		got := withoutFlushWait(in)
		cfg, err := pgxpool.ParseConfig(got)
		if err != nil {
			t.Fatalf("pgxpool.ParseConfig(%q): %v", got, err)
		}
		opts := cfg.ConnConfig.RuntimeParams["options"]
		if !strings.HasSuffix(opts, "-c synchronous_commit=off") || (strings.Contains(in, "statement_timeout") && !strings.Contains(opts, "-c statement_timeout=5s")) {
			t.Errorf("withoutFlushWait(%q) = %q: options %q", in, got, opts)
		}
	}
	var sc string
	if err := Pool(t).QueryRow(context.Background(), `SELECT current_setting('synchronous_commit')`).Scan(&sc); err != nil || sc != "off" {
		t.Fatalf("a test session's synchronous_commit: %q, %v; want off", sc, err)
	}
}

// A binary that waited for its slot longer than the connect timeout still
// connects: the timeout counts from when it holds the slot. It once
// counted from before the wait, and on a busy machine whole packages
// failed with "connect to test database: context deadline exceeded" right
// after "pgtest: got slot".
func TestSetupTimeoutStartsAfterTheSlot(t *testing.T) {
	t.Parallel()
	if _, err := pgserver.FindBinaries(); err != nil && os.Getenv("CI") != "true" {
		t.Skip("no local PostgreSQL binaries")
	}
	ctx := t.Context()
	srv, err := pgserver.Start(ctx, "max_connections="+strconv.Itoa(reservedConns+binaryBudget)) // one slot
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Error(err)
		}
	})
	held, err := acquireSlot(ctx, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	const timeout = 500 * time.Millisecond
	var s sharedDB
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.setup(srv.URL, false, timeout)
	}()
	// Longer than the timeout, while the other binary holds the slot.
	Eventually(t, time.Minute, "the binary waiting for the slot", func() bool {
		var n int
		err := held.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgtest budget slot'`).Scan(&n)
		return err == nil && n == 2
	})
	time.Sleep(2 * timeout) // the wait being tested: longer than the timeout
	if err := held.Close(ctx); err != nil {
		t.Fatal(err)
	}
	<-done
	if s.err != nil {
		t.Fatalf("after a wait for the slot longer than the timeout: %v", s.err)
	}
	s.pool.Close()
	if err := s.slot.Close(ctx); err != nil {
		t.Fatal(err)
	}
}
