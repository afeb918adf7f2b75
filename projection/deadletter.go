package projection

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	sq "github.com/Masterminds/squirrel"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// Dead-letter statuses. A dead letter is open until a retry applies its
// event (resolved) or an operator gives up on it (discarded); neither
// deletes it, so the table stays the record of what failed.
const (
	DeadLetterOpen      = "open"
	DeadLetterResolved  = "resolved"
	DeadLetterDiscarded = "discarded"
)

// ErrEventPruned: a dead letter's event is no longer in the log, hot or
// archived (retention pruned it after it was dead-lettered), so it cannot
// be retried; it can
// only be discarded. It matches [projector.ErrInvalidTransition] too, so the
// CLI reports it as a refusal.
var ErrEventPruned = fmt.Errorf("%w: the dead letter's event was pruned from the log", projector.ErrInvalidTransition)

// ErrDeadLetterSuperseded: a dead letter was recorded against a model of
// the consumer that a rebuild has replaced (or by a rebuild that has not
// switched in, or never will), so it cannot be retried: the rebuild replayed
// its event through the new model's handlers, which applied it or recorded
// a dead letter of their own, and a retry into the live tables could apply
// it twice. It can only be discarded. It matches
// [projector.ErrInvalidTransition] too, so the CLI reports it as a refusal.
var ErrDeadLetterSuperseded = fmt.Errorf("%w: the dead letter belongs to a model a rebuild replaced", projector.ErrInvalidTransition)

// ErrWrongVersion: a retry was asked of a binary whose projection is not
// the version of the consumer's live model (a rolling deploy's other
// binary, or one whose rebuild has not switched in): its handlers must not
// write the live tables. A dispatcher leaves such a retry request for one
// of the right version. It matches [projector.ErrInvalidTransition] too.
var ErrWrongVersion = fmt.Errorf("%w: the projection is not the version of the consumer's live model", projector.ErrInvalidTransition)

// ErrInvalidFilter: a dead-letter listing was asked for with a value that
// cannot be a filter (a negative limit, an unknown status or reason).
var ErrInvalidFilter = errors.New("projection: invalid dead-letter filter")

// DeadLetter is one row of the dead-letter table: an event a continuous-mode
// consumer could not apply, and what has been done about it since.
type DeadLetter struct {
	ID         int64              `json:"id"`
	Consumer   string             `json:"consumer"`
	Instance   string             `json:"instance_id"`
	EventID    uuid.UUID          `json:"event_id"`
	Position   projector.Position `json:"-"`
	EventType  string             `json:"event_type"`
	Tenant     string             `json:"tenant"`
	StreamType string             `json:"stream_type"`
	StreamID   string             `json:"stream_id"`
	Version    int64              `json:"version"`
	// Error is the last failure: the original one, or that of the last
	// failed retry.
	Error    string `json:"error"`
	Attempts int    `json:"attempts"`
	// Reason is why it was dead-lettered: "apply-error" or "skipped".
	Reason    string    `json:"reason"`
	Status    string    `json:"status"`
	CreatedAt time.Time `json:"created_at"`
	// ResolvedAt is when it was resolved or discarded.
	ResolvedAt *time.Time `json:"resolved_at,omitempty"`
	// LastRetriedAt is when a retry last ran.
	LastRetriedAt *time.Time `json:"last_retried_at,omitempty"`
	// RetryRequestedAt is set while a retry request waits for a dispatcher
	// that has the projection.
	RetryRequestedAt *time.Time `json:"retry_requested_at,omitempty"`
	// ModelRebuildID is the model of the consumer the dead letter was
	// recorded against: the id of the rebuild that built it, 0 for a
	// model never rebuilt. Only a dead letter of the live model can be
	// retried (see [ErrDeadLetterSuperseded]).
	ModelRebuildID int64 `json:"model_rebuild_id"`
}

// ValidateDeadLetterStatus checks a status to select dead letters by: one
// of [DeadLetterOpen], [DeadLetterResolved] and [DeadLetterDiscarded], or ""
// for all. The JetStream claims consumer's dead letters have the same three
// statuses, so its listing checks them here too and both refuse the same
// values alike. Errors match [ErrInvalidFilter].
func ValidateDeadLetterStatus(status string) error {
	switch status {
	case "", DeadLetterOpen, DeadLetterResolved, DeadLetterDiscarded:
		return nil
	}
	return fmt.Errorf("%w: status %s (want open, resolved or discarded)", ErrInvalidFilter, projector.Quoted(status))
}

