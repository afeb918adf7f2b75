package saga

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	sq "github.com/Masterminds/squirrel"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// ParseStatus reads a status as the CLI and the tables spell it.
func ParseStatus(s string) (Status, error) {
	switch st := Status(s); st {
	case Active, Completed, Failed, Parked:
		return st, nil
	}
	return "", fmt.Errorf("%w: status %q: want active, completed, failed or parked", ErrInvalidArgument, s)
}

// InstanceInfo is an instance as listed.
type InstanceInfo struct {
	ID            uuid.UUID       `json:"id"`
	Saga          string          `json:"saga"`
	Tenant        string          `json:"tenant"`
	Key           string          `json:"key"`
	CorrelationID uuid.UUID       `json:"correlation_id"`
	Status        Status          `json:"status"`
	Version       int64           `json:"version"`
	LateEvents    int64           `json:"late_events"`
	LastError     string          `json:"last_error,omitempty"`
	State         json.RawMessage `json:"state"`
	CreatedAt     time.Time       `json:"created_at"`
	UpdatedAt     time.Time       `json:"updated_at"`
	CompletedAt   time.Time       `json:"completed_at,omitzero"`
	// NextTimeoutAt is when the earliest of its pending timeouts is due;
	// zero when none is pending.
	NextTimeoutAt time.Time `json:"next_timeout_at,omitzero"`
}

// ListQuery selects instances of one saga; the optional filters combine.
type ListQuery struct {
	Saga string
	// Statuses, when not empty, keeps instances in one of them.
	Statuses []Status
	// Tenant, when not empty, keeps one tenant's instances.
	Tenant string
	// Limit caps the rows, newest update first; default 100.
	Limit int
}

// List returns instances of q.Saga, most recently updated first.
func List(ctx context.Context, store *postgres.Store, q ListQuery) ([]InstanceInfo, error) {
	if q.Saga == "" {
		return nil, fmt.Errorf("%w: list saga instances: no saga name", ErrInvalidArgument)
	}
	if err := checkText("list saga instances", "saga", q.Saga, "tenant", q.Tenant); err != nil {
		return nil, err
	}
	if q.Limit < 0 {
		return nil, fmt.Errorf("%w: list saga instances: negative limit %d", ErrInvalidArgument, q.Limit)
	}
	if q.Limit == 0 {
		q.Limit = 100
	}
	// The filters are optional and combine: the query's shape changes at
	// run time, which is what squirrel is for.
	b := sq.StatementBuilder.PlaceholderFormat(sq.Dollar).
		Select(instanceColumns, nextTimeoutColumn(store)).From(store.Table("projector_saga_instances")+" i").
		Where(sq.Eq{"saga": q.Saga}).OrderBy("updated_at DESC", "id").Limit(uint64(q.Limit))
	if len(q.Statuses) > 0 {
		sts := make([]string, len(q.Statuses))
		for i, st := range q.Statuses {
			if _, err := ParseStatus(string(st)); err != nil {
				return nil, err
			}
			sts[i] = string(st)
		}
		b = b.Where(sq.Eq{"status": sts})
	}
	if q.Tenant != "" {
		b = b.Where(sq.Eq{"tenant_id": q.Tenant})
	}
	sql, args, err := b.ToSql()
	if err != nil {
		return nil, fmt.Errorf("list saga instances: build query: %w", err)
	}
	rows, err := store.Pool().Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("list saga instances of %s: %w", projector.Printable(q.Saga), err)
	}
	out, err := pgx.CollectRows(rows, scanInstance)
	if err != nil {
		return nil, fmt.Errorf("list saga instances of %s: %w", projector.Printable(q.Saga), err)
	}
	return out, nil
}

// checkText refuses, as [ErrInvalidArgument], any of the named values
// (name, value, name, value, …) that PostgreSQL text cannot hold, before
// it is sent: the driver's error would say nothing a caller can test with
// errors.Is, and abort a caller's transaction.
func checkText(op string, pairs ...string) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if err := projector.ValidText(pairs[i+1]); err != nil {
			return fmt.Errorf("%w: %s: %s %s %w", ErrInvalidArgument, op, pairs[i], projector.Printable(pairs[i+1]), err)
		}
	}
	return nil
}

