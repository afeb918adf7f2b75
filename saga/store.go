package saga

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/clientcheck"
	"github.com/projectorhq/projector/internal/pgretry"
	"github.com/projectorhq/projector/internal/tracing"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// queries are the saga's fixed SQL for one store's schema.
type queries struct {
	lock, lockMany, insert, save, step, schedule, cancel, cancelAll, claim, fired, failTimeout, failInstance, nextDue, deadLetter string
}

func newQueries(store *postgres.Store) queries {
	i, st, t := store.Table("projector_saga_instances"), store.Table("projector_saga_steps"), store.Table("projector_saga_timeouts")
	return queries{
		// The instance's row lock is what serialises its steps: an event's
		// step (in the dispatcher's pass) and a timeout's (in a runner) both
		// take it before they read the state, so they run one after the
		// other and each sees the other's committed result.
		lock: `SELECT id, correlation_id, status, version, state FROM ` + i + `
			WHERE saga = $1 AND tenant_id = $2 AND key = $3 FOR UPDATE`,
		// Joined with the keys rather than key = ANY($3): the array form
		// is a linear search per row, and on statistics taken while the
		// table was small the planner scans the saga's every instance with
		// it. The join probes the unique index once per key.
		lockMany: `SELECT i.id, i.key, i.correlation_id, i.status, i.version, i.state
			FROM unnest($3::text[]) AS k(key) JOIN ` + i + ` i ON i.saga = $1 AND i.tenant_id = $2 AND i.key = k.key
			ORDER BY i.id FOR UPDATE OF i`,
		// ON CONFLICT: a second start event for the key finds the first
		// instance instead of making another.
		insert: `INSERT INTO ` + i + ` (id, saga, tenant_id, key, correlation_id, state)
			VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (saga, tenant_id, key) DO NOTHING`,
		// One statement writes a touched instance's steps' outcome: the
		// state and version after the batch's last step, the status, and
		// the events that arrived after completion.
		save: `UPDATE ` + i + ` SET state = $2, version = $3, status = $4, late_events = late_events + $5, updated_at = now(),
				completed_at = CASE WHEN $4 = 'completed' AND completed_at IS NULL THEN now() ELSE completed_at END
			WHERE id = $1 AND version = $6`,
		// The cause is unique per instance: a step applied twice would fail
		// here rather than happen twice.
		step: `INSERT INTO ` + st + ` (instance_id, step, cause_id, cause, type, appended) VALUES ($1, $2, $3, $4, $5, $6)`,
		// The trace columns keep the scheduling step's span context for the
		// timeout's span to link to.
		schedule: `INSERT INTO ` + t + ` (id, instance_id, saga, name, due_at, scheduled_by, trace_parent, trace_state)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
			ON CONFLICT (instance_id, name) DO UPDATE SET id = EXCLUDED.id, due_at = EXCLUDED.due_at,
				scheduled_by = EXCLUDED.scheduled_by, trace_parent = EXCLUDED.trace_parent, trace_state = EXCLUDED.trace_state,
				retry_at = NULL, attempts = 0, last_error = NULL, created_at = now()`,
		cancel:    `DELETE FROM ` + t + ` WHERE instance_id = $1 AND name = $2`,
		cancelAll: `DELETE FROM ` + t + ` WHERE instance_id = $1`,
		// The earliest due timeouts of a saga (the due index, no scan), with
		// their instances, all locked. SKIP LOCKED: a timeout whose instance
		// an event's step holds is left for the next round instead of
		// waiting, and runners in several processes share the work. A row
		// changed by a step that committed meanwhile is re-checked against
		// the WHERE clause, so a cancelled or moved timeout is not claimed,
		// nor one of an instance parked meanwhile: a parked instance's
		// timeouts wait, due or not, until a retry makes it active.
		claim: `SELECT t.id, t.name, t.due_at, t.attempts, coalesce(t.trace_parent, ''), coalesce(t.trace_state, ''), i.id, i.tenant_id, i.key, i.correlation_id, i.status, i.version, i.state
			FROM ` + t + ` t JOIN ` + i + ` i ON i.id = t.instance_id
			WHERE t.saga = $1 AND t.due_at <= $2 AND (t.retry_at IS NULL OR t.retry_at <= $2) AND i.status <> 'parked'
			ORDER BY t.due_at LIMIT $3 FOR UPDATE OF t, i SKIP LOCKED`,
		fired: `DELETE FROM ` + t + ` WHERE id = $1`,
		failTimeout: `UPDATE ` + t + ` SET attempts = attempts + 1, last_error = $2, retry_at = $3
			WHERE id = $1 RETURNING attempts`,
		failInstance: `UPDATE ` + i + ` SET status = 'failed', last_error = $2, updated_at = now() WHERE id = $1`,
		nextDue:      `SELECT min(coalesce(retry_at, due_at)) FROM ` + t + ` WHERE saga = $1`,
		// Continuous mode's dead letter of a failing step's event, under the
		// saga's consumer, as the dispatcher writes its own.
		deadLetter: `INSERT INTO ` + store.Table("projector_dead_letters") + `
			(consumer, instance_id, event_id, event_tx_id, event_seq, event_type, tenant_id, stream_type, stream_id, version, error, attempts, reason)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, 1, 'apply-error')`,
	}
}

