package saga

import (
	"context"
	"fmt"
	"time"

	"github.com/projectorhq/projector/stores/postgres"
)

// PruneCompleted deletes the instances that completed more than olderThan
// ago, with their steps, and returns how many it deleted. Active and
// failed instances are kept: an active one still has work to do and a
// failed one waits for an operator. The events the instances appended stay
// in the log (the store's own retention prunes those).
func PruneCompleted(ctx context.Context, store *postgres.Store, olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("%w: prune completed saga instances older than %v: negative", ErrInvalidArgument, olderThan)
	}
	tag, err := store.Pool().Exec(ctx, `DELETE FROM `+store.Table("projector_saga_instances")+`
		WHERE status = 'completed' AND completed_at < now() - make_interval(secs => $1)`, olderThan.Seconds())
	if err != nil {
		return 0, fmt.Errorf("prune completed saga instances: %w", err)
	}
	return tag.RowsAffected(), nil
}

// CountCompleted returns how many instances [PruneCompleted] would delete
// for olderThan now: for a dry run of the retention command.
func CountCompleted(ctx context.Context, store *postgres.Store, olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("%w: count completed saga instances older than %v: negative", ErrInvalidArgument, olderThan)
	}
	var n int64
	err := store.Pool().QueryRow(ctx, `SELECT count(*) FROM `+store.Table("projector_saga_instances")+`
		WHERE status = 'completed' AND completed_at < now() - make_interval(secs => $1)`, olderThan.Seconds()).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count completed saga instances: %w", err)
	}
	return n, nil
}
