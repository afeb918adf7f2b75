package projection

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// SharedInstance is the instance id of a shared consumer's one shard. It is
// reserved: no dispatcher may use it as its own instance id.
const SharedInstance = "__shared__"

// Status is a shard's state.
type Status string

// Shard states and the transitions between them:
//
//	idle ⇄ processing    the dispatcher, as it catches up and keeps up
//	processing → dead    MaxAttempts failures of one event (halt mode)
//	dead → idle          Restart (retry the event) or Skip (dead-letter it)
//	any but disabled → disabled    Disable
//	disabled → idle      Enable
const (
	StatusIdle       Status = "idle"
	StatusProcessing Status = "processing"
	StatusDead       Status = "dead"
	StatusDisabled   Status = "disabled"
)

// ShardID names one consumer shard.
type ShardID struct {
	// Consumer is the projection's name.
	Consumer string `json:"consumer"`
	// Instance is the instance id of a per-instance shard; empty means the
	// shared shard, [SharedInstance].
	Instance string `json:"instance_id"`
}

func (s ShardID) normal() ShardID {
	if s.Instance == "" {
		s.Instance = SharedInstance
	}
	return s
}

// String renders the shard as consumer or consumer@instance.
func (s ShardID) String() string {
	s = s.normal()
	if s.Instance == SharedInstance {
		return s.Consumer
	}
	return s.Consumer + "@" + s.Instance
}

// ShardState is a shard's row, with its lag measured when it was read.
type ShardState struct {
	ShardID
	Cursor    projector.Position `json:"cursor"`
	Status    Status             `json:"status"`
	Attempts  int                `json:"attempts"`
	LastError string             `json:"last_error,omitempty"`
	// LastErrorAt is zero when the shard has no error.
	LastErrorAt time.Time `json:"last_error_at,omitzero"`
	// FailedAt is the position of the event that is failing; zero without.
	FailedAt      projector.Position `json:"failed_at,omitzero"`
	FailedEventID uuid.UUID          `json:"failed_event_id,omitzero"`
	NextRetryAt   time.Time          `json:"next_retry_at,omitzero"`
	Processed     int64              `json:"processed"`
	UpdatedAt     time.Time          `json:"updated_at"`
	// LagEvents counts events after the cursor (whatever their type, up to
	// [LagCountCap]); LagSeconds is the age of the oldest of them.
	LagEvents  int64   `json:"lag_events"`
	LagSeconds float64 `json:"lag_seconds"`
	// Dispatcher says whether a live dispatcher runs the shard, from the
	// heartbeats in projector_instances: see [DispatcherState].
	Dispatcher DispatcherState `json:"dispatcher"`
	// LastSeen is the newest heartbeat of a dispatcher instance that runs
	// the shard (for a per-instance shard: of its instance); zero if none
	// ever ran it since heartbeats were recorded.
	LastSeen time.Time `json:"last_seen_at,omitzero"`
	// Version is the model version the shard maintains;
	// [PartitionedVersion] on the unpartitioned row of a partitioned
	// consumer (the fence, see [ShardState.Fence]).
	Version int `json:"version"`
	// Partition and Partitions say which partition of how many the shard
	// is; Partitions is 0 for a shard that is not a partition. Owner is the
	// instance that works the partition, "" for none yet.
	Partition  int    `json:"partition"`
	Partitions int    `json:"partitions"`
	Owner      string `json:"owner,omitempty"`
	// InRate and Skew measure a partition's load (zero on other shards): InRate
	// is the events per second appended to its streams over the log's last
	// [LoadWindow] events, and Skew its share of those events over an even
	// share (1: even; [HotSkew] or more: a hot partition, see
	// [ShardState.Hot]). Skew is zero while the window holds fewer than
	// [MinLoadSample] events.
	InRate float64 `json:"in_per_second,omitempty"`
	Skew   float64 `json:"skew,omitempty"`
	// Held says a partition waits at Hold for its sibling to merge
	// ([Admin.Merge]): its cursor does not pass Hold. A merge that was
	// killed leaves it held; running the merge again finishes it.
	Held bool               `json:"held,omitempty"`
	Hold projector.Position `json:"hold,omitzero"`
	// Parked counts the shard's open parks ([ParkStream]): streams whose
	// events wait for an operator's retry or discard.
	Parked int64 `json:"parked_streams"`
}

