package aggregate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// snapshotStatements holds the snapshot SQL with the table filled in once.
type snapshotStatements struct {
	load, insert, prune string
}

// loadSnapshotSQL finds the newest snapshot of this aggregate's current
// shape at or below a version (and, for as-of-time loads, folded from events
// recorded at or before a time): an index range scan on the primary key.
const loadSnapshotSQL = `
SELECT version, state FROM {{t}}
WHERE tenant_id = $1 AND stream_type = $2 AND stream_id = $3 AND aggregate = $4 AND snapshot_version = $5
  AND version <= $6 AND ($7::timestamptz IS NULL OR event_recorded_at <= $7::timestamptz)
ORDER BY version DESC
LIMIT 1`

// insertSnapshotSQL ignores a snapshot that already exists: the state at a
// version of one shape is the same whoever folded it.
const insertSnapshotSQL = `
INSERT INTO {{t}} (tenant_id, stream_type, stream_id, aggregate, snapshot_version, version, state, event_recorded_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT DO NOTHING`

// pruneSnapshotsSQL keeps the newest $5+1 snapshots of a stream and
// aggregate, whatever their shape, so snapshots of a shape no longer in use
// age out too.
const pruneSnapshotsSQL = `
DELETE FROM {{t}}
WHERE tenant_id = $1 AND stream_type = $2 AND stream_id = $3 AND aggregate = $4
  AND version < (
	SELECT version FROM {{t}}
	WHERE tenant_id = $1 AND stream_type = $2 AND stream_id = $3 AND aggregate = $4
	ORDER BY version DESC
	OFFSET $5 LIMIT 1)`

// snapshotSavepoint fences a snapshot write, so a failing one is undone
// without aborting the append's transaction.
const snapshotSavepoint = "projector_snapshot"

func buildSnapshotStatements(table string) snapshotStatements {
	r := strings.NewReplacer("{{t}}", table)
	return snapshotStatements{
		load:   r.Replace(loadSnapshotSQL),
		insert: r.Replace(insertSnapshotSQL),
		prune:  r.Replace(pruneSnapshotsSQL),
	}
}

// readSnapshot returns the newest usable snapshot at or below maxVersion
// (0: no bound) and recorded at or before until (zero: no bound), or a zero
// Loaded when there is none. A snapshot that fails to decode is logged and
// skipped: folding from the first event is slower, never wrong.
func (r *Repository[S]) readSnapshot(ctx context.Context, db postgres.DBTX, stream projector.StreamRef, maxVersion int64, until time.Time) (Loaded[S], error) {
	l := Loaded[S]{Stream: stream}
	if maxVersion <= 0 {
		maxVersion = math.MaxInt64
	}
	var untilArg *time.Time
	if !until.IsZero() {
		untilArg = &until
	}
	var version int64
	var data []byte
	err := db.QueryRow(ctx, r.sql.load, stream.Tenant, stream.Type, stream.ID, r.name, r.snap.Version, maxVersion, untilArg).Scan(&version, &data)
	if errors.Is(err, pgx.ErrNoRows) {
		return l, nil
	}
	if err != nil {
		return l, fmt.Errorf("read snapshot: %w", err)
	}
	if r.sealed() {
		if data, _, err = r.store.OpenData(ctx, db, stream.Tenant, r.snap.Personal, data); err != nil {
			return l, fmt.Errorf("read snapshot: %w", err)
		}
	}
	if err := json.Unmarshal(data, &l.State); err != nil {
		r.logger.WarnContext(ctx, "aggregate: ignoring a snapshot that does not decode; bump Snapshots.Version when the state's shape changes",
			slog.String("aggregate", r.name), slog.String("stream", stream.String()), slog.Int64("version", version),
			slog.Int("snapshot_version", r.snap.Version), slog.String("error", err.Error()))
		return Loaded[S]{Stream: stream}, nil
	}
	l.Version, l.FromSnapshot = version, version
	return l, nil
}

// sealed reports whether snapshots seal personal state fields.
func (r *Repository[S]) sealed() bool { return r.snap.Personal.Subject != "" }

// writeSnapshot stores l's state inside tx behind a savepoint, so that
// whatever goes wrong (a state that does not encode, a missing grant, a
// constraint) is undone and logged and the append it follows is untouched.
// It reports whether the snapshot was written.
func (r *Repository[S]) writeSnapshot(ctx context.Context, tx pgx.Tx, l Loaded[S], recordedAt time.Time) bool {
	if ctx.Err() != nil {
		return false
	}
	warn := func(msg string, err error) {
		r.logger.WarnContext(ctx, "aggregate: "+msg+"; the append is unaffected",
			slog.String("aggregate", r.name), slog.String("stream", l.Stream.String()), slog.Int64("version", l.Version),
			slog.String("error", err.Error()))
	}
	data, err := json.Marshal(l.State)
	if err != nil {
		warn("state does not encode as JSON, no snapshot written", err)
		return false
	}
	// The savepoint goes out on its own, so that whatever fails after it,
	// even before the batch reaches the server, there is one to roll back to.
	if _, err := tx.Exec(ctx, "SAVEPOINT "+snapshotSavepoint); err != nil {
		warn("could not open a savepoint for the snapshot", err)
		return false
	}
	s := l.Stream
	if r.sealed() {
		// After the savepoint: sealing may create the subject's key.
		if data, err = r.store.SealTx(ctx, tx, s.Tenant, r.snap.Personal, data); err != nil {
			warn("personal fields of the state could not be sealed, no snapshot written", err)
			undoSnapshot(ctx, tx)
			return false
		}
	}
	b := &pgx.Batch{}
	b.Queue(r.sql.insert, s.Tenant, s.Type, s.ID, r.name, r.snap.Version, l.Version, data, recordedAt)
	if r.snap.Keep > 0 {
		b.Queue(r.sql.prune, s.Tenant, s.Type, s.ID, r.name, r.snap.Keep-1)
	}
	b.Queue("RELEASE SAVEPOINT " + snapshotSavepoint)
	err = tx.SendBatch(ctx, b).Close()
	if err == nil {
		return true
	}
	warn("snapshot write failed and was rolled back to its savepoint", err)
	undoSnapshot(ctx, tx)
	return false
}

// undoSnapshot rolls tx back to the snapshot's savepoint, even when ctx is
// done, leaving the append before it untouched.
func undoSnapshot(ctx context.Context, tx pgx.Tx) {
	undo := context.WithoutCancel(ctx)
	if _, err := tx.Exec(undo, "ROLLBACK TO SAVEPOINT "+snapshotSavepoint); err == nil {
		_, _ = tx.Exec(undo, "RELEASE SAVEPOINT "+snapshotSavepoint)
	}
}
