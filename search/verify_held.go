package search

import (
	"context"
	"fmt"

	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// Verify's last resort while the consumer keeps moving.
//
// Verify reads a page of the index without holding the consumer: it reads
// the cursor, the page, looks at the shards' locks (held while a batch is
// in flight) and reads the cursor again, and reads again while either
// says the consumer moved. A consumer that moves through every attempt
// leaves it with a page read against a cursor it may not match: a batch
// in flight on Meilisearch has written documents the cursor does not yet
// explain. When that page differs from the log, Verify reads it once more
// holding the consumer (readPageHeld): a difference it then still finds
// is in the index, not in flight, and one that came from a batch in
// flight is gone. A page that agrees is not read again: a difference the
// index holds shows on any read.

// readPageHeld waits for the lock of every shard whose passes move the
// view from (the consumer's one shard, or each of its partitions) — the
// lock a pass holds from before its write to the index to its commit —
// and, holding them, reads the cursors, replays into want what they
// passed since from, and lists the page. No batch is in flight meanwhile,
// so the page holds exactly what the cursors say. The consumer's passes
// are held off for as long: the wait for a batch in flight, the replay of
// the events it applied and one listing of the page (a pass that found a
// lock taken tries again once they are released, woken by
// projection.WakeConsumer). The locks are
// taken in a transaction that writes nothing, so it holds back no
// horizon. ok is false, and nothing read, when the layout changed since
// from (partitioned, split or merged since): the locks taken are then not
// those of the shards that move the index.
func (p *Projection) readPageHeld(ctx context.Context, store *postgres.Store, admin *projection.Admin, id projection.ShardID, from cursors, want *memIndex,
	list func() ([]Stored, error)) (held cursors, events int, got []Stored, ok bool, err error) {
	tx, err := store.Pool().Begin(ctx)
	if err != nil {
		return cursors{}, 0, nil, false, fmt.Errorf("hold the consumer: %w", err)
	}
	defer func() {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		// The locks are free again: a pass that found one taken looks
		// now rather than at its dispatcher's next Recheck.
		_ = projection.WakeConsumer(ctx, store, p.name)
	}()
	ids := from.shards(p.name)
	if from.partitioned() {
		parts := make([]string, len(ids))
		for i, id := range ids {
			parts[i] = id.Instance
		}
		err = projection.LockPartitions(ctx, tx, store, p.name, parts)
	} else {
		err = projection.LockShard(ctx, tx, store, ids[0])
	}
	if err != nil {
		return cursors{}, 0, nil, false, fmt.Errorf("hold the consumer: %w", err)
	}
	if held, err = readCursors(ctx, store, admin, id); err != nil {
		return cursors{}, 0, nil, false, err
	}
	if held.partitioned() != from.partitioned() || !sameLayout(from, held) {
		return cursors{}, 0, nil, false, nil
	}
	if events, err = p.replaySince(ctx, store, want, from, held); err != nil {
		return cursors{}, 0, nil, false, err
	}
	if got, err = list(); err != nil {
		return cursors{}, 0, nil, false, err
	}
	return held, events, got, true, nil
}
