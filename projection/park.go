package projection

// Parking ([ParkStream]): the pass's two hooks (parkHeld holds back the
// events of parked streams before the handlers run; parkFailed parks the
// stream of an event that failed MaxAttempts times), and the operator's
// ways out (list, show, retry, discard). Migration 0018 has the tables.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// Park statuses. A park is open until a retry applies its whole sequence
// (resolved) or an operator gives up on it (discarded); neither deletes the
// row, which stays the record of what was done, by whom, to how many events.
const (
	ParkOpen      = "parked"
	ParkResolved  = "resolved"
	ParkDiscarded = "discarded"
)

// ErrInvalidParkFilter: a park listing was asked for with a value that
// cannot be a filter.
var ErrInvalidParkFilter = errors.New("projection: invalid park filter")

// Park is one parked stream of a consumer shard ([ParkStream]).
type Park struct {
	ID         int64  `json:"id"`
	Consumer   string `json:"consumer"`
	Instance   string `json:"instance_id"`
	Tenant     string `json:"tenant"`
	StreamType string `json:"stream_type"`
	StreamID   string `json:"stream_id"`
	Status     string `json:"status"`
	// EventID, EventType and Version are the event that failed and parked
	// the stream.
	EventID   uuid.UUID `json:"event_id"`
	EventType string    `json:"event_type"`
	Version   int64     `json:"version"`
	// Error is the last failure: the one that parked the stream, or that of
	// the last failed retry.
	Error string `json:"error"`
	// Attempts counts the tries of the parked sequence: MaxAttempts when
	// parked, one more for each retry.
	Attempts int       `json:"attempts"`
	ParkedAt time.Time `json:"parked_at"`
	// Events is how many events the parked sequence holds (open), or held
	// when it was resolved or discarded.
	Events           int        `json:"events"`
	LastRetriedAt    *time.Time `json:"last_retried_at,omitempty"`
	RetryRequestedAt *time.Time `json:"retry_requested_at,omitempty"`
	ResolvedAt       *time.Time `json:"resolved_at,omitempty"`
	// ResolvedBy is who resolved (retried) or discarded it.
	ResolvedBy string `json:"resolved_by,omitempty"`
	// Kind is [ParkKindStream] or [ParkKindSagaInstance] (whose StreamID is
	// the instance's correlation key).
	Kind string `json:"kind"`
	// LiveThrough is the stream version through which a model before this
	// one applied the stream's events live (set by a blue/green switch that
	// handed the park over; 0 when none): a retry gives the parked events
	// up to it to the handlers as replays, so their Emit calls append once.
	LiveThrough int64 `json:"live_through,omitempty"`
}

// Stream returns the parked stream.
func (p Park) Stream() projector.StreamRef {
	return projector.StreamRef{Tenant: p.Tenant, Type: p.StreamType, ID: p.StreamID}
}

// parkSQL is what the pass and the operations run on the park tables.
type parkSQL struct {
	held, hold, park string
}

func buildParkSQL(store *postgres.Store) parkSQL {
	p, e := store.Table("projector_parks"), store.Table("projector_parked_events")
	return parkSQL{
		// The open parks among the batch's streams (distinct), along the
		// partial unique index of open parks.
		held: `SELECT p.id, p.tenant_id, p.stream_type, p.stream_id FROM ` + p + ` p
			WHERE p.consumer = $1 AND p.instance_id = $2 AND p.status = 'parked'
			  AND (p.tenant_id, p.stream_type, p.stream_id) IN (SELECT * FROM unnest($3::text[], $4::text[], $5::text[]))`,
		// Idempotent: a pass that parked events and then recorded a failure
		// before them (its cursor stops there) reads them again next time.
		hold: `INSERT INTO ` + e + ` (park_id, version, event_id)
			SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::uuid[]) ON CONFLICT DO NOTHING`,
		// The no-op update on conflict (an open park of the stream exists
		// already) returns its id.
		park: `INSERT INTO ` + p + ` AS p (consumer, instance_id, tenant_id, stream_type, stream_id, event_id, event_type, version, error, attempts)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
			ON CONFLICT (consumer, instance_id, tenant_id, stream_type, stream_id) WHERE status = 'parked'
			DO UPDATE SET attempts = p.attempts RETURNING id`,
	}
}