// DeadLetterFilter selects dead letters; zero fields do not filter. The
// filters combine (AND).
type DeadLetterFilter struct {
	Consumer  string
	Instance  string
	EventType string
	Tenant    string
	// Reason is "apply-error" or "skipped".
	Reason string
	// Status is "open", "resolved", "discarded", or "" for all.
	Status string
	// Since keeps dead letters recorded at or after it.
	Since time.Time
	// AfterID pages: only dead letters with a larger id (pass the last id
	// of the previous page).
	AfterID int64
	// Limit caps the rows returned; 0 means 100.
	Limit int
	// Model is "" for all, [ModelLive] for dead letters of their
	// consumer's live model (the ones a retry may apply), or
	// [ModelSuperseded] for those of a model a rebuild replaced or of a
	// cancelled rebuild, which can only be discarded (see
	// [ErrDeadLetterSuperseded]). Neither holds those of a rebuild still
	// building.
	Model string
}

// The models a [DeadLetterFilter] selects by.
const (
	ModelLive       = "live"
	ModelSuperseded = "superseded"
)

// liveModelSQL is the id of the rebuild that built the live model of the
// consumer named by the expression {{c}}: its latest switched or in-place
// rebuild, 0 when it was never rebuilt (as migration 0011's trigger
// records it on each dead letter).
const liveModelSQL = `coalesce((SELECT max(r.id) FROM {{r}} r WHERE r.name = {{c}} AND (r.status = 'switched' OR r.mode = 'in-place')), 0)`

func liveModel(store *postgres.Store, consumer string) string {
	return strings.NewReplacer("{{r}}", store.Table("projector_rebuilds"), "{{c}}", consumer).Replace(liveModelSQL)
}

const deadLetterColumns = `id, consumer, instance_id, event_id, event_tx_id, event_seq, event_type, tenant_id,
	stream_type, stream_id, version, error, attempts, reason, status, created_at, resolved_at, last_retried_at, retry_requested_at, model_rebuild_id`

func scanDeadLetter(row pgx.CollectableRow) (DeadLetter, error) {
	var dl DeadLetter
	err := row.Scan(&dl.ID, &dl.Consumer, &dl.Instance, &dl.EventID, &dl.Position.TxID, &dl.Position.Seq, &dl.EventType,
		&dl.Tenant, &dl.StreamType, &dl.StreamID, &dl.Version, &dl.Error, &dl.Attempts, &dl.Reason, &dl.Status,
		&dl.CreatedAt, &dl.ResolvedAt, &dl.LastRetriedAt, &dl.RetryRequestedAt, &dl.ModelRebuildID)
	return dl, err
}

// validatePage checks the page a listing of dead letters or parks is asked
// for: limit 0..10000 (0 for 100) and an after id that is not negative.
// Its errors match invalid, the listing's sentinel.
func validatePage(invalid error, limit int, afterID int64) error {
	if limit < 0 || limit > 10_000 {
		return fmt.Errorf("%w: limit %d (want 1 to 10000, 0 for 100)", invalid, limit)
	}
	if afterID < 0 {
		return fmt.Errorf("%w: after id %d is negative", invalid, afterID)
	}
	return nil
}