// instanceColumns are the columns of an instance, read from
// projector_saga_instances aliased i, followed by nextTimeoutColumn:
// what scanInstance reads.
const instanceColumns = `i.id, i.saga, i.tenant_id, i.key, i.correlation_id, i.status, i.version, i.late_events, coalesce(i.last_error, ''),
	i.state, i.created_at, i.updated_at, coalesce(i.completed_at, 'epoch')`

// nextTimeoutColumn is the due time of instance i's earliest pending
// timeout ('epoch' for none), found through the timeouts' (instance_id,
// name) index.
func nextTimeoutColumn(store *postgres.Store) string {
	return `coalesce((SELECT min(t.due_at) FROM ` + store.Table("projector_saga_timeouts") + ` t WHERE t.instance_id = i.id), 'epoch')`
}

func scanInstance(row pgx.CollectableRow) (InstanceInfo, error) {
	var in InstanceInfo
	err := row.Scan(&in.ID, &in.Saga, &in.Tenant, &in.Key, &in.CorrelationID, &in.Status, &in.Version, &in.LateEvents,
		&in.LastError, &in.State, &in.CreatedAt, &in.UpdatedAt, &in.CompletedAt, &in.NextTimeoutAt)
	epoch := time.Unix(0, 0)
	if in.CompletedAt.Equal(epoch) {
		in.CompletedAt = time.Time{}
	}
	if in.NextTimeoutAt.Equal(epoch) {
		in.NextTimeoutAt = time.Time{}
	}
	return in, err
}

// InstanceDetail is an instance with its pending timeouts, its steps (the
// events and timeouts that drove it) and the events it appended.
type InstanceDetail struct {
	InstanceInfo
	Timeouts []PendingTimeout `json:"timeouts"`
	Steps    []StepInfo       `json:"steps"`
	Appended []AppendedEvent  `json:"appended"`
}

// PendingTimeout is a timeout not yet fired.
type PendingTimeout struct {
	ID        uuid.UUID `json:"id"`
	Name      string    `json:"name"`
	DueAt     time.Time `json:"due_at"`
	Attempts  int       `json:"attempts"`
	LastError string    `json:"last_error,omitempty"`
}

// StepInfo is one step the instance took.
type StepInfo struct {
	Step int64 `json:"step"`
	// Cause is "event" or "timeout"; CauseID the event's or timeout's id.
	Cause   string    `json:"cause"`
	CauseID uuid.UUID `json:"cause_id"`
	// Type is the event type or the timeout's name.
	Type string `json:"type"`
	// Stream is the handled event's stream, "" for a timeout (or an event
	// retention has pruned).
	Stream   string    `json:"stream,omitempty"`
	Appended int       `json:"appended"`
	At       time.Time `json:"at"`
}

// AppendedEvent is an event the instance appended, read from the log by its
// correlation and causation ids.
type AppendedEvent struct {
	ID          uuid.UUID `json:"id"`
	Type        string    `json:"type"`
	Stream      string    `json:"stream"`
	Version     int64     `json:"version"`
	CausationID uuid.UUID `json:"causation_id"`
	RecordedAt  time.Time `json:"recorded_at"`
}

// Show returns the instance of saga for tenant and key, with its pending
// timeouts, steps and appended events; [projector.ErrNotFound] if none.
func Show(ctx context.Context, store *postgres.Store, saga, tenant, key string) (InstanceDetail, error) {
	if err := checkText("show saga instance", "saga", saga, "tenant", tenant, "key", key); err != nil {
		return InstanceDetail{}, err
	}
	return show(ctx, store, saga, fmt.Sprintf("instance %s of tenant %s", projector.Printable(key), projector.Printable(tenant)),
		`i.saga = $1 AND i.tenant_id = $2 AND i.key = $3`, saga, tenant, key)
}

