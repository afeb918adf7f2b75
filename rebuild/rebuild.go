package rebuild

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// Mode is how a projection is rebuilt.
type Mode string

// The modes.
const (
	// BlueGreen builds the new version into shadow tables while the live
	// version serves, then switches atomically. The default.
	BlueGreen Mode = "blue-green"
	// InPlace clears the live tables and replays into them: readers see an
	// empty, then partial model until it catches up. For development and
	// small models.
	InPlace Mode = "in-place"
	// InlineRebuild is how [List] reports the rebuild of an inline
	// projection ([Inline], or [Request] of a name only the inline registry
	// knows): shadow tables built from the log while appends go on, switched
	// under a short lock. It is carried out by a process that has the
	// projection's code ([ServeInline], which `projector run` starts). It is
	// not an [Options.Mode]: Request picks it for inline projections.
	InlineRebuild Mode = "inline"
)

// Status is where a rebuild is.
type Status string

// The statuses.
const (
	// Building: replaying.
	Building Status = "building"
	// Ready: a blue/green rebuild held for a diff has caught up and waits
	// for Switch.
	Ready Status = "ready"
	// Swapping: the blue/green rebuild of a projection with an external
	// target (a Meilisearch index) has switched in PostgreSQL (cursor and
	// version moved) and its new target is being swapped in; the live
	// shard stands aside until a dispatcher of the version has done it.
	Swapping Status = "swapping"
	// Switched: the blue/green rebuild's tables are live.
	Switched Status = "switched"
	// Done: an in-place rebuild reached the position it started at.
	Done Status = "done"
	// Cancelled: stopped by an operator; nothing of it is live.
	Cancelled Status = "cancelled"
)

// Errors callers can test with errors.Is.
var (
	// ErrUnknownProjection: no dispatcher ever registered a projection of
	// that name (and version).
	ErrUnknownProjection = errors.New("rebuild: unknown projection")
	// ErrNoTables: the projection declares no read-model tables, so there
	// is nothing a rebuild could clear or copy.
	ErrNoTables = errors.New("rebuild: projection declares no tables")
	// ErrNotRebuildable: the projection cannot be rebuilt as it stands (a
	// per-instance consumer, a table shape a switch cannot carry).
	ErrNotRebuildable = errors.New("rebuild: projection cannot be rebuilt")
	// ErrActive: the projection is being rebuilt already.
	ErrActive = errors.New("rebuild: a rebuild of this projection is in progress")
	// ErrNotActive: no rebuild of the projection is in progress.
	ErrNotActive = errors.New("rebuild: no rebuild of this projection is in progress")
	// ErrPruned: retention deleted events the projection reads, so a
	// replay from the log could not be exact.
	ErrPruned = errors.New("rebuild: retention deleted events the projection needs")
	// ErrDisabled: an in-place rebuild of a disabled consumer was asked
	// for. It would clear the live tables for a replay no dispatcher runs
	// (a disabled shard is passed over), leaving an empty model waiting;
	// enable the consumer first, or rebuild blue/green. It is also an
	// [ErrNotRebuildable].
	ErrDisabled = fmt.Errorf("%w: its consumer is disabled", ErrNotRebuildable)
)

// MaxVersion is the highest projection version: versions are stored as
// PostgreSQL integers.
const MaxVersion = math.MaxInt32

// Options says how to rebuild.
type Options struct {
	// Mode defaults to BlueGreen.
	Mode Mode
	// Version is the projection version to build; zero means the highest
	// version a dispatcher has registered. A blue/green rebuild is carried
	// out by dispatchers running that version.
	Version int
	// Hold keeps a blue/green rebuild from switching once it caught up,
	// until Switch: time to compare the shadow tables with the live ones.
	Hold bool
}

// Rebuild is one rebuild's record, with its progress while it runs.
type Rebuild struct {
	ID           int64
	Name         string
	Version      int
	Mode         Mode
	Status       Status
	Hold         bool
	Tables       []string
	ShadowSchema string
	OldSchema    string
	// Target is the log's last event when the rebuild started, and
	// TotalEvents the number of events up to it.
	Target      projector.Position
	TotalEvents int64
	RequestedAt time.Time
	FinishedAt  time.Time
	// SwitchTook is how long the blue/green switch held the live tables.
	SwitchTook time.Duration
	Note       string
	// Cursor and Remaining measure an active rebuild: where its cursor is,
	// and how many events up to Target are still to replay.
	Cursor    projector.Position
	Remaining int64
}