// Fence reports the unpartitioned row of a partitioned consumer, which only
// keeps binaries that do not know partitions from running it.
func (s ShardState) Fence() bool { return s.Version == PartitionedVersion }

// DispatcherState says whether anything is applying a shard's events, so an
// idle shard can be told from an unattended one.
type DispatcherState string

const (
	// DispatcherLive: a dispatcher running the shard has heartbeat within
	// the last [LiveHeartbeats] heartbeat intervals and has not stopped.
	DispatcherLive DispatcherState = "live"
	// DispatcherNone: no live dispatcher runs the shard. It still holds
	// retention back; start a dispatcher for it, or remove or disable it.
	DispatcherNone DispatcherState = "none"
	// DispatcherStale: a per-instance shard whose instance has not been
	// seen for its expiry ([Config.InstanceExpiry]). It no longer holds
	// retention back; see docs/operations.md for what `events prune` does to
	// it.
	DispatcherStale DispatcherState = "stale"
)

// LiveHeartbeats is how many heartbeat intervals a dispatcher may miss
// before the shards it runs are no longer shown as live.
const LiveHeartbeats = 3

// Failing reports a shard that is retrying an event.
func (s ShardState) Failing() bool { return s.Attempts > 0 && s.Status != StatusDead }

// LagCountCap bounds the lag count so a status call stays cheap on a
// consumer that is millions of events behind.
const LagCountCap = 10_000_000

// TransitionError is an operation refused in the shard's current state. It
// matches [projector.ErrInvalidTransition]; nothing was changed.
type TransitionError struct {
	Shard   ShardID
	Op      string
	From    Status
	Allowed []Status
	// Detail adds why, when the status alone does not say (skip needs a
	// failing event).
	Detail string
}

// Error implements error.
func (e *TransitionError) Error() string {
	allowed := make([]string, len(e.Allowed))
	for i, s := range e.Allowed {
		allowed[i] = string(s)
	}
	if e.Detail != "" {
		return fmt.Sprintf("cannot %s consumer %s (%s): %s", e.Op, e.Shard, e.From, e.Detail)
	}
	return fmt.Sprintf("cannot %s consumer %s: it is %s; %s is allowed only from %s", e.Op, e.Shard, e.From, e.Op, strings.Join(allowed, " or "))
}

// Is makes errors.Is(err, projector.ErrInvalidTransition) true.
func (e *TransitionError) Is(target error) bool { return target == projector.ErrInvalidTransition }

// Admin runs the operator's functions on consumer shards: list, status and
// the guarded transitions. It needs only the store, not the projections, so
// an ops tool can steer a fleet it does not run.
type Admin struct {
	store *postgres.Store
	sql   adminSQL
	split splitSQL
	// handOff is a split handed to the partitions' own passes
	// (splithandoff.go).
	handOff handOffSQL
	// handOffWait, when set, replaces splitHandOff (tests that must not
	// depend on the passes splitting within its five seconds under load).
	handOffWait time.Duration
	// lookHook, when set, is called after each look of a merge's wait
	// (awaitHolds) with what it saw, before the wait decides on it
	// (tests that act between two looks).
	lookHook func(ready bool, merged []bool)
	// holdHook, when set, is called by a merge's hold without the halves'
	// locks between its read of their rows and its write (holdUnlocked).
	holdHook func()
}

// NewAdmin returns the ops functions for the consumers of store's schema.
func NewAdmin(store *postgres.Store) *Admin {
	return &Admin{store: store, sql: buildAdminSQL(store), split: buildSplitSQL(store), handOff: buildHandOffSQL(store)}
}

type adminSQL struct {
	list, lock, waitLock, update, deadLetter, between, lockTable, tryLock, remove string
}

