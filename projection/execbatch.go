package projection

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A pipeline sent without describing its statements first.
//
// pgx sends a batch in two round trips when one of its statements is new
// to the connection: the statements' Parse and Describe with a Sync, for
// their parameters' types, then the pipeline itself. A pass that splits
// its partition (splithandoff.go) sends statements no pass of that
// connection has sent before (the halves' rows, the dead letters' and
// parks' moves, the removal, the layout NOTIFY), so its last pipeline, the
// cursor advance with them and the COMMIT, cost it that extra round trip
// after its batch's writes gave it a transaction id: while it lasted the
// oldest running transaction was likely this one, and every partition of
// every consumer in the cluster read below it (promise 3). The latency
// test's horizon sampler (PROJECTOR_TEST_LATENCY_HORIZON) caught splitting
// passes idle in transaction, waiting for the client, right after Parse of
// the NOTIFY: that round trip. It is one part of the pipeline's time
// (a median of 7-10 ms under that test's load against under 1 ms for an
// ordinary pass's advance and COMMIT; docs/performance.md), the rest being
// the statements, the NOTIFY's commit-time lock and the COMMIT amid the
// work the split starts.
//
// execPipeline sends such a pipeline in one round trip whatever the
// connection has seen: each statement unnamed, its parameters encoded by
// pgx as in its QueryExecModeExec (text format, types the server infers
// from the statement, as it does for pgx's Describe), one Sync at the end.
// As in pgx's batch, a failing statement makes the server skip the rest,
// the COMMIT included, and the transaction is left aborted for the
// caller's rollback.

// execPipeline runs b's statements (none may read rows into a callback)
// on tx's connection in one round trip and returns the last one's command
// tag.
func execPipeline(ctx context.Context, tx pgx.Tx, b *pgx.Batch) (pgconn.CommandTag, error) {
	conn := tx.Conn()
	pb := &pgconn.Batch{}
	for _, q := range b.QueuedQueries {
		if q.Fn != nil {
			return pgconn.CommandTag{}, fmt.Errorf("execPipeline: %q reads its result", q.SQL)
		}
		// A builder per statement: Build reuses its buffers, and the
		// batch keeps every statement's parameters until it is sent.
		var eqb pgx.ExtendedQueryBuilder
		if err := eqb.Build(conn.TypeMap(), nil, q.Arguments); err != nil {
			return pgconn.CommandTag{}, fmt.Errorf("execPipeline: %q: %w", q.SQL, err)
		}
		pb.ExecParams(q.SQL, eqb.ParamValues, nil, eqb.ParamFormats, eqb.ResultFormats)
	}
	results, err := conn.PgConn().ExecBatch(ctx, pb).ReadAll()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	for _, r := range results {
		if r.Err != nil {
			return pgconn.CommandTag{}, r.Err
		}
	}
	if len(results) != len(b.QueuedQueries) {
		return pgconn.CommandTag{}, fmt.Errorf("execPipeline: %d results for %d statements", len(results), len(b.QueuedQueries))
	}
	return results[len(results)-1].CommandTag, nil
}
