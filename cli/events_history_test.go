package cli

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
)

// runEvents runs an events subcommand to the end.
func runEvents(t *testing.T, reg *projector.Registry, schema string, args ...string) *cliRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := startCLI(ctx, t, reg, schema, Wiring{}, append([]string{"events"}, args...)...)
	<-r.done
	return r
}

func TestEventsExportImport(t *testing.T) {
	t.Parallel()
	schema, reader := tailEnv(t)
	writer := testevents.New()
	if _, err := projector.Define[ticketArchived](writer.Registry, "ticket.archived"); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "history.jsonl")
	r := runEvents(t, writer.Registry, schema, "export", "-o", file, "--redact", "body")
	// The summary gives the position as status prints cursors, and how
	// to export what comes after it.
	if r.code != ExitOK || !strings.Contains(r.out.String(), "exported 5 events") ||
		!regexp.MustCompile(`up to log position (\d+/max) \(`+"`"+`projector events export --after (\d+/max)`+"`"+` exports what comes after\)`).MatchString(r.out.String()) {
		t.Fatalf("export: exit %d\n%s%s", r.code, r.out.String(), r.errOut.String())
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), `"body":"c"`) || !strings.Contains(string(b), `"body":""`) {
		t.Fatalf("--redact body left the comments in:\n%s", b)
	}

	// A binary that does not define ticket.archived refuses the file at
	// the archived event's line, and writes nothing of its batch.
	empty := pgtest.Store(t, reader).Schema()
	r = runEvents(t, reader, empty, "import", file)
	if r.code != ExitError || !strings.Contains(r.errOut.String(), "line 6") || !strings.Contains(r.errOut.String(), "ticket.archived") {
		t.Fatalf("import of an undefined type: exit %d\n%s%s", r.code, r.out.String(), r.errOut.String())
	}
	r = runEvents(t, writer.Registry, empty, "import", "--batch-size", "2", file)
	if r.code != ExitOK || !strings.Contains(r.out.String(), "imported 5 events (0 already in the log, skipped) in 3 batches") {
		t.Fatalf("import: exit %d\n%s%s", r.code, r.out.String(), r.errOut.String())
	}
	r = runEvents(t, writer.Registry, empty, "import", file)
	if r.code != ExitOK || !strings.Contains(r.out.String(), "imported 0 events (5 already in the log, skipped)") {
		t.Fatalf("second import: exit %d\n%s%s", r.code, r.out.String(), r.errOut.String())
	}

	for _, args := range [][]string{
		{"import", "--batch-size", "0", file},
		{"import", "--batch-size", "1000001", file},
		{"import", filepath.Join(t.TempDir(), "missing.jsonl")},
		{"export", "--from", "yesterday"},
		{"export", "--from", "2026-02-01T00:00:00Z", "--to", "2026-01-01T00:00:00Z"},
		{"export", "--redact", "a..b"},
		{"export", "--tenant", "a\x00b"},
		{"export", "--after", "12"},
	} {
		if r := runEvents(t, writer.Registry, schema, args...); r.code != ExitUsage {
			t.Errorf("events %q: exit %d, want %d\n%s", args, r.code, ExitUsage, r.errOut.String())
		}
	}
}

// TestEventsExportRedactCounts: the summary counts the events each --redact
// path redacted, and a path that redacted nothing (here the stream type
// put before the field, as an auditor did with ticket.email) is warned of
// on standard error; an export without events warns of nothing.
func TestEventsExportRedactCounts(t *testing.T) {
	t.Parallel()
	schema, _ := tailEnv(t)
	writer := testevents.New()
	if _, err := projector.Define[ticketArchived](writer.Registry, "ticket.archived"); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "history.jsonl")
	r := runEvents(t, writer.Registry, schema, "export", "-o", file, "--redact", "ticket.body", "--redact", "body")
	if r.code != ExitOK || !strings.Contains(r.out.String(), "redacted: ticket.body in 0 events, body in 2 events\n") {
		t.Fatalf("export: exit %d, want %d with the count of each path\n%s%s", r.code, ExitOK, r.out.String(), r.errOut.String())
	}
	if !strings.Contains(r.errOut.String(), "warning: --redact ticket.body redacted nothing: no exported event has that payload field") ||
		strings.Contains(r.errOut.String(), "--redact body ") {
		t.Fatalf("export: want a warning of ticket.body alone on standard error, got\n%s", r.errOut.String())
	}

	r = runEvents(t, writer.Registry, schema, "export", "-o", file, "--stream-type", "nosuch", "--redact", "ticket.body")
	if r.code != ExitOK || !strings.Contains(r.out.String(), "redacted: ticket.body in 0 events\n") || r.errOut.String() != "" {
		t.Fatalf("empty export: exit %d, want %d, a count and no warning\n%s%s", r.code, ExitOK, r.out.String(), r.errOut.String())
	}
}