const shardColumns = `c.name, c.instance_id, c.cursor_tx_id, c.cursor_seq, c.status, c.attempts,
	coalesce(c.last_error, ''), coalesce(c.last_error_at, 'epoch'), coalesce(c.failed_tx_id, '0'), coalesce(c.failed_seq, 0),
	coalesce(c.failed_event_id, '00000000-0000-0000-0000-000000000000'), coalesce(c.next_retry_at, 'epoch'), c.processed, c.updated_at,
	c.version, coalesce(c.owner, ''), c.hold_tx_id IS NOT NULL, coalesce(c.hold_tx_id, '0'), coalesce(c.hold_seq, 0)`

// dispatcherColumns are a shard's DispatcherState and LastSeen, from the
// heartbeats of the instances that run it: any instance listing the
// consumer for a shared shard, the shard's own instance for a per-instance
// one. Stale applies to per-instance shards only: a shared shard is the
// consumer's one shard, which any later dispatcher resumes.
//
// A rebuild's shadow shard is, like a shared one, run by any dispatcher of
// the consumer (the one of the rebuilt version takes it): its reserved
// instance id is no process's.
func dispatcherColumns(instances string) string {
	anyOf := `(c.instance_id IN ('` + SharedInstance + `', '` + RebuildInstance + `') OR c.instance_id LIKE '` + PartitionPrefix + `%')`
	// Of the shard's own model version (versionMember); a process of a
	// release that lists no version is taken at its name, as before, and
	// so is the fence row of a partitioned consumer, which no process runs.
	ofVersion := `(c.name || '@v' || c.version::text = ANY(i.consumers) OR c.version = ` + fmt.Sprint(PartitionedVersion) + `
		OR NOT EXISTS (SELECT 1 FROM unnest(i.consumers) m WHERE starts_with(m, c.name || '@v')))`
	runs := `c.name = ANY(i.consumers) AND (` + anyOf + ` OR i.instance_id = c.instance_id) AND ` + ofVersion
	return `CASE
		WHEN EXISTS (SELECT 1 FROM ` + instances + ` i WHERE ` + runs + ` AND i.stopped_at IS NULL
			AND i.last_seen_at > now() - ` + fmt.Sprint(LiveHeartbeats) + ` * i.heartbeat_every) THEN 'live'
		WHEN NOT ` + anyOf + ` AND EXISTS (SELECT 1 FROM ` + instances + ` i
			WHERE i.instance_id = c.instance_id AND i.last_seen_at < now() - i.expire_after) THEN 'stale'
		ELSE 'none' END,
		coalesce((SELECT max(i.last_seen_at) FROM ` + instances + ` i
			WHERE i.instance_id = c.instance_id OR (` + anyOf + ` AND c.name = ANY(i.consumers))), 'epoch')`
}

