package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/internal/pgserver"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
)

// `status` and `horizon` name the transaction holding the horizon on their
// first call: a session of another database of the cluster, then a
// prepared transaction. The cluster is the test's own (the shared one has
// two-phase commit off, and other tests' transactions come and go on it).
func TestStatusNamesHorizonHolder(t *testing.T) {
	t.Parallel()
	if _, err := pgserver.FindBinaries(); errors.Is(err, pgserver.ErrNoBinaries) && os.Getenv("CI") != "true" {
		t.Skip("no local PostgreSQL binaries")
	}
	ctx := context.Background()
	srv, err := pgserver.Start(ctx, "max_prepared_transactions=10")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	admin, err := pgx.Connect(ctx, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close(context.Background()) })
	for _, sql := range []string{`CREATE DATABASE elsewhere`, `CREATE TABLE twophase (n int)`} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	run := func(args ...string) (string, int) {
		t.Helper()
		e := &dlEnv{t: t, ctx: ctx, url: srv.URL}
		out, stderr, code := e.cliSchema("projector", args...)
		return out + stderr, code
	}
	if out, code := run("migrate", "up"); code != ExitOK {
		t.Fatalf("migrate: %d %s", code, out)
	}
	if out, code := run("status"); code != ExitOK || !strings.Contains(out, "no open transaction") {
		t.Fatalf("status on a quiet cluster: %d %s", code, out)
	}

	other, err := pgx.Connect(ctx, strings.Replace(srv.URL, "@/postgres?", "@/elsewhere?", 1)+"&application_name=stuck-report")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close(context.Background()) })
	if _, err := other.Exec(ctx, `BEGIN`); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Exec(ctx, `SELECT pg_current_xact_id() /* horizon-holder-test */`); err != nil {
		t.Fatal(err)
	}
	pid := other.PgConn().PID()
	// The prepared transaction of the second half starts now, younger
	// than the session's, so one wait past the threshold serves both
	// (the horizon names the oldest holder): two waits of
	// HorizonThreshold were half the test's time.
	for _, sql := range []string{`BEGIN`, `INSERT INTO twophase VALUES (1)`, `PREPARE TRANSACTION 'stuck-2pc'`} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), `ROLLBACK PREPARED 'stuck-2pc'`) })
	pastThreshold(t, admin)
	out, code := run("status")
	for _, want := range []string{fmt.Sprintf("held by session pid %d", pid), "another database, elsewhere", `application "stuck-report"`,
		"idle in transaction since", "horizon-holder-test", fmt.Sprintf("pg_terminate_backend(%d)", pid)} {
		if code != ExitOK || !strings.Contains(out, want) {
			t.Fatalf("status: exit %d, no %q in\n%s", code, want, out)
		}
	}
	out, code = run("horizon", "-o", "json")
	var rep projection.HorizonReport
	if code != ExitOK || json.Unmarshal([]byte(out), &rep) != nil || rep.Holder == nil || uint32(rep.Holder.PID) != pid || rep.Holder.Database != "elsewhere" {
		t.Fatalf("horizon -o json: exit %d: %s", code, out)
	}
	// status -o json: the shards under "shards", the same report under
	// "horizon"; consumer list -o json stays the bare array.
	out, code = run("status", "-o", "json")
	var status StatusJSON
	if err := json.Unmarshal([]byte(out), &status); code != ExitOK || err != nil || status.Shards == nil ||
		status.Horizon.Holder == nil || uint32(status.Horizon.Holder.PID) != pid || status.Horizon.Holder.Database != "elsewhere" ||
		status.Horizon.Holder.ApplicationName != "stuck-report" || status.Horizon.AgeSeconds <= 0 {
		t.Fatalf("status -o json: exit %d, %v: %s", code, err, out)
	}
	out, code = run("consumer", "list", "-o", "json")
	var list []ShardJSON
	if err := json.Unmarshal([]byte(out), &list); code != ExitOK || err != nil {
		t.Fatalf("consumer list -o json: exit %d, %v: %s", code, err, out)
	}
	if _, err := other.Exec(ctx, `ROLLBACK`); err != nil {
		t.Fatal(err)
	}

	pastThreshold(t, admin) // at once, in all likelihood
	out, code = run("status")
	if code != ExitOK || !strings.Contains(out, `held by prepared transaction "stuck-2pc"`) || !strings.Contains(out, "ROLLBACK PREPARED 'stuck-2pc'") {
		t.Fatalf("status with a prepared transaction: exit %d:\n%s", code, out)
	}
	out, code = run("status", "-o", "json")
	status = StatusJSON{}
	if err := json.Unmarshal([]byte(out), &status); code != ExitOK || err != nil || status.Horizon.Holder == nil ||
		status.Horizon.Holder.Kind != projection.HolderPrepared || status.Horizon.Holder.GID != "stuck-2pc" {
		t.Fatalf("status -o json with a prepared transaction: exit %d, %v: %s", code, err, out)
	}
	if out, code := run("horizon", "-o", "yaml"); code != ExitUsage {
		t.Fatalf("horizon -o yaml: exit %d %s", code, out)
	}
}

