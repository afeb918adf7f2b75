package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/examples/helpdesk"
	"github.com/projectorhq/projector/internal/pgtest"
)

// count returns how many events of streamType the ops schema holds, read
// from the table itself.
func (o *opsEnv) count(streamType string) int {
	o.t.Helper()
	var n int
	if err := o.store.Pool().QueryRow(context.Background(), `SELECT count(*) FROM `+o.store.Table("projector_events")+` WHERE stream_type = $1`,
		streamType).Scan(&n); err != nil {
		o.t.Fatal(err)
	}
	return n
}

// An --older-than that does not fit a duration is refused before anything
// is deleted: 214897102651462d once wrapped around to about a second and
// deleted every session event, 106752d turned negative, 99999999d gave a
// cutoff in 1807.
func TestPruneRefusesAnAgeThatOverflows(t *testing.T) {
	t.Parallel()
	o := newOpsEnv(t)
	for _, age := range []string{"214897102651462d", "106752d", "99999999d", "9999999999h", "0d", "0s"} {
		r := run(t, o.env, "events", "prune", "--older-than", age, "--stream-type", helpdesk.SessionStream)
		wantError(t, r, 2, "--older-than")
		if !strings.Contains(r.stderr, "106751d") && !strings.Contains(r.stderr, "positive") {
			t.Errorf("%s: the error does not name the limit: %q", age, r.stderr)
		}
		if n := o.count(helpdesk.SessionStream); n != 2 {
			t.Fatalf("prune --older-than %s deleted events: %d of 2 left", age, n)
		}
	}
	// The longest age that fits is accepted, and its cutoff is a real date.
	r := run(t, o.env, "events", "prune", "--older-than", "106751d", "--dry-run")
	if r.code != 0 || !strings.Contains(r.stdout, "would delete 0 events") || !strings.Contains(r.stdout, "recorded before 17") {
		t.Fatalf("prune --older-than 106751d: %+v", r)
	}
}

// Naming a stream type that is not declared ephemeral (aggregate history)
// deletes nothing without --include-aggregates, and the dry run says what
// it would delete.
func TestPruneKeepsAggregateHistoryUnlessIncluded(t *testing.T) {
	t.Parallel()
	o := newOpsEnv(t)
	r := run(t, o.env, "events", "prune", "--older-than", "1ms", "--stream-type", helpdesk.TicketStream)
	wantError(t, r, 2, "--include-aggregates")
	if n := o.count(helpdesk.TicketStream); n != 3 {
		t.Fatalf("ticket history pruned without --include-aggregates: %d of 3 left", n)
	}
	r = run(t, o.env, "events", "prune", "--older-than", "1ms", "--stream-type", helpdesk.TicketStream, "--stream-type", helpdesk.SessionStream,
		"--include-aggregates", "--dry-run")
	if r.code != 0 || !strings.Contains(r.stdout, "would delete 5 events") ||
		!strings.Contains(r.stdout, "3 events of stream type ticket (aggregate history) from 1 stream") ||
		!strings.Contains(r.stdout, "2 events of stream type session (ephemeral) from 1 stream") {
		t.Fatalf("dry run does not say what it would delete: %+v", r)
	}
	if n := o.count(helpdesk.TicketStream); n != 3 {
		t.Fatalf("dry run deleted: %d of 3 left", n)
	}
	r = run(t, o.env, "events", "prune", "--older-than", "1ms", "--stream-type", helpdesk.TicketStream, "--include-aggregates")
	if r.code != 0 || o.count(helpdesk.TicketStream) != 0 {
		t.Fatalf("prune --include-aggregates: %+v", r)
	}
}