// parking reports whether sh parks streams: any shard of a ParkStream
// projection, a rebuild's shadow shard included. The shadow's parks are
// recorded under its instance (RebuildInstance), so no live pass or retry
// takes them for the live model's; the switch hands those still open to
// the live shards (rebuild_park.go), and a shadow that parks a stream its
// new version still fails on reaches its switch all the same.
func (sh *shard) parking() bool {
	return sh.proj.cfg.ErrorMode == ParkStream
}

// streamKey is a stream as the park tables key it.
type streamKey struct{ tenant, typ, id string }

func keyOf(ev projector.Event) streamKey {
	return streamKey{ev.Stream.Tenant, ev.Stream.Type, ev.Stream.ID}
}

// parkHeld holds back, in tx, the events of streams sh has parked: they go
// to their parks, behind the events parked before them, and are not
// applied. It returns the events to apply (events itself when none is held;
// never a slice sharing events' array otherwise, which a shared read may
// hand to other shards) and how many it held.
func (d *Dispatcher) parkHeld(ctx context.Context, tx pgx.Tx, sh *shard, events []projector.Event) ([]projector.Event, int, error) {
	if len(events) == 0 {
		return events, 0, nil
	}
	seen := make(map[streamKey]bool, len(events))
	var tenants, types, ids []string
	for _, ev := range events {
		k := keyOf(ev)
		if !seen[k] {
			seen[k] = true
			tenants, types, ids = append(tenants, k.tenant), append(types, k.typ), append(ids, k.id)
		}
	}
	rows, err := tx.Query(ctx, d.park.held, sh.id.Consumer, sh.id.Instance, tenants, types, ids)
	if err != nil {
		return nil, 0, fmt.Errorf("read parked streams: %w", err)
	}
	parks := map[streamKey]int64{}
	var id int64
	var k streamKey
	_, err = pgx.ForEachRow(rows, []any{&id, &k.tenant, &k.typ, &k.id}, func() error {
		parks[k] = id
		return nil
	})
	if err != nil {
		return nil, 0, fmt.Errorf("read parked streams: %w", err)
	}
	if len(parks) == 0 {
		return events, 0, nil
	}
	keep := make([]projector.Event, 0, len(events))
	var held []projector.Event
	for _, ev := range events {
		if parks[keyOf(ev)] != 0 {
			held = append(held, ev)
		} else {
			keep = append(keep, ev)
		}
	}
	if err := d.hold(ctx, tx, parks, held); err != nil {
		return nil, 0, err
	}
	return keep, len(held), nil
}

// hold adds events to the parks of their streams.
func (d *Dispatcher) hold(ctx context.Context, tx pgx.Tx, parks map[streamKey]int64, events []projector.Event) error {
	if len(events) == 0 {
		return nil
	}
	parkIDs, versions, eventIDs := make([]int64, len(events)), make([]int64, len(events)), make([][16]byte, len(events))
	for i, ev := range events {
		parkIDs[i], versions[i], eventIDs[i] = parks[keyOf(ev)], ev.Version, [16]byte(ev.ID)
	}
	if _, err := tx.Exec(ctx, d.park.hold, parkIDs, versions, eventIDs); err != nil {
		return fmt.Errorf("park events: %w", err)
	}
	return nil
}