// Projection returns the async projection that runs the saga on a
// dispatcher bound to store: hand it to projection.New with the others.
// Each event's step (the instance's state, the events it appends, its
// timeouts) commits in the dispatcher's transaction together with the
// consumer's cursor, so a crash anywhere neither loses nor repeats a step.
func (s *Saga[S]) Projection(store *postgres.Store) (*projection.Async, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: saga %q: nil store", ErrInvalidDefinition, s.name)
	}
	if err := s.Validate(store.Registry()); err != nil {
		return nil, err
	}
	if err := s.checkMasterKey(store); err != nil {
		return nil, err
	}
	cfg := s.cfg.Async
	// Partitioned, a saga is partitioned by its correlation key, not by
	// stream: an instance hears from many streams, and all of its events
	// must reach the one partition that takes its steps in order.
	cfg.PartitionKey = func(ev projector.Event) (string, error) {
		key, _, handled, err := s.Route(ev)
		if err == nil && !handled {
			err = fmt.Errorf("%w: saga %q does not handle %q", ErrInvalidStep, s.name, ev.Type)
		}
		return key, err
	}
	p := projection.NewAsync(s.name, cfg)
	q := newQueries(store)
	types := make([]projection.TypeName, len(s.types))
	for i, typ := range s.types {
		types[i] = s.routes[typ].et
	}
	// A batch handler: the instances a batch touches are locked and read in
	// one statement and their new states written in one round trip, rather
	// than two round trips per event. A failing event is still isolated:
	// the dispatcher bisects a failing batch down to it.
	err := projection.OnBatch(p, func(ctx context.Context, tx pgx.Tx, b projection.Batch) error {
		return s.handleBatch(ctx, store, q, tx, b)
	}, types...)
	if err != nil {
		return nil, fmt.Errorf("saga %q: %w", s.name, err)
	}
	if err := p.Validate(store.Registry()); err != nil {
		return nil, fmt.Errorf("saga %q: %w", s.name, err)
	}
	return p, nil
}

// live is an instance as a batch's steps change it.
type live[S any] struct {
	snap    Snapshot[S]
	version int64 // as stored, for the update's check
	late    int
	touched bool
	// failure is the error of the step that failed the instance in
	// continuous mode, "" while it has not.
	failure string
}