func buildAdminSQL(store *postgres.Store) adminSQL {
	c, e, archive := store.Table("projector_consumers"), store.Table("projector_events"), store.Table("projector_events_archive")
	// A partition's lag counts its own streams' events only: the buckets
	// [p·64/n, (p+1)·64/n) of its instance id __partition__p/n. A
	// partition by key (its fence note says so) reads every event after
	// its cursor: that is its lag (partitionkey.go).
	part := `substr(c.instance_id, ` + fmt.Sprint(len(PartitionPrefix)+1) + `)`
	keyed := `EXISTS (SELECT 1 FROM ` + c + ` f WHERE f.name = c.name AND f.instance_id = '` + SharedInstance + `' AND f.last_error LIKE '` + keyedFence + `%')`
	inPartition := `(c.instance_id NOT LIKE '` + PartitionPrefix + `%' OR ` + keyed + ` OR ` + store.Schema() + `.projector_stream_bucket(e.tenant_id, e.stream_type, e.stream_id)
		BETWEEN split_part(` + part + `, '/', 1)::int * ` + fmt.Sprint(postgres.MaxPartitions) + ` / split_part(` + part + `, '/', 2)::int
		AND (split_part(` + part + `, '/', 1)::int + 1) * ` + fmt.Sprint(postgres.MaxPartitions) + ` / split_part(` + part + `, '/', 2)::int - 1)`
	disp := dispatcherColumns(store.Table("projector_instances"))
	return adminSQL{
		list: `SELECT ` + shardColumns + `, ` + disp + `,
			(SELECT count(*) FROM (SELECT 1 FROM ` + e + ` e WHERE (e.tx_id, e.seq) > (c.cursor_tx_id, c.cursor_seq) AND ` + inPartition + ` LIMIT ` + fmt.Sprint(LagCountCap) + `) l),
			coalesce(extract(epoch FROM now() - (SELECT e.recorded_at FROM ` + e + ` e
				WHERE (e.tx_id, e.seq) > (c.cursor_tx_id, c.cursor_seq) AND ` + inPartition + ` ORDER BY e.tx_id, e.seq LIMIT 1)), 0)::float8,
			(SELECT count(*) FROM ` + store.Table("projector_parks") + ` p WHERE p.consumer = c.name AND p.instance_id = c.instance_id AND p.status = 'parked')
			FROM ` + c + ` c WHERE ($1::text IS NULL OR c.name = $1) AND ($2::text IS NULL OR c.instance_id = $2)
			ORDER BY c.name, c.instance_id`,
		lock:     `SELECT ` + shardColumns + `, ` + disp + `, 0::bigint, 0::float8, 0::bigint FROM ` + c + ` c WHERE c.name = $1 AND c.instance_id = $2 FOR UPDATE OF c`,
		waitLock: waitShardLockSQL,
		// between and deadLetter read the hot log and the archive in one
		// statement, so in one snapshot: a shard registered or rewound
		// behind `streams archive` fails on archived events, and an
		// unarchive moving them back meanwhile commits whole, so the event
		// is in exactly one of the two tables (at the same position).
		between: `SELECT EXISTS (SELECT 1 FROM ` + e + ` WHERE (tx_id, seq) > ($1::xid8, $2::bigint) AND (tx_id, seq) < ($3::xid8, $4::bigint))
			OR EXISTS (SELECT 1 FROM ` + archive + ` WHERE (tx_id, seq) > ($1::xid8, $2::bigint) AND (tx_id, seq) < ($3::xid8, $4::bigint))`,
		update: `UPDATE ` + c + ` SET status = $3, attempts = $4, cursor_tx_id = $5, cursor_seq = $6,
			last_error = NULLIF($7, ''), last_error_at = CASE WHEN $7 = '' THEN NULL ELSE last_error_at END,
			failed_tx_id = CASE WHEN $7 = '' THEN NULL ELSE failed_tx_id END,
			failed_seq = CASE WHEN $7 = '' THEN NULL ELSE failed_seq END,
			failed_event_id = CASE WHEN $7 = '' THEN NULL ELSE failed_event_id END,
			next_retry_at = NULL, updated_at = now()
			WHERE name = $1 AND instance_id = $2`,
		deadLetter: `INSERT INTO ` + store.Table("projector_dead_letters") + `
			(consumer, instance_id, event_id, event_tx_id, event_seq, event_type, tenant_id, stream_type, stream_id, version, error, attempts, reason)
			SELECT $1, $2, e.id, e.tx_id, e.seq, e.type, e.tenant_id, e.stream_type, e.stream_id, e.version, $5, $6, $7
			FROM (SELECT id, tx_id, seq, type, tenant_id, stream_type, stream_id, version FROM ` + e + ` WHERE tx_id = $3 AND seq = $4
				UNION ALL SELECT id, tx_id, seq, type, tenant_id, stream_type, stream_id, version FROM ` + archive + ` WHERE tx_id = $3 AND seq = $4) e`,
		// SHARE ROW EXCLUSIVE waits for passes that have written and keeps
		// dispatchers from registering or writing until the removal commits,
		// so the liveness read after it is not overtaken by a start.
		lockTable: `LOCK TABLE ` + c + ` IN SHARE ROW EXCLUSIVE MODE`,
		tryLock:   `SELECT pg_try_advisory_xact_lock(hashtextextended($1::text, 0))`,
		remove:    `DELETE FROM ` + c + ` WHERE name = $1 AND instance_id = $2`,
	}
}

