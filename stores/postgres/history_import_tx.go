package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// importTx is one import batch's transaction. Where the batch applies
// inline projections, which are handed a pgx.Tx, it is one (tx); otherwise
// it is a connection of the pool (conn) on which the transaction is begun
// by a BEGIN sent in the same round trip as the batch's first statement
// (see prepare): pgx's Begin waits for its BEGIN's answer alone, a round
// trip per batch that an import of many batches paid on top of its COPYs
// (7–20 ms a batch on the loaded 2-core machine, where each round trip
// waits for the server process to be scheduled).
type importTx struct {
	tx   pgx.Tx
	conn *pgxpool.Conn
	// done says the transaction ended (committed or rolled back).
	done bool
}

// beginImportTx starts a batch's transaction: a pgx.Tx at once when the
// batch needs one (inline projections), otherwise a connection whose
// transaction prepare begins.
func (s *Store) beginImportTx(ctx context.Context, needTx bool) (*importTx, error) {
	if needTx {
		tx, err := s.pool.Begin(ctx)
		if err != nil {
			return nil, err
		}
		return &importTx{tx: tx}, nil
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return &importTx{conn: conn}, nil
}

// prepare runs the batch's statement before its COPY, preceded on a bare
// connection by the BEGIN of its transaction, both in one round trip (a
// pipeline of two statements and one Sync: a BEGIN there turns the
// pipeline's implicit transaction into the batch's, which stays open
// after the Sync), and calls row for each row it returns.
func (t *importTx) prepare(ctx context.Context, sql string, args []any, scans []any, row func() error) error {
	if t.tx != nil {
		rows, err := t.tx.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		_, err = pgx.ForEachRow(rows, scans, row)
		return err
	}
	var batch pgx.Batch
	batch.Queue("BEGIN")
	batch.Queue(sql, args...)
	br := t.conn.SendBatch(ctx, &batch)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return fmt.Errorf("begin: %w", err)
	}
	rows, err := br.Query()
	if err == nil {
		_, err = pgx.ForEachRow(rows, scans, row)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

func (t *importTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.tx != nil {
		return t.tx.Query(ctx, sql, args...)
	}
	return t.conn.Query(ctx, sql, args...)
}

func (t *importTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.tx != nil {
		return t.tx.QueryRow(ctx, sql, args...)
	}
	return t.conn.QueryRow(ctx, sql, args...)
}

func (t *importTx) pgConn() *pgconn.PgConn {
	if t.tx != nil {
		return t.tx.Conn().PgConn()
	}
	return t.conn.Conn().PgConn()
}

// commit commits the transaction. On a bare connection, a COMMIT that
// PostgreSQL answers with ROLLBACK (the transaction had failed) is an
// error, as pgx's Commit makes it.
//
// The COMMIT is not cancelled with ctx: a cancellation arriving while it
// is on its way (an operator's Ctrl-C) made pgx give up on the answer
// while the server committed, and the import then reported the batch as
// not written (its counts one batch short). It runs to its answer, for at
// most importCommitTimeout, and the cancellation is seen by the next
// batch, after this one is counted.
func (t *importTx) commit(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), importCommitTimeout)
	defer cancel()
	if t.tx != nil {
		t.done = true
		return t.tx.Commit(ctx)
	}
	tag, err := t.conn.Exec(ctx, "COMMIT")
	t.done = true
	if err != nil {
		return err
	}
	if tag.String() != "COMMIT" {
		return pgx.ErrTxCommitRollback
	}
	return nil
}

// importCommitTimeout bounds a batch's COMMIT, which a cancellation does
// not interrupt (importTx.commit).
const importCommitTimeout = time.Minute

// close rolls back a transaction not committed and gives the connection
// back to the pool (which closes it instead if it is left in a
// transaction, a rollback that could not be sent).
func (t *importTx) close(ctx context.Context) {
	if t.tx != nil {
		_ = t.tx.Rollback(ctx)
		return
	}
	if !t.done {
		_, _ = t.conn.Exec(ctx, "ROLLBACK")
	}
	t.conn.Release()
}