// handleBatch takes the steps of a batch's events, in log order (a saga's
// instance hears from several streams, and the batch groups by stream): it
// locks the instances the batch names in one statement, starts the missing
// ones a start event names, decides each event's step on the state the
// previous one left, and writes the steps, timeouts and final states in one
// round trip. It runs in the dispatcher's transaction, scoped to the
// batch's tenant.
func (s *Saga[S]) handleBatch(ctx context.Context, store *postgres.Store, q queries, tx pgx.Tx, b projection.Batch) error {
	var events []projector.Event
	for _, st := range b.Streams {
		events = append(events, st.Events...)
	}
	slices.SortFunc(events, func(x, y projector.Event) int {
		switch {
		case x.Position.Less(y.Position):
			return -1
		case y.Position.Less(x.Position):
			return 1
		}
		return 0
	})
	keys := make([]string, len(events))
	keyErrs := make([]error, len(events)) // continuous mode: events to dead-letter
	var distinct []string
	seen := map[string]bool{}
	for i, ev := range events {
		key, _, _, err := s.Route(ev)
		if err != nil && s.continuous && stepFault(err) {
			keyErrs[i] = err
			continue
		}
		if err != nil {
			return fmt.Errorf("%s v%d of %s: %w", ev.Type, ev.Version, ev.Stream, err)
		}
		keys[i] = key
		if !seen[key] {
			seen[key] = true
			distinct = append(distinct, key)
		}
	}
	instances, err := s.lockInstances(ctx, store, q, tx, b.Tenant, distinct)
	if err != nil {
		return err
	}
	parks, err := s.parksOf(ctx, store, tx, b.Tenant, instances)
	if err != nil {
		return err
	}
	wb := &pgx.Batch{}
	now := s.cfg.Now()
	var order []*live[S] // touched instances, in first-touch order
	for i, ev := range events {
		if keyErrs[i] != nil {
			if err := s.deadLetter(ctx, store, q, tx, b.Tenant, ev, keyErrs[i]); err != nil {
				return err
			}
			continue
		}
		_, starts, _, _ := s.Route(ev)
		in := instances[keys[i]]
		isNew := false
		if in == nil {
			if !starts {
				s.ignored.Add(1)
				continue
			}
			if in, isNew, err = s.start(ctx, store, q, tx, b.Tenant, keys[i], ev); err != nil {
				return err
			}
			instances[keys[i]] = in
		}
		if in.snap.Status == Parked && parks.hold(s.name, b.Tenant, in, ev) {
			continue
		}
		if !in.touched {
			in.touched = true
			order = append(order, in)
		}
		if in.snap.Status != Active {
			s.late.Add(1)
			in.late++
			continue
		}
		sctx, span := startStep(ctx, s, in, ev)
		err := s.step(sctx, store, q, tx, wb, b.Tenant, parks, in, isNew, ev, now)
		endSpan(span, err)
		if err != nil {
			return err
		}
	}
	if err := parks.write(ctx, s, store, tx, b.Tenant); err != nil {
		return err
	}
	for _, in := range order {
		if err := s.queueSave(ctx, store, q, tx, wb, in); err != nil {
			return err
		}
		if in.failure != "" {
			wb.Queue(q.failInstance, in.snap.ID, in.failure)
			wb.Queue(q.cancelAll, in.snap.ID)
		}
	}
	if err := tx.SendBatch(ctx, wb).Close(); err != nil {
		return fmt.Errorf("saga %q: save steps: %w", s.name, err)
	}
	return nil
}

// step decides and applies the step of event ev on instance in, queuing its
// writes on wb; in continuous mode a step's own failure dead-letters ev and
// fails the instance instead of failing the batch, and under ParkStream its
// last allowed failure parks the instance (parks). ctx carries the step's
// span, under which its appends run.
func (s *Saga[S]) step(ctx context.Context, store *postgres.Store, q queries, tx pgx.Tx, wb *pgx.Batch, tenant string, parks *batchParks[S],
	in *live[S], isNew bool, ev projector.Event, now time.Time,
) error {
	// Instead of failing the batch: continuous mode dead-letters, parking
	// mode parks (or fails the batch, to be retried, before MaxAttempts).
	// A retry of the instance's park fails as a whole instead.
	handled := (s.continuous || s.parking) && !parks.retrying(s.name, tenant, in)
	fault := func(err error) error {
		if s.continuous {
			return s.failStep(ctx, store, q, tx, tenant, in, ev, err)
		}
		return s.parkStep(ctx, store, tx, tenant, parks, in, ev, err)
	}
	d, err := s.Decide(ctx, store.Registry(), in.snap, isNew, ev, now)
	if err != nil {
		err = s.redacted(store, err, in.snap.State, ev)
	}
	if err != nil && handled && ctx.Err() == nil && stepFault(err) {
		// Nothing of the step was written: the handler only decides.
		return fault(err)
	}
	if err != nil {
		return fmt.Errorf("%s v%d of %s: %w", ev.Type, ev.Version, ev.Stream, err)
	}
	mctx := projector.WithMetadata(ctx, ev.Metadata)
	// In continuous mode a step that writes at once (appends, commands)
	// does so under a savepoint, so a failure takes back its writes
	// alone; its queued writes are taken off the batch.
	guarded, queued := handled && (len(d.Appends) > 0 || len(d.Commands) > 0), len(wb.QueuedQueries)
	if guarded {
		if _, err := tx.Exec(ctx, "SAVEPOINT projector_saga_step"); err != nil {
			return fmt.Errorf("saga %q: savepoint: %w", s.name, err)
		}
	}
	if err := s.applyStep(mctx, store, q, tx, wb, &in.snap, d, ev.ID, "event", ev.Type); err != nil {
		// A command or append that fails may quote the decided state.
		err = s.redacted(store, err, d.State, ev)
		if !guarded || ctx.Err() != nil || !stepFault(err) {
			return fmt.Errorf("%s v%d of %s: %w", ev.Type, ev.Version, ev.Stream, err)
		}
		if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT projector_saga_step"); rerr != nil {
			// The transaction itself is gone: retry the batch.
			return fmt.Errorf("%s v%d of %s: %w (and the step could not be rolled back: %v)", ev.Type, ev.Version, ev.Stream, err, rerr)
		}
		wb.QueuedQueries = wb.QueuedQueries[:queued]
		return fault(err)
	}
	if guarded {
		if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT projector_saga_step"); err != nil {
			return fmt.Errorf("saga %q: release savepoint: %w", s.name, err)
		}
	}
	return nil
}