// ListDeadLetters returns the dead letters f selects, in id order (the
// order they were recorded), at most f.Limit of them.
func ListDeadLetters(ctx context.Context, store *postgres.Store, f DeadLetterFilter) ([]DeadLetter, error) {
	if err := validatePage(ErrInvalidFilter, f.Limit, f.AfterID); err != nil {
		return nil, err
	}
	if err := ValidateDeadLetterStatus(f.Status); err != nil {
		return nil, err
	}
	switch f.Reason {
	case "", "apply-error", "skipped":
	default:
		return nil, fmt.Errorf("%w: reason %q (want apply-error or skipped)", ErrInvalidFilter, f.Reason)
	}
	switch f.Model {
	case "", ModelLive, ModelSuperseded:
	default:
		return nil, fmt.Errorf("%w: model %q (want live or superseded)", ErrInvalidFilter, f.Model)
	}
	for _, c := range [...]struct{ what, v string }{{"consumer", f.Consumer}, {"instance", f.Instance},
		{"event type", f.EventType}, {"tenant", f.Tenant}} {
		if err := projector.ValidText(c.v); err != nil {
			return nil, fmt.Errorf("%w: %s %s %w", ErrInvalidFilter, c.what, projector.Printable(c.v), err)
		}
	}
	if f.Limit == 0 {
		f.Limit = 100
	}
	// The filters are optional and combine: the query's shape changes at
	// run time, which is what squirrel is for.
	b := sq.StatementBuilder.PlaceholderFormat(sq.Dollar).
		Select(deadLetterColumns).From(store.Table("projector_dead_letters") + " d").
		Where(sq.Gt{"id": f.AfterID}).OrderBy("id").Limit(uint64(f.Limit))
	// In a fixed order, so equal filters give the same SQL text (and one
	// cached statement).
	for _, c := range [...]struct{ col, v string }{{"consumer", f.Consumer}, {"instance_id", f.Instance},
		{"event_type", f.EventType}, {"tenant_id", f.Tenant}, {"reason", f.Reason}, {"status", f.Status}} {
		if c.v != "" {
			b = b.Where(sq.Eq{c.col: c.v})
		}
	}
	if !f.Since.IsZero() {
		b = b.Where(sq.GtOrEq{"created_at": f.Since})
	}
	switch f.Model {
	case ModelLive:
		b = b.Where(`d.instance_id <> '` + RebuildInstance + `' AND d.model_rebuild_id = ` + liveModel(store, "d.consumer"))
	case ModelSuperseded:
		b = b.Where(`d.model_rebuild_id <> ` + liveModel(store, "d.consumer") + ` AND NOT EXISTS (SELECT 1 FROM ` +
			store.Table("projector_rebuilds") + ` a WHERE a.id = d.model_rebuild_id AND a.status IN ('building', 'ready'))`)
	}
	sql, args, err := b.ToSql()
	if err != nil {
		return nil, fmt.Errorf("list dead letters: build query: %w", err)
	}
	rows, err := store.Pool().Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanDeadLetter)
	if err != nil {
		return nil, fmt.Errorf("list dead letters: %w", err)
	}
	return out, nil
}

// GetDeadLetter returns dead letter id and its event from the log, hot or
// archived, or a nil event if the event was pruned since (dead letters are never pruned,
// events may be). An unknown id matches [projector.ErrNotFound].
func GetDeadLetter(ctx context.Context, store *postgres.Store, id int64) (DeadLetter, *projector.Event, error) {
	return getDeadLetterWithEvent(ctx, store, id, false)
}

// GetDeadLetterRaw is [GetDeadLetter] with the event undecoded: it carries
// Data but no Payload, and a type the store's registry does not know is
// returned rather than failing the read. It is for tools that show a dead
// letter without the application's types, as the stock `projector
// dead-letters show` and the console do.
func GetDeadLetterRaw(ctx context.Context, store *postgres.Store, id int64) (DeadLetter, *projector.Event, error) {
	return getDeadLetterWithEvent(ctx, store, id, true)
}

func getDeadLetterWithEvent(ctx context.Context, store *postgres.Store, id int64, raw bool) (DeadLetter, *projector.Event, error) {
	dl, err := getDeadLetter(ctx, store.Pool(), store, id, false)
	if err != nil {
		return DeadLetter{}, nil, err
	}
	ev, err := deadLetterEvent(ctx, store.Pool(), store, dl, raw)
	if err != nil {
		return dl, nil, err
	}
	return dl, ev, nil
}

func getDeadLetter(ctx context.Context, db postgres.DBTX, store *postgres.Store, id int64, forUpdate bool) (DeadLetter, error) {
	q := `SELECT ` + deadLetterColumns + ` FROM ` + store.Table("projector_dead_letters") + ` WHERE id = $1`
	if forUpdate {
		q += ` FOR UPDATE`
	}
	rows, err := db.Query(ctx, q, id)
	if err != nil {
		return DeadLetter{}, fmt.Errorf("dead letter %d: %w", id, err)
	}
	dl, err := pgx.CollectExactlyOneRow(rows, scanDeadLetter)
	if errors.Is(err, pgx.ErrNoRows) {
		return DeadLetter{}, fmt.Errorf("dead letter %d: %w", id, projector.ErrNotFound)
	}
	if err != nil {
		return DeadLetter{}, fmt.Errorf("dead letter %d: %w", id, err)
	}
	return dl, nil
}