// parkFailed parks the stream of failing, which failed attempts times
// (MaxAttempts), with its error, and holds back the events of that stream
// among rest (the events after failing in the batch). It returns the rest
// to apply and how many events it parked, failing included. tx must be
// unscoped. herr comes redacted (applyEvents replaces failing's personal
// values, errortext.go).
func (d *Dispatcher) parkFailed(ctx context.Context, tx pgx.Tx, sh *shard, failing projector.Event, herr error, attempts int,
	rest []projector.Event,
) ([]projector.Event, int, error) {
	var id int64
	if err := tx.QueryRow(ctx, d.park.park, sh.id.Consumer, sh.id.Instance, failing.Stream.Tenant, failing.Stream.Type,
		failing.Stream.ID, [16]byte(failing.ID), failing.Type, failing.Version, StoredError(herr), attempts).Scan(&id); err != nil {
		return nil, 0, fmt.Errorf("park stream %s: %w", failing.Stream, err)
	}
	key := keyOf(failing)
	held := []projector.Event{failing}
	keep := make([]projector.Event, 0, len(rest))
	for _, ev := range rest {
		if keyOf(ev) == key {
			held = append(held, ev)
		} else {
			keep = append(keep, ev)
		}
	}
	if err := d.hold(ctx, tx, map[streamKey]int64{key: id}, held); err != nil {
		return nil, 0, err
	}
	d.logger.WarnContext(ctx, "projection dispatcher: stream parked after MaxAttempts; its later events wait behind it, other streams go on",
		slog.String("consumer", sh.id.String()), slog.Int64("park_id", id), slog.String("stream", failing.Stream.String()),
		slog.String("event_id", failing.ID.String()), slog.String("type", failing.Type), slog.Int("attempts", attempts),
		slog.Any("error", herr))
	return keep, len(held), nil
}

// ParkFilter selects parks; zero fields do not filter.
type ParkFilter struct {
	Consumer string
	Instance string
	Tenant   string
	// Status is "parked", "resolved", "discarded", or "" for all.
	Status string
	// AfterID pages: only parks with a larger id.
	AfterID int64
	// Limit caps the rows returned; 0 means 100, at most 10,000.
	Limit int
}

// ParkRetryResult is what one retry of a park did.
type ParkRetryResult struct {
	ID int64 `json:"id"`
	// Resolved: the handlers applied the whole sequence, committed with the
	// park marked resolved; the stream is live again.
	Resolved bool `json:"resolved"`
	// Events is how many events the sequence held.
	Events int `json:"events"`
	// Error is the new error when the retry failed: nothing of it was
	// applied, and the park stays open with it and one more attempt.
	Error    string `json:"error,omitempty"`
	Attempts int    `json:"attempts"`
}

// RetryPark applies park id's whole sequence, in order, through p's current
// handlers, in one transaction that also marks the park resolved (by, who
// asked: an operator's name), so every parked event is applied exactly
// once; the stream is live again when it commits. It waits for the
// consumer shard's lock, which every pass holds: no pass runs meanwhile,
// and the first pass after it applies the stream's later events after the
// parked ones, never ahead of them. A retry that fails rolls the handlers'
// writes back and keeps the park open with the new error and one more
// attempt (a nil error with Resolved false); one aborted by a conflict is
// tried again, and one whose handler failed for a reason not about the
// events ([IsSystemic]) returns that failure, both as [RetryDeadLetter]
// says. A park that is not open is
// refused with [projector.ErrInvalidTransition], so of racing retries and
// discards exactly one wins; a park of a rebuild's shadow shard with
// [ErrParkNotLive] (the switch hands it over). The events are applied as
// live, not as replays, except those a model before had applied live: an
// in-place rebuild's replay held them before the event that parked the
// stream, or a blue/green switch marked them (applyParked). On a partition,
// a forget of a subject whose fields the handlers were given, committed
// while the retry ran, makes it apply the events again as they read now
// (applyGuarded). logger receives handler panics; nil means
// slog.Default().
func RetryPark(ctx context.Context, store *postgres.Store, p *Async, id int64, by string, logger *slog.Logger) (ParkRetryResult, error) {
	var res ParkRetryResult
	err := retryConflicts(ctx, fmt.Sprintf("retry park %d", id), func() error {
		var err error
		res, _, err = retryPark(ctx, store, p, id, by, logger, false)
		return err
	})
	return res, err
}

