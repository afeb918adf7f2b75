package rebuild_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
)

// What a reader using pgx with its default statement cache sees across a
// blue/green switch whose new version adds a column (docs/rebuilds.md, "What
// readers must know"), each reader on its own connection that ran its query
// once before the switch, so the statement is prepared and cached:
//
//   - an explicit column list keeps working, outside and inside a
//     transaction, and reads the new table from the first query on;
//   - SELECT * fails once with SQLSTATE 0A000 ("cached plan must not change
//     result type"), with or without arguments; pgx then drops the statement
//     from its cache, so the next try succeeds and returns the new column;
//   - inside a transaction that failure aborts the transaction (25P02 for
//     every statement after it) and only a new transaction succeeds;
//   - without a cached plan (QueryExecModeExec), SELECT * works at once.
func TestReadersAcrossASwitch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.ticket("r1")
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := e.dispatcher(e.counter(1, projection.AsyncConfig{})).CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	table := pgx.Identifier{e.schema, "counts"}.Sanitize()
	cols := `SELECT stream_id, n, v FROM ` + table + ` WHERE stream_id = $1`
	star := `SELECT * FROM ` + table + ` WHERE stream_id = $1`
	starNoArgs := `SELECT * FROM ` + table + ` ORDER BY stream_id LIMIT 1`

	connect := func(mode ...pgx.QueryExecMode) *pgx.Conn {
		t.Helper()
		cfg := pgtest.PoolConfig(t).ConnConfig.Copy()
		if cfg.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement || cfg.StatementCacheCapacity == 0 {
			t.Fatalf("pgx's default is no longer a statement cache: mode %v, capacity %d", cfg.DefaultQueryExecMode, cfg.StatementCacheCapacity)
		}
		if len(mode) > 0 {
			cfg.DefaultQueryExecMode = mode[0]
		}
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		return conn
	}
	// readV reads the row of r1 and returns its v and its column count.
	readV := func(q pgx.Tx, conn *pgx.Conn, sql string, args ...any) (v int32, ncols int, err error) {
		var rows pgx.Rows
		if q != nil {
			rows, err = q.Query(ctx, sql, args...)
		} else {
			rows, err = conn.Query(ctx, sql, args...)
		}
		if err != nil {
			return 0, 0, err
		}
		defer rows.Close()
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				return 0, 0, err
			}
			v, ncols = vals[2].(int32), len(vals)
		}
		return v, ncols, rows.Err()
	}
	colsOut, colsIn, starOut, starIn, noArgs, execMode := connect(), connect(), connect(), connect(), connect(), connect(pgx.QueryExecModeExec)
	for _, c := range []struct {
		conn *pgx.Conn
		sql  string
	}{{colsOut, cols}, {colsIn, cols}, {starOut, star}, {starIn, star}, {noArgs, starNoArgs}, {execMode, star}} {
		var args []any
		if c.sql != starNoArgs {
			args = []any{"r1"}
		}
		if v, n, err := readV(nil, c.conn, c.sql, args...); err != nil || v != 1 || n != 3 {
			t.Fatalf("before the switch, %s: v%d, %d columns, %v", c.sql, v, n, err)
		}
	}

	// Version 2 adds a column: built into the shadow table, switched in.
	e.dispatcher(e.counter(2, projection.AsyncConfig{}))
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Hold: true}); err != nil {
		t.Fatal(err)
	}
	rb := e.waitReady("counter")
	e.exec(`ALTER TABLE ` + pgx.Identifier{rb.ShadowSchema, "counts"}.Sanitize() + ` ADD COLUMN note text NOT NULL DEFAULT 'v2'`)
	if err := rebuild.Switch(e.ctx, e.store, "counter"); err != nil {
		t.Fatal(err)
	}
	if final, err := rebuild.Wait(ctx, e.store, "counter", 10*time.Millisecond, nil); err != nil || final.Status != rebuild.Switched {
		t.Fatalf("switch: %+v, %v", final, err)
	}

	// (a) An explicit column list: no error, the new model at once.
	if v, _, err := readV(nil, colsOut, cols, "r1"); err != nil || v != 2 {
		t.Errorf("column list outside a transaction after the switch: v%d, %v; want v2", v, err)
	}
	if err := pgx.BeginFunc(ctx, colsIn, func(tx pgx.Tx) error {
		v, _, err := readV(tx, nil, cols, "r1")
		if err == nil && v != 2 {
			err = errors.New("not the new model")
		}
		return err
	}); err != nil {
		t.Errorf("column list inside a transaction after the switch: %v", err)
	}

	// (b) SELECT *, outside a transaction: fails once, then reads the new
	// table with its new column.
	for _, c := range []struct {
		conn *pgx.Conn
		sql  string
		args []any
	}{{starOut, star, []any{"r1"}}, {noArgs, starNoArgs, nil}} {
		_, _, err := readV(nil, c.conn, c.sql, c.args...)
		if !isSQLState(err, "0A000") {
			t.Errorf("%s, first time after the switch: %v; want SQLSTATE 0A000", c.sql, err)
		}
		if v, n, err := readV(nil, c.conn, c.sql, c.args...); err != nil || v != 2 || n != 4 {
			t.Errorf("%s, retried: v%d, %d columns, %v; want v2 with 4 columns", c.sql, v, n, err)
		}
	}

	// Without a cached plan (QueryExecModeExec: an unnamed statement per
	// query), SELECT * reads the new table at once.
	if v, n, err := readV(nil, execMode, star, "r1"); err != nil || v != 2 || n != 4 {
		t.Errorf("SELECT * in exec mode after the switch: v%d, %d columns, %v; want v2 with 4 columns", v, n, err)
	}

	// (b) SELECT * inside a transaction: the failure aborts it.
	tx, err := starIn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := readV(tx, nil, star, "r1"); !isSQLState(err, "0A000") {
		t.Errorf("SELECT * in a transaction after the switch: %v; want SQLSTATE 0A000", err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1`); !isSQLState(err, "25P02") {
		t.Errorf("the next statement of that transaction: %v; want 25P02 (transaction aborted)", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, starIn, func(tx pgx.Tx) error {
		v, n, err := readV(tx, nil, star, "r1")
		if err == nil && (v != 2 || n != 4) {
			err = errors.New("not the new model")
		}
		return err
	}); err != nil {
		t.Errorf("SELECT * in a new transaction: %v", err)
	}
}

func isSQLState(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}
