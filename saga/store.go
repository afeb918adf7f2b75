package saga

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// queries are the saga's fixed SQL for one store's schema.
type queries struct {
	lock, insert, late, update, step, schedule, cancel, cancelAll, claim, fired, failTimeout, failInstance, nextDue string
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
		// ON CONFLICT: a second start event for the key finds the first
		// instance instead of making another.
		insert: `INSERT INTO ` + i + ` (id, saga, tenant_id, key, correlation_id, state)
			VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (saga, tenant_id, key) DO NOTHING`,
		late: `UPDATE ` + i + ` SET late_events = late_events + 1 WHERE id = $1`,
		update: `UPDATE ` + i + ` SET state = $2, version = version + 1, status = $3, updated_at = now(),
				completed_at = CASE WHEN $3 = 'completed' THEN now() END
			WHERE id = $1 AND version = $4`,
		// The cause is unique per instance: a step applied twice would fail
		// here rather than happen twice.
		step: `INSERT INTO ` + st + ` (instance_id, step, cause_id, cause, type, appended) VALUES ($1, $2, $3, $4, $5, $6)`,
		schedule: `INSERT INTO ` + t + ` (id, instance_id, saga, name, due_at, scheduled_by) VALUES ($1, $2, $3, $4, $5, $6)
			ON CONFLICT (instance_id, name) DO UPDATE SET id = EXCLUDED.id, due_at = EXCLUDED.due_at,
				scheduled_by = EXCLUDED.scheduled_by, retry_at = NULL, attempts = 0, last_error = NULL, created_at = now()`,
		cancel:    `DELETE FROM ` + t + ` WHERE instance_id = $1 AND name = $2`,
		cancelAll: `DELETE FROM ` + t + ` WHERE instance_id = $1`,
		// The earliest due timeouts of a saga (the due index, no scan), with
		// their instances, all locked. SKIP LOCKED: a timeout whose instance
		// an event's step holds is left for the next round instead of
		// waiting, and runners in several processes share the work. A row
		// changed by a step that committed meanwhile is re-checked against
		// the WHERE clause, so a cancelled or moved timeout is not claimed.
		claim: `SELECT t.id, t.name, t.due_at, t.attempts, i.id, i.tenant_id, i.key, i.correlation_id, i.status, i.version, i.state
			FROM ` + t + ` t JOIN ` + i + ` i ON i.id = t.instance_id
			WHERE t.saga = $1 AND t.due_at <= $2 AND (t.retry_at IS NULL OR t.retry_at <= $2)
			ORDER BY t.due_at LIMIT $3 FOR UPDATE OF t, i SKIP LOCKED`,
		fired: `DELETE FROM ` + t + ` WHERE id = $1`,
		failTimeout: `UPDATE ` + t + ` SET attempts = attempts + 1, last_error = $2, retry_at = $3
			WHERE id = $1 RETURNING attempts`,
		failInstance: `UPDATE ` + i + ` SET status = 'failed', last_error = $2, updated_at = now() WHERE id = $1`,
		nextDue:      `SELECT min(coalesce(retry_at, due_at)) FROM ` + t + ` WHERE saga = $1`,
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
	p := projection.NewAsync(s.name, s.cfg.Async)
	q := newQueries(store)
	for _, typ := range s.types {
		err := projection.OnEvent(p, s.routes[typ].et, func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
			return s.handleEvent(ctx, store, q, tx, ev)
		})
		if err != nil {
			return nil, fmt.Errorf("saga %q: %w", s.name, err)
		}
	}
	if err := p.Validate(store.Registry()); err != nil {
		return nil, fmt.Errorf("saga %q: %w", s.name, err)
	}
	return p, nil
}

