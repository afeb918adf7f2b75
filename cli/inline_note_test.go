package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/projectorhq/projector"
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

// --start-retry is range-checked: a bad command line, exit 2.
func TestRunStartRetryRangeChecked(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"-1s", "2h"} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		r := startCLI(ctx, t, projector.NewRegistry(), "projector", Wiring{}, "run", "--start-retry", v, "--http-addr", "")
		<-r.done
		cancel()
		r.want(t, ExitUsage, "--start-retry")
	}
}