// Bad numbers in flags are usage errors (exit 2), refused before anything
// runs: a negative batch size once reached SQL (exit 1), a negative tail
// limit followed forever.
func TestNumericFlagsAreRangeChecked(t *testing.T) {
	t.Parallel()
	env := []string{"PROJECTOR_DATABASE_URL=postgres://127.0.0.1:1/x?connect_timeout=1"}
	cases := []struct {
		args []string
		msg  string
	}{
		{[]string{"events", "prune", "--older-than", "1h", "--batch-size", "-1"}, "--batch-size"},
		{[]string{"events", "prune", "--older-than", "1h", "--batch-size", "0"}, "--batch-size"},
		{[]string{"events", "prune", "--older-than", "1h", "--batch-size", "100000000"}, "--batch-size"},
		{[]string{"events", "tail", "--limit", "-1"}, "--limit"},
		{[]string{"demo", "--users", "-1"}, "--users"},
		{[]string{"demo", "--users", "0"}, "--users"},
		{[]string{"demo", "--actions", "-3"}, "--actions"},
		{[]string{"demo", "--users", "100000"}, "--users"},
		{[]string{"repair", "restored-cluster", "--lock-timeout", "-1s"}, "--lock-timeout"},
		{[]string{"run", "--stop-timeout", "-1s"}, "--stop-timeout"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			wantError(t, run(t, env, tc.args...), 2, tc.msg)
			if d := time.Since(start); d > 20*time.Second {
				t.Fatalf("took %v: the flag was not checked before connecting", d)
			}
		})
	}
}

// No part of a URL's user info is ever printed: this URL's unescaped '@'
// once made the driver take "PW-hb@127.0.0.1" for the host, and the error
// said "cannot reach database at PW-hb@127.0.0.1".
func TestDatabaseURLPasswordNeverPrinted(t *testing.T) {
	t.Parallel()
	for _, url := range []string{
		"postgres://u:S3cret@PW-hb@127.0.0.1:1/db",
		"postgres://u:S3cret@PW-hb@127.0.0.1:99999999/db",
		"postgres://u:S3cret%40PW-hb@127.0.0.1:1/db?connect_timeout=1",
		"postgres://u:S3cret%40PW-hb@127.0.0.1:99999999/db",
		"host=127.0.0.1 port=1 user=u password=S3cret@PW-hb connect_timeout=1",
		"host=127.0.0.1 port=x user=u password='S3cret@PW-hb'",
	} {
		for _, args := range [][]string{{"migrate", "status", "--database-url", url}, {"demo", "--database-url", url}} {
			r := run(t, nil, args...)
			if r.code == 0 {
				t.Fatalf("%q: exit 0", url)
			}
			for _, secret := range []string{"S3cret", "PW-hb", "PW%2Dhb"} {
				if strings.Contains(r.stdout+r.stderr, secret) {
					t.Errorf("%v printed %q: %+v", args, secret, r)
				}
			}
		}
	}
	wantError(t, run(t, nil, "migrate", "status", "--database-url", "postgres://u:S3cret@PW-hb@127.0.0.1:1/db"), 2, "%40")
}

// Errors print one "projector:" prefix, not the binary's name followed by
// the sentinel's own prefix.
func TestErrorsHaveOnePrefix(t *testing.T) {
	t.Parallel()
	r := run(t, []string{"PROJECTOR_DATABASE_URL=" + pgtest.URL(t)}, "events", "tail", "--schema", "pt_never_migrated")
	wantError(t, r, 1, "schema needs migrating")
	if strings.Contains(r.stderr, "projector: projector:") {
		t.Fatalf("doubled prefix: %q", r.stderr)
	}
}

// A server that answers but has no such database or role is not
// "unreachable": the error says what is missing and what to do.
func TestConnectErrorsSayWhatIsMissing(t *testing.T) {
	t.Parallel()
	base := strings.TrimPrefix(pgtest.URL(t), "postgres://")
	userAndHost, rest, _ := strings.Cut(base, "/")
	_, host, _ := strings.Cut(userAndHost, "@")
	_, query, _ := strings.Cut(rest, "?")
	cases := []struct{ url, msg string }{
		{"postgres://" + userAndHost + "/pt_no_such_database?" + query, `database "pt_no_such_database" does not exist`},
		{"postgres://pt_no_such_role@" + host + "/postgres?" + query, "pt_no_such_role"},
	}
	for _, c := range cases {
		r := run(t, nil, "migrate", "status", "--database-url", c.url)
		wantError(t, r, 1, c.msg)
		if strings.Contains(r.stderr, "cannot reach") {
			t.Errorf("a server that answered is called unreachable: %q", r.stderr)
		}
	}
}

