package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
)

// runIn runs the command tree, with reg's event types, in this process
// against schema and returns what it printed (the error last, as Main prints it) and the exit
// code.
func runIn(t *testing.T, schema string, reg *projector.Registry, args ...string) (string, int) {
	t.Helper()
	root := New(Config{Registry: reg})
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append(args, "--database-url", pgtest.URL(t), "--schema", schema))
	err := root.ExecuteContext(context.Background())
	if err != nil {
		out.WriteString(message(err) + "\n")
	}
	return out.String(), ExitCode(err)
}

// A name, tenant or other filter PostgreSQL text cannot hold (invalid
// UTF-8, a NUL byte) is a bad command line, exit 2, with the value shown
// escaped: it once reached the driver and came back as exit 1 with
// `invalid byte sequence for encoding "UTF8"`.
func TestUnstorableStringsAreUsageErrors(t *testing.T) {
	t.Parallel()
	store := pgtest.Store(t, projector.NewRegistry())
	for _, bad := range []string{"x\xffy", "x\x00y"} {
		for _, args := range [][]string{
			{"saga", "list", bad},
			{"saga", "list", "sla", "--tenant", bad},
			{"saga", "show", bad, "k"},
			{"saga", "show", "sla", bad},
			{"saga", "show", "sla", "k", "--tenant", bad},
			{"saga", "retry", bad, "k"},
			{"saga", "retry", "sla", bad},
			{"saga", "retry", "sla", "k", "--tenant", bad},
			{"saga", "retry", "sla", "k", "--by", bad},
			{"dead-letters", "list", "--consumer", bad},
			{"dead-letters", "list", "--tenant", bad},
			{"dead-letters", "list", "--type", bad},
			{"dead-letters", "list", "--instance", bad},
			{"dead-letters", "retry", "--all", "--consumer", bad},
			{"parked", "list", "--consumer", bad},
			{"parked", "list", "--tenant", bad},
			{"parked", "list", "--instance", bad},
			{"parked", "discard", "1", "--by", bad},
			{"parked", "retry", "1", "--by", bad},
			{"consumer", "remove", "x", "--by", bad},
			{"rebuild", "list", bad},
			{"rebuild", "cancel", bad},
			{"rebuild", "switch", bad},
			{"consumer", "restart", "x", "--instance", bad},
		} {
			out, code := runIn(t, store.Schema(), nil, args...)
			if code != ExitUsage {
				t.Errorf("%q: exit %d, want %d\n%s", args, code, ExitUsage, out)
			}
			if strings.Contains(out, bad) || strings.Contains(out, "SQLSTATE") {
				t.Errorf("%q: raw bytes or a driver error in the output: %q", args, out)
			}
		}
	}
	// A saga no dispatcher ran here, with no instances: a mistyped name, said
	// so (it listed an empty table, exit 0).
	if out, code := runIn(t, store.Schema(), nil, "saga", "list", "nosuch"); code != ExitUsage || !strings.Contains(out, "saga nosuch: not found") {
		t.Errorf("saga list of an unknown saga: exit %d, want %d:\n%s", code, ExitUsage, out)
	}
	// An empty --instance named the shared shard silently; --by names what
	// is wrong with it, not a "state transition".
	if out, code := runIn(t, store.Schema(), nil, "consumer", "disable", "x", "--instance", ""); code != ExitUsage || !strings.Contains(out, "--instance is empty") {
		t.Errorf("consumer disable --instance '': exit %d, want %d:\n%s", code, ExitUsage, out)
	}
	if out, code := runIn(t, store.Schema(), nil, "parked", "discard", "1", "--by", "\x1b[31mX"); code != ExitUsage || strings.Contains(out, "transition") || !strings.Contains(out, "want who acts") {
		t.Errorf("parked discard --by with an escape: exit %d, want %d naming the flag's rule:\n%s", code, ExitUsage, out)
	}
	// consumer remove --by: an escape, 100 kB, and a name that fits alone
	// but not with the " (consumer removed)" its closed parks record.
	if out, code := runIn(t, store.Schema(), nil, "consumer", "remove", "x", "--by", "\x1b[2J"); code != ExitUsage || !strings.Contains(out, "want who acts") {
		t.Errorf("consumer remove --by with an escape: exit %d, want %d naming the flag's rule:\n%s", code, ExitUsage, out)
	}
	if out, code := runIn(t, store.Schema(), nil, "consumer", "remove", "x", "--by", strings.Repeat("a", 100_000)); code != ExitUsage || !strings.Contains(out, "want who acts") || len(out) > 4096 {
		t.Errorf("consumer remove --by of 100 kB: exit %d, want %d, briefly:\n%.300s", code, ExitUsage, out)
	}
	if out, code := runIn(t, store.Schema(), nil, "consumer", "remove", "x", "--by", strings.Repeat("a", 250)); code != ExitUsage || !strings.Contains(out, "(consumer removed)") {
		t.Errorf("consumer remove --by of 250 bytes: exit %d, want %d:\n%.400s", code, ExitUsage, out)
	}
}