func scanShard(row pgx.Row) (ShardState, error) {
	var s ShardState
	err := row.Scan(&s.Consumer, &s.Instance, &s.Cursor.TxID, &s.Cursor.Seq, &s.Status, &s.Attempts,
		&s.LastError, &s.LastErrorAt, &s.FailedAt.TxID, &s.FailedAt.Seq, &s.FailedEventID, &s.NextRetryAt,
		&s.Processed, &s.UpdatedAt, &s.Version, &s.Owner, &s.Held, &s.Hold.TxID, &s.Hold.Seq, &s.Dispatcher, &s.LastSeen, &s.LagEvents, &s.LagSeconds, &s.Parked)
	if p, n, ok := ParsePartition(s.Instance); ok {
		s.Partition, s.Partitions = p, n
	}
	if s.LastSeen.Unix() == 0 {
		s.LastSeen = time.Time{}
	}
	if s.LastErrorAt.Unix() == 0 {
		s.LastErrorAt = time.Time{}
	}
	if s.NextRetryAt.Unix() == 0 {
		s.NextRetryAt = time.Time{}
	}
	return s, err
}

// List returns every shard of every consumer (consumer "" ) or of one, with
// its lag.
func (a *Admin) List(ctx context.Context, consumer string) ([]ShardState, error) {
	var name *string
	if consumer != "" {
		name = &consumer
	}
	return a.list(ctx, name, nil)
}