// Active reports a rebuild still replaying, waiting to switch or
// swapping its external target in.
func (r Rebuild) Active() bool {
	return r.Status == Building || r.Status == Ready || r.Status == Swapping
}

// Progress is the share of the events up to Target replayed, 0 to 1.
func (r Rebuild) Progress() float64 {
	switch {
	case !r.Active() || r.Status == Swapping:
		return 1
	case r.TotalEvents <= 0:
		return 0
	}
	return min(1, max(0, float64(r.TotalEvents-r.Remaining)/float64(r.TotalEvents)))
}

var namePattern = regexp.MustCompile(`^[a-z][a-z0-9_.-]{0,99}$`)

// Request starts a rebuild of the projection name, recorded in the
// database so that dispatchers running the projection carry it out; the
// caller needs only the store, not the projection's code.
//
// In place, it clears the declared tables and rewinds the consumer in one
// transaction, after waiting for a running batch: a dispatcher anywhere
// then replays from the start, with handlers told they are replaying.
// Blue/green, it creates a shadow schema with copies of the declared tables
// (structure, indexes, grants and row-level-security policies) and a shadow
// shard that dispatchers of the requested version build it with; the switch
// happens when it has caught up.
//
// A name only the inline registry knows (an inline projection) records an
// [InlineRebuild], blue/green only, at the version the stores record, for a
// process with the projection's code to carry out ([ServeInline], which
// `projector run` starts, or [Inline]).
func Request(ctx context.Context, store *postgres.Store, name string, opts Options) (Rebuild, error) {
	opts.Mode = Mode(strings.TrimSpace(string(opts.Mode)))
	if opts.Mode == "" {
		opts.Mode = BlueGreen
	}
	if opts.Mode != BlueGreen && opts.Mode != InPlace {
		return Rebuild{}, fmt.Errorf("%w: mode %q: want %s or %s", ErrNotRebuildable, opts.Mode, BlueGreen, InPlace)
	}
	if opts.Version < 0 || opts.Version > MaxVersion {
		return Rebuild{}, fmt.Errorf("%w: version %d: want 1 to %d (0: the highest registered)", ErrUnknownProjection, opts.Version, MaxVersion)
	}
	if opts.Hold && opts.Mode == InPlace {
		return Rebuild{}, fmt.Errorf("%w: an in-place rebuild has no switch to hold", ErrNotRebuildable)
	}
	if !namePattern.MatchString(name) {
		return Rebuild{}, fmt.Errorf("%w: %s is not a projection name", ErrUnknownProjection, projector.Printable(name))
	}
	var out Rebuild
	err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		if inline, err := requestInline(ctx, tx, store, name, opts, &out); inline || err != nil {
			return err
		}
		decl, err := declaration(ctx, tx, store, name, opts.Version)
		if err != nil {
			return err
		}
		if opts.Mode == InPlace && decl.external != "" {
			return fmt.Errorf("%w: %s writes a %s index, which a rebuild cannot clear in place; rebuild it blue/green (the default)", ErrNotRebuildable, name, decl.external)
		}
		if err := checkPruned(ctx, tx, store, name, decl.eventTypes); err != nil {
			return err
		}
		// The unpartitioned shard's lock: a partitioned consumer's fence
		// lock, which splits and merges take too, so its partitions stay
		// as lockPartitions reads them until this commits.
		live := projection.ShardID{Consumer: name}
		if err := projection.LockShard(ctx, tx, store, live); err != nil {
			return err
		}
		var status, note string
		var version int
		err = tx.QueryRow(ctx, `SELECT status, version, coalesce(last_error, '') FROM `+store.Table("projector_consumers")+` WHERE name = $1 AND instance_id = $2`,
			name, projection.SharedInstance).Scan(&status, &version, &note)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: projection %s has no consumer yet; a dispatcher builds it from the start when it first runs", ErrNotRebuildable, name)
		}
		if err != nil {
			return fmt.Errorf("rebuild %s: %w", name, err)
		}
		partitioned := version == projection.PartitionedVersion
		if partitioned && projection.KeyedFenceNote(note) {
			// Its partitions hold keys, not streams: the hand-over of the
			// shadow's dead letters places them by stream (partition.go).
			return fmt.Errorf("%w: %s is partitioned by key (a saga): its state is not read-model tables a rebuild replays", ErrNotRebuildable, name)
		}
		if partitioned && opts.Mode == InPlace {
			// The fence is disabled by design; the partitions are what
			// replays (partition.go).
			if status, err = lockPartitions(ctx, tx, store, name); err != nil {
				return err
			}
		}
		if opts.Mode == InPlace && status == string(projection.StatusDisabled) {
			return fmt.Errorf("%w: an in-place rebuild of %s would clear its tables for a replay no dispatcher runs; enable it first (`projector consumer enable %s`), or rebuild it blue/green", ErrDisabled, name, name)
		}
		target, total, err := logEnd(ctx, tx, store, name)
		if err != nil {
			return err
		}
		id, err := insertRow(ctx, tx, store, name, decl, opts, target, total)
		if err != nil {
			return err
		}
		if opts.Mode == InPlace {
			err = startInPlace(ctx, tx, store, name, decl, partitioned)
		} else {
			err = startBlueGreen(ctx, tx, store, name, decl, id)
		}
		if err != nil {
			return err
		}
		if err := recheckPruned(ctx, tx, store, name, decl.eventTypes); err != nil {
			return err
		}
		out, err = get(ctx, tx, store, id)
		return err
	})
	// The consumer's locks are free again (and an in-place rebuild's
	// replay may start): its passes look now rather than at their
	// dispatcher's next Recheck.
	_ = projection.WakeConsumer(ctx, store, name)
	return out, err
}

