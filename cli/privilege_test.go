package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
)

// A read-only operator role (SELECT on the schema's tables, as docs/
// operations.md's "Roles and privileges" gives it) reads, and a command that
// changes state is refused by PostgreSQL: the CLI says which role lacks what
// and where the grants are documented, instead of the bare driver error (a
// least-privilege deployment drill).
func TestReadOnlyOperatorRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := pgtest.Store(t, projector.NewRegistry())
	role := pgtest.ReaderRole(t, store.Schema())
	url := pgtest.URL(t)
	if strings.Contains(url, "?") {
		url += "&role=" + role
	} else {
		url += "?role=" + role
	}
	run := func(args ...string) (string, int) {
		var out bytes.Buffer
		code := Run(ctx, Config{Getenv: func(string) string { return "" }}, append(args, "--database-url", url, "--schema", store.Schema()), &out, &out)
		return out.String(), code
	}
	if out, code := run("status"); code != ExitOK {
		t.Fatalf("status as the read-only role: exit %d:\n%s", code, out)
	}
	var id string
	if err := store.Pool().QueryRow(ctx, `INSERT INTO `+store.Table("projector_dead_letters")+` (consumer, instance_id, event_id, event_tx_id, event_seq,
		event_type, tenant_id, stream_type, stream_id, version, error, attempts, reason)
		VALUES ('c', '__shared__', gen_random_uuid(), '1', 1, 'x', '__system__', 't', 'i', 1, 'boom', 1, 'skipped') RETURNING id::text`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if out, code := run("dead-letters", "list"); code != ExitOK || !strings.Contains(out, "boom") {
		t.Fatalf("dead-letters list as the read-only role: exit %d:\n%s", code, out)
	}
	// migrate needs the owner, and says so, not the application role's
	// privileges as the generic hint would (a tenancy walkthrough).
	var migrateOut bytes.Buffer
	code := Run(ctx, Config{Getenv: func(string) string { return "" }}, []string{"migrate", "--database-url", url, "--schema", store.Schema() + "_new"}, &migrateOut, &migrateOut)
	if out := migrateOut.String(); code != ExitError ||
		!strings.Contains(out, "run the migrations as the schema's owner") || strings.Contains(out, "application role's privileges") {
		t.Errorf("migrate of a new schema as the read-only role: exit %d, want %d saying to run it as the owner, once:\n%s", code, ExitError, out)
	}
	out, code := run("dead-letters", "discard", id)
	if code != ExitError || !strings.Contains(out, "permission denied") || !strings.Contains(out, `"Roles and privileges"`) {
		t.Fatalf("dead-letters discard as the read-only role: exit %d, want %d naming the missing privilege and the doc:\n%s", code, ExitError, out)
	}
}