// pastThreshold waits until the horizon is HorizonThreshold old, from which
// the horizon line names its holder.
func pastThreshold(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	pgtest.Eventually(t, time.Minute, "the horizon to pass the threshold", func() bool {
		rep, err := projection.Horizon(context.Background(), conn)
		if err != nil {
			t.Fatal(err)
		}
		return rep.AgeSeconds > HorizonThreshold.Seconds()
	})
}

// The horizon line names a holder only past HorizonThreshold, says when it
// is in another database or Projector's own work (with no advice to
// terminate it), and is never malformed.
func TestWriteHorizonLine(t *testing.T) {
	t.Parallel()
	now := time.Now()
	session := func(age time.Duration, db, app string) projection.HorizonReport {
		return projection.HorizonReport{AgeSeconds: age.Seconds(), Database: "shop", Holder: &projection.HorizonHolder{
			Kind: projection.HolderSession, PID: 4242, Database: db, User: "u", ApplicationName: app, State: "active",
			Query: "SELECT 1", Since: now.Add(-age), TxID: 77}}
	}
	hidden := session(0, "shop", "")
	hidden.Holder.Hidden, hidden.Holder.Since = true, time.Time{}
	cases := []struct {
		name      string
		rep       projection.HorizonReport
		want, not []string
	}{
		{"young, another database", session(41*time.Millisecond, "reports", "psql"),
			[]string{"HORIZON: 41ms old: no transaction holds it back for long (a holder is named from 5s)"}, []string{"pid", "pg_terminate_backend"}},
		{"old, another database", session(2*time.Minute, "reports", "psql"),
			[]string{"HORIZON: 2m old, held by session pid 4242", "in another database, reports", "pg_terminate_backend(4242)"}, nil},
		{"old, this database", session(2*time.Minute, "shop", "psql"), []string{"in database shop,", "pg_terminate_backend(4242)"}, []string{"another database"}},
		{"projector's own", session(2*time.Minute, "shop", "projector rebuild"),
			[]string{"held by session pid 4242", "Projector's own work"}, []string{"pg_terminate_backend"}},
		{"hidden", hidden, []string{"held by session pid 4242 (xid 77) of another role", "age is not visible"}, []string{"- old", "pg_terminate_backend"}},
		{"invisible", projection.HorizonReport{Missing: "the transaction holding the horizon is not visible to this role"},
			[]string{"HORIZON: held by a transaction this role cannot see"}, []string{"- old"}},
		{"quiet", projection.HorizonReport{}, []string{"HORIZON: no open transaction with an id holds it back"}, nil},
	}
	for _, tc := range cases {
		var b strings.Builder
		if err := WriteHorizon(&b, tc.rep, now); err != nil {
			t.Fatal(err)
		}
		for _, w := range tc.want {
			if !strings.Contains(b.String(), w) {
				t.Errorf("%s: no %q in\n%s", tc.name, w, b.String())
			}
		}
		for _, n := range tc.not {
			if strings.Contains(b.String(), n) {
				t.Errorf("%s: %q in\n%s", tc.name, n, b.String())
			}
		}
	}
}

func TestApplicationName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ binary, command, want string }{
		{"projector", " run", "projector run"},
		{"projector", "", "projector"},
		{"billing-ops", " rebuild", "projector rebuild (billing-ops)"},
		{"bad\x1bname", " run", "projector run (bad?name)"},
	} {
		got := ApplicationName(tc.binary, tc.command)
		if got != tc.want || !IsProjectorApplication(got) {
			t.Errorf("ApplicationName(%q, %q) = %q, want %q", tc.binary, tc.command, got, tc.want)
		}
	}
	if len(ApplicationName(strings.Repeat("x", 100), " run")) != 63 {
		t.Error("a long application name is not cut to 63 bytes")
	}
}