// deadLetterEvent reads a dead letter's event through its stream (the
// store's public read, decoding unless raw), nil if it is gone. The
// archive is read too, in the same statement: a consumer registered or
// rewound behind `streams archive` reads archived events and may fail on
// one, and an archived event is still in the log — only a pruned one is
// gone. (One statement, one snapshot: an unarchive moving the stream back
// meanwhile shows the event in one table or the other, never neither.)
func deadLetterEvent(ctx context.Context, db postgres.DBTX, store *postgres.Store, dl DeadLetter, raw bool) (*projector.Event, error) {
	stream := projector.StreamRef{Tenant: dl.Tenant, Type: dl.StreamType, ID: dl.StreamID}
	events, err := store.ReadStreamTx(ctx, db, stream, postgres.StreamQuery{FromVersion: dl.Version, ToVersion: dl.Version, Raw: raw, IncludeArchived: true})
	if err != nil {
		return nil, fmt.Errorf("dead letter %d: read its event: %w", dl.ID, err)
	}
	if len(events) != 1 || events[0].ID != dl.EventID {
		return nil, nil
	}
	return &events[0], nil
}

// DiscardDeadLetters marks open dead letters discarded: given up on, kept
// for the record. All or none: an unknown id matches
// [projector.ErrNotFound], one that is not open
// [projector.ErrInvalidTransition], and then nothing is changed.
func DiscardDeadLetters(ctx context.Context, store *postgres.Store, ids []int64) error {
	if len(ids) == 0 {
		return fmt.Errorf("%w: discard: no dead-letter ids", ErrInvalidFilter)
	}
	return pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		for _, id := range ids {
			dl, err := getDeadLetter(ctx, tx, store, id, true)
			if err != nil {
				return fmt.Errorf("discard: %w", err)
			}
			if dl.Status != DeadLetterOpen {
				return fmt.Errorf("discard dead letter %d: it is %s already: %w", id, dl.Status, projector.ErrInvalidTransition)
			}
			if _, err := tx.Exec(ctx, `UPDATE `+store.Table("projector_dead_letters")+`
				SET status = 'discarded', resolved_at = now(), retry_requested_at = NULL WHERE id = $1`, id); err != nil {
				return fmt.Errorf("discard dead letter %d: %w", id, err)
			}
		}
		return nil
	})
}

// RequestDeadLetterRetry records a retry request on open dead letters, for
// a dispatcher that has the consumer's projection registered to carry out:
// a binary without the projection's code cannot run its handlers. Once
// committed it wakes the dispatchers' retry loops, which otherwise look
// only every Recheck. All or none, refused like [DiscardDeadLetters]; an
// event pruned meanwhile matches [ErrEventPruned].
func RequestDeadLetterRetry(ctx context.Context, store *postgres.Store, ids []int64) error {
	if len(ids) == 0 {
		return fmt.Errorf("%w: retry: no dead-letter ids", ErrInvalidFilter)
	}
	var consumers []string
	err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		consumers = consumers[:0]
		for _, id := range ids {
			dl, err := getDeadLetter(ctx, tx, store, id, true)
			if err != nil {
				return fmt.Errorf("retry: %w", err)
			}
			if dl.Status != DeadLetterOpen {
				return fmt.Errorf("retry dead letter %d: it is %s already: %w", id, dl.Status, projector.ErrInvalidTransition)
			}
			if err := checkModel(ctx, tx, store, dl); err != nil {
				return err
			}
			// Raw: a request only needs the event to be there (the stock
			// binary, which knows no application types, files it too); the
			// dispatcher that carries it out decodes it.
			ev, err := deadLetterEvent(ctx, tx, store, dl, true)
			if err != nil {
				return err
			}
			if ev == nil {
				return fmt.Errorf("retry dead letter %d (%s %s): %w; discard it", id, projector.Printable(dl.EventType), dl.EventID, ErrEventPruned)
			}
			if _, err := tx.Exec(ctx, `UPDATE `+store.Table("projector_dead_letters")+`
				SET retry_requested_at = now() WHERE id = $1`, id); err != nil {
				return fmt.Errorf("request retry of dead letter %d: %w", id, err)
			}
			consumers = append(consumers, dl.Consumer)
		}
		return nil
	})
	if err != nil {
		return err
	}
	_ = wakeRetries(ctx, store, consumers...)
	return nil
}

// RetryResult is what one retry of a dead letter did.
type RetryResult struct {
	ID int64 `json:"id"`
	// Resolved: the handler applied the event, committed with the dead
	// letter marked resolved.
	Resolved bool `json:"resolved"`
	// Error is the handler's new error when it failed again; the dead letter
	// stays open with it and one more attempt.
	Error    string `json:"error,omitempty"`
	Attempts int    `json:"attempts"`
	// OutOfOrder: the consumer had applied later events of the same stream
	// already, so this one was applied after them (what continuous mode
	// means; the handler must cope).
	OutOfOrder bool `json:"out_of_order"`
}

