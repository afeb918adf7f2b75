package cli

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// events tail's --stream-type and --stream take names PostgreSQL text can
// hold: an unstorable one is a bad command line (exit 2), shown escaped.
// --stream-type "a\x00" once came back from the driver as exit 1 and
// --stream "a\x00" as exit 0 with nothing printed, a filter no stream can
// match.
func TestTailUnstorableFiltersAreUsageErrors(t *testing.T) {
	t.Parallel()
	store := pgtest.Store(t, projector.NewRegistry())
	long := strings.Repeat("s", projector.MaxNameLength+1)
	for _, bad := range []string{"x\xffy", "x\x00y", long} {
		for _, args := range [][]string{
			{"events", "tail", "--no-follow", "--stream-type", bad},
			{"events", "tail", "--no-follow", "--stream-type", "order", "--stream", bad},
		} {
			out, code := runIn(t, store.Schema(), nil, args...)
			if code != ExitUsage || !strings.Contains(out, "--stream") {
				t.Errorf("%q: exit %d, want %d naming the flag\n%s", args, code, ExitUsage, out)
			}
			if strings.Contains(out, bad) || strings.Contains(out, "SQLSTATE") {
				t.Errorf("%q: raw bytes or a driver error in the output: %q", args, out)
			}
		}
	}
}

// A file name events export or import cannot open is echoed made
// printable: the error once carried the name's bytes as typed, so a name
// holding an escape sequence rewrote the operator's terminal.
func TestHistoryFileNamesArePrintedEscaped(t *testing.T) {
	t.Parallel()
	store := pgtest.Store(t, projector.NewRegistry())
	name := filepath.Join(t.TempDir(), "no-such-dir", "x\x1b]0;owned\x07\x1b[2J\ny")
	for _, args := range [][]string{
		{"events", "export", "-o", name},
		{"events", "import", name},
	} {
		out, code := runIn(t, store.Schema(), nil, args...)
		if code == ExitOK || !strings.Contains(out, "no such file or directory") {
			t.Errorf("%q: exit %d, want the open's failure\n%s", args, code, out)
		}
		if strings.ContainsAny(out, "\x1b\x07") || strings.Count(out, "\n") != 1 {
			t.Errorf("%q: the file name reached the terminal unescaped: %q", args, out)
		}
	}
}

// A subject id subjects forget can never forget (its stream
// projector.subject/ID would be over the name limit) is a bad command line
// (exit 2) and writes nothing: it once got as far as the append and failed
// with exit 1.
func TestForgetOverlongSubjectIsUsageError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.NewPersonal()
	master, err := postgres.NewMasterKey("cli", testevents.MasterKey("cli"))
	if err != nil {
		t.Fatal(err)
	}
	store := pgtest.Store(t, types.Registry, postgres.Config{MasterKey: master})
	long := strings.Repeat("c", projector.MaxNameLength+1)
	for _, args := range [][]string{
		{"subjects", "forget", long},
		{"subjects", "forget", "c-1", "--tenant", strings.Repeat("t", projector.MaxNameLength+1)},
	} {
		out, code := runIn(t, store.Schema(), types.Registry, args...)
		if code != ExitUsage || !strings.Contains(out, "255") {
			t.Errorf("%q: exit %d, want %d stating the limit\n%s", args[:2], code, ExitUsage, out)
		}
	}
	var n int
	if err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT count(*) FROM `+store.Table("projector_events")).Scan(&n)
	}); err != nil || n != 0 {
		t.Fatalf("events written: %d, %v", n, err)
	}
}

// A wrong count of arguments is a bad command line (exit 2): events import
// with no file, or two, and rebuild list with two names came back as exit
// 1 (cobra's own argument checks return errors ExitCode did not know).
func TestArgumentCountIsUsageError(t *testing.T) {
	t.Parallel()
	store := pgtest.Store(t, projector.NewRegistry())
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"events", "import"}, "history file"},
		{[]string{"events", "import", "a.jsonl", "b.jsonl"}, "history file"},
		{[]string{"rebuild", "list", "a", "b"}, "arg"},
	} {
		out, code := runIn(t, store.Schema(), nil, c.args...)
		if code != ExitUsage || !strings.Contains(out, c.want) {
			t.Errorf("%q: exit %d, want %d with %q\n%s", c.args, code, ExitUsage, c.want, out)
		}
	}
}

// bench's out-of-range sizes name the flag, once: benchmark.Config.Validate
// checks each append figure and each phase apart, so --writers 100000000
// came back as "writers 100000000 outside 1..1000" twice (once per default
// --events-per-tx). A measuring time is at most an hour: 1000000h was
// taken. (--rate is out of range too in that case, so a bench that took the
// duration stops at it instead of running.)
func TestBenchOutOfRangeNamesTheFlag(t *testing.T) {
	t.Parallel()
	store := pgtest.Store(t, projector.NewRegistry())
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--writers", "100000000"}, "--writers 100000000: want 1..1000\n"},
		{[]string{"bench", "--events-per-tx", "20000"}, "--events-per-tx 20000: want 1..10000\n"},
		{[]string{"bench", "--rebuild-batch-size", "9999999999"}, "--rebuild-batch-size 9999999999: want 1..100000\n"},
		{[]string{"bench", "--append-duration", "1000000h", "--rate", "2000000000"}, "--append-duration 1000000h0m0s: want more than 0 and at most 1h0m0s\n"},
		{[]string{"bench", "--latency-duration", "1000000h", "--rate", "2000000000"}, "--latency-duration 1000000h0m0s: want more than 0 and at most 1h0m0s\n"},
	} {
		out, code := runIn(t, store.Schema(), nil, c.args...)
		if code != ExitUsage || out != c.want {
			t.Errorf("%q: exit %d, want %d with %q\n%q", c.args, code, ExitUsage, c.want, out)
		}
	}
}
