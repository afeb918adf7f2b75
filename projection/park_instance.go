package projection

// Parks of saga instances: a saga under ParkStream parks the instance whose
// step failed MaxAttempts times, keyed by its correlation key, rather than
// the stream of the event (an instance hears from several streams). The
// saga decides and holds in its own step (saga/park.go); these are the park
// table's side of it, so list, show, retry, discard, the metrics and the
// console treat both kinds alike. Migration 0021 has the kind column.

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// Park kinds.
const (
	// ParkKindStream is a parked stream of a projection.
	ParkKindStream = "stream"
	// ParkKindSagaInstance is a parked saga instance: the park's consumer is
	// the saga, its StreamID the instance's correlation key (StreamType is
	// empty), and its sequence holds the instance's events in log order,
	// from any streams.
	ParkKindSagaInstance = "saga-instance"
)

// SagaKey returns the correlation key of a saga instance's park, "" for a
// stream's.
func (p Park) SagaKey() string {
	if p.Kind != ParkKindSagaInstance {
		return ""
	}
	return p.StreamID
}

// What names what is parked, printable: a stream (tenant/type/id), or a
// saga instance by its key and tenant.
func (p Park) What() string {
	if p.Kind == ParkKindSagaInstance {
		return "saga instance " + projector.Printable(p.StreamID) + " (tenant " + projector.Printable(p.Tenant) + ")"
	}
	return p.Stream().String()
}

// retryingKey carries the park a retry is applying to the handlers.
type retryingKey struct{}

// RetryingPark returns the park whose sequence the handler is being given
// by a retry ([RetryPark]), if it is. A saga's handler uses it to take the
// steps of its parked instance rather than hold them again.
func RetryingPark(ctx context.Context) (Park, bool) {
	p, ok := ctx.Value(retryingKey{}).(Park)
	return p, ok
}

// FailedAttempts returns how many times ev has failed on consumer shard id,
// this time included, as the dispatcher counts them for MaxAttempts: the
// shard counts the attempts of the event it last failed on. For a handler
// that parks in its own step (a saga) in the pass's transaction tx, which
// must be unscoped.
func FailedAttempts(ctx context.Context, tx pgx.Tx, store *postgres.Store, id ShardID, ev projector.Event) (int, error) {
	var st shardRow
	err := tx.QueryRow(ctx, `SELECT attempts, coalesce(failed_event_id, '00000000-0000-0000-0000-000000000000')
		FROM `+store.Table("projector_consumers")+` WHERE name = $1 AND instance_id = $2`, id.Consumer, id.Instance).
		Scan(&st.attempts, &st.failedEvent)
	if errors.Is(err, pgx.ErrNoRows) {
		return 1, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read the attempts of %s: %w", id, err)
	}
	return failedAttempts(st, ev), nil
}

// OpenInstanceParks returns the open parks of saga instances of consumer
// (the saga) in tenant among keys, by key, in tx (unscoped).
func OpenInstanceParks(ctx context.Context, tx pgx.Tx, store *postgres.Store, consumer, tenant string, keys []string) (map[string]int64, error) {
	rows, err := tx.Query(ctx, `SELECT stream_id, id FROM `+store.Table("projector_parks")+`
		WHERE consumer = $1 AND tenant_id = $2 AND stream_type = '' AND stream_id = ANY($3)
		  AND status = 'parked' AND kind = 'saga-instance'`, consumer, tenant, keys)
	if err != nil {
		return nil, fmt.Errorf("read parked instances of %s: %w", projector.Printable(consumer), err)
	}
	out := map[string]int64{}
	var key string
	var id int64
	if _, err := pgx.ForEachRow(rows, []any{&key, &id}, func() error {
		out[key] = id
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read parked instances of %s: %w", projector.Printable(consumer), err)
	}
	return out, nil
}

// ParkInstance opens the park of saga instance key of consumer in tenant
// for failing, which failed attempts times with herr, in tx (unscoped), and
// returns its id; failing is not held yet ([HoldInstanceEvents] does).
func ParkInstance(ctx context.Context, tx pgx.Tx, store *postgres.Store, consumer, tenant, key string, failing projector.Event,
	herr error, attempts int,
) (int64, error) {
	// Under the shard that handles the instance's events (its partition,
	// when the saga is partitioned by key), whose dispatcher retries it.
	instance := SharedInstance
	if id, ok := ShardFrom(ctx); ok {
		instance = id.Instance
	}
	var id int64
	err := tx.QueryRow(ctx, `INSERT INTO `+store.Table("projector_parks")+` AS p
			(consumer, instance_id, tenant_id, stream_type, stream_id, event_id, event_type, version, error, attempts, kind)
		VALUES ($1, $2, $3, '', $4, $5, $6, $7, $8, $9, 'saga-instance')
		ON CONFLICT (consumer, instance_id, tenant_id, stream_type, stream_id) WHERE status = 'parked'
		DO UPDATE SET attempts = p.attempts RETURNING id`,
		consumer, instance, tenant, key, [16]byte(failing.ID), failing.Type, failing.Version, StoredError(herr, OpenedEvents(store.Registry(), failing)...), attempts).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("park instance %s of %s: %w", projector.Printable(key), projector.Printable(consumer), err)
	}
	return id, nil
}

