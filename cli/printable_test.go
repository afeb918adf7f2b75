package cli

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
)

// terminalLine, the net under every error line Run prints: what a terminal
// would obey shows as a Go escape where it stands, the rest as it reads,
// and a line past maxMessage bytes is cut with its length noted.
func TestTerminalLine(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"consumer x: not found":             "consumer x: not found",
		"consumer x@\x1b[31mX: not found":   `consumer x@\x1b[31mX: not found`,
		"bad \xff byte, bell \a, nul \x00":  `bad \xff byte, bell \a, nul \x00`,
		"invisible \u200b and \u202e right": `invisible \u200b and \u202e right`,
		"ünïcödé 名前 stays":                  "ünïcödé 名前 stays",
		`already \x1b escaped stays`:        `already \x1b escaped stays`,
	} {
		if got := terminalLine(in); got != want {
			t.Errorf("terminalLine(%q) = %q, want %q", in, got, want)
		}
	}
	long := strings.Repeat("é", maxMessage) // 2 bytes a rune: cut mid-rune otherwise
	got := terminalLine("--schema " + long)
	if len(got) > maxMessage+40 || !strings.HasSuffix(got, fmt.Sprintf("…(%d bytes)", len("--schema ")+len(long))) || !utf8.ValidString(got) {
		t.Errorf("a long line: %d bytes, ends %q", len(got), got[len(got)-30:])
	}
}

// Every error line Run prints goes through terminalLine: an escape typed
// into a flag name cobra echoes, a 100 kB value, an instance id that would
// reach log lines and status tables.
func TestRunPrintsErrorsForATerminal(t *testing.T) {
	t.Parallel()
	run := func(args ...string) (string, int) {
		var out, errOut bytes.Buffer
		code := Run(t.Context(), Config{Getenv: func(string) string { return "" }}, args, &out, &errOut)
		return out.String() + errOut.String(), code
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "--\x1b[31mx"}, `\x1b[31mx`},
		{[]string{"status", "-o", strings.Repeat("j", 100_000)}, "bytes)"},
		{[]string{"run", "--instance-id", "\x1b[31mx\x01", "--database-url", "postgres://127.0.0.1:1/x"}, "does not print"},
		{[]string{"run", "--instance-id", strings.Repeat("i", 100_000), "--database-url", "postgres://127.0.0.1:1/x"}, "--instance-id"},
		{[]string{"run", "--instance-expiry", "0", "--database-url", "postgres://127.0.0.1:1/x"}, "--instance-expiry 0s: want between"},
		{[]string{"run", "--stop-timeout", "2562047h", "--database-url", "postgres://127.0.0.1:1/x"}, "--stop-timeout"},
	} {
		out, code := run(c.args...)
		if code != ExitUsage || !strings.Contains(out, c.want) || strings.ContainsRune(out, 0x1b) || strings.ContainsRune(out, 0x01) || len(out) > maxMessage+200 {
			t.Errorf("%.80q: exit %d, want %d with %q, no raw escape, short:\n%.300s", c.args, code, ExitUsage, c.want, out)
		}
	}
	// An unparsable NATS URL is a bad command line too (it was exit 1),
	// and its credentials stay hidden.
	store := pgtest.Store(t, projector.NewRegistry())
	out, code := runIn(t, store.Schema(), projector.NewRegistry(), "relay", "status", "--nats-url", "nats://alice:pw@127.0.0.1:1\x1b[31m")
	if code != ExitUsage || !strings.Contains(out, "does not parse") || strings.Contains(out, "pw@") {
		t.Errorf("relay status with an unparsable --nats-url: exit %d, want %d, credentials hidden:\n%s", code, ExitUsage, out)
	}
}

// Ids named twice are acted on once (`relay dead-letters discard 5 5`
// discarded 5, then reported the second as a failure: a relay audit).
func TestParseIDsOnce(t *testing.T) {
	t.Parallel()
	ids, err := parseIDs([]string{"5", "3", "5", "3", "7"})
	if err != nil || len(ids) != 3 || ids[0] != 5 || ids[1] != 3 || ids[2] != 7 {
		t.Fatalf("parseIDs: %v, %v; want [5 3 7]", ids, err)
	}
	if _, err := parseIDs([]string{"5", "0"}); ExitCode(err) != ExitUsage {
		t.Fatalf("an id of 0: %v; want a usage error", err)
	}
}