func (a *Admin) list(ctx context.Context, name, instance *string) ([]ShardState, error) {
	if name != nil && validName(*name) != nil {
		return nil, nil // no consumer can have that name
	}
	if instance != nil && validInstance(*instance) != nil {
		return nil, nil
	}
	rows, err := a.store.Pool().Query(ctx, a.sql.list, name, instance)
	if err != nil {
		return nil, fmt.Errorf("list consumers: %w", err)
	}
	var out []ShardState
	for rows.Next() {
		s, err := scanShard(rows)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("list consumers: %w", err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list consumers: %w", err)
	}
	if err := a.partitionLoad(ctx, out); err != nil {
		return nil, fmt.Errorf("list consumers: %w", err)
	}
	// Partitions under their consumer, in partition order (the query's
	// text order would put 10/16 before 2/16).
	sortPartitions(out)
	return out, nil
}

// Status returns one shard's state, or an error matching
// [projector.ErrNotFound].
func (a *Admin) Status(ctx context.Context, id ShardID) (ShardState, error) {
	id = id.normal()
	states, err := a.list(ctx, &id.Consumer, &id.Instance)
	if err != nil {
		return ShardState{}, err
	}
	if len(states) == 0 {
		return ShardState{}, fmt.Errorf("consumer %s: %w", projector.Printable(id.String()), projector.ErrNotFound)
	}
	return states[0], nil
}

// Restart moves a dead shard back to idle with its attempts cleared and its
// cursor kept, so the failing event is tried again. Only from dead.
func (a *Admin) Restart(ctx context.Context, id ShardID) error {
	return a.transition(ctx, id, "restart", []Status{StatusDead}, func(s *ShardState, _ txExec) (string, error) {
		s.Status, s.Attempts = StatusIdle, 0
		return "", nil
	})
}

// Skip moves a dead or failing shard past its failing event, recording the
// event in the dead-letter table, and sets it idle. The event may be in the
// archive: a shard behind `streams archive` reads and fails on archived
// events as on hot ones. Only from dead, or from
// processing while an event is failing.
func (a *Admin) Skip(ctx context.Context, id ShardID) error {
	return a.transition(ctx, id, "skip", []Status{StatusDead, StatusProcessing}, func(s *ShardState, exec txExec) (string, error) {
		if s.FailedAt == (projector.Position{}) {
			return "no event is failing", nil
		}
		// Moving the cursor to the failing event passes every event
		// before it: refuse unless they were all applied, which the
		// dispatcher records by leaving the cursor right before the
		// failing event. (A failure recorded otherwise, by an older
		// version, is retried once by a restart and then recorded so.)
		var unapplied bool
		if err := a.store.Pool().QueryRow(ctx, a.sql.between, s.Cursor.TxID, s.Cursor.Seq, s.FailedAt.TxID, s.FailedAt.Seq).Scan(&unapplied); err != nil {
			return "", fmt.Errorf("check events before the failing one: %w", err)
		}
		if unapplied {
			return fmt.Sprintf("events between its cursor %s and the failing event at %s were not applied; restart it so they are, then skip if the event still fails", s.Cursor, s.FailedAt), nil
		}
		n, err := exec(ctx, a.sql.deadLetter, s.Consumer, s.Instance, s.FailedAt.TxID, s.FailedAt.Seq,
			cmp.Or(s.LastError, "skipped by an operator"), s.Attempts, "skipped")
		if err != nil {
			return "", fmt.Errorf("record dead letter: %w", err)
		}
		if n == 0 {
			return "", fmt.Errorf("failing event at %s is no longer in the log or the archive", s.FailedAt)
		}
		s.Cursor, s.Status, s.Attempts = s.FailedAt, StatusIdle, 0
		return "", nil
	})
}

// Disable stops a shard: the dispatcher leaves it alone and retention no
// longer waits for it. From any state but disabled.
func (a *Admin) Disable(ctx context.Context, id ShardID) error {
	return a.transition(ctx, id, "disable", []Status{StatusIdle, StatusProcessing, StatusDead}, func(s *ShardState, _ txExec) (string, error) {
		s.Status = StatusDisabled
		return "", nil
	})
}

// Enable moves a disabled shard back to idle; it resumes from its cursor.
// Only from disabled.
func (a *Admin) Enable(ctx context.Context, id ShardID) error {
	return a.transition(ctx, id, "enable", []Status{StatusDisabled}, func(s *ShardState, _ txExec) (string, error) {
		s.Status, s.Attempts = StatusIdle, 0
		return "", nil
	})
}

// txExec runs statements of the current transition.
type txExec func(ctx context.Context, sql string, args ...any) (int64, error)

// transition locks the shard's row (waiting for a running batch to finish),
// checks the state, lets change edit it and writes it back, all in one
// transaction: a refused transition changes nothing.
func (a *Admin) transition(ctx context.Context, id ShardID, op string, allowed []Status, change func(*ShardState, txExec) (refuse string, err error)) error {
	id = id.normal()
	if validName(id.Consumer) != nil || validInstance(id.Instance) != nil {
		// Refused before anything reaches PostgreSQL: a name no shard can
		// have (NUL, invalid UTF-8) would otherwise come back as a raw
		// driver error quoting its bytes.
		return fmt.Errorf("consumer %s: %w", projector.Printable(id.String()), projector.ErrNotFound)
	}
	err := pgx.BeginFunc(ctx, a.store.Pool(), func(tx pgx.Tx) error {
		// Wait for a running batch: the dispatcher holds the shard's
		// advisory lock for the length of a pass.
		if _, err := tx.Exec(ctx, a.sql.waitLock, shardLockKey(a.store.Schema(), id)); err != nil {
			return err
		}
		s, err := scanShard(tx.QueryRow(ctx, a.sql.lock, id.Consumer, id.Instance))
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("consumer %s: %w", id, projector.ErrNotFound)
		}
		if err != nil {
			return err
		}
		if s.Fence() {
			return &TransitionError{Shard: id, Op: op, From: s.Status, Allowed: allowed,
				Detail: "the consumer is partitioned; this row only fences binaries that do not know partitions: name a partition (--partition P)"}
		}
		if !slices.Contains(allowed, s.Status) {
			return &TransitionError{Shard: id, Op: op, From: s.Status, Allowed: allowed}
		}
		refuse, err := change(&s, func(ctx context.Context, sql string, args ...any) (int64, error) {
			tag, err := tx.Exec(ctx, sql, args...)
			return tag.RowsAffected(), err
		})
		if err != nil {
			return err
		}
		if refuse != "" {
			return &TransitionError{Shard: id, Op: op, From: s.Status, Allowed: allowed, Detail: refuse}
		}
		lastError := s.LastError
		if s.Attempts == 0 {
			lastError = ""
		}
		_, err = tx.Exec(ctx, a.sql.update, id.Consumer, id.Instance, s.Status, s.Attempts, s.Cursor.TxID, s.Cursor.Seq, lastError)
		return err
	})
	// The shard's lock is free again and, unless refused, the shard may
	// run: a pass that stood aside looks now rather than at its Recheck.
	_ = WakeShards(ctx, a.store, id)
	if err != nil {
		var te *TransitionError
		if errors.As(err, &te) || errors.Is(err, projector.ErrNotFound) {
			return err
		}
		return fmt.Errorf("%s consumer %s: %w", op, id, err)
	}
	return nil
}

