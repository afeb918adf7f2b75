package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/internal/pgserver"
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
	out, code := run("status")
	for _, want := range []string{fmt.Sprintf("held by session pid %d", pid), "database elsewhere", `application "stuck-report"`,
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

	for _, sql := range []string{`BEGIN`, `INSERT INTO twophase VALUES (1)`, `PREPARE TRANSACTION 'stuck-2pc'`} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), `ROLLBACK PREPARED 'stuck-2pc'`) })
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
