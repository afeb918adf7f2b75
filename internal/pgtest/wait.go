package pgtest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/projectorhq/projector/stores/postgres"
)

// WaitUntilBlocked polls pg_stat_activity until backend pid waits on a
// heavyweight lock (a row, transaction or advisory lock): proof that it is
// queued behind another transaction, without guessing at timings.
func WaitUntilBlocked(t testing.TB, db postgres.DBTX, pid uint32) {
	t.Helper()
	waitFor(t, "backend to wait on a lock", func() (bool, error) {
		var waitType *string
		err := db.QueryRow(context.Background(), `SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waitType)
		return waitType != nil && *waitType == "Lock", err
	})
}

// WaitForLockOn polls pg_locks until some backend waits for a lock on table
// (a quoted, qualified name): for a statement whose backend the test cannot
// name, such as one inside a library call.
func WaitForLockOn(t testing.TB, db postgres.DBTX, table string) {
	t.Helper()
	waitFor(t, "a backend to wait for a lock on "+table, func() (bool, error) {
		var waiting bool
		err := db.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_locks l WHERE NOT l.granted AND l.relation = $1::regclass)`, table).Scan(&waiting)
		return waiting, err
	})
}

func waitFor(t testing.TB, what string, observed func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, err := observed()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond) // polling interval, not synchronisation
	}
}

// Activity describes the other backends of db's database, one line each:
// pid, application name, state, what it waits for and whose locks block
// it, its transaction's age and the start of its statement. For a test
// that gave up waiting on a process: what was stuck, and on whom.
func Activity(db postgres.DBTX) string {
	rows, err := db.Query(context.Background(), `SELECT pid, application_name, coalesce(state, ''),
			coalesce(wait_event_type || ':' || wait_event, ''), pg_blocking_pids(pid)::text,
			coalesce(round(extract(epoch FROM now() - xact_start)::numeric, 1)::text, '-'), left(query, 160)
		FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() ORDER BY pid`)
	if err != nil {
		return "pg_stat_activity: " + err.Error()
	}
	var b strings.Builder
	for rows.Next() {
		var pid int32
		var app, state, wait, blockers, age, query string
		if err := rows.Scan(&pid, &app, &state, &wait, &blockers, &age, &query); err != nil {
			return b.String() + "pg_stat_activity: " + err.Error()
		}
		fmt.Fprintf(&b, "  pid %d %q %s wait=%s blocked_by=%s xact=%ss: %s\n", pid, app, state, wait, blockers, age, strings.Join(strings.Fields(query), " "))
	}
	if err := rows.Err(); err != nil {
		return b.String() + "pg_stat_activity: " + err.Error()
	}
	return b.String()
}

// NoLockWaitersWithin polls pg_locks until no backend waits for a lock on
// table (a quoted, qualified name) and reports whether that came within d:
// for a test that kills a process whose backend waited there.
func NoLockWaitersWithin(t testing.TB, db postgres.DBTX, table string, d time.Duration) bool {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		var waiting bool
		if err := db.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_locks l WHERE NOT l.granted AND l.relation = $1::regclass)`, table).Scan(&waiting); err != nil {
			t.Fatalf("waiting for no backend to wait for a lock on %s: %v", table, err)
		}
		if !waiting {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond) // polling interval, not synchronisation
	}
}

// BlockedBy reports whether some backend waits for a lock the backend pid
// holds: the other side of a deadlock a test makes, or a retry queued
// behind the test's transaction.
func BlockedBy(t testing.TB, db postgres.DBTX, pid int32) bool {
	t.Helper()
	var waiting bool
	if err := db.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid)))`, pid).Scan(&waiting); err != nil {
		t.Fatal(err)
	}
	return waiting
}
