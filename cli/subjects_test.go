package cli

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// `subjects forget` forgets once (exit 0), refuses a second forget (exit
// 3), does not find an unknown subject (exit 1) and takes an unstorable id
// as a bad command line (exit 2); it needs no master key.
func TestSubjectsForget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.NewPersonal()
	master, err := postgres.NewMasterKey("cli", testevents.MasterKey("cli"))
	if err != nil {
		t.Fatal(err)
	}
	store := pgtest.Store(t, types.Registry, postgres.Config{MasterKey: master})
	err = pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		_, err := store.Append(ctx, tx, projector.TenantStream("acme", "customer", "c-1"), projector.NoStream,
			testevents.CustomerRegistered{Customer: "c-1", Name: "Ada", Email: "ada@example.com"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"subjects", "forget", "c-1", "--tenant", "acme"}, ExitOK, "forgot subject acme/c-1"},
		{[]string{"subjects", "forget", "c-1", "--tenant", "acme"}, ExitRefused, "already forgotten"},
		{[]string{"subjects", "forget", "c-1"}, ExitError, "no personal data"},
		{[]string{"subjects", "forget", "c\x00-1", "--tenant", "acme"}, ExitUsage, "NUL"},
		{[]string{"subjects", "forget"}, ExitUsage, "missing ID"},
	} {
		out, code := runIn(t, store.Schema(), types.Registry, c.args...)
		if code != c.code || !strings.Contains(out, c.out) {
			t.Errorf("%q: exit %d, want %d with %q:\n%s", c.args, code, c.code, c.out, out)
		}
	}
	evs, err := store.ReadStream(ctx, projector.TenantStream("acme", "customer", "c-1"), postgres.StreamQuery{})
	if err != nil || !evs[0].Forgotten {
		t.Fatalf("after forget: %+v %v", evs, err)
	}
}
