package pgtest

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The connection budget. `go test ./...` runs one test binary per package,
// as many at once as the machine has cores, and each binary opens pools,
// starts child processes and runs the projector binary; unchecked, a
// suite on a stock server (max_connections = 100) runs out of connections
// ("sorry, too many clients already"), and more cores make it worse. So
// each binary keeps to a budget, and binaries sharing one server take
// turns:
//
//   - A binary on a shared server holds one of a few slots, a session
//     advisory lock on a connection of its own, for as long as it runs;
//     the number of slots is what the server's max_connections leaves
//     room for at binaryBudget connections each. A binary that finds no
//     free slot waits for one (and says so).
//   - Within a binary, at most maxParallel tests run in parallel (unless
//     -parallel says otherwise), so a machine with many cores does not
//     starve the shared pool of sharedPoolConns connections, idle ones
//     closing after a few seconds; a child process ([StartChild])
//     inherits the slot and opens childPoolConns; the projector binary a
//     test runs is handed [URL], which tells it childPoolConns too.
//
// A throwaway cluster (no PROJECTOR_TEST_DATABASE_URL) belongs to its
// binary alone and needs no slot.
const (
	// binaryBudget is the most connections one test binary, its child
	// processes and the projector processes it runs hold at once: the
	// shared pool, three children and the slot, with room for a test's
	// own pool. Check it by sampling pg_stat_activity during a full run.
	binaryBudget = 35
	// reservedConns is kept free of test binaries: the superuser
	// reserve, psql, a dashboard, other clients of a developer's server.
	reservedConns = 15
	// sharedPoolConns bounds [Pool]'s pool in a test binary: room for
	// the tests that hold eight transactions open at once to race them.
	sharedPoolConns = 16
	// maxParallel is go test's -parallel for a binary that is not given
	// one: its default, the number of cores, would let a many-core machine
	// run more database tests at once than sharedPoolConns serves, and
	// tests holding a connection while waiting for another would stall.
	maxParallel = 4
	// childPoolConns bounds the pool of a child process and of every
	// projector process a test starts with [URL].
	childPoolConns = 4
	// poolIdle is how long an idle test connection stays open: long
	// enough to be reused by the next test, short enough that a burst's
	// connections do not hold the budget for the rest of the run.
	poolIdle = 5 * time.Second
)

// EnvSlotHeld marks a process whose parent test binary holds a slot of the
// budget: a child process runs under its parent's slot, with a small pool,
// and never waits for a slot of its own (which could wait for its parent).
const EnvSlotHeld = "PROJECTOR_TEST_SLOT_HELD"

// slotLockKey is the advisory lock class of the budget's slots; the slot
// number is the second key. Session locks, so they end with the holder.
const slotLockKey = 0x70746573 // "ptes"

// capParallel lowers go test's -parallel to maxParallel unless it was given
// on the command line. It runs before m.Run, which reads the flag.
func capParallel() {
	if !flag.Parsed() {
		flag.Parse()
	}
	f := flag.Lookup("test.parallel")
	if f == nil {
		return
	}
	explicit := false
	flag.Visit(func(set *flag.Flag) { explicit = explicit || set.Name == f.Name })
	if n, err := strconv.Atoi(f.Value.String()); err == nil && n > maxParallel && !explicit {
		_ = f.Value.Set(strconv.Itoa(maxParallel))
	}
}

// isChild reports whether this process runs under a parent's slot.
func isChild() bool { return os.Getenv(EnvSlotHeld) != "" }

// tunePool applies the budget's size and idle time to a test pool.
func tunePool(cfg *pgxpool.Config, maxConns int32) {
	cfg.MaxConns = maxConns
	cfg.MinConns = 0
	cfg.MaxConnIdleTime = poolIdle
	cfg.HealthCheckPeriod = poolIdle
}

// slots returns how many test binaries may use a server with
// max_connections at once: at least one.
func slots(maxConnections int) int {
	return max(1, (maxConnections-reservedConns)/binaryBudget)
}

// acquireSlot waits for a free slot of the budget on the server at url and
// returns the connection holding it, which must stay open for the life of
// the test binary.
func acquireSlot(ctx context.Context, url string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["application_name"] = "pgtest budget slot"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	var maxConnections int
	if err := conn.QueryRow(ctx, `SELECT current_setting('max_connections')::int`).Scan(&maxConnections); err != nil {
		_ = conn.Close(ctx)
		return nil, err
	}
	n := slots(maxConnections)
	told := false
	for {
		for slot := range n {
			var ok bool
			if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1, $2)`, slotLockKey, slot).Scan(&ok); err != nil {
				_ = conn.Close(ctx)
				return nil, err
			}
			if ok {
				if told {
					fmt.Fprintf(os.Stderr, "pgtest: got slot %d of %d\n", slot, n)
				}
				return conn, nil
			}
		}
		if !told {
			fmt.Fprintf(os.Stderr, "pgtest: waiting for one of the %d test-binary slots of a server with max_connections = %d (%d connections each)\n", n, maxConnections, binaryBudget)
			told = true
		}
		select {
		case <-ctx.Done():
			_ = conn.Close(context.Background())
			return nil, fmt.Errorf("wait for a test-binary slot: %w", ctx.Err())
		case <-time.After(250 * time.Millisecond): // polling a lock another process holds
		}
	}
}

// withPoolMaxConns returns conn (a URL or a keyword/value string) with
// pgxpool's pool_max_conns set to n, so a process that opens a pool on it
// (the projector binary) keeps to the budget.
func withPoolMaxConns(conn string, n int) string {
	return withParam(conn, "pool_max_conns", strconv.Itoa(n))
}

// withParam returns conn (a URL or a keyword/value string) with the
// connection parameter key set to value.
func withParam(conn, key, value string) string {
	u, err := url.Parse(conn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		if value != "" && !strings.ContainsAny(value, ` '\`) {
			return conn + " " + key + "=" + value
		}
		return conn + " " + key + "='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(value) + "'"
	}
	q := u.Query()
	q.Set(key, value)
	// Spaces as %20: pgx reads a query's "+" as a plus sign.
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
	return u.String()
}

// withoutFlushWait returns conn with synchronous_commit off for its
// sessions (appended to any options it has): a commit returns before its WAL
// reaches the disk. The tests kill clients, never the server, and a commit
// is visible to every other session at once either way, so nothing they
// check changes; the suite stops waiting for an fsync per commit (a third
// of the time of the tests that append most, on a shared disk). A test
// that needs the server's own setting sets it on its pool.
func withoutFlushWait(conn string) string {
	opt := "-c synchronous_commit=off"
	if u, err := url.Parse(conn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		if o := u.Query().Get("options"); o != "" {
			opt = o + " " + opt
		}
		return withParam(conn, "options", opt)
	}
	if cfg, err := pgconn.ParseConfig(conn); err == nil {
		if o := cfg.RuntimeParams["options"]; o != "" {
			opt = o + " " + opt
		}
	}
	return withParam(conn, "options", opt)
}
