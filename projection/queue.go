package projection

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

type queueKey struct{}

// writeQueue is one apply's queued writes: a pgx batch and, for each
// statement, the index of the event whose handler queued it.
type writeQueue struct {
	batch   *pgx.Batch
	owners  []int
	current int
}

func (q *writeQueue) reset() {
	q.batch, q.owners, q.current = &pgx.Batch{}, q.owners[:0], 0
}

// Queue adds a write to the current batch instead of running it at once:
// the dispatcher sends every statement its handlers queued in one
// pipelined round trip, in the order they were queued, after the batch's
// handlers ran and before the cursor moves, in the same transaction. A
// per-event handler that writes this way costs no round trip of its own,
// which is most of a per-event handler's time.
//
// Queued writes are not visible to reads made by handlers of the same
// batch; queue only what the batch does not read back. A queued statement
// that fails fails the event whose handler queued it, like a returned error.
// Queue works only in handlers run by a dispatcher ([ErrNoDispatcher]
// elsewhere, such as in inline projections).
func Queue(ctx context.Context, sql string, args ...any) error {
	q, ok := ctx.Value(queueKey{}).(*writeQueue)
	if !ok {
		return ErrNoDispatcher
	}
	q.batch.Queue(sql, args...)
	q.owners = append(q.owners, q.current)
	return nil
}

// flush sends the queued writes; on a failure it returns the index of the
// event that queued the failing statement.
func (q *writeQueue) flush(ctx context.Context, tx pgx.Tx) (int, error) {
	n := q.batch.Len()
	if n == 0 {
		return -1, nil
	}
	br := tx.SendBatch(ctx, q.batch)
	for j := range n {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return q.owners[j], fmt.Errorf("queued write: %w", err)
		}
	}
	if err := br.Close(); err != nil {
		return q.owners[n-1], fmt.Errorf("queued writes: %w", err)
	}
	return -1, nil
}