// InUseError is a removal refused because a dispatcher runs the consumer:
// removing the state of a shard that is being applied would have the
// dispatcher register it again from its start. It matches
// [projector.ErrInvalidTransition]; nothing was changed.
type InUseError struct {
	Consumer string
	// Reasons says, per shard, what runs it.
	Reasons []string
}

// Error implements error.
func (e *InUseError) Error() string {
	return fmt.Sprintf("cannot remove consumer %s while a dispatcher runs it: %s; stop those dispatchers (or deploy them without the projection) and try again",
		e.Consumer, strings.Join(e.Reasons, "; "))
}

// Is makes errors.Is(err, projector.ErrInvalidTransition) true.
func (e *InUseError) Is(target error) bool { return target == projector.ErrInvalidTransition }

// Remove is [Admin.RemoveAs] recorded as by "Admin.Remove"; it returns the
// shards it removed.
func (a *Admin) Remove(ctx context.Context, consumer, instance string) ([]ShardID, error) {
	r, err := a.RemoveAs(ctx, consumer, instance, "Admin.Remove")
	return r.Shards, err
}

// RemoveAs unregisters a consumer on behalf of by (who removes it, for the
// record): it deletes the state rows of its shards (every shard when
// instance is "", else the one shard of that instance id; [SharedInstance]
// names the shared one), so retention no longer waits for it and status no
// longer lists it. Its dead letters are kept. Its open parks on those
// shards (every open park of the consumer when instance is "": a
// rebuild's shadow and partitions included) are discarded in the same
// transaction, recorded as by by+[RemovedBy], their pending retry requests
// cancelled: a dispatcher that runs the projection again later registers
// it afresh, from where its StartFrom says, and applies the parked events
// itself (closeRemovedParks says why a park must not outlive its shard).
//
// RemoveAs refuses with an [*InUseError] while a dispatcher runs any of
// those shards: a live heartbeat from an instance that runs the consumer,
// or a shard lock held by a pass or a park retry. It returns what it
// removed and closed, or an error matching [projector.ErrNotFound] when it
// found neither a shard nor an open park (open parks with no shard left
// are those a removal by an earlier release kept: they are closed alone).
func (a *Admin) RemoveAs(ctx context.Context, consumer, instance, by string) (Removal, error) {
	if err := validBy(by); err != nil {
		return Removal{}, err
	}
	if len(by)+len(RemovedBy) > projector.MaxNameLength {
		// The parks record by+RemovedBy: a longer text is cut where it is
		// printed, and the reason with it.
		return Removal{}, fmt.Errorf("%w: who %s: longer than %d bytes (the closed parks record it with %q)",
			projector.ErrInvalidTransition, projector.Printable(by), projector.MaxNameLength-len(RemovedBy), RemovedBy)
	}
	if validName(consumer) != nil || (instance != "" && validInstance(instance) != nil) {
		return Removal{}, fmt.Errorf("consumer %s: %w", projector.Printable(ShardID{Consumer: consumer, Instance: instance}.String()), projector.ErrNotFound)
	}
	var removed Removal
	err := pgx.BeginFunc(ctx, a.store.Pool(), func(tx pgx.Tx) error {
		// Removing a partition's row changes the consumer's layout, which
		// every split, merge and partitioned start changes only under the
		// fence lock (the unpartitioned shard's): taken here too, so a
		// removal never lands between such a change reading the layout and
		// writing it. Tried, not waited for, as the shards' locks below.
		var fenceFree bool
		if err := tx.QueryRow(ctx, a.sql.tryLock, shardLockKey(a.store.Schema(), ShardID{Consumer: consumer, Instance: SharedInstance})).Scan(&fenceFree); err != nil {
			return err
		}
		if !fenceFree {
			return &InUseError{Consumer: consumer, Reasons: []string{
				"its fence lock is held: a split or merge of its partitions, a dispatcher starting it, or a pass of its unpartitioned shard is in progress",
			}}
		}
		if _, err := tx.Exec(ctx, a.sql.lockTable); err != nil {
			return err
		}
		var name, inst *string = &consumer, nil
		if instance != "" {
			inst = &instance
		}
		rows, err := tx.Query(ctx, a.sql.list, name, inst)
		if err != nil {
			return err
		}
		shards, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ShardState, error) { return scanShard(row) })
		if err != nil {
			return err
		}
		var reasons []string
		for _, s := range shards {
			if s.Dispatcher == DispatcherLive {
				reasons = append(reasons, fmt.Sprintf("shard %s has a live dispatcher (last heartbeat %s ago)", s.ShardID, time.Since(s.LastSeen).Round(time.Second)))
				continue
			}
			var free bool
			if err := tx.QueryRow(ctx, a.sql.tryLock, shardLockKey(a.store.Schema(), s.ShardID)).Scan(&free); err != nil {
				return err
			}
			if !free {
				reasons = append(reasons, fmt.Sprintf("shard %s is locked by a pass, a park retry or an operator transition in progress", s.ShardID))
			}
		}
		if len(reasons) > 0 {
			return &InUseError{Consumer: consumer, Reasons: reasons}
		}
		for _, s := range shards {
			if _, err := tx.Exec(ctx, a.sql.remove, s.Consumer, s.Instance); err != nil {
				return err
			}
			removed.Shards = append(removed.Shards, s.ShardID)
		}
		var instances []string // nil: every instance's parks
		if instance != "" {
			instances = []string{instance}
		}
		if removed.ParksClosed, removed.RetriesCancelled, err = closeRemovedParks(ctx, tx, a.store, consumer, instances, by); err != nil {
			return err
		}
		if len(shards) == 0 && removed.ParksClosed == 0 {
			if instance == "" {
				return fmt.Errorf("consumer %s: %w", consumer, projector.ErrNotFound)
			}
			return fmt.Errorf("consumer %s: %w", ShardID{Consumer: consumer, Instance: instance}, projector.ErrNotFound)
		}
		return nil
	})
	if err != nil {
		var inUse *InUseError
		if errors.As(err, &inUse) || errors.Is(err, projector.ErrNotFound) {
			return Removal{}, err
		}
		return Removal{}, fmt.Errorf("remove consumer %s: %w", consumer, err)
	}
	return removed, nil
}