// HoldInstanceEvents adds events, in log order, to the end of the sequence
// of instance park id, in tx (unscoped): they are numbered after the ones
// held already. An event held already is not held again.
func HoldInstanceEvents(ctx context.Context, tx pgx.Tx, store *postgres.Store, id int64, events []projector.Event) error {
	if len(events) == 0 {
		return nil
	}
	ids := make([][16]byte, len(events))
	for i, ev := range events {
		ids[i] = [16]byte(ev.ID)
	}
	e := store.Table("projector_parked_events")
	// Only the saga's consumer, under its shard lock, adds to its parks:
	// the numbering is not raced.
	_, err := tx.Exec(ctx, `INSERT INTO `+e+` (park_id, version, event_id)
		SELECT $1, coalesce((SELECT max(version) FROM `+e+` WHERE park_id = $1), 0) + row_number() OVER (ORDER BY u.n), u.id
		FROM unnest($2::uuid[]) WITH ORDINALITY AS u(id, n)
		WHERE NOT EXISTS (SELECT 1 FROM `+e+` h WHERE h.park_id = $1 AND h.event_id = u.id)`, id, ids)
	if err != nil {
		return fmt.Errorf("hold events in park %d: %w", id, err)
	}
	return nil
}

// instanceParkedEvents reads the sequence of instance park p from the log,
// hot or archived (as [parkedEvents]), in the order it was held (log
// order). Each read takes both tables in one statement: an unarchive
// moving a stream back between the lookup of an event's stream and the
// read of the event finds it in one table or the other.
func instanceParkedEvents(ctx context.Context, db postgres.DBTX, store *postgres.Store, p Park, raw bool) ([]projector.Event, error) {
	rows, err := db.Query(ctx, `SELECT h.event_id, coalesce(e.tenant_id, ''), coalesce(e.stream_type, ''), coalesce(e.stream_id, ''), coalesce(e.version, 0)
		FROM `+store.Table("projector_parked_events")+` h LEFT JOIN (
			SELECT id, tenant_id, stream_type, stream_id, version FROM `+store.Table("projector_events")+`
			UNION ALL SELECT id, tenant_id, stream_type, stream_id, version FROM `+store.Table("projector_events_archive")+`) e ON e.id = h.event_id
		WHERE h.park_id = $1 ORDER BY h.version`, p.ID)
	if err != nil {
		return nil, fmt.Errorf("park %d: read its events: %w", p.ID, err)
	}
	type held struct {
		id      uuid.UUID
		stream  projector.StreamRef
		version int64
	}
	seq, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (held, error) {
		var h held
		return h, row.Scan(&h.id, &h.stream.Tenant, &h.stream.Type, &h.stream.ID, &h.version)
	})
	if err != nil {
		return nil, fmt.Errorf("park %d: read its events: %w", p.ID, err)
	}
	out := make([]projector.Event, 0, len(seq))
	for _, h := range seq {
		var evs []projector.Event
		if h.version > 0 {
			if evs, err = store.ReadStreamTx(ctx, db, h.stream, postgres.StreamQuery{FromVersion: h.version, ToVersion: h.version,
				Raw: raw, IncludeArchived: true}); err != nil {
				return nil, fmt.Errorf("park %d: read its events: %w", p.ID, err)
			}
		}
		if len(evs) != 1 || evs[0].ID != h.id {
			return nil, fmt.Errorf("park %d: event %s of saga instance %s: %w; discard the park", p.ID, h.id, projector.Printable(p.StreamID), ErrParkedEventMissing)
		}
		out = append(out, evs[0])
	}
	return out, nil
}

// reactivateInstance makes the saga instance of a discarded park active
// again, in tx: its parked events are dropped, its later ones reach it.
func reactivateInstance(ctx context.Context, tx pgx.Tx, store *postgres.Store, p Park) error {
	if p.Kind != ParkKindSagaInstance {
		return nil
	}
	_, err := tx.Exec(ctx, `UPDATE `+store.Table("projector_saga_instances")+` SET status = 'active', updated_at = now()
		WHERE saga = $1 AND tenant_id = $2 AND key = $3 AND status = 'parked'`, p.Consumer, p.Tenant, p.StreamID)
	if err != nil {
		return fmt.Errorf("discard park %d: make saga instance %s active again: %w", p.ID, projector.Printable(p.StreamID), err)
	}
	return nil
}
