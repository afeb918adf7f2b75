package cli

import (
	"strings"
	"testing"
)

// Commands that only read keep quiet about an inline projection recorded
// in the schema that this binary does not run: the note was logged by every
// command of the stock binary.
func TestReadOnlyCommandsDoNotNoteMissingInline(t *testing.T) {
	t.Parallel()
	e := newInlineCLIEnv(t, 2)
	lines := 0
	for _, args := range [][]string{{"rebuild", "list"}, {"rebuild", "list", "-o", "json"}, {"events", "tail", "--from-start", "--limit", "2"}} {
		r := e.run(Wiring{}, args...)
		r.want(t, ExitOK)
		lines += strings.Count(r.errOut.String(), "not in Config.Inline")
	}
	if lines != 0 {
		t.Fatalf("read-only commands logged the missing-inline note %d times, want never", lines)
	}
}
