package jetstream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// Gap is a source stream whose next event has not arrived while later ones
// have: the claims consumer holds those (negative acknowledgement with
// HoldDelay) until the missing one is handled. The missing versions are
// FirstMissing..HeldFrom-1; the held ones are within HeldFrom..HeldTo.
type Gap struct {
	Stream projector.StreamRef
	// LastVersion is the last version handled (applied or dead-lettered).
	LastVersion int64
	// FirstMissing is LastVersion+1: the version the stream waits for.
	FirstMissing int64
	// HeldFrom and HeldTo are the lowest and highest versions held so far.
	// SkipTo accepts HeldFrom at most.
	HeldFrom, HeldTo int64
	// HeldSince is when the first of them was held.
	HeldSince time.Time
}

// Gaps returns the streams of subscription that hold events behind a
// missing one, oldest hold first: what an operator reads before [SkipTo].
// A gap that lasts more than a few HoldDelays is real (the predecessor was
// pruned before it was relayed, deleted from the stream, or the
// subscription started mid-stream).
func Gaps(ctx context.Context, store *postgres.Store, subscription string) ([]Gap, error) {
	if err := ValidateSubscription(subscription); err != nil {
		return nil, fmt.Errorf("jetstream gaps: %w", err)
	}
	rows, err := store.Pool().Query(ctx, `SELECT tenant_id, stream_type, stream_id, last_version, held_version, coalesce(held_max, held_version), held_since
		FROM `+store.Table("projector_jetstream_streams")+`
		WHERE subscription = $1 AND held_version IS NOT NULL ORDER BY held_since, tenant_id, stream_type, stream_id`, subscription)
	if err != nil {
		return nil, fmt.Errorf("jetstream gaps of %s: %w", subscription, err)
	}
	gaps, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Gap, error) {
		var g Gap
		err := r.Scan(&g.Stream.Tenant, &g.Stream.Type, &g.Stream.ID, &g.LastVersion, &g.HeldFrom, &g.HeldTo, &g.HeldSince)
		g.FirstMissing = g.LastVersion + 1
		return g, err
	})
	if err != nil {
		return nil, fmt.Errorf("jetstream gaps of %s: %w", subscription, err)
	}
	return gaps, nil
}

// SkipTo moves a subscription's stream past a real gap: the stream's last
// handled version becomes version-1, so the event at version, held until
// now, is applied next. For a predecessor that will never come (pruned
// before it was relayed, deleted from the JetStream stream, dead-lettered
// by another subscription's operator): read the gap with [Gaps] and pass
// its HeldFrom.
//
// It never passes a held event: a version above the lowest held one is
// refused, since the held versions below it would be acknowledged as
// duplicates without being applied or dead-lettered. A stream with nothing
// held has no gap to skip and is refused too, as is a move backwards; all
// refusals match [projector.ErrInvalidTransition] and change nothing. A
// stream this subscription never saw may be started at version (as
// ConsumerConfig.AcceptFirstSeen would do for every stream).
func SkipTo(ctx context.Context, store *postgres.Store, subscription string, stream projector.StreamRef, version int64) error {
	if version < 1 {
		return fmt.Errorf("%w: version %d below 1", ErrInvalidConfig, version)
	}
	table := store.Table("projector_jetstream_streams")
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("skip stream %s to version %d: %w: "+format, append([]any{stream, version, projector.ErrInvalidTransition}, args...)...)
	}
	err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		// The row lock orders this against the consumer, which holds it
		// while it applies an event of the stream.
		var last int64
		var heldFrom, heldTo *int64
		err := tx.QueryRow(ctx, `SELECT last_version, held_version, coalesce(held_max, held_version) FROM `+table+`
			WHERE subscription = $1 AND tenant_id = $2 AND stream_type = $3 AND stream_id = $4 FOR UPDATE`,
			subscription, stream.Tenant, stream.Type, stream.ID).Scan(&last, &heldFrom, &heldTo)
		if errors.Is(err, pgx.ErrNoRows) {
			tag, err := tx.Exec(ctx, `INSERT INTO `+table+` (subscription, tenant_id, stream_type, stream_id, last_version) VALUES ($1, $2, $3, $4, $5)
				ON CONFLICT DO NOTHING`, subscription, stream.Tenant, stream.Type, stream.ID, version-1)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				return refuse("the stream was handled meanwhile: read its gap again")
			}
			return nil
		}
		if err != nil {
			return err
		}
		switch {
		case version-1 <= last:
			return refuse("already at or past it (last handled version %d)", last)
		case heldFrom == nil:
			return refuse("nothing is held behind a gap (last handled version %d): the versions up to %d may still arrive", last, version-1)
		case version > *heldFrom:
			return refuse("versions %d..%d are held, waiting to be applied: skip to %d at most (the first missing version is %d)", *heldFrom, *heldTo, *heldFrom, last+1)
		}
		_, err = tx.Exec(ctx, `UPDATE `+table+` SET last_version = $5, updated_at = now()
			WHERE subscription = $1 AND tenant_id = $2 AND stream_type = $3 AND stream_id = $4`,
			subscription, stream.Tenant, stream.Type, stream.ID, version-1)
		return err
	})
	if err != nil && !errors.Is(err, projector.ErrInvalidTransition) {
		return fmt.Errorf("skip stream %s to version %d: %w", stream, version, err)
	}
	return err
}