// logEnd returns the log's last event and its number of events, the
// archive's included (a replay reads it): what a rebuild's progress is
// measured against.
func logEnd(ctx context.Context, tx pgx.Tx, store *postgres.Store, name string) (projector.Position, int64, error) {
	var target projector.Position
	var total int64
	e, a := store.Table("projector_events"), store.Table("projector_events_archive")
	err := tx.QueryRow(ctx, `SELECT tx_id, seq FROM ((SELECT tx_id, seq FROM `+e+` ORDER BY tx_id DESC, seq DESC LIMIT 1)
		UNION ALL (SELECT tx_id, seq FROM `+a+` ORDER BY tx_id DESC, seq DESC LIMIT 1)) u ORDER BY tx_id DESC, seq DESC LIMIT 1`).Scan(&target.TxID, &target.Seq)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return target, 0, fmt.Errorf("rebuild %s: read the log's end: %w", name, err)
	}
	if err := tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+e+`) + (SELECT count(*) FROM `+a+`)`).Scan(&total); err != nil {
		return target, 0, fmt.Errorf("rebuild %s: count the log: %w", name, err)
	}
	return target, total, nil
}

// requestInline records a rebuild of name if name is an inline projection
// (recorded by the stores that run it, and not an async projection's
// name): a process with its code carries it out (ServeInline). It reports
// whether name was an inline projection.
func requestInline(ctx context.Context, tx pgx.Tx, store *postgres.Store, name string, opts Options, out *Rebuild) (bool, error) {
	var version int
	var types []string
	err := tx.QueryRow(ctx, `SELECT i.version, i.event_types FROM `+store.Table("projector_inline_projections")+` i
		WHERE i.name = $1 AND NOT EXISTS (SELECT 1 FROM `+store.Table("projector_projections")+` p WHERE p.name = $1)`, name).Scan(&version, &types)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return true, fmt.Errorf("rebuild %s: read the inline projections: %w", name, err)
	}
	switch {
	case opts.Mode == InPlace:
		return true, fmt.Errorf("%w: %s is an inline projection: it is rebuilt into shadow tables and switched under a short lock while appends go on; drop --in-place", ErrNotRebuildable, name)
	case opts.Hold:
		return true, fmt.Errorf("%w: %s is an inline projection: its rebuild switches as soon as it has caught up (the appends keep writing the live tables); --hold and --diff are not available", ErrNotRebuildable, name)
	case opts.Version != 0 && opts.Version != version:
		return true, fmt.Errorf("%w: %s: the schema records version %d, not %d; an inline rebuild builds the version the appending stores run", ErrInlineVersion, name, version, opts.Version)
	}
	if err := checkPruned(ctx, tx, store, name, types); err != nil {
		return true, err
	}
	target, total, err := logEnd(ctx, tx, store, name)
	if err != nil {
		return true, err
	}
	// The tables are the projection's code's to say: the process that
	// carries the rebuild out records them when it starts.
	id, err := insertRow(ctx, tx, store, name, decl{version: version, tables: []string{}, eventTypes: types}, Options{Mode: BlueGreen}, target, total)
	if err != nil {
		return true, err
	}
	shadow, _ := inlineShadowSchema(store.Schema(), name)
	if _, err := tx.Exec(ctx, `UPDATE `+store.Table("projector_rebuilds")+` SET shadow_schema = $2 WHERE id = $1`, id, shadow); err != nil {
		return true, fmt.Errorf("rebuild %s: record: %w", name, err)
	}
	*out, err = get(ctx, tx, store, id)
	return true, err
}

