package projection

import (
	"context"
	"errors"
	"log/slog"

	"github.com/jackc/pgx/v5/pgconn"
)

// holdCheck is the constraint on projector_consumers (migration 30) that
// refuses a cursor past its merge hold, in every statement that writes
// one. A merge holds caught-up halves without their shard locks
// (holdUnlocked, split.go), so a pass may have read its state just before
// the hold committed and end its batch past it: its cursor update is then
// refused, and its transaction, handlers' writes and all, rolls back.
const holdCheck = "projector_consumers_cursor_within_hold"

// pastHold reports whether err is holdCheck's refusal.
func pastHold(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23514" && pgErr.ConstraintName == holdCheck
}

// againPastHold wraps a pass's result: a pass refused by holdCheck
// applied nothing and is no failure of the database, so the loop runs it
// again at once (passMore), and that pass reads the hold and cuts its
// batch there. Only once in a row: a refusal that comes back (a writer
// other than the batch's, such as a rebuild's switch) is a failure, retried
// with the usual backoff, not in a loop.
func (sh *shard) againPastHold(ctx context.Context, log *slog.Logger, res passResult, err error) (passResult, error) {
	again := pastHold(err) && !sh.crossedHold
	sh.crossedHold = again
	if !again {
		return res, err
	}
	log.DebugContext(ctx, "projection dispatcher: a merge held the partition during its batch; running it again, cut at the hold",
		slog.Any("error", err))
	return passResult{kind: passMore, held: res.held}, nil
}
