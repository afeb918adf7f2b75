package postgres_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// A process that opens many stores on a schema whose recorded inline
// projection it does not run notes it once, and a store told the process
// only reads does not note it at all.
func TestInlineNoteOncePerProcess(t *testing.T) {
	t.Parallel()
	types := testevents.New()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	const note = "not in Config.Inline"
	open := func(schema string, quiet bool) int {
		t.Helper()
		var buf bytes.Buffer
		_, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: types.Registry, QuietInlineNote: quiet,
			Logger: slog.New(slog.NewTextHandler(&buf, nil))})
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(buf.String(), note)
	}
	record := func(schema string) {
		t.Helper()
		if _, err := pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "projector_inline_projections"}.Sanitize()+` (name, version, event_types)
			VALUES ('tickets', 1, ARRAY['ticket.opened'])`); err != nil {
			t.Fatal(err)
		}
	}

	noisy := pgtest.Schema(t)
	record(noisy)
	lines := 0
	for range 5 {
		lines += open(noisy, false)
	}
	if lines != 1 {
		t.Fatalf("5 stores opened: the note logged %d times, want once", lines)
	}

	quiet := pgtest.Schema(t)
	record(quiet)
	if n := open(quiet, true); n != 0 {
		t.Fatalf("a store told the process only reads logged the note %d times", n)
	}
}