// ShowID is [Show] for the instance with id, which must be an instance of
// saga: the console links instances by id, which needs neither the tenant
// nor a key that may not fit in a URL. [projector.ErrNotFound] if saga
// has no instance id.
func ShowID(ctx context.Context, store *postgres.Store, saga string, id uuid.UUID) (InstanceDetail, error) {
	if err := checkText("show saga instance", "saga", saga); err != nil {
		return InstanceDetail{}, err
	}
	return show(ctx, store, saga, "instance "+id.String(), `i.saga = $1 AND i.id = $2`, saga, id)
}

// show reads the instance of saga that where (on projector_saga_instances
// aliased i, with args) selects, and what hangs off it; what names it in
// errors.
func show(ctx context.Context, store *postgres.Store, saga, what, where string, args ...any) (InstanceDetail, error) {
	var d InstanceDetail
	rows, err := store.Pool().Query(ctx, `SELECT `+instanceColumns+`, `+nextTimeoutColumn(store)+`
		FROM `+store.Table("projector_saga_instances")+` i WHERE `+where, args...)
	if err != nil {
		return d, fmt.Errorf("show saga %s %s: %w", projector.Printable(saga), what, err)
	}
	d.InstanceInfo, err = pgx.CollectExactlyOneRow(rows, scanInstance)
	if errors.Is(err, pgx.ErrNoRows) {
		return d, fmt.Errorf("show saga %s %s: %w", projector.Printable(saga), what, projector.ErrNotFound)
	}
	if err != nil {
		return d, fmt.Errorf("show saga %s %s: %w", projector.Printable(saga), what, err)
	}
	key := d.Key
	rows, err = store.Pool().Query(ctx, `SELECT id, name, due_at, attempts, coalesce(last_error, '') FROM `+
		store.Table("projector_saga_timeouts")+` WHERE instance_id = $1 ORDER BY due_at, name`, d.ID)
	if err == nil {
		d.Timeouts, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (PendingTimeout, error) {
			var t PendingTimeout
			return t, r.Scan(&t.ID, &t.Name, &t.DueAt, &t.Attempts, &t.LastError)
		})
	}
	if err != nil {
		return d, fmt.Errorf("show saga %s instance %s: timeouts: %w", projector.Printable(saga), projector.Printable(key), err)
	}
	ev := store.Table("projector_events")
	rows, err = store.Pool().Query(ctx, `SELECT s.step, s.cause, s.cause_id, s.type,
			coalesce(e.stream_type || '/' || e.stream_id, ''), s.appended, s.created_at
		FROM `+store.Table("projector_saga_steps")+` s LEFT JOIN `+ev+` e ON s.cause = 'event' AND e.id = s.cause_id
		WHERE s.instance_id = $1 ORDER BY s.step`, d.ID)
	if err == nil {
		d.Steps, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (StepInfo, error) {
			var s StepInfo
			return s, r.Scan(&s.Step, &s.Cause, &s.CauseID, &s.Type, &s.Stream, &s.Appended, &s.At)
		})
	}
	if err != nil {
		return d, fmt.Errorf("show saga %s instance %s: steps: %w", projector.Printable(saga), projector.Printable(key), err)
	}
	causes := make([]uuid.UUID, len(d.Steps))
	for i, s := range d.Steps {
		causes[i] = s.CauseID
	}
	rows, err = store.Pool().Query(ctx, `SELECT id, type, stream_type || '/' || stream_id, version, causation_id, recorded_at
		FROM `+ev+` WHERE correlation_id = $1 AND causation_id = ANY($2) ORDER BY tx_id, seq`, d.CorrelationID, causes)
	if err == nil {
		d.Appended, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (AppendedEvent, error) {
			var a AppendedEvent
			return a, r.Scan(&a.ID, &a.Type, &a.Stream, &a.Version, &a.CausationID, &a.RecordedAt)
		})
	}
	if err != nil {
		return d, fmt.Errorf("show saga %s instance %s: appended events: %w", projector.Printable(saga), projector.Printable(key), err)
	}
	return d, nil
}

