package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// cancelOnCommit cancels its context a moment after the first COMMIT is
// sent: while the server is still committing.
type cancelOnCommit struct {
	once   sync.Once
	cancel context.CancelFunc
}

func (c *cancelOnCommit) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.EqualFold(strings.TrimSpace(d.SQL), "commit") {
		c.once.Do(func() { time.AfterFunc(100*time.Millisecond, c.cancel) })
	}
	return ctx
}

func (c *cancelOnCommit) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestImportCancelledDuringCommitCountsTheBatch: an import cancelled while
// a batch's COMMIT is on its way (an operator's Ctrl-C) lets that COMMIT
// finish, counts the batch, and reports exactly the batches the log holds.
// The COMMIT is made slow by a deferred trigger that sleeps at commit.
// Before, the COMMIT was cancelled with the import: here the server aborted
// it (nothing written, nothing counted), but a cancellation that reached
// the server too late to abort it left the batch committed and uncounted,
// a newcomer's interrupted imports reporting one batch short in 2 of 27.
// Now the COMMIT always runs to its answer, so the count is the log's.
func TestImportCancelledDuringCommitCountsTheBatch(t *testing.T) {
	t.Parallel()
	src := setup(t)
	for _, id := range []string{"slow", "next"} {
		src.appendTx(t, projector.Stream("ticket", id), projector.NoStream, testevents.TicketOpened{Title: id})
	}
	var file bytes.Buffer
	if _, err := src.store.Export(src.ctx, &file, postgres.ExportOptions{}); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := pgtest.PoolConfig(t)
	cfg.ConnConfig.Tracer = &cancelOnCommit{cancel: cancel}
	pool := pgtest.PoolFromConfig(t, cfg)
	schema := pgtest.Schema(t)
	dst, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: src.types.Registry})
	if err != nil {
		t.Fatal(err)
	}
	q := pgx.Identifier{schema}.Sanitize()
	for _, sql := range []string{
		`CREATE FUNCTION ` + q + `.slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(0.5); RETURN NULL; END $$`,
		`CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON ` + dst.Table("projector_events") +
			` DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.stream_id = 'slow') EXECUTE FUNCTION ` + q + `.slow_commit()`,
	} {
		if _, err := pool.Exec(context.Background(), sql); err != nil {
			t.Fatal(err)
		}
	}
	res, err := dst.Import(ctx, &file, postgres.ImportOptions{BatchSize: 1})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("import: %+v, %v; want it cancelled", res, err)
	}
	var rows, txs int64
	if err := pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT tx_id) FROM `+dst.Table("projector_events")).Scan(&rows, &txs); err != nil {
		t.Fatal(err)
	}
	if rows != 1 || res.Imported != rows || int64(res.Batches) != txs {
		t.Fatalf("the log holds %d events in %d transactions; the import reported %d in %d batches", rows, txs, res.Imported, res.Batches)
	}
}
