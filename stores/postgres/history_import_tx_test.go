package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// TestHistory_ImportExecModes runs an import whose third batch fails, then
// the import again, on a one-connection pool in each of pgx's query modes:
// without inline projections a batch begins its transaction in the round
// trip of its first statement (a pipeline in the extended modes, one query
// string in the simple protocol), so a batch must still commit alone,
// leave nothing of itself behind when it fails (its events and its stream
// head), and hand back a connection out of any transaction.
func TestHistory_ImportExecModes(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			cfg := pgtest.PoolConfig(t)
			cfg.MaxConns, cfg.MinConns = 1, 0
			cfg.ConnConfig.DefaultQueryExecMode = mode
			types := testevents.New()
			store, err := postgres.New(ctx, pgtest.PoolFromConfig(t, cfg), postgres.Config{Schema: pgtest.Schema(t), Registry: types.Registry})
			if err != nil {
				t.Fatal(err)
			}
			f := fixture{ctx: ctx, types: types, store: store}
			var lines []string
			for i := 1; i <= 25; i++ {
				lines = append(lines, eventLine("a", int64(i), "ticket.commented", `{"body":"b"}`))
			}
			lines[22] = eventLine("a", 23, "ticket.opened", `{"title":""}`) // line 24 of the file
			res, err := store.Import(ctx, strings.NewReader(historyFile(lines...)), postgres.ImportOptions{BatchSize: 10})
			var le *postgres.HistoryLineError
			if !errors.As(err, &le) || le.Line != 24 {
				t.Fatalf("err %v: want a line 24 error", err)
			}
			if got := countEvents(t, f); got != 20 || res.Imported != 20 || res.Batches != 2 {
				t.Fatalf("%d events in the log, %+v: want the two batches before the bad one (20)", got, res)
			}
			if v := headVersion(t, f, "a"); v != 20 {
				t.Fatalf("stream head at version %d: want 20, the failing batch's head rolled back", v)
			}
			lines[22] = eventLine("a", 23, "ticket.opened", `{"title":"fixed"}`)
			res, err = store.Import(ctx, strings.NewReader(historyFile(lines...)), postgres.ImportOptions{BatchSize: 10})
			if err != nil {
				t.Fatal(err)
			}
			if got := countEvents(t, f); got != 25 || res.Imported != 5 || res.Skipped != 20 {
				t.Fatalf("%d events in the log, %+v: want 25, 5 imported and 20 skipped", got, res)
			}
			if v := headVersion(t, f, "a"); v != 25 {
				t.Fatalf("stream head at version %d: want 25", v)
			}
			conn, err := store.Pool().Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Release()
			if s := conn.Conn().PgConn().TxStatus(); s != 'I' {
				t.Fatalf("the pool's connection is in transaction status %q: want idle", s)
			}
		})
	}
}

func headVersion(t *testing.T, f fixture, stream string) int64 {
	t.Helper()
	var v int64
	err := f.store.Pool().QueryRow(f.ctx, `SELECT version FROM `+f.store.Table("projector_streams")+
		` WHERE tenant_id = 'acme' AND stream_type = 'ticket' AND stream_id = $1`, stream).Scan(&v)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