// RetryDeadLetter applies dead letter id's event again through p's
// handlers, in this process, in one transaction with its new status: a
// retry that succeeds commits the handler's writes and "resolved" together,
// so the event is applied exactly once however often retries are asked
// for (a second retry of a resolved one is refused with
// [projector.ErrInvalidTransition]); a retry that fails rolls the handler's
// writes back and keeps the dead letter open with the new error and one
// more attempt (a nil error with Resolved false). A retry aborted by a
// conflict (a deadlock, a serialization failure, in the handler or not, or
// a lost connection) says nothing about the event: it is tried again, a
// few times, and then returned as an error with nothing recorded; a handler
// failure that is not about the event ([IsSystemic]: a missing table or
// grant) is returned at once, with nothing recorded either. It waits
// for the consumer shard's lock, so it never runs beside a pass of the
// same shard.
//
// The event is applied as live, not as a replay: it never was applied, so
// [Replaying] is false and [Emit] appends. AfterCommit is not called. The
// dead letter must belong to p (matched by name); an event pruned
// meanwhile matches [ErrEventPruned]. On a partition, a forget of the
// event's subject committed while the retry ran makes it apply the event
// again as it reads now (applyGuarded). logger receives handler panics;
// nil means slog.Default().
func RetryDeadLetter(ctx context.Context, store *postgres.Store, p *Async, id int64, logger *slog.Logger) (RetryResult, error) {
	var res RetryResult
	err := retryConflicts(ctx, fmt.Sprintf("retry dead letter %d", id), func() error {
		var err error
		res, _, err = retryDeadLetter(ctx, store, p, id, logger, false)
		return err
	})
	return res, err
}

// errNoRequest: a dispatcher found the retry request it was about to carry
// out gone (another dispatcher of the projection did it first).
var errNoRequest = errors.New("retry request carried out elsewhere")