// validInstance reports whether an instance id can be stored: PostgreSQL
// text holds no NUL and only valid UTF-8, and the id is part of the
// consumers table's key, so it is kept to a name's length.
func validInstance(id string) error {
	switch {
	case id == "":
		return errors.New("instance id is empty")
	case len(id) > projector.MaxNameLength:
		return fmt.Errorf("instance id is %d bytes, more than %d", len(id), projector.MaxNameLength)
	}
	if err := projector.ValidText(id); err != nil {
		return fmt.Errorf("instance id %s %w", projector.Printable(id), err)
	}
	return nil
}

// sortPartitions orders each consumer's partitions by where their streams
// lie in the hash space (so 1/4 sits between 1/8 and 4/8 when sizes are
// mixed, after a live split), after its other shards, keeping the query's order otherwise (a consumer's rows
// are contiguous there).
func sortPartitions(shards []ShardState) {
	type key struct{ group, part, at int }
	keys := make(map[int]key, len(shards))
	group := 0
	for i, s := range shards {
		if i > 0 && s.Consumer != shards[i-1].Consumer {
			group++
		}
		part := -1
		if s.Partitions > 0 {
			part = s.Partition * (postgres.MaxPartitions / s.Partitions)
		}
		keys[i] = key{group, part, i}
	}
	idx := make([]int, len(shards))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int {
		ka, kb := keys[a], keys[b]
		if ka.group != kb.group {
			return ka.group - kb.group
		}
		if ka.part != kb.part {
			return ka.part - kb.part
		}
		return ka.at - kb.at
	})
	sorted := make([]ShardState, len(shards))
	for i, j := range idx {
		sorted[i] = shards[j]
	}
	copy(shards, sorted)
}