// handleEvent takes an event's step: find (or start) the instance, lock
// it, decide, apply. It runs in the dispatcher's transaction, scoped to the
// event's tenant.
func (s *Saga[S]) handleEvent(ctx context.Context, store *postgres.Store, q queries, tx pgx.Tx, ev projector.Event) error {
	key, starts, handled, err := s.Route(ev)
	if err != nil || !handled {
		return err
	}
	snap, found, err := s.lockInstance(ctx, q, tx, ev.Stream.Tenant, key)
	if err != nil {
		return err
	}
	isNew := false
	if !found {
		if !starts {
			s.ignored.Add(1)
			return nil
		}
		var zero S
		state, err := json.Marshal(zero)
		if err != nil {
			return fmt.Errorf("saga %q: encode zero state: %w", s.name, err)
		}
		snap = Snapshot[S]{ID: uuid.New(), Key: key, Tenant: ev.Stream.Tenant, CorrelationID: ev.Metadata.CorrelationID, Status: Active}
		if snap.CorrelationID == uuid.Nil {
			snap.CorrelationID = uuid.New()
		}
		tag, err := tx.Exec(ctx, q.insert, snap.ID, s.name, snap.Tenant, key, snap.CorrelationID, state)
		if err != nil {
			return fmt.Errorf("saga %q: start instance %q: %w", s.name, key, err)
		}
		if tag.RowsAffected() == 0 {
			// Another transaction started it first: take that one.
			if snap, found, err = s.lockInstance(ctx, q, tx, ev.Stream.Tenant, key); err != nil {
				return err
			} else if !found {
				return fmt.Errorf("saga %q: instance %q vanished while starting", s.name, key)
			}
		} else {
			isNew = true
		}
	}
	if snap.Status != Active {
		s.late.Add(1)
		if _, err := tx.Exec(ctx, q.late, snap.ID); err != nil {
			return fmt.Errorf("saga %q: count late event for %q: %w", s.name, key, err)
		}
		return nil
	}
	now := s.cfg.Now()
	d, err := s.Decide(ctx, store.Registry(), snap, isNew, ev, now)
	if err != nil {
		return err
	}
	return s.apply(ctx, store, q, tx, snap, d, ev.ID, "event", ev.Type)
}

// lockInstance reads and row-locks the instance of key.
func (s *Saga[S]) lockInstance(ctx context.Context, q queries, tx pgx.Tx, tenant, key string) (Snapshot[S], bool, error) {
	snap := Snapshot[S]{Key: key, Tenant: tenant}
	var state []byte
	err := tx.QueryRow(ctx, q.lock, s.name, tenant, key).Scan(&snap.ID, &snap.CorrelationID, &snap.Status, &snap.Version, &state)
	if errors.Is(err, pgx.ErrNoRows) {
		return snap, false, nil
	}
	if err != nil {
		return snap, false, fmt.Errorf("saga %q: lock instance %q: %w", s.name, key, err)
	}
	if err := json.Unmarshal(state, &snap.State); err != nil {
		return snap, false, fmt.Errorf("saga %q: decode state of %q: %w", s.name, key, err)
	}
	return snap, true, nil
}

// apply writes a step's decisions in tx: the appends and aggregate
// commands (with the instance's correlation id and cause as causation), in
// the order they were decided; then, in one round trip, the timeouts in the
// order they were scheduled and cancelled, the new state and version, and
// the step's row.
func (s *Saga[S]) apply(ctx context.Context, store *postgres.Store, q queries, tx pgx.Tx, snap Snapshot[S], d Decision[S],
	cause uuid.UUID, kind, typ string,
) error {
	ctx = projector.WithCausationID(projector.WithCorrelationID(ctx, snap.CorrelationID), cause)
	appended := 0
	b := &pgx.Batch{}
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
			b.Queue(q.schedule, uuid.New(), snap.ID, s.name, o.name, o.at, cause)
		case opCancel:
			b.Queue(q.cancel, snap.ID, o.name)
		}
		if err != nil {
			return fmt.Errorf("saga %q, instance %q: %w", s.name, snap.Key, err)
		}
	}
	status := Active
	if d.Completed {
		status = Completed
		b.Queue(q.cancelAll, snap.ID)
	}
	state, err := json.Marshal(d.State)
	if err != nil {
		return fmt.Errorf("saga %q, instance %q: encode state: %w", s.name, snap.Key, err)
	}
	b.Queue(q.update, snap.ID, state, status, snap.Version).Exec(func(tag pgconn.CommandTag) error {
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("%w: version %d changed under the row lock", projector.ErrConcurrency, snap.Version)
		}
		return nil
	})
	b.Queue(q.step, snap.ID, snap.Version+1, cause, kind, typ, appended)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("saga %q, instance %q: save the step: %w", s.name, snap.Key, err)
	}
	return nil
}

// claimed is a due timeout claimed with its instance.
type claimed[S any] struct {
	t        Timeout
	attempts int
	snap     Snapshot[S]
	state    []byte
}