// lockInstances reads and row-locks the instances of keys, in id order so
// two transactions locking overlapping sets cannot deadlock on them.
func (s *Saga[S]) lockInstances(ctx context.Context, store *postgres.Store, q queries, tx pgx.Tx, tenant string, keys []string) (map[string]*live[S], error) {
	out := make(map[string]*live[S], len(keys))
	rows, err := tx.Query(ctx, q.lockMany, s.name, tenant, keys)
	if err != nil {
		return nil, fmt.Errorf("saga %q: lock instances: %w", s.name, err)
	}
	var state []byte
	in := &live[S]{}
	// Sealed states are opened once the rows are read: opening reads keys.
	var sealed map[*live[S]][]byte
	_, err = pgx.ForEachRow(rows, []any{&in.snap.ID, &in.snap.Key, &in.snap.CorrelationID, &in.snap.Status, &in.snap.Version, &state}, func() error {
		l := &live[S]{snap: in.snap, version: in.snap.Version}
		l.snap.Tenant = tenant
		out[l.snap.Key] = l
		if s.sealed() && projector.IsSealed(state) {
			if sealed == nil {
				sealed = map[*live[S]][]byte{}
			}
			sealed[l] = bytes.Clone(state)
			return nil
		}
		if err := json.Unmarshal(state, &l.snap.State); err != nil {
			return fmt.Errorf("decode state of %q: %w", l.snap.Key, err)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("saga %q: lock instances: %w", s.name, err)
	}
	for l, data := range sealed {
		if l.snap.State, err = s.decodeState(ctx, store, tx, tenant, data); err != nil {
			return nil, fmt.Errorf("saga %q: lock instances: decode state of %q: %w", s.name, l.snap.Key, err)
		}
	}
	return out, nil
}

// start inserts the instance of key for start event ev. When another
// transaction inserted it first, the unique constraint makes the insert do
// nothing, and that instance is locked and returned instead (isNew false).
func (s *Saga[S]) start(ctx context.Context, store *postgres.Store, q queries, tx pgx.Tx, tenant, key string, ev projector.Event) (*live[S], bool, error) {
	var zero S
	state, err := json.Marshal(zero)
	if err != nil {
		return nil, false, fmt.Errorf("saga %q: encode zero state: %w", s.name, err)
	}
	snap := Snapshot[S]{ID: uuid.New(), Key: key, Tenant: tenant, CorrelationID: ev.Metadata.CorrelationID, Status: Active}
	if snap.CorrelationID == uuid.Nil {
		snap.CorrelationID = uuid.New()
	}
	tag, err := tx.Exec(ctx, q.insert, snap.ID, s.name, tenant, key, snap.CorrelationID, state)
	if err != nil {
		return nil, false, fmt.Errorf("saga %q: start instance %q: %w", s.name, key, err)
	}
	if tag.RowsAffected() == 1 {
		return &live[S]{snap: snap}, true, nil
	}
	snap, found, err := s.lockInstance(ctx, store, q, tx, tenant, key)
	if err != nil {
		return nil, false, err
	}
	if !found {
		return nil, false, fmt.Errorf("saga %q: instance %q vanished while starting", s.name, key)
	}
	return &live[S]{snap: snap, version: snap.Version}, false, nil
}

// queueSave queues the write of a touched instance's final state, version,
// status and late-event count, checked against the version it was read at;
// sealing the state's personal fields reads (or creates) the subject's key
// in tx.
func (s *Saga[S]) queueSave(ctx context.Context, store *postgres.Store, q queries, tx pgx.Tx, wb *pgx.Batch, in *live[S]) error {
	state, err := s.encodeState(ctx, store, tx, in.snap.Tenant, in.snap.State)
	if err != nil {
		return fmt.Errorf("saga %q, instance %q: encode state: %w", s.name, in.snap.Key, err)
	}
	wb.Queue(q.save, in.snap.ID, state, in.snap.Version, in.snap.Status, in.late, in.version).Exec(func(tag pgconn.CommandTag) error {
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("saga %q, instance %q: %w: version %d changed under the row lock", s.name, in.snap.Key, projector.ErrConcurrency, in.version)
		}
		return nil
	})
	return nil
}

// lockInstance reads and row-locks the instance of key.
func (s *Saga[S]) lockInstance(ctx context.Context, store *postgres.Store, q queries, tx pgx.Tx, tenant, key string) (Snapshot[S], bool, error) {
	snap := Snapshot[S]{Key: key, Tenant: tenant}
	var state []byte
	err := tx.QueryRow(ctx, q.lock, s.name, tenant, key).Scan(&snap.ID, &snap.CorrelationID, &snap.Status, &snap.Version, &state)
	if errors.Is(err, pgx.ErrNoRows) {
		return snap, false, nil
	}
	if err != nil {
		return snap, false, fmt.Errorf("saga %q: lock instance %q: %w", s.name, key, err)
	}
	if snap.State, err = s.decodeState(ctx, store, tx, tenant, state); err != nil {
		return snap, false, fmt.Errorf("saga %q: decode state of %q: %w", s.name, key, err)
	}
	return snap, true, nil
}

// applyStep carries out a step's decisions in tx: the appends and
// aggregate commands (with the instance's correlation id and cause as
// causation) at once, in the order they were decided; the timeouts, in
// order, and the step's row queued on wb, to go in one round trip. snap
// takes the step's state, version and status.
func (s *Saga[S]) applyStep(ctx context.Context, store *postgres.Store, q queries, tx pgx.Tx, wb *pgx.Batch, snap *Snapshot[S], d Decision[S],
	cause uuid.UUID, kind, typ string,
) error {
	ctx = projector.WithCausationID(projector.WithCorrelationID(ctx, snap.CorrelationID), cause)
	appended := 0
	// The scheduling step's trace context, taken at its first schedule.
	var traceParent, traceState any
	traced := false
	for _, o := range d.ops {
		var err error
		switch o.kind {
		case opAppend:
			if _, err = store.Append(ctx, tx, o.stream, o.expected, o.payloads...); err == nil {
				appended += len(o.payloads)
			}
		case opCommand:
			var n int
			n, err = o.command(ctx, tx)
			appended += n
		case opSchedule:
			if !traced {
				traceParent, traceState = schedulingTrace(ctx)
				traced = true
			}
			wb.Queue(q.schedule, uuid.New(), snap.ID, s.name, o.name, o.at, cause, traceParent, traceState)
		case opCancel:
			wb.Queue(q.cancel, snap.ID, o.name)
		}
		if err != nil {
			return fmt.Errorf("saga %q, instance %q: %w", s.name, snap.Key, err)
		}
	}
	if d.Completed {
		snap.Status = Completed
		wb.Queue(q.cancelAll, snap.ID)
	}
	snap.State = d.State
	snap.Version++
	wb.Queue(q.step, snap.ID, snap.Version, cause, kind, typ, appended)
	return nil
}

// claimed is a due timeout claimed with its instance.
type claimed[S any] struct {
	t        Timeout
	attempts int
	// trace holds the scheduling step's traceparent and tracestate.
	traceCtx map[string]string
	snap     Snapshot[S]
	state    []byte
}

// fireDue fires up to limit due timeouts of the saga in one transaction,
// each step under a savepoint of its own, so a failing one is rolled back
// alone (and recorded) while the others commit. It returns how many steps it
// took, how many timeouts it claimed, and the first step failure.
//
// observe, when not nil, is called after the commit with the lateness of
// each fired timeout: from its due time to the saga clock's reading when the
// batch was claimed.
func (s *Saga[S]) fireDue(ctx context.Context, store *postgres.Store, q queries, tracer trace.Tracer, limit int, observe func(time.Duration)) (fired, claimedN int, stepErr error) {
	now := s.cfg.Now()
	tx, err := store.Pool().Begin(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("saga %q: begin: %w", s.name, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	// The claim goes with the client check (internal/clientcheck), in one
	// round trip: a runner killed while a step waits for a lock must not
	// keep its claimed timeouts, which other runners skip, until the wait
	// ends.
	b := &pgx.Batch{}
	if clientcheck.Supported(tx.Conn().PgConn()) {
		b.Queue(clientcheck.SQL)
	}
	var due []claimed[S]
	b.Queue(q.claim, s.name, now, limit).Query(func(rows pgx.Rows) error {
		var err error
		due, err = pgx.CollectRows(rows, s.scanClaimed)
		return err
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return 0, 0, fmt.Errorf("saga %q: claim due timeouts: %w", s.name, err)
	}
	if len(due) == 0 {
		return 0, 0, nil
	}
	scope := projector.SystemTenant
	var lateness []time.Duration
	for _, c := range due {
		savepoint, err := s.fireClaimed(ctx, store, q, tracer, tx, c, now, &scope)
		if err == nil {
			fired++
			if c.snap.Status == Active {
				lateness = append(lateness, now.Sub(c.t.Due))
			}
			continue
		}
		if ctx.Err() != nil {
			return 0, len(due), ctx.Err()
		}
		if savepoint {
			// The step's writes and its SET LOCAL scope go with the savepoint.
			if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT projector_saga_timeout"); rerr != nil {
				if pgretry.Conflict(err) {
					// The conflict struck before the savepoint was set (a
					// batch's statements are prepared first, taking the same
					// locks): the transaction is aborted, the round rolls
					// back whole with nothing recorded.
					return 0, len(due), fmt.Errorf("saga %q: timeout %q of %q lost a conflict, the round is rolled back with nothing recorded: %w", s.name, c.t.Name, c.snap.Key, err)
				}
				return 0, len(due), fmt.Errorf("saga %q: timeout %q of %q failed (%v) and could not be rolled back: %w", s.name, c.t.Name, c.snap.Key, err, rerr)
			}
			scope = ""
		}
		if errors.Is(err, projector.ErrConcurrency) {
			// Contention, not a failure: an event's step appended to the
			// same stream from a younger transaction (promise 4 refuses the
			// older writer). The timeout stays due for the next round.
			continue
		}
		if pgretry.Conflict(err) {
			// Lost a conflict with another transaction (a deadlock's
			// victim, a serialization failure): not the step's failure
			// either, and not an attempt. Rolled back to its savepoint, it
			// stays due for the next round; without one the transaction is
			// aborted, and the whole round is tried again.
			if savepoint {
				continue
			}
			return 0, len(due), fmt.Errorf("saga %q: timeout %q of %q lost a conflict, nothing recorded: %w", s.name, c.t.Name, c.snap.Key, err)
		}
		if projection.IsSystemic(err) {
			// Not the step's failure either (a missing table or grant, a
			// full disk: every step would fail alike), and not an attempt,
			// or an outage longer than the backoff would fail every
			// instance whose timeout came due in it. The timeout stays due
			// for the next look, and the round reports why.
			err = fmt.Errorf("saga %q: timeout %q of %q failed for a reason not about the step (nothing counted, still due): %w", s.name, c.t.Name, c.snap.Key, err)
			if !savepoint {
				return 0, len(due), err
			}
			if stepErr == nil {
				stepErr = err
			}
			continue
		}
		if err := s.timeoutFailed(ctx, store, q, tx, &scope, c, err); err != nil {
			return 0, len(due), err
		}
		if stepErr == nil {
			stepErr = fmt.Errorf("saga %q: timeout %q of %q failed (attempt %d): %w", s.name, c.t.Name, c.snap.Key, c.attempts+1, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, len(due), fmt.Errorf("saga %q: commit fired timeouts: %w", s.name, err)
	}
	if observe != nil {
		for _, l := range lateness {
			observe(l)
		}
	}
	return fired, len(due), stepErr
}

// scanClaimed reads a row of the claim (queries.claim).
func (s *Saga[S]) scanClaimed(r pgx.CollectableRow) (claimed[S], error) {
	var c claimed[S]
	var parent, state string
	if err := r.Scan(&c.t.ID, &c.t.Name, &c.t.Due, &c.attempts, &parent, &state, &c.snap.ID, &c.snap.Tenant, &c.snap.Key,
		&c.snap.CorrelationID, &c.snap.Status, &c.snap.Version, &c.state); err != nil {
		return c, err
	}
	if parent != "" {
		c.traceCtx = map[string]string{tracing.HeaderTraceParent: parent, tracing.HeaderTraceState: state}
	}
	return c, nil
}

// fireClaimed takes one claimed timeout's step in tx: decide on the
// instance's state, then, under a savepoint, apply the step and delete the
// timeout. A step without appends or commands goes in one round trip, the
// savepoint and its release included. savepoint reports whether a
// savepoint was set, which a failure must roll back to. scope tracks the
// tenant tx is scoped to.
func (s *Saga[S]) fireClaimed(ctx context.Context, store *postgres.Store, q queries, tracer trace.Tracer, tx pgx.Tx, c claimed[S], now time.Time, scope *string) (savepoint bool, err error) {
	if c.snap.Status != Active {
		// Completion deletes timeouts; this one is a leftover.
		if _, err := tx.Exec(ctx, q.fired, c.t.ID); err != nil {
			return false, fmt.Errorf("saga %q: timeout %q of %q: %w", s.name, c.t.Name, c.snap.Key, err)
		}
		return false, nil
	}
	ctx, span := startTimeout(ctx, tracer, s, c)
	defer func() { endSpan(span, err) }()
	snap := c.snap
	if err := scopeTo(ctx, store, tx, scope, snap.Tenant); err != nil {
		return false, err
	}
	// After scoping: opening sealed personal fields reads the tenant's keys.
	if snap.State, err = s.decodeState(ctx, store, tx, snap.Tenant, c.state); err != nil {
		return false, fmt.Errorf("saga %q: decode state of %q: %w", s.name, snap.Key, err)
	}
	// The step's failure is recorded, returned and traced without the
	// personal values of the state the handler was given.
	defer func() { err = s.redacted(store, err, snap.State) }()
	ctx = projector.WithActor(ctx, "saga:"+s.name)
	d, err := s.DecideTimeout(ctx, store.Registry(), snap, c.t, now)
	if err != nil {
		return false, err // nothing written yet
	}
	wb := &pgx.Batch{}
	immediate := len(d.Appends) > 0 || len(d.Commands) > 0
	if immediate {
		if _, err := tx.Exec(ctx, "SAVEPOINT projector_saga_timeout"); err != nil {
			return false, fmt.Errorf("saga %q: savepoint: %w", s.name, err)
		}
	} else {
		wb.Queue("SAVEPOINT projector_saga_timeout")
	}
	in := &live[S]{snap: snap, version: snap.Version}
	if err := s.applyStep(ctx, store, q, tx, wb, &in.snap, d, c.t.ID, "timeout", c.t.Name); err != nil {
		return immediate, err // without appends, nothing was sent yet
	}
	wb.Queue(q.fired, c.t.ID)
	if err := s.queueSave(ctx, store, q, tx, wb, in); err != nil {
		return immediate, err
	}
	wb.Queue("RELEASE SAVEPOINT projector_saga_timeout")
	if err := tx.SendBatch(ctx, wb).Close(); err != nil {
		return true, fmt.Errorf("saga %q: save the step of timeout %q of %q: %w", s.name, c.t.Name, snap.Key, err)
	}
	return false, nil
}

func scopeTo(ctx context.Context, store *postgres.Store, tx pgx.Tx, scope *string, tenant string) error {
	if *scope == tenant {
		return nil
	}
	if err := store.ScopeTx(ctx, tx, tenant); err != nil {
		return err
	}
	*scope = tenant
	return nil
}

// timeoutFailed records a failing timeout step in tx, after its savepoint
// was rolled back: retried with backoff, and after TimeoutAttempts the
// instance is marked failed (visible in `projector saga list --status
// failed`) and its timeouts dropped.
func (s *Saga[S]) timeoutFailed(ctx context.Context, store *postgres.Store, q queries, tx pgx.Tx, scope *string, c claimed[S], stepErr error) error {
	if err := scopeTo(ctx, store, tx, scope, projector.SystemTenant); err != nil {
		return err
	}
	backoff := time.Second << min(c.attempts, 8)
	var n int
	err := tx.QueryRow(ctx, q.failTimeout, c.t.ID, projection.StoredError(stepErr), s.cfg.Now().Add(backoff)).Scan(&n)
	if err == nil && n >= s.cfg.TimeoutAttempts {
		if _, err = tx.Exec(ctx, q.failInstance, c.snap.ID, projection.StoredError(stepErr)); err == nil {
			_, err = tx.Exec(ctx, q.cancelAll, c.snap.ID)
		}
	}
	if err != nil {
		return fmt.Errorf("saga %q: record failure of timeout %q of %q (%v): %w", s.name, c.t.Name, c.snap.Key, stepErr, err)
	}
	return nil
}

// nextDue returns when the saga's earliest timeout is due, zero if none.
func (s *Saga[S]) nextDue(ctx context.Context, store *postgres.Store, q queries) (time.Time, error) {
	var next *time.Time
	if err := store.Pool().QueryRow(ctx, q.nextDue, s.name).Scan(&next); err != nil {
		return time.Time{}, fmt.Errorf("saga %q: next due timeout: %w", s.name, err)
	}
	if next == nil {
		return time.Time{}, nil
	}
	return *next, nil
}

// stepFault reports whether err is a step's own failure, which continuous
// mode dead-letters, rather than contention or a failing database, which
// are retried whatever the mode: a step refused by promise 4 or by a
// serialization failure or deadlock would succeed on the next try, and
// dead-lettering it would skip an event for nothing. A failing database
// includes its schema and grants ([projection.IsSystemic]): a step that
// meets a missing table or a revoked grant would have dead-lettered every
// event and failed every instance until the fix.
func stepFault(err error) bool {
	if errors.Is(err, projector.ErrConcurrency) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) {
		return false
	}
	if projection.IsSystemic(err) {
		// A missing table or grant, a standby, a full disk: the dispatcher
		// stops the shard on it, in either mode, as for a projection.
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && len(pgErr.Code) == 5 {
		switch pgErr.Code[:2] {
		case "08", "40", "53", "55", "57", "58", "XX": // connection, rollback, resources, lock, operator, system, internal
			return false
		}
	}
	return true
}

// failStep is continuous mode's answer to an event's failing step: the
// event goes to the dead-letter table, the instance is marked failed when
// the batch saves it (with the error; its timeouts cancelled), and the
// events after it in the batch find it failed and are counted as late.
func (s *Saga[S]) failStep(ctx context.Context, store *postgres.Store, q queries, tx pgx.Tx, tenant string, in *live[S], ev projector.Event, cause error) error {
	cause = fmt.Errorf("%s v%d of %s: %w", ev.Type, ev.Version, ev.Stream, cause)
	in.snap.Status = Failed
	in.failure = projection.StoredError(cause)
	return s.deadLetter(ctx, store, q, tx, tenant, ev, cause)
}

// deadLetter records ev under the saga's consumer. The dead-letter table is
// the dispatcher's, which a tenant role has no rights on: the write is made
// unscoped, and the transaction scoped back to the batch's tenant after.
func (s *Saga[S]) deadLetter(ctx context.Context, store *postgres.Store, q queries, tx pgx.Tx, tenant string, ev projector.Event, cause error) error {
	return s.unscoped(ctx, store, tx, tenant, func() error {
		// Under the shard that handled ev (a partition, when the saga is
		// partitioned), whose dispatcher carries out a retry of it.
		shard := projection.ShardID{Consumer: s.name, Instance: projection.SharedInstance}
		if id, ok := projection.ShardFrom(ctx); ok {
			shard = id
		}
		if _, err := tx.Exec(ctx, q.deadLetter, s.name, shard.Instance, ev.ID, ev.Position.TxID, ev.Position.Seq, ev.Type,
			ev.Stream.Tenant, ev.Stream.Type, ev.Stream.ID, ev.Version, projection.StoredError(cause)); err != nil {
			return fmt.Errorf("saga %q: dead-letter %s %s: %w", s.name, ev.Type, ev.ID, err)
		}
		s.deadLettered.Add(1)
		return nil
	})
}