// applyParked applies park pk's sequence events through p's handlers in
// tx, as [applyLive]. The events a model applied live before are given to
// the handlers as replays, so an Emit does not append what it appended
// when it first handled them: those before the one that parked the stream
// (held only by an in-place rebuild's replay, over cleared tables) and
// those up to the park's live mark (a blue/green switch handed the park
// over from its shadow, whose new version failed on events the model
// before had applied live). The rest were never handled live and are live.
func applyParked(ctx context.Context, tx pgx.Tx, store *postgres.Store, p *Async, id ShardID, pk Park, events []projector.Event,
	logger *slog.Logger,
) (herr, err error) {
	replayed := 0
	for pk.Kind == ParkKindStream && replayed < len(events) &&
		(events[replayed].Version < pk.Version || events[replayed].Version <= pk.LiveThrough) {
		replayed++
	}
	if replayed > 0 {
		if herr, err = applyLive(withReplay(ctx, &replayState{}), tx, store, p, id, events[:replayed], logger); herr != nil || err != nil {
			return herr, err
		}
	}
	if replayed == len(events) {
		return nil, nil
	}
	return applyLive(ctx, tx, store, p, id, events[replayed:], logger)
}

// ValidateOperator checks who acts on a park, as its record keeps it:
// not empty, at most [projector.MaxNameLength] bytes, text PostgreSQL can
// hold, printable (it is shown on operators' terminals and pages). Errors
// match [projector.ErrInvalidTransition].
func ValidateOperator(by string) error { return validBy(by) }

func validBy(by string) error {
	if by == "" {
		return fmt.Errorf("%w: say who is acting on the park", projector.ErrInvalidTransition)
	}
	if len(by) > projector.MaxNameLength {
		return fmt.Errorf("%w: who %s: longer than %d bytes", projector.ErrInvalidTransition, projector.Printable(by), projector.MaxNameLength)
	}
	if err := projector.ValidText(by); err != nil {
		return fmt.Errorf("%w: who %s %w", projector.ErrInvalidTransition, projector.Printable(by), err)
	}
	// It is shown on operators' terminals and pages: printable only.
	if strings.IndexFunc(by, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return fmt.Errorf("%w: who %s: not printable", projector.ErrInvalidTransition, projector.Printable(by))
	}
	return nil
}

