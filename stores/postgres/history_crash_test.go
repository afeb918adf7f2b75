package postgres_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// The helper process's settings: the history file, the database and the
// schema it imports into.
const (
	importChildEnv       = "PROJECTOR_TEST_IMPORT_CHILD"
	importChildURLEnv    = "PROJECTOR_TEST_IMPORT_CHILD_URL"
	importChildSchemaEnv = "PROJECTOR_TEST_IMPORT_CHILD_SCHEMA"
	importChildBatch     = 500
)

// importChild imports the file named by importChildEnv, in small batches,
// until it is done or killed.
func importChild() int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(importChildURLEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: os.Getenv(importChildSchemaEnv), Registry: testevents.New().Registry})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	f, err := os.Open(os.Getenv(importChildEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer f.Close()
	res, err := store.Import(ctx, f, postgres.ImportOptions{BatchSize: importChildBatch})
	fmt.Printf("import: %+v %v\n", res, err)
	if err != nil {
		return 1
	}
	return 0
}

// TestHistory_ImportCrashResumes SIGKILLs a process in the middle of an
// import and runs the import again: the log then holds every event of the
// file once, in the file's order, and the killed run left whole batches
// only.
func TestHistory_ImportCrashResumes(t *testing.T) {
	t.Parallel()
	const streams, perStream = 200, 100
	f := setup(t)
	path := filepath.Join(t.TempDir(), "history.jsonl")
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	var ids []uuid.UUID
	enc := postgres.NewHistoryEncoder(out)
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for v := 1; v <= perStream; v++ { // interleaved streams: every batch touches many
		for s := range streams {
			id := uuid.New()
			ids = append(ids, id)
			must(t, enc.Encode(postgres.HistoryEvent{
				Stream:  postgres.HistoryStream{Tenant: "acme", Type: "ticket", ID: fmt.Sprintf("t-%d", s)},
				Version: int64(v), Type: "ticket.commented", SchemaVersion: 1, ID: id, RecordedAt: at,
				Payload: []byte(fmt.Sprintf(`{"body":"b","n":%d}`, v)),
			}))
		}
	}
	must(t, enc.Flush())
	must(t, out.Close())

	child := pgtest.StartChild(t, importChildEnv+"="+path, importChildURLEnv+"="+pgtest.URL(t), importChildSchemaEnv+"="+f.store.Schema())
	for deadline := time.Now().Add(time.Minute); countEvents(t, f) < 4*importChildBatch; {
		select {
		case <-child.Done():
			t.Fatal("the import ended before it could be killed")
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the import wrote nothing within a minute")
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
	child.Kill(t)
	killed := countEvents(t, f)
	if killed%importChildBatch != 0 || killed >= int64(len(ids)) {
		t.Fatalf("the killed import left %d events: want whole batches of %d, not all %d", killed, importChildBatch, len(ids))
	}

	in, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	res, err := f.store.Import(f.ctx, bufio.NewReader(in), postgres.ImportOptions{BatchSize: importChildBatch})
	if err != nil {
		t.Fatal(err)
	}
	if res.Skipped != killed || res.Imported != int64(len(ids))-killed {
		t.Fatalf("resumed import %+v after %d were in: want them skipped and the rest imported", res, killed)
	}
	rows, err := f.store.Pool().Query(f.ctx, `SELECT id FROM `+f.store.Table("projector_events")+` ORDER BY tx_id, seq`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(ids) {
		t.Fatalf("%d events in the log, want %d", len(got), len(ids))
	}
	for i := range ids {
		if got[i] != ids[i] {
			t.Fatalf("log event %d is %s, the file's is %s: the log is not in the file's order", i, got[i], ids[i])
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