// fireDue fires up to limit due timeouts of the saga in one transaction,
// each step under a savepoint of its own, so a failing one is rolled back
// alone (and recorded) while the others commit. It returns how many steps it
// took, how many timeouts it claimed, and the first step failure.
func (s *Saga[S]) fireDue(ctx context.Context, store *postgres.Store, q queries, limit int) (fired, claimedN int, stepErr error) {
	now := s.cfg.Now()
	tx, err := store.Pool().Begin(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("saga %q: begin: %w", s.name, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := tx.Query(ctx, q.claim, s.name, now, limit)
	if err != nil {
		return 0, 0, fmt.Errorf("saga %q: claim due timeouts: %w", s.name, err)
	}
	due, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (claimed[S], error) {
		var c claimed[S]
		return c, r.Scan(&c.t.ID, &c.t.Name, &c.t.Due, &c.attempts, &c.snap.ID, &c.snap.Tenant, &c.snap.Key,
			&c.snap.CorrelationID, &c.snap.Status, &c.snap.Version, &c.state)
	})
	if err != nil {
		return 0, 0, fmt.Errorf("saga %q: claim due timeouts: %w", s.name, err)
	}
	if len(due) == 0 {
		return 0, 0, nil
	}
	scope := projector.SystemTenant
	for _, c := range due {
		if _, err := tx.Exec(ctx, "SAVEPOINT projector_saga_timeout"); err != nil {
			return 0, len(due), fmt.Errorf("saga %q: savepoint: %w", s.name, err)
		}
		err := s.fireClaimed(ctx, store, q, tx, c, now, &scope)
		if err == nil {
			if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT projector_saga_timeout"); err != nil {
				return 0, len(due), fmt.Errorf("saga %q: release savepoint: %w", s.name, err)
			}
			fired++
			continue
		}
		if ctx.Err() != nil {
			return 0, len(due), ctx.Err()
		}
		// The step's writes and its SET LOCAL scope go with the savepoint.
		if _, rerr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT projector_saga_timeout"); rerr != nil {
			return 0, len(due), fmt.Errorf("saga %q: timeout %q of %q failed (%v) and could not be rolled back: %w", s.name, c.t.Name, c.snap.Key, err, rerr)
		}
		scope = ""
		if errors.Is(err, projector.ErrConcurrency) {
			// Contention, not a failure: an event's step appended to the
			// same stream from a younger transaction (promise 4 refuses the
			// older writer). The timeout stays due for the next round.
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
	return fired, len(due), stepErr
}

// fireClaimed takes one claimed timeout's step in tx: delete the timeout,
// decide on the instance's state, apply. scope tracks the tenant tx is
// scoped to.
func (s *Saga[S]) fireClaimed(ctx context.Context, store *postgres.Store, q queries, tx pgx.Tx, c claimed[S], now time.Time, scope *string) error {
	if err := scopeTo(ctx, store, tx, scope, projector.SystemTenant); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, q.fired, c.t.ID); err != nil {
		return fmt.Errorf("saga %q: timeout %q of %q: %w", s.name, c.t.Name, c.snap.Key, err)
	}
	if c.snap.Status != Active {
		return nil // completion deletes timeouts; this one is a leftover
	}
	snap := c.snap
	if err := json.Unmarshal(c.state, &snap.State); err != nil {
		return fmt.Errorf("saga %q: decode state of %q: %w", s.name, snap.Key, err)
	}
	if err := scopeTo(ctx, store, tx, scope, snap.Tenant); err != nil {
		return err
	}
	d, err := s.DecideTimeout(projector.WithActor(ctx, "saga:"+s.name), store.Registry(), snap, c.t, now)
	if err != nil {
		return err
	}
	return s.apply(ctx, store, q, tx, snap, d, c.t.ID, "timeout", c.t.Name)
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
	err := tx.QueryRow(ctx, q.failTimeout, c.t.ID, stepErr.Error(), s.cfg.Now().Add(backoff)).Scan(&n)
	if err == nil && n >= s.cfg.TimeoutAttempts {
		if _, err = tx.Exec(ctx, q.failInstance, c.snap.ID, stepErr.Error()); err == nil {
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

func commit(ctx context.Context, tx pgx.Tx) error {
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}