// retryPark is [RetryPark]; requested makes it a dispatcher's carrying out
// of a retry request, which does nothing (errNoRequest) if the request is
// gone under the lock.
func retryPark(ctx context.Context, store *postgres.Store, p *Async, id int64, by string, logger *slog.Logger, requested bool) (ParkRetryResult, bool, error) {
	res := ParkRetryResult{ID: id}
	if err := p.Validate(store.Registry()); err != nil {
		return res, false, err
	}
	if err := validBy(by); err != nil {
		return res, false, err
	}
	if logger == nil {
		logger = slog.Default()
	}
	pk, err := getPark(ctx, store.Pool(), store, id, false)
	if err != nil {
		return res, false, fmt.Errorf("retry: %w", err)
	}
	if pk.Consumer != p.name {
		return res, false, fmt.Errorf("retry park %d: it belongs to consumer %s, not %s: %w", id,
			projector.Printable(pk.Consumer), projector.Printable(p.name), projector.ErrInvalidTransition)
	}
	if pk.Instance == RebuildInstance {
		return res, false, shadowParkErr(pk)
	}
	pt, et := store.Table("projector_parks"), store.Table("projector_parked_events")
	err = pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		shardID := ShardID{Consumer: pk.Consumer, Instance: pk.Instance}
		pk, err := lockForRetry(ctx, tx, store, p, shardID, requested, retryCheck[Park]{
			what: fmt.Sprintf("park %d", id),
			read: func() (Park, error) { return getPark(ctx, tx, store, id, true) },
			open: func(pk Park) (string, bool, bool) {
				return pk.Status, pk.Status == ParkOpen, pk.RetryRequestedAt != nil
			},
			instance: func(pk Park) string { return pk.Instance },
		})
		if err != nil {
			return err
		}
		// All or nothing: applyLive keeps the events before a failing one,
		// which must not commit without the rest; and on a partition, a
		// forget of a subject they opened is guarded against (forgetguard.go).
		events, herr, err := applyGuarded(ctx, tx, store, retryGuardsForgets(store, p, shardID), fmt.Sprintf("park %d", id),
			func() ([]projector.Event, error) { return parkedEvents(ctx, tx, store, pk, false) },
			func(events []projector.Event) (error, error) {
				return applyParked(context.WithValue(ctx, retryingKey{}, pk), tx, store, p, shardID, pk, events, logger)
			})
		if err != nil {
			return err
		}
		if herr != nil { // (a retry that succeeded collects nothing)
			herr = RedactError(herr, OpenedEvents(store.Registry(), events...)...)
		}
		if err := retryNotAboutEvent(fmt.Sprintf("park %d", id), herr, requested); err != nil {
			return err
		}
		res.Events, res.Attempts = len(events), pk.Attempts+1
		if herr == nil {
			res.Resolved = true
			if _, err := tx.Exec(ctx, `DELETE FROM `+et+` WHERE park_id = $1`, id); err != nil {
				return fmt.Errorf("retry park %d: %w", id, err)
			}
			_, err = tx.Exec(ctx, `UPDATE `+pt+` SET status = 'resolved', resolved_at = now(), resolved_by = $2, events = $3,
				last_retried_at = now(), attempts = attempts + 1, retry_requested_at = NULL WHERE id = $1`, id, by, len(events))
		} else {
			res.Error = StoredError(herr)
			_, err = tx.Exec(ctx, `UPDATE `+pt+` SET error = $2, last_retried_at = now(), attempts = attempts + 1,
				retry_requested_at = NULL WHERE id = $1`, id, "retry: "+StoredError(herr))
		}
		if err != nil {
			return fmt.Errorf("retry park %d: record the outcome: %w", id, err)
		}
		return nil
	})
	// The shard's lock is free again: a pass that found it taken looks now.
	_ = WakeShards(ctx, store, ShardID{Consumer: pk.Consumer, Instance: pk.Instance})
	if errors.Is(err, errNoRequest) {
		return ParkRetryResult{ID: id}, false, nil
	}
	if err != nil {
		return ParkRetryResult{ID: id}, false, err
	}
	logger.InfoContext(ctx, "projection: park retried", slog.Int64("id", id), slog.String("consumer", pk.Consumer),
		slog.String("parked", pk.What()), slog.Int("events", res.Events), slog.Bool("resolved", res.Resolved),
		slog.String("error", res.Error))
	return res, true, nil
}