// decl is what a projection version declared when a dispatcher started.
type decl struct {
	version    int
	tables     []string
	eventTypes []string
	// external is the kind of target outside PostgreSQL the projection
	// writes ("meilisearch"), "" for none.
	external string
}

func declaration(ctx context.Context, tx pgx.Tx, store *postgres.Store, name string, version int) (decl, error) {
	var d decl
	var delivery string
	err := tx.QueryRow(ctx, `SELECT version, tables, event_types, delivery, coalesce(external, '') FROM `+store.Table("projector_projections")+`
		WHERE name = $1 AND ($2 = 0 OR version = $2) ORDER BY version DESC LIMIT 1`, name, version).
		Scan(&d.version, &d.tables, &d.eventTypes, &delivery, &d.external)
	if errors.Is(err, pgx.ErrNoRows) {
		known, kerr := registered(ctx, tx, store)
		if kerr != nil {
			return d, kerr
		}
		if version != 0 {
			return d, fmt.Errorf("%w: no dispatcher has run version %d of %s (registered: %s); start one with that version first", ErrUnknownProjection, version, name, known)
		}
		return d, fmt.Errorf("%w: %s (registered: %s)", ErrUnknownProjection, name, known)
	}
	if err != nil {
		return d, fmt.Errorf("rebuild %s: read its declaration: %w", name, err)
	}
	if delivery != projection.Shared.String() {
		return d, fmt.Errorf("%w: %s is a per-instance consumer: its state lives in each process, not in tables", ErrNotRebuildable, name)
	}
	if len(d.tables) == 0 && d.external == "" {
		return d, fmt.Errorf("%w: %s declares no read-model tables (projection.AsyncConfig.Tables), so a rebuild would not know what to clear or copy; declare them and restart its dispatcher", ErrNoTables, name)
	}
	return d, nil
}

// registered lists the projection versions dispatchers have recorded.
func registered(ctx context.Context, tx pgx.Tx, store *postgres.Store) (string, error) {
	rows, err := tx.Query(ctx, `SELECT name || ' v' || version FROM `+store.Table("projector_projections")+` ORDER BY name, version`)
	if err != nil {
		return "", fmt.Errorf("rebuild: list projections: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", fmt.Errorf("rebuild: list projections: %w", err)
	}
	if len(names) == 0 {
		return "none", nil
	}
	return strings.Join(names, ", "), nil
}

func checkPruned(ctx context.Context, tx pgx.Tx, store *postgres.Store, name string, types []string) error {
	rows, err := tx.Query(ctx, `SELECT event_type || ' (' || deleted || ')' FROM `+store.Table("projector_pruned")+` WHERE event_type = ANY($1) ORDER BY 1`, types)
	if err != nil {
		return fmt.Errorf("rebuild %s: read retention's record: %w", name, err)
	}
	pruned, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("rebuild %s: read retention's record: %w", name, err)
	}
	if len(pruned) > 0 {
		return fmt.Errorf("%w: %s reads event types that `events prune` deleted events of: %s; a replay would build a model without them", ErrPruned, name, strings.Join(pruned, ", "))
	}
	return nil
}

