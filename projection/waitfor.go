package projection

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// ErrShardStopped matches a [*ShardStoppedError]: WaitFor gave up at once
// because a shard that has not passed the position is dead or disabled, so
// nothing will move it until an operator does.
var ErrShardStopped = errors.New("projection: shard is stopped before the position")

// ShardStoppedError names the shard that keeps [WaitFor] from returning: it
// is dead or disabled and its cursor is still before the awaited position.
type ShardStoppedError struct {
	Shard    ShardID
	Status   Status
	Cursor   projector.Position
	Position projector.Position
}

func (e *ShardStoppedError) Error() string {
	return fmt.Sprintf("projection: shard %s is %s at %s, before %s", e.Shard, e.Status, e.Cursor, e.Position)
}

// Is makes errors.Is(err, [ErrShardStopped]) hold.
func (e *ShardStoppedError) Is(target error) bool { return target == ErrShardStopped }

// Poll bounds of WaitFor: the first look comes waitPollMin after the
// first read, each later one twice as late, up to waitPollMax.
const (
	waitPollMin = time.Millisecond
	waitPollMax = 50 * time.Millisecond
)

// WaitFor returns once every shard of consumer (the shared one, and every
// per-instance one, since each instance applies every event) has passed
// pos: the position of an event, typically the last of an append
// ([postgres.AppendResult.Position]), read after its transaction
// committed. It is how a request that has just appended can answer from a
// read model the async dispatcher updates ("read your writes").
//
// "Passed" is the dispatcher's own test: a cursor at or after pos in
// (transaction id, sequence) order. The cursor may also pass pos without the
// event having been handled — the projection does not handle its type — in
// which case there is nothing to wait for either. A rebuild's shadow shard
// is not waited for (nothing reads from it); a rebuild in place rewinds the
// cursor, and WaitFor then waits for the replay to reach pos.
//
// It returns at once:
//   - nil when every shard has already passed pos (and for [projector.Start]);
//   - a [*ShardStoppedError] (errors.Is [ErrShardStopped]) when a shard that
//     has not passed pos is dead or disabled: waiting would only end with ctx;
//   - an error matching [projector.ErrNotFound] when the consumer has no
//     shard (no dispatcher ever registered it: a misspelt name would
//     otherwise wait until ctx ends);
//   - a database error, as is.
//
// Otherwise it waits until ctx ends and returns ctx.Err() wrapped, naming a
// shard still behind. Give ctx a deadline: a dispatcher that is down or far
// behind makes WaitFor wait that long. Calling it inside the appending
// transaction waits for a position no dispatcher can see before the
// transaction commits.
//
// WaitFor polls the consumer's rows (one primary-key read per look),
// waiting 1 ms after the first look and doubling up to 50 ms, rather than
// LISTEN for cursor moves: polling works from any process with nothing but
// the store's pool, holds no connection while it sleeps, and needs no
// notification from the dispatcher, whose passes stay as they are. So it
// costs nothing while nobody waits, and a waiter sees an update at most
// about 50 ms late.
func WaitFor(ctx context.Context, store *postgres.Store, consumer string, pos projector.Position) error {
	if err := validName(consumer); err != nil {
		return fmt.Errorf("wait for %s: consumer %w: %w", pos, err, projector.ErrNotFound)
	}
	q := `SELECT instance_id, cursor_tx_id, cursor_seq, status FROM ` + store.Table("projector_consumers") + `
		WHERE name = $1 AND instance_id <> '` + RebuildInstance + `' AND version <> ` + strconv.Itoa(PartitionedVersion) // a partitioned consumer's fence never moves; its partitions do
	interval := waitPollMin
	timer := time.NewTimer(interval) // reset before every wait (Go 1.23 timers)
	defer timer.Stop()
	// last is the shard the previous look found behind: a deadline that
	// lands during a look (on a loaded server, often) still names it.
	var last *ShardStoppedError
	for {
		behind, err := waitLook(ctx, store, q, consumer, pos)
		if err != nil {
			if ctx.Err() != nil {
				if last != nil {
					return fmt.Errorf("wait for %s at %s: shard %s is at %s: %w", consumer, pos, last.Shard, last.Cursor, ctx.Err())
				}
				return fmt.Errorf("wait for %s at %s: %w", consumer, pos, ctx.Err())
			}
			return fmt.Errorf("wait for %s at %s: %w", consumer, pos, err)
		}
		if behind == nil {
			return nil
		}
		last = behind
		timer.Reset(interval)
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s at %s: shard %s is at %s: %w", consumer, pos, behind.Shard, behind.Cursor, ctx.Err())
		case <-timer.C:
		}
		interval = min(2*interval, waitPollMax)
	}
}

// waitLook reads the consumer's shards once. It returns a shard still
// behind pos (nil when none is), or a [*ShardStoppedError] for a stopped one.
func waitLook(ctx context.Context, store *postgres.Store, q, consumer string, pos projector.Position) (*ShardStoppedError, error) {
	rows, err := store.Pool().Query(ctx, q, consumer)
	if err != nil {
		return nil, fmt.Errorf("read shards: %w", err)
	}
	var behind *ShardStoppedError
	var instance string
	var cursor projector.Position
	var status Status
	seen := 0
	_, err = pgx.ForEachRow(rows, []any{&instance, &cursor.TxID, &cursor.Seq, &status}, func() error {
		seen++
		if !cursor.Less(pos) {
			return nil
		}
		s := &ShardStoppedError{Shard: ShardID{Consumer: consumer, Instance: instance}, Status: status, Cursor: cursor, Position: pos}
		if status == StatusDead || status == StatusDisabled {
			return s
		}
		if behind == nil {
			behind = s
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, ErrShardStopped) {
			return nil, err
		}
		return nil, fmt.Errorf("read shards: %w", err)
	}
	if seen == 0 {
		return nil, fmt.Errorf("consumer has no shard: %w", projector.ErrNotFound)
	}
	return behind, nil
}
