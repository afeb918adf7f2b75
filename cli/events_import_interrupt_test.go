package cli

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// cancellingReader cancels the command's context on its first read, as a
// Ctrl-C arriving once the import has begun, then reads on.
type cancellingReader struct {
	r      *bytes.Reader
	once   sync.Once
	cancel context.CancelFunc
}

func (c *cancellingReader) Read(p []byte) (int, error) {
	c.once.Do(c.cancel)
	return c.r.Read(p)
}

// TestEventsImportInterruptedSaysSo: an import stopped by Ctrl-C says it
// was interrupted, how much it committed and that running it again goes
// on, instead of ending on "context canceled" (a newcomer's report).
func TestEventsImportInterruptedSaysSo(t *testing.T) {
	t.Parallel()
	types := testevents.New()
	src := pgtest.Store(t, types.Registry)
	ctx := context.Background()
	if err := pgx.BeginFunc(ctx, src.Pool(), func(tx pgx.Tx) error {
		_, err := src.Append(ctx, tx, projector.Stream("ticket", "t-1"), projector.NoStream, testevents.TicketOpened{Title: "a"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var file bytes.Buffer
	if _, err := src.Export(ctx, &file, postgres.ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	dst := pgtest.Store(t, types.Registry)

	cmdCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	root := New(Config{Registry: types.Registry})
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetIn(&cancellingReader{r: bytes.NewReader(file.Bytes()), cancel: cancel})
	root.SetArgs([]string{"events", "import", "-", "--database-url", pgtest.URL(t), "--schema", dst.Schema()})
	err := root.ExecuteContext(cmdCtx)
	msg := ""
	if err != nil {
		msg = message(err)
	}
	if ExitCode(err) != 1 || !strings.Contains(msg, "import interrupted after 0 events in 0 committed batches") ||
		!strings.Contains(msg, "run it again") || strings.Contains(msg, "context canceled") {
		t.Fatalf("exit %d: %q (printed %q)", ExitCode(err), msg, out.String())
	}
}