// recheckPruned is checkPruned made exact against a concurrent `events
// prune`: the first check runs before the wait for the live shard's lock
// (so a refusal is quick), and a prune may commit after it, deleting events
// the live cursor passed but the rebuild's new or rewound cursor (not yet
// committed) has not. Prune reads the cursors under a SHARE lock on the
// consumers table; ROW EXCLUSIVE conflicts with it, and with nothing a
// dispatcher takes, so from here on a prune waits for this transaction and
// then sees its cursor, and a prune that committed before is in the record
// read after the lock. Called last, once the transaction has written its
// cursor (or, for a partial rebuild, read its events), so the lock is held
// only to the commit: a prune queued behind it makes every dispatcher's
// cursor write queue behind the prune.
func recheckPruned(ctx context.Context, tx pgx.Tx, store *postgres.Store, name string, types []string) error {
	if _, err := tx.Exec(ctx, `LOCK TABLE `+store.Table("projector_consumers")+` IN ROW EXCLUSIVE MODE`); err != nil {
		return fmt.Errorf("rebuild %s: lock out retention: %w", name, err)
	}
	return checkPruned(ctx, tx, store, name, types)
}

func insertRow(ctx context.Context, tx pgx.Tx, store *postgres.Store, name string, d decl, opts Options, target projector.Position, total int64) (int64, error) {
	var id int64
	err := tx.QueryRow(ctx, `INSERT INTO `+store.Table("projector_rebuilds")+`
			(name, version, mode, status, hold, tables, target_tx_id, target_seq, total_events)
		VALUES ($1, $2, $3, 'building', $4, $5, $6, $7, $8) RETURNING id`,
		name, d.version, string(opts.Mode), opts.Hold, d.tables, target.TxID, target.Seq, total).Scan(&id)
	if isUniqueViolation(err) {
		return 0, fmt.Errorf("%w: %s; follow it with `projector rebuild list`, or cancel it", ErrActive, name)
	}
	if err != nil {
		return 0, fmt.Errorf("rebuild %s: record: %w", name, err)
	}
	return id, nil
}

// startInPlace clears the tables and rewinds the consumer, under its lock.
// The events up to the consumer's old cursor are replays: the live version
// handled them, side effects and emitted events included. Events after it
// were never handled and are not replays, even those of transactions that
// commit later below the log's end.
//
// A partitioned consumer's partitions are rewound, each replaying up to its
// own cursor, under every partition's lock (lockPartitions); its fence
// stays as it is.
func startInPlace(ctx context.Context, tx pgx.Tx, store *postgres.Store, name string, d decl, partitioned bool) error {
	idents := make([]string, len(d.tables))
	for i, t := range d.tables {
		idents[i] = qualified(t)
	}
	if _, err := tx.Exec(ctx, `TRUNCATE `+strings.Join(idents, ", ")); err != nil {
		return fmt.Errorf("rebuild %s: clear its tables: %w", name, err)
	}
	// A shard still replaying up to a mark past its cursor (a blue/green
	// switch's, docs/rebuilds.md) handled the events up to the mark live
	// before: the replay goes up to there.
	laterMark := `replay_until_tx_id IS NOT NULL AND (replay_until_tx_id, replay_until_seq) > (cursor_tx_id, cursor_seq)`
	_, err := tx.Exec(ctx, `UPDATE `+store.Table("projector_consumers")+` SET cursor_tx_id = '0', cursor_seq = 0,
			status = CASE WHEN status = 'disabled' THEN 'disabled' ELSE 'idle' END, attempts = 0,
			last_error = NULL, last_error_at = NULL, failed_tx_id = NULL, failed_seq = NULL, failed_event_id = NULL,
			next_retry_at = NULL, version = $3,
			replay_until_tx_id = CASE WHEN `+laterMark+` THEN replay_until_tx_id ELSE NULLIF(cursor_tx_id, '0') END,
			replay_until_seq = CASE WHEN `+laterMark+` THEN replay_until_seq WHEN cursor_tx_id = '0' THEN NULL ELSE cursor_seq END,
			updated_at = now()
		WHERE name = $1 AND CASE WHEN $4 THEN starts_with(instance_id, $5) ELSE instance_id = $2 END`,
		name, projection.SharedInstance, d.version, partitioned, projection.PartitionPrefix)
	if err != nil {
		return fmt.Errorf("rebuild %s: rewind its consumer: %w", name, err)
	}
	return nil
}

func qualified(t string) string {
	schema, rel, _ := strings.Cut(t, ".")
	return pgx.Identifier{schema, rel}.Sanitize()
}

func isUniqueViolation(err error) bool {
	var pgErr interface{ SQLState() string }
	return errors.As(err, &pgErr) && pgErr.SQLState() == "23505"
}