// FailedCounts returns, per saga with any, how many of its instances are
// failed: for `projector status`, so a failed instance is seen without
// asking about each saga.
func FailedCounts(ctx context.Context, store *postgres.Store) (map[string]int64, error) {
	rows, err := store.Pool().Query(ctx, `SELECT saga, count(*) FROM `+store.Table("projector_saga_instances")+`
		WHERE status = 'failed' GROUP BY saga ORDER BY saga`)
	if err != nil {
		return nil, fmt.Errorf("count failed saga instances: %w", err)
	}
	out := map[string]int64{}
	var name string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&name, &n}, func() error { out[name] = n; return nil }); err != nil {
		return nil, fmt.Errorf("count failed saga instances: %w", err)
	}
	return out, nil
}

// Summary is one saga at a glance: its instances counted by status and its
// pending timeouts, of which those overdue. An overdue timeout is due (by
// the database's clock) and not yet fired: a Runner that is not running,
// an instance whose row stays locked, or a handler that keeps failing
// (Attempts and LastError on the instance's [PendingTimeout]) leave it so.
// One just due is overdue too until the runner's next look, at most
// [RunnerConfig.Poll] later, so OldestOverdueAt says how long it has been.
type Summary struct {
	Saga      string `json:"saga"`
	Active    int64  `json:"active"`
	Completed int64  `json:"completed"`
	Failed    int64  `json:"failed"`
	// Parked instances wait for a retry of their park (ParkStream); their
	// timeouts stay pending, and may be overdue, meanwhile.
	Parked int64 `json:"parked"`
	// PendingTimeouts are scheduled and neither fired nor cancelled.
	PendingTimeouts int64 `json:"pending_timeouts"`
	// OverdueTimeouts are the pending timeouts already due.
	OverdueTimeouts int64 `json:"overdue_timeouts"`
	// OldestOverdueAt is the due time of the earliest overdue timeout; zero
	// when none is overdue.
	OldestOverdueAt time.Time `json:"oldest_overdue_at,omitzero"`
}

// Instances is how many instances the saga has, in any status.
func (s Summary) Instances() int64 { return s.Active + s.Completed + s.Failed + s.Parked }

// Summaries counts, per saga with any instance, its instances by status
// and its pending and overdue timeouts, ordered by saga name; with names,
// only those sagas' (a name without instances has no summary). It reads the
// status index and the timeouts' due index, no instance's state.
func Summaries(ctx context.Context, store *postgres.Store, names ...string) ([]Summary, error) {
	if names == nil {
		names = []string{}
	}
	for _, n := range names {
		if err := projector.ValidText(n); err != nil {
			return nil, fmt.Errorf("%w: saga name %s %w", ErrInvalidArgument, projector.Printable(n), err)
		}
	}
	rows, err := store.Pool().Query(ctx, `WITH i AS (
			SELECT saga, count(*) FILTER (WHERE status = 'active') AS active,
				count(*) FILTER (WHERE status = 'completed') AS completed,
				count(*) FILTER (WHERE status = 'failed') AS failed,
				count(*) FILTER (WHERE status = 'parked') AS parked
			FROM `+store.Table("projector_saga_instances")+`
			WHERE cardinality($1::text[]) = 0 OR saga = ANY($1) GROUP BY saga
		), t AS (
			SELECT saga, count(*) AS pending, count(*) FILTER (WHERE due_at <= now()) AS overdue,
				min(due_at) FILTER (WHERE due_at <= now()) AS oldest
			FROM `+store.Table("projector_saga_timeouts")+`
			WHERE cardinality($1::text[]) = 0 OR saga = ANY($1) GROUP BY saga
		)
		SELECT i.saga, i.active, i.completed, i.failed, i.parked, coalesce(t.pending, 0), coalesce(t.overdue, 0), coalesce(t.oldest, 'epoch')
		FROM i LEFT JOIN t USING (saga) ORDER BY i.saga`, names)
	if err != nil {
		return nil, fmt.Errorf("summarise sagas: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Summary, error) {
		var s Summary
		err := r.Scan(&s.Saga, &s.Active, &s.Completed, &s.Failed, &s.Parked, &s.PendingTimeouts, &s.OverdueTimeouts, &s.OldestOverdueAt)
		if s.OldestOverdueAt.Equal(time.Unix(0, 0)) {
			s.OldestOverdueAt = time.Time{}
		}
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("summarise sagas: %w", err)
	}
	return out, nil
}
