package projection

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// RemovedBy is the suffix a park closed by a consumer's removal carries
// after who removed it, in its ResolvedBy: the record says why it was
// discarded, not only by whom.
const RemovedBy = " (consumer removed)"

// Removal is what [Admin.RemoveAs] did.
type Removal struct {
	// Shards are the consumer shards it removed.
	Shards []ShardID
	// ParksClosed counts the open parks it discarded with them.
	ParksClosed int
	// RetriesCancelled counts those of them that had a retry request
	// waiting for a dispatcher (`parked retry` without --here).
	RetriesCancelled int
}

// closeRemovedParks discards, in tx, the open parks of consumer on the
// instances removed (every instance when nil: a rebuild's shadow and the
// partitions included), records them as discarded by by+[RemovedBy] with
// how many events they held, cancels their pending retry requests, drops
// their sequences and makes a parked saga instance active again, as
// [DiscardPark] does.
//
// A park outlives its shard otherwise, and a dispatcher that registers
// the consumer again starts from its StartFrom, applying the parked events
// itself: the old park would then hold the stream against the new
// registration (absorbing events the new one never applied), and a retry
// of it would apply its sequence a second time, out of order. Dead letters
// are kept open by a removal because they hold nothing back; a park does.
//
// The caller holds the shards' locks, so no pass adds to a sequence
// meanwhile. The rows are locked (FOR UPDATE) before they are read: a
// retry that holds one commits first and its park is left resolved, and a
// retry request or discard waiting on one finds it discarded after the
// commit (refused, exit 3).
func closeRemovedParks(ctx context.Context, tx pgx.Tx, store *postgres.Store, consumer string, instances []string, by string) (closed, cancelled int, err error) {
	p, e := store.Table("projector_parks"), store.Table("projector_parked_events")
	rows, err := tx.Query(ctx, `WITH closing AS (
			SELECT id, retry_requested_at IS NOT NULL AS requested FROM `+p+`
			WHERE consumer = $1 AND status = 'parked' AND ($2::text[] IS NULL OR instance_id = ANY($2))
			ORDER BY id FOR UPDATE)
		UPDATE `+p+` p SET status = 'discarded', resolved_at = now(), resolved_by = $3, retry_requested_at = NULL,
			events = (SELECT count(*) FROM `+e+` e WHERE e.park_id = p.id)
		FROM closing c WHERE p.id = c.id
		RETURNING p.id, p.kind, p.tenant_id, p.stream_id, c.requested`, consumer, instances, by+RemovedBy)
	if err != nil {
		return 0, 0, fmt.Errorf("close the parks of consumer %s: %w", projector.Printable(consumer), err)
	}
	var ids []int64
	var sagas []Park
	var pk Park
	var requested bool
	_, err = pgx.ForEachRow(rows, []any{&pk.ID, &pk.Kind, &pk.Tenant, &pk.StreamID, &requested}, func() error {
		ids = append(ids, pk.ID)
		if requested {
			cancelled++
		}
		if pk.Kind == ParkKindSagaInstance {
			sagas = append(sagas, Park{ID: pk.ID, Kind: pk.Kind, Consumer: consumer, Tenant: pk.Tenant, StreamID: pk.StreamID})
		}
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("close the parks of consumer %s: %w", projector.Printable(consumer), err)
	}
	if len(ids) == 0 {
		return 0, 0, nil
	}
	if _, err := tx.Exec(ctx, `DELETE FROM `+e+` WHERE park_id = ANY($1)`, ids); err != nil {
		return 0, 0, fmt.Errorf("close the parks of consumer %s: %w", projector.Printable(consumer), err)
	}
	for _, s := range sagas {
		if err := reactivateInstance(ctx, tx, store, s); err != nil {
			return 0, 0, err
		}
	}
	return len(ids), cancelled, nil
}