// retryDeadLetter is [RetryDeadLetter]; requested makes it a dispatcher's
// carrying out of a retry request, which does nothing (errNoRequest) if the
// request is gone under the lock: several dispatchers of one projection
// may pick up the same request, and only one may try.
func retryDeadLetter(ctx context.Context, store *postgres.Store, p *Async, id int64, logger *slog.Logger, requested bool) (RetryResult, bool, error) {
	res := RetryResult{ID: id}
	if err := p.Validate(store.Registry()); err != nil {
		return res, false, err
	}
	if logger == nil {
		logger = slog.Default()
	}
	dl, err := getDeadLetter(ctx, store.Pool(), store, id, false)
	if err != nil {
		return res, false, fmt.Errorf("retry: %w", err)
	}
	if dl.Consumer != p.name {
		return res, false, fmt.Errorf("retry dead letter %d: it belongs to consumer %s, not %s: %w", id,
			projector.Printable(dl.Consumer), projector.Printable(p.name), projector.ErrInvalidTransition)
	}
	dt := store.Table("projector_dead_letters")
	err = pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		shardID := ShardID{Consumer: dl.Consumer, Instance: dl.Instance}
		dl, err := lockForRetry(ctx, tx, store, p, shardID, requested, retryCheck[DeadLetter]{
			what: fmt.Sprintf("dead letter %d", id),
			read: func() (DeadLetter, error) { return getDeadLetter(ctx, tx, store, id, true) },
			open: func(dl DeadLetter) (string, bool, bool) {
				return dl.Status, dl.Status == DeadLetterOpen, dl.RetryRequestedAt != nil
			},
			// Under the shard's lock, which rebuilds and switches take too:
			// the live model cannot change until this commits.
			check:    func(dl DeadLetter) error { return checkModel(ctx, tx, store, dl) },
			instance: func(dl DeadLetter) string { return dl.Instance },
		})
		if err != nil {
			return err
		}
		read := func() ([]projector.Event, error) {
			ev, err := deadLetterEvent(ctx, tx, store, dl, false)
			if err != nil {
				return nil, err
			}
			if ev == nil {
				return nil, fmt.Errorf("retry dead letter %d (%s %s): %w; discard it", id, dl.EventType, dl.EventID, ErrEventPruned)
			}
			return []projector.Event{*ev}, nil
		}
		// Later events of the stream may be archived (a consumer behind
		// the archive read them there): both tables, in one statement.
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM (SELECT tenant_id, stream_type, stream_id, version, tx_id, seq FROM `+store.Table("projector_events")+`
					UNION ALL SELECT tenant_id, stream_type, stream_id, version, tx_id, seq FROM `+store.Table("projector_events_archive")+`) e
				JOIN `+store.Table("projector_consumers")+` c ON c.name = $4 AND c.instance_id = $5
				WHERE e.tenant_id = $1 AND e.stream_type = $2 AND e.stream_id = $3 AND e.version > $6
				  AND (e.tx_id, e.seq) <= (c.cursor_tx_id, c.cursor_seq))`,
			dl.Tenant, dl.StreamType, dl.StreamID, dl.Consumer, dl.Instance, dl.Version).Scan(&res.OutOfOrder); err != nil {
			return fmt.Errorf("retry dead letter %d: check order: %w", id, err)
		}
		// On a partition, a forget of the event's subject is guarded
		// against (forgetguard.go).
		events, herr, err := applyGuarded(ctx, tx, store, retryGuardsForgets(store, p, shardID), fmt.Sprintf("dead letter %d", id), read,
			func(events []projector.Event) (error, error) {
				return applyLive(ctx, tx, store, p, shardID, events, logger)
			})
		if err != nil {
			return err
		}
		if herr != nil { // (a retry that succeeded collects nothing)
			herr = RedactError(herr, OpenedEvents(store.Registry(), events...)...)
		}
		if err := retryNotAboutEvent(fmt.Sprintf("dead letter %d", id), herr, requested); err != nil {
			return err
		}
		res.Attempts = dl.Attempts + 1
		if herr == nil {
			res.Resolved = true
			_, err = tx.Exec(ctx, `UPDATE `+dt+` SET status = 'resolved', resolved_at = now(), last_retried_at = now(),
				attempts = attempts + 1, retry_requested_at = NULL WHERE id = $1`, id)
		} else {
			res.Error = StoredError(herr)
			_, err = tx.Exec(ctx, `UPDATE `+dt+` SET error = $2, last_retried_at = now(),
				attempts = attempts + 1, retry_requested_at = NULL WHERE id = $1`, id, "retry: "+StoredError(herr))
		}
		if err != nil {
			return fmt.Errorf("retry dead letter %d: record the outcome: %w", id, err)
		}
		return nil
	})
	// The shard's lock is free again: a pass that found it taken looks now.
	_ = WakeShards(ctx, store, ShardID{Consumer: dl.Consumer, Instance: dl.Instance})
	if errors.Is(err, errNoRequest) {
		return RetryResult{ID: id}, false, nil
	}
	if err != nil {
		return RetryResult{ID: id}, false, err
	}
	logger.InfoContext(ctx, "projection: dead letter retried", slog.Int64("id", id), slog.String("consumer", dl.Consumer),
		slog.Bool("resolved", res.Resolved), slog.Bool("out_of_order", res.OutOfOrder), slog.String("error", res.Error))
	return res, true, nil
}

// retryCheck says how [lockForRetry] reads and checks what a retry applies
// (a dead letter, a park).
type retryCheck[T any] struct {
	// what names it in errors: "dead letter 5", "park 5".
	what string
	// read reads it again in the retry's transaction, under its row lock.
	read func() (T, error)
	// open returns its status, whether that is open, and whether a retry
	// request is pending on it.
	open func(T) (status string, open, requested bool)
	// check, if set, refuses it for a reason of its kind, before the
	// version is checked.
	check func(T) error
	// instance returns the shard instance it belongs to now: a rebuild's
	// switch or a split may have moved it since the caller chose the lock.
	instance func(T) string
}

// lockForRetry is the start a retry of a dead letter or a park shares, in
// its transaction tx: it waits for the lock of consumer shard id (every
// pass, rebuild and switch takes it, so no batch runs beside the retry and
// the live model and its version cannot change until tx ends), reads the
// item again under its row lock (a racing retry or discard committed
// before this one got them), and refuses it when it is no longer open
// ([projector.ErrInvalidTransition]: of racing retries and discards exactly
// one wins), when c.check does, or when p is not the version of the
// shard's live model ([ErrWrongVersion]). requested makes it a dispatcher's
// carrying out of a retry request, which returns errNoRequest when the
// request is gone.
func lockForRetry[T any](ctx context.Context, tx pgx.Tx, store *postgres.Store, p *Async, id ShardID, requested bool, c retryCheck[T]) (T, error) {
	var zero T
	if err := LockShard(ctx, tx, store, id); err != nil {
		return zero, err
	}
	item, err := c.read()
	if err != nil {
		return zero, fmt.Errorf("retry: %w", err)
	}
	if now := c.instance(item); now != id.Instance {
		// Moved to another shard (a switch's hand-over, a split) while
		// this waited: the lock held is not the one that holds its passes
		// off, so nothing is applied; the caller reads it again.
		return zero, fmt.Errorf("retry %s: it moved from shard %s to %s meanwhile; try again: %w", c.what,
			projector.Printable(id.Instance), projector.Printable(now), projector.ErrInvalidTransition)
	}
	status, open, pending := c.open(item)
	if requested && !pending {
		return zero, errNoRequest
	}
	if !open {
		return zero, fmt.Errorf("retry %s: it is %s already (nothing applied again): %w", c.what, status, projector.ErrInvalidTransition)
	}
	if c.check != nil {
		if err := c.check(item); err != nil {
			return zero, err
		}
	}
	if err := checkVersion(ctx, tx, store, p, c.what, id); err != nil {
		return zero, err
	}
	return item, nil
}

// checkModel refuses a dead letter that does not belong to the consumer's
// live model with [ErrDeadLetterSuperseded], saying which rebuild replaced
// it: the live model is the one built by the consumer's latest switched or
// in-place rebuild (0: never rebuilt), as the insert trigger of migration
// 0011 records it.
func checkModel(ctx context.Context, tx pgx.Tx, store *postgres.Store, dl DeadLetter) error {
	r := store.Table("projector_rebuilds")
	var live int64
	if err := tx.QueryRow(ctx, `SELECT `+liveModel(store, "$1"), dl.Consumer).Scan(&live); err != nil {
		return fmt.Errorf("retry dead letter %d: read the consumer's live model: %w", dl.ID, err)
	}
	if dl.Instance != RebuildInstance && dl.ModelRebuildID == live {
		return nil
	}
	// Say which rebuild: the one that recorded it (a shadow shard's), or
	// the one that replaced its model.
	which := live
	if dl.Instance == RebuildInstance {
		which = dl.ModelRebuildID
	}
	var version int
	var mode, status string
	err := tx.QueryRow(ctx, `SELECT version, mode, status FROM `+r+` WHERE id = $1`, which).Scan(&version, &mode, &status)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("retry dead letter %d: read rebuild %d: %w", dl.ID, which, err)
	}
	name := projector.Printable(dl.Consumer)
	switch {
	case dl.Instance == RebuildInstance && (status == "building" || status == "ready"):
		return fmt.Errorf("retry dead letter %d: %w: it was recorded by the shadow shard of rebuild %d (v%d) of %s, which is still %s; "+
			"its model is not live, so there are no tables to retry it into: retry it after the switch", dl.ID, ErrDeadLetterSuperseded, which, version, name, status)
	case dl.Instance == RebuildInstance:
		return fmt.Errorf("retry dead letter %d: %w: it was recorded by the shadow shard of rebuild %d (v%d) of %s, which was %s, so nothing of its model is live; discard it",
			dl.ID, ErrDeadLetterSuperseded, which, version, name, cmp.Or(status, "deleted"))
	}
	return fmt.Errorf("retry dead letter %d: %w: it was recorded against the model of %s that rebuild %d (%s, v%d) replaced; "+
		"that rebuild replayed its event through the new model's handlers, which applied it or recorded a dead letter of their own "+
		"(dead-letters list --consumer %s), so a retry could apply it twice; discard it",
		dl.ID, ErrDeadLetterSuperseded, name, live, mode, version, name)
}

// checkVersion refuses, with [ErrWrongVersion], to run p's handlers for
// what (a dead letter, a park) of consumer shard id when its live model is
// of another version.
func checkVersion(ctx context.Context, tx pgx.Tx, store *postgres.Store, p *Async, what string, id ShardID) error {
	var live int
	err := tx.QueryRow(ctx, `SELECT version FROM `+store.Table("projector_consumers")+` WHERE name = $1 AND instance_id = $2`,
		id.Consumer, id.Instance).Scan(&live)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // the shard was removed: there is no live model to differ from
	}
	if err != nil {
		return fmt.Errorf("retry %s: read the consumer's version: %w", what, err)
	}
	if live != p.cfg.Version {
		return fmt.Errorf("retry %s: %w: the live model of %s is version %d and this binary's projection is version %d; "+
			"retry it with a binary of version %d (or, after a rebuild to version %d switches in, with this one)",
			what, ErrWrongVersion, projector.Printable(id.Consumer), live, p.cfg.Version, live, p.cfg.Version)
	}
	return nil
}

// applyLive runs p's handlers on events, in order, in tx the way a pass does
// (decoded payload, tenant scope, queued writes flushed, a savepoint that
// rolls a failure back, the projection's BatchTimeout), not as a replay.
// It returns the handler's error (then nothing of events is applied), or
// err when the transaction itself failed. tx ends scoped to the system
// tenant.
func applyLive(ctx context.Context, tx pgx.Tx, store *postgres.Store, p *Async, id ShardID, events []projector.Event, logger *slog.Logger) (herr, err error) {
	d := &Dispatcher{store: store, logger: logger, sql: buildDispatchSQL(store)}
	sh := &shard{id: id, proj: p}
	handlerCtx, cancel := context.WithTimeout(ctx, p.cfg.BatchTimeout)
	defer cancel()
	r := newRun(d, tx, sh, "", handlerCtx)
	k, herr := r.applyUntil(ctx, events, 0)
	if r.abort != nil {
		return nil, r.abort
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := r.unscope(ctx); err != nil {
		return nil, err
	}
	if k < 0 {
		return nil, nil
	}
	if herr == nil {
		herr = errors.New("handler failed")
	}
	return herr, nil
}

// retryLoop carries out the retry requests of dead letters and parks of
// this dispatcher's projections (`projector dead-letters retry` and
// `projector parked retry` without --here): each in its own transaction,
// the same as [RetryDeadLetter] and [RetryPark].
func (d *Dispatcher) retryLoop(ctx context.Context) {
	byName := map[string]*Async{}
	var names []string
	for _, sh := range d.allShards() {
		if sh.shadow == nil && byName[sh.id.Consumer] == nil {
			byName[sh.id.Consumer] = sh.proj
			names = append(names, sh.id.Consumer)
		}
	}
	if len(names) == 0 {
		return
	}
	q := `SELECT id, consumer FROM ` + d.store.Table("projector_dead_letters") + `
		WHERE retry_requested_at IS NOT NULL AND status = 'open' AND consumer = ANY($1)
		  AND (instance_id = ANY($2) OR instance_id LIKE '` + PartitionPrefix + `%') ORDER BY id LIMIT 100`
	// The shared shard's, this instance's and any partition's: a
	// partition's dead letters and parks are filed under its instance id,
	// and the retry takes that partition's lock, so any process running
	// the consumer may carry it out.
	instances := []string{SharedInstance, d.instance}
	ticker := time.NewTicker(d.cfg.Recheck)
	defer ticker.Stop()
	for {
		type req struct {
			id   int64
			name string
		}
		rows, err := d.store.Pool().Query(ctx, q, names, instances)
		var reqs []req
		if err == nil {
			reqs, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (req, error) {
				var r req
				return r, row.Scan(&r.id, &r.name)
			})
		}
		if err != nil && ctx.Err() == nil {
			d.logger.WarnContext(ctx, "projection dispatcher: looking for dead-letter retry requests failed", slog.Any("error", err))
		}
		for _, r := range reqs {
			_, _, err := retryDeadLetter(ctx, d.store, byName[r.name], r.id, d.logger, true)
			if errors.Is(err, ErrWrongVersion) {
				// A rolling deploy's other binary: leave the request to a
				// dispatcher of the live model's version.
				continue
			}
			if err != nil && ctx.Err() == nil && retryLater(err) {
				d.logger.WarnContext(ctx, "projection dispatcher: a dead-letter retry request failed; trying again at the next look",
					slog.Int64("id", r.id), slog.Any("error", err))
				continue
			}
			if err != nil && ctx.Err() == nil {
				// Clear the request, so one that cannot be carried out
				// (pruned meanwhile) is not tried on every poll.
				_, _ = d.store.Pool().Exec(context.WithoutCancel(ctx), `UPDATE `+d.store.Table("projector_dead_letters")+`
					SET retry_requested_at = NULL WHERE id = $1 AND status = 'open'`, r.id)
				d.logger.WarnContext(ctx, "projection dispatcher: a dead-letter retry request failed", slog.Int64("id", r.id), slog.Any("error", err))
			}
		}
		d.parkRetryRequests(ctx, byName, names, instances)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		case <-d.retryKick: // a request was committed (layoutnotify.go)
		}
	}
}
