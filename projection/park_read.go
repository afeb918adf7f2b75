package projection

// Reading parks: the list, one park, and its parked sequence of events.

import (
	"context"
	"errors"
	"fmt"
	"strings"

	sq "github.com/Masterminds/squirrel"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

const parkColumns = `p.id, p.consumer, p.instance_id, p.tenant_id, p.stream_type, p.stream_id, p.status, p.event_id, p.event_type,
	p.version, p.error, p.attempts, p.parked_at,
	CASE WHEN p.status = 'parked' THEN (SELECT count(*) FROM {{e}} e WHERE e.park_id = p.id)::int ELSE coalesce(p.events, 0) END,
	p.last_retried_at, p.retry_requested_at, p.resolved_at, coalesce(p.resolved_by, ''), p.kind, coalesce(p.live_through, 0)`

func parkColumnsOf(store *postgres.Store) string {
	return strings.ReplaceAll(parkColumns, "{{e}}", store.Table("projector_parked_events"))
}

func parkSelect(store *postgres.Store) string {
	return `SELECT ` + parkColumnsOf(store) + ` FROM ` + store.Table("projector_parks") + ` p`
}

func scanPark(row pgx.CollectableRow) (Park, error) {
	var p Park
	err := row.Scan(&p.ID, &p.Consumer, &p.Instance, &p.Tenant, &p.StreamType, &p.StreamID, &p.Status, &p.EventID, &p.EventType,
		&p.Version, &p.Error, &p.Attempts, &p.ParkedAt, &p.Events, &p.LastRetriedAt, &p.RetryRequestedAt, &p.ResolvedAt, &p.ResolvedBy, &p.Kind, &p.LiveThrough)
	return p, err
}

// ValidateParkStatus checks a status to select parks by: [ParkOpen],
// [ParkResolved], [ParkDiscarded] or "" for all. Errors match
// [ErrInvalidParkFilter].
func ValidateParkStatus(status string) error {
	switch status {
	case "", ParkOpen, ParkResolved, ParkDiscarded:
		return nil
	}
	return fmt.Errorf("%w: status %s (want parked, resolved or discarded)", ErrInvalidParkFilter, projector.Quoted(status))
}

// ListParks returns the parks f selects in id order (the order they were
// parked), at most f.Limit of them.
func ListParks(ctx context.Context, store *postgres.Store, f ParkFilter) ([]Park, error) {
	if err := validatePage(ErrInvalidParkFilter, f.Limit, f.AfterID); err != nil {
		return nil, err
	}
	if err := ValidateParkStatus(f.Status); err != nil {
		return nil, err
	}
	for _, c := range [...]struct{ what, v string }{{"consumer", f.Consumer}, {"instance", f.Instance}, {"tenant", f.Tenant}} {
		if err := projector.ValidText(c.v); err != nil {
			return nil, fmt.Errorf("%w: %s %s %w", ErrInvalidParkFilter, c.what, projector.Printable(c.v), err)
		}
	}
	if f.Limit == 0 {
		f.Limit = 100
	}
	// The filters are optional and combine: squirrel, as for dead letters.
	b := sq.StatementBuilder.PlaceholderFormat(sq.Dollar).Select(parkColumnsOf(store)).From(store.Table("projector_parks") + " p").
		Where(sq.Gt{"p.id": f.AfterID}).OrderBy("p.id").Limit(uint64(f.Limit))
	for _, c := range [...]struct{ col, v string }{{"p.consumer", f.Consumer}, {"p.instance_id", f.Instance},
		{"p.tenant_id", f.Tenant}, {"p.status", f.Status}} {
		if c.v != "" {
			b = b.Where(sq.Eq{c.col: c.v})
		}
	}
	sql, args, err := b.ToSql()
	if err != nil {
		return nil, fmt.Errorf("list parks: build query: %w", err)
	}
	rows, err := store.Pool().Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("list parks: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanPark)
	if err != nil {
		return nil, fmt.Errorf("list parks: %w", err)
	}
	return out, nil
}

func getPark(ctx context.Context, db postgres.DBTX, store *postgres.Store, id int64, forUpdate bool) (Park, error) {
	q := parkSelect(store) + ` WHERE p.id = $1`
	if forUpdate {
		q += ` FOR UPDATE OF p`
	}
	rows, err := db.Query(ctx, q, id)
	if err != nil {
		return Park{}, fmt.Errorf("park %d: %w", id, err)
	}
	p, err := pgx.CollectExactlyOneRow(rows, scanPark)
	if errors.Is(err, pgx.ErrNoRows) {
		return Park{}, fmt.Errorf("park %d: %w", id, projector.ErrNotFound)
	}
	if err != nil {
		return Park{}, fmt.Errorf("park %d: %w", id, err)
	}
	return p, nil
}

// GetPark returns park id and, while it is open, its parked sequence of
// events in order, read from the log (hot or archived) and decoded with the store's
// registry. An unknown id matches [projector.ErrNotFound].
func GetPark(ctx context.Context, store *postgres.Store, id int64) (Park, []projector.Event, error) {
	return getParkWithEvents(ctx, store, id, false)
}

// GetParkRaw is [GetPark] with the sequence undecoded: events carry Data
// but no Payload, and types the store's registry does not know are
// returned rather than failing the read. It is for tools that show a park
// without the application's types, as the stock `projector parked show`
// does.
func GetParkRaw(ctx context.Context, store *postgres.Store, id int64) (Park, []projector.Event, error) {
	return getParkWithEvents(ctx, store, id, true)
}

// ParkByID returns park id alone, without reading its events: what a
// caller following a park's status needs. An unknown id matches
// [projector.ErrNotFound].
func ParkByID(ctx context.Context, store *postgres.Store, id int64) (Park, error) {
	return getPark(ctx, store.Pool(), store, id, false)
}

func getParkWithEvents(ctx context.Context, store *postgres.Store, id int64, raw bool) (Park, []projector.Event, error) {
	p, err := getPark(ctx, store.Pool(), store, id, false)
	if err != nil {
		return Park{}, nil, err
	}
	if p.Status != ParkOpen {
		return p, nil, nil
	}
	events, err := parkedEvents(ctx, store.Pool(), store, p, raw)
	return p, events, err
}

// ErrParkedEventMissing: an event of a parked sequence is not in the log,
// hot or archived. `events prune` keeps parked events, so only a manual
// delete gets here;
// the park can only be discarded. It matches
// [projector.ErrInvalidTransition] too.
var ErrParkedEventMissing = fmt.Errorf("%w: a parked event is missing from the log", projector.ErrInvalidTransition)

// parkedEvents reads park p's sequence from the log in version order. The
// archive is read too, in the same statement: a consumer registered or
// rewound behind `streams archive` reads archived events and may park a
// stream whose events are archived (the archive holds back only streams
// parked before it ran). One statement, one snapshot: an unarchive moving
// the stream back meanwhile shows each event in one table or the other,
// never neither.
func parkedEvents(ctx context.Context, db postgres.DBTX, store *postgres.Store, p Park, raw bool) ([]projector.Event, error) {
	if p.Kind == ParkKindSagaInstance {
		return instanceParkedEvents(ctx, db, store, p, raw)
	}
	rows, err := db.Query(ctx, `SELECT version, event_id FROM `+store.Table("projector_parked_events")+` WHERE park_id = $1 ORDER BY version`, p.ID)
	if err != nil {
		return nil, fmt.Errorf("park %d: read its events: %w", p.ID, err)
	}
	type held struct {
		version int64
		id      uuid.UUID
	}
	seq, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (held, error) {
		var h held
		return h, row.Scan(&h.version, &h.id)
	})
	if err != nil {
		return nil, fmt.Errorf("park %d: read its events: %w", p.ID, err)
	}
	if len(seq) == 0 {
		return nil, nil
	}
	log, err := store.ReadStreamTx(ctx, db, p.Stream(), postgres.StreamQuery{FromVersion: seq[0].version, ToVersion: seq[len(seq)-1].version,
		Raw: raw, IncludeArchived: true})
	if err != nil {
		return nil, fmt.Errorf("park %d: read its events: %w", p.ID, err)
	}
	byVersion := make(map[int64]projector.Event, len(log))
	for _, ev := range log {
		byVersion[ev.Version] = ev
	}
	out := make([]projector.Event, 0, len(seq))
	for _, h := range seq {
		ev, ok := byVersion[h.version]
		if !ok || ev.ID != h.id {
			return nil, fmt.Errorf("park %d: v%d (%s) of %s: %w; discard the park", p.ID, h.version, h.id, p.Stream(), ErrParkedEventMissing)
		}
		out = append(out, ev)
	}
	return out, nil
}