// demo drops only a schema it created itself: a schema that existed before
// with a table of its own survives `demo --demo-schema` untouched.
func TestDemoKeepsASchemaItDidNotCreate(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	schema := fmt.Sprintf("pt_%d_keep%d", time.Now().Unix(), time.Now().UnixNano()%1e6)
	ctx := context.Background()
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	})
	if _, err := pool.Exec(ctx, `CREATE SCHEMA `+schema+`; CREATE TABLE `+schema+`.precious (v text); INSERT INTO `+schema+`.precious VALUES ('keep me')`); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"demo", "--demo-schema", schema}, {"demo", "--schema", schema}} {
		r := run(t, []string{"PROJECTOR_DATABASE_URL=" + pgtest.URL(t)}, append(args, "--users", "2", "--actions", "5")...)
		wantError(t, r, 1, "was not created by the demo")
		var v string
		if err := pool.QueryRow(ctx, `SELECT v FROM `+schema+`.precious`).Scan(&v); err != nil || v != "keep me" {
			t.Fatalf("%v: the schema's own table is gone: %v", args, err)
		}
	}
}

// `events tail` refuses an event type the application does not define,
// filters by stream, and prints JSON lines with -o json.
func TestTailFiltersAndJSON(t *testing.T) {
	t.Parallel()
	o := newOpsEnv(t)
	wantError(t, run(t, o.env, "events", "tail", "--type", "ticket.exploded"), 2, `"ticket.exploded"`)
	r := run(t, o.env, "events", "tail", "--from-start", "--stream-type", helpdesk.TicketStream, "--stream", "T-1", "--limit", "3", "-o", "json")
	if r.code != 0 {
		t.Fatalf("tail -o json: %+v", r)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 {
		t.Fatalf("want 3 JSON lines: %q", r.stdout)
	}
	for i, l := range lines {
		var ev struct {
			Type       string          `json:"type"`
			StreamType string          `json:"stream_type"`
			StreamID   string          `json:"stream_id"`
			Version    int64           `json:"version"`
			Data       json.RawMessage `json:"data"`
		}
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatalf("line %d is not JSON: %v: %q", i, err, l)
		}
		if ev.StreamType != helpdesk.TicketStream || ev.StreamID != "T-1" || ev.Version != int64(i+1) || len(ev.Data) == 0 {
			t.Fatalf("line %d: %+v", i, ev)
		}
	}
	wantError(t, run(t, o.env, "events", "tail", "-o", "yaml"), 2, "--output")
	wantError(t, run(t, o.env, "events", "tail", "--stream", "T-1"), 2, "--stream-type")
}

// `run --http-addr` on a port another process holds is a failure (exit 1),
// not a bad command line (exit 2).
func TestRunPortInUseExitsOne(t *testing.T) {
	t.Parallel()
	o := newOpsEnv(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	wantError(t, run(t, o.env, "run", "--http-addr", ln.Addr().String(), "--instance-id", "port-test"), 1, "address already in use")
}

// A console token too short to be safe is a bad configuration (exit 2),
// before anything is served.
func TestRunShortConsoleTokenExitsTwo(t *testing.T) {
	t.Parallel()
	o := newOpsEnv(t)
	env := append([]string{"PROJECTOR_CONSOLE_TOKEN=short"}, o.env...)
	wantError(t, run(t, env, "run", "--http-addr", "127.0.0.1:0", "--instance-id", "token-test"), 2, "PROJECTOR_CONSOLE_TOKEN")
}