// DiscardPark gives up on park id: its sequence is dropped (the events stay
// in the log; the consumer never applies them) and the park is marked
// discarded with who (by), when and how many events, kept for the record.
// The stream (a saga instance: the instance, active again) is live again
// from its next event. It takes the consumer
// shard's lock, so no pass adds to the sequence meanwhile; a park that is
// not open is refused with [projector.ErrInvalidTransition], so of racing
// retries and discards exactly one wins; a retry only requested (not yet
// carried out by a dispatcher) is cancelled. It returns the park as
// discarded, its RetryRequestedAt (which a closed park does not keep) the
// time of the request it cancelled, nil when none was pending.
func DiscardPark(ctx context.Context, store *postgres.Store, id int64, by string) (Park, error) {
	if err := validBy(by); err != nil {
		return Park{}, err
	}
	pk, err := getPark(ctx, store.Pool(), store, id, false)
	if err != nil {
		return Park{}, fmt.Errorf("discard: %w", err)
	}
	var cancelled *time.Time
	err = pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		locked := pk.Instance
		if err := LockShard(ctx, tx, store, ShardID{Consumer: pk.Consumer, Instance: locked}); err != nil {
			return err
		}
		if pk, err = getPark(ctx, tx, store, id, true); err != nil {
			return fmt.Errorf("discard: %w", err)
		}
		if pk.Instance != locked {
			// A rebuild's switch (or a split) moved it to another shard
			// meanwhile, whose passes this lock does not hold off.
			return fmt.Errorf("discard park %d: it moved from shard %s to %s meanwhile; try again: %w", id,
				projector.Printable(locked), projector.Printable(pk.Instance), projector.ErrInvalidTransition)
		}
		if pk.Status != ParkOpen {
			return fmt.Errorf("discard park %d: it is %s already: %w", id, pk.Status, projector.ErrInvalidTransition)
		}
		cancelled = pk.RetryRequestedAt
		if _, err := tx.Exec(ctx, `DELETE FROM `+store.Table("projector_parked_events")+` WHERE park_id = $1`, id); err != nil {
			return fmt.Errorf("discard park %d: %w", id, err)
		}
		if err := reactivateInstance(ctx, tx, store, pk); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE `+store.Table("projector_parks")+` SET status = 'discarded', resolved_at = now(),
				resolved_by = $2, events = $3, retry_requested_at = NULL WHERE id = $1`, id, by, pk.Events); err != nil {
			return fmt.Errorf("discard park %d: %w", id, err)
		}
		return nil
	})
	_ = WakeShards(ctx, store, ShardID{Consumer: pk.Consumer, Instance: pk.Instance}) // its lock is free again
	if err != nil {
		return Park{}, err
	}
	if pk, err = getPark(ctx, store.Pool(), store, id, false); err != nil {
		return Park{}, err
	}
	pk.RetryRequestedAt = cancelled
	return pk, nil
}

// RequestParkRetry records a retry request on an open park, for a
// dispatcher that has the consumer's projection to carry out with by as
// who retried it; it wakes the dispatchers' retry loops, which otherwise
// look only every Recheck. A park that is not open is
// refused with [projector.ErrInvalidTransition], one of a rebuild's shadow
// shard with [ErrParkNotLive].
func RequestParkRetry(ctx context.Context, store *postgres.Store, id int64, by string) error {
	if err := validBy(by); err != nil {
		return err
	}
	var consumer string
	err := store.Pool().QueryRow(ctx, `UPDATE `+store.Table("projector_parks")+` SET retry_requested_at = now(), resolved_by = $2
		WHERE id = $1 AND status = 'parked' AND instance_id <> '`+RebuildInstance+`' RETURNING consumer`, id, by).Scan(&consumer)
	if err == nil {
		_ = wakeRetries(ctx, store, consumer)
		return nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("request retry of park %d: %w", id, err)
	}
	pk, err := getPark(ctx, store.Pool(), store, id, false)
	if err != nil {
		return fmt.Errorf("retry: %w", err)
	}
	if pk.Status == ParkOpen && pk.Instance == RebuildInstance {
		return shadowParkErr(pk)
	}
	return fmt.Errorf("retry park %d: it is %s already: %w", id, pk.Status, projector.ErrInvalidTransition)
}

// parkRetryRequests carries out the retry requests of open parks of
// byName's projections on instances (see retryLoop), each as [RetryPark]
// on behalf of whoever asked.
func (d *Dispatcher) parkRetryRequests(ctx context.Context, byName map[string]*Async, names, instances []string) {
	type req struct {
		id       int64
		name, by string
	}
	rows, err := d.store.Pool().Query(ctx, `SELECT id, consumer, coalesce(resolved_by, '') FROM `+d.store.Table("projector_parks")+`
		WHERE retry_requested_at IS NOT NULL AND status = 'parked' AND consumer = ANY($1)
		  AND (instance_id = ANY($2) OR instance_id LIKE '`+PartitionPrefix+`%') ORDER BY id LIMIT 100`,
		names, instances)
	var reqs []req
	if err == nil {
		reqs, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (req, error) {
			var r req
			return r, row.Scan(&r.id, &r.name, &r.by)
		})
	}
	if err != nil && ctx.Err() == nil {
		d.logger.WarnContext(ctx, "projection dispatcher: looking for park retry requests failed", slog.Any("error", err))
	}
	for _, r := range reqs {
		_, _, err := retryPark(ctx, d.store, byName[r.name], r.id, cmp.Or(r.by, "dispatcher "+d.instance), d.logger, true)
		if errors.Is(err, ErrWrongVersion) {
			continue // a rolling deploy's other binary: leave it to one of the live version
		}
		if err != nil && ctx.Err() == nil && retryLater(err) {
			d.logger.WarnContext(ctx, "projection dispatcher: a park retry request failed; trying again at the next look",
				slog.Int64("id", r.id), slog.Any("error", err))
			continue
		}
		if err != nil && ctx.Err() == nil {
			// Clear the request, so one that cannot be carried out is not
			// tried on every poll; the error is kept on the park.
			_, _ = d.store.Pool().Exec(context.WithoutCancel(ctx), `UPDATE `+d.store.Table("projector_parks")+`
				SET retry_requested_at = NULL, error = $2 WHERE id = $1 AND status = 'parked'`, r.id, "retry request: "+StoredError(err))
			d.logger.WarnContext(ctx, "projection dispatcher: a park retry request failed", slog.Int64("id", r.id), slog.Any("error", err))
		}
	}
}

// refreshParks publishes each consumer's open parks and the age of its
// oldest, 0 included for every consumer this dispatcher runs (so an alert
// on > 0 has a series from the start), along the open parks' index. A
// rebuild's shadow parks are not counted: they hold nothing back of the
// live model until its switch hands them over.
func (d *Dispatcher) refreshParks(ctx context.Context) {
	type gauge struct{ n, age float64 }
	by := map[string]gauge{}
	names := []string{}
	for _, sh := range d.allShards() {
		if _, ok := by[sh.id.Consumer]; !ok {
			by[sh.id.Consumer] = gauge{}
			names = append(names, sh.id.Consumer)
		}
	}
	var name string
	var g gauge
	rows, err := d.store.Pool().Query(ctx, `SELECT consumer, count(*), extract(epoch FROM now() - min(parked_at))::float8
		FROM `+d.store.Table("projector_parks")+` WHERE status = 'parked' AND consumer = ANY($1) AND instance_id <> '`+RebuildInstance+`'
		GROUP BY consumer`, names)
	if err == nil {
		_, err = pgx.ForEachRow(rows, []any{&name, &g.n, &g.age}, func() error {
			by[name] = g
			return nil
		})
	}
	if err != nil {
		if ctx.Err() == nil {
			d.logger.DebugContext(ctx, "projection dispatcher: refresh parks", slog.Any("error", err))
		}
		return
	}
	for name, g := range by {
		d.metrics.parkedStreams.With(prometheus.Labels{"consumer": name}).Set(g.n)
		d.metrics.parkedAge.With(prometheus.Labels{"consumer": name}).Set(max(g.age, 0))
	}
}

// withoutParked returns events without those an open park of consumer's
// live model holds (a rebuild's shadow parks hold events for a model not
// yet live), and how many it left out.
func withoutParked(ctx context.Context, tx pgx.Tx, store *postgres.Store, consumer string, events []projector.Event) ([]projector.Event, int, error) {
	if len(events) == 0 {
		return events, 0, nil
	}
	ids := make([][16]byte, len(events))
	for i, ev := range events {
		ids[i] = [16]byte(ev.ID)
	}
	rows, err := tx.Query(ctx, `SELECT e.event_id FROM `+store.Table("projector_parked_events")+` e
		JOIN `+store.Table("projector_parks")+` p ON p.id = e.park_id
		WHERE p.consumer = $1 AND p.instance_id <> '`+RebuildInstance+`' AND p.status = 'parked' AND e.event_id = ANY($2)`, consumer, ids)
	if err != nil {
		return nil, 0, fmt.Errorf("replay: read parked events: %w", err)
	}
	held, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, 0, fmt.Errorf("replay: read parked events: %w", err)
	}
	if len(held) == 0 {
		return events, 0, nil
	}
	skip := make(map[uuid.UUID]bool, len(held))
	for _, id := range held {
		skip[id] = true
	}
	out := make([]projector.Event, 0, len(events)-len(held))
	for _, ev := range events {
		if !skip[ev.ID] {
			out = append(out, ev)
		}
	}
	return out, len(held), nil
}
