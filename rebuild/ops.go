package rebuild

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// queryer is what reading a rebuild needs: the pool or a transaction.
type queryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func selectRebuilds(store *postgres.Store, where string) string {
	c, e, a := store.Table("projector_consumers"), store.Table("projector_events"), store.Table("projector_events_archive")
	return `SELECT r.id, r.name, r.version, r.mode, r.status, r.hold, r.tables, coalesce(r.shadow_schema, ''), coalesce(r.old_schema, ''),
			r.target_tx_id, r.target_seq, r.total_events, r.requested_at, coalesce(r.finished_at, 'epoch'), coalesce(r.switch_ms, 0),
			coalesce(r.note, ''), coalesce(s.cursor_tx_id, '0'), coalesce(s.cursor_seq, 0),
			CASE WHEN r.status IN ('building', 'ready') AND s.name IS NOT NULL THEN (SELECT count(*) FROM ` + e + ` e
				WHERE (e.tx_id, e.seq) > (s.cursor_tx_id, s.cursor_seq) AND (e.tx_id, e.seq) <= (r.target_tx_id, r.target_seq))
				+ (SELECT count(*) FROM ` + a + ` e
				WHERE (e.tx_id, e.seq) > (s.cursor_tx_id, s.cursor_seq) AND (e.tx_id, e.seq) <= (r.target_tx_id, r.target_seq))
				WHEN r.status IN ('building', 'ready') AND r.mode = 'blue-green' THEN r.total_events ELSE 0 END,
			r.mode = 'in-place' AND r.status = 'building' AND s.name IS NOT NULL AND s.replayed
		FROM ` + store.Table("projector_rebuilds") + ` r
		` + projection.RebuildShardSQL(c) + `
		` + where
}

// scanRebuilds reads selectRebuilds' rows. An inline rebuild is recorded
// with mode 'blue-green' (it is one: shadow tables, an atomic switch) and
// the shadow schema only an inline rebuild of that name uses; it is
// reported as [InlineRebuild].
func scanRebuilds(store *postgres.Store, rows pgx.Rows) ([]Rebuild, []bool, error) {
	var out []Rebuild
	var finished []bool
	for rows.Next() {
		var r Rebuild
		var mode, status string
		var switchMS float64
		var done bool
		if err := rows.Scan(&r.ID, &r.Name, &r.Version, &mode, &status, &r.Hold, &r.Tables, &r.ShadowSchema, &r.OldSchema,
			&r.Target.TxID, &r.Target.Seq, &r.TotalEvents, &r.RequestedAt, &r.FinishedAt, &switchMS, &r.Note,
			&r.Cursor.TxID, &r.Cursor.Seq, &r.Remaining, &done); err != nil {
			rows.Close()
			return nil, nil, err
		}
		r.Mode, r.Status = Mode(mode), Status(status)
		if r.Mode == BlueGreen && isInlineShadow(store.Schema(), r.Name, r.ShadowSchema) {
			r.Mode = InlineRebuild
		}
		r.SwitchTook = time.Duration(switchMS * float64(time.Millisecond))
		if r.FinishedAt.Unix() == 0 {
			r.FinishedAt = time.Time{}
		}
		out = append(out, r)
		finished = append(finished, done)
	}
	return out, finished, rows.Err()
}

func get(ctx context.Context, q queryer, store *postgres.Store, id int64) (Rebuild, error) {
	rows, err := q.Query(ctx, selectRebuilds(store, `WHERE r.id = $1`), id)
	if err != nil {
		return Rebuild{}, fmt.Errorf("rebuild: read: %w", err)
	}
	rs, _, err := scanRebuilds(store, rows)
	if err != nil {
		return Rebuild{}, fmt.Errorf("rebuild: read: %w", err)
	}
	if len(rs) == 0 {
		return Rebuild{}, fmt.Errorf("rebuild %d: %w", id, projector.ErrNotFound)
	}
	return rs[0], nil
}

// List returns the rebuilds of the projection name ("" for all), newest
// first, with the progress of those in progress. An in-place rebuild whose
// consumer has replayed up to where it started is recorded as done here.
func List(ctx context.Context, store *postgres.Store, name string) ([]Rebuild, error) {
	var n *string
	if name != "" {
		n = &name
	}
	rows, err := store.Pool().Query(ctx, selectRebuilds(store, `WHERE $1::text IS NULL OR r.name = $1 ORDER BY r.id DESC`), n)
	if err != nil {
		return nil, fmt.Errorf("rebuild: list: %w", err)
	}
	rs, finished, err := scanRebuilds(store, rows)
	if err != nil {
		return nil, fmt.Errorf("rebuild: list: %w", err)
	}
	for i := range rs {
		if !finished[i] {
			continue
		}
		if _, err := store.Pool().Exec(ctx, `UPDATE `+store.Table("projector_rebuilds")+` SET status = 'done', finished_at = now()
			WHERE id = $1 AND status = 'building'`, rs[i].ID); err != nil {
			return nil, fmt.Errorf("rebuild: record %s done: %w", rs[i].Name, err)
		}
		rs[i].Status, rs[i].Remaining, rs[i].FinishedAt = Done, 0, time.Now()
	}
	return rs, nil
}

// Current returns the projection's active rebuild, or its latest one, or
// an error matching projector.ErrNotFound.
func Current(ctx context.Context, store *postgres.Store, name string) (Rebuild, error) {
	rs, err := List(ctx, store, name)
	if err != nil {
		return Rebuild{}, err
	}
	if len(rs) == 0 {
		return Rebuild{}, fmt.Errorf("rebuild: no rebuild of %s: %w", projector.Printable(name), projector.ErrNotFound)
	}
	return rs[0], nil
}

// active locks and returns the projection's active rebuild.
func active(ctx context.Context, tx pgx.Tx, store *postgres.Store, name string) (id int64, mode Mode, schema string, err error) {
	var m string
	err = tx.QueryRow(ctx, `SELECT id, mode, coalesce(shadow_schema, '') FROM `+store.Table("projector_rebuilds")+`
		WHERE name = $1 AND status IN ('building', 'ready') FOR UPDATE`, name).Scan(&id, &m, &schema)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, "", "", fmt.Errorf("%w: %s", ErrNotActive, projector.Printable(name))
	}
	if err != nil {
		return 0, "", "", fmt.Errorf("rebuild %s: %w", name, err)
	}
	return id, Mode(m), schema, nil
}

// Cancel stops the projection's blue/green or inline rebuild: its shadow
// shard (an inline rebuild's cursor) and schema are dropped, after waiting
// for a running shadow batch, and the live model is untouched; a process
// replaying an inline rebuild stops at its next batch. An in-place rebuild cannot be cancelled: its
// tables were cleared when it started, and replaying is how they fill.
func Cancel(ctx context.Context, store *postgres.Store, name string) error {
	return pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		// The shadow shard's lock first, then the rebuild's row: a shadow
		// pass takes them in that order (it marks the row ready under its
		// lock), and the other order deadlocks with it.
		if err := projection.LockShard(ctx, tx, store, projection.ShardID{Consumer: name, Instance: projection.RebuildInstance}); err != nil {
			return err
		}
		id, mode, schema, err := active(ctx, tx, store, name)
		if err != nil {
			return err
		}
		if mode == InPlace {
			return fmt.Errorf("%w: %s is rebuilding in place: its tables were cleared when it started, so it can only run to the end", ErrNotRebuildable, name)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM `+store.Table("projector_consumers")+` WHERE name = $1 AND instance_id = $2`,
			name, projection.RebuildInstance); err != nil {
			return fmt.Errorf("rebuild %s: remove the shadow shard: %w", name, err)
		}
		if schema != "" {
			if _, err := tx.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`); err != nil {
				return fmt.Errorf("rebuild %s: drop the shadow schema: %w", name, err)
			}
		}
		// The shadow's parks (ParkStream) held events for a model that
		// never goes live: closed, kept for the record.
		if err := projection.DiscardShadowParks(ctx, tx, store, name, id); err != nil {
			return fmt.Errorf("rebuild %s: %w", name, err)
		}
		if _, err := tx.Exec(ctx, `UPDATE `+store.Table("projector_rebuilds")+` SET status = 'cancelled', finished_at = now() WHERE id = $1`, id); err != nil {
			return fmt.Errorf("rebuild %s: record: %w", name, err)
		}
		return nil
	})
}

// Switch lets a blue/green rebuild requested with Hold switch: the
// dispatcher building it switches once it has caught up (at once if it is
// ready).
func Switch(ctx context.Context, store *postgres.Store, name string) error {
	return pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		id, mode, _, err := active(ctx, tx, store, name)
		if err != nil {
			return err
		}
		if mode == InPlace {
			return fmt.Errorf("%w: %s is rebuilding in place: there is nothing to switch", ErrNotRebuildable, name)
		}
		if _, err := tx.Exec(ctx, `UPDATE `+store.Table("projector_rebuilds")+` SET hold = false WHERE id = $1`, id); err != nil {
			return fmt.Errorf("rebuild %s: release the switch: %w", name, err)
		}
		return nil
	})
}

// DropOld drops the tables a blue/green switch replaced (kept in the
// rebuild's "_old" schema until now) and returns the schemas it dropped.
func DropOld(ctx context.Context, store *postgres.Store, name string) ([]string, error) {
	if !namePattern.MatchString(name) {
		return nil, fmt.Errorf("%w: %s is not a projection name", ErrUnknownProjection, projector.Printable(name))
	}
	var dropped []string
	err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		var known bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+store.Table("projector_projections")+` WHERE name = $1)
			OR EXISTS (SELECT 1 FROM `+store.Table("projector_rebuilds")+` WHERE name = $1)`, name).Scan(&known); err != nil {
			return fmt.Errorf("rebuild %s: %w", name, err)
		}
		if !known {
			known, kerr := registered(ctx, tx, store)
			if kerr != nil {
				return kerr
			}
			return fmt.Errorf("%w: %s (registered: %s)", ErrUnknownProjection, name, known)
		}
		rows, err := tx.Query(ctx, `SELECT id, old_schema FROM `+store.Table("projector_rebuilds")+`
			WHERE name = $1 AND status = 'switched' AND old_schema IS NOT NULL ORDER BY id FOR UPDATE`, name)
		if err != nil {
			return fmt.Errorf("rebuild %s: %w", name, err)
		}
		type old struct {
			id     int64
			schema string
		}
		var olds []old
		for rows.Next() {
			var o old
			if err := rows.Scan(&o.id, &o.schema); err != nil {
				rows.Close()
				return fmt.Errorf("rebuild %s: %w", name, err)
			}
			olds = append(olds, o)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("rebuild %s: %w", name, err)
		}
		for _, o := range olds {
			if _, err := tx.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{o.schema}.Sanitize()+` CASCADE`); err != nil {
				return fmt.Errorf("rebuild %s: drop %s: %w", name, o.schema, err)
			}
			if _, err := tx.Exec(ctx, `UPDATE `+store.Table("projector_rebuilds")+` SET old_schema = NULL,
				note = 'old tables dropped ' || now()::text WHERE id = $1`, o.id); err != nil {
				return fmt.Errorf("rebuild %s: record: %w", name, err)
			}
			dropped = append(dropped, o.schema)
		}
		return nil
	})
	return dropped, err
}

// Wait polls the projection's latest rebuild every interval, calling fn
// with it, until it is no longer active; it returns that final record.
func Wait(ctx context.Context, store *postgres.Store, name string, every time.Duration, fn func(Rebuild)) (Rebuild, error) {
	if every <= 0 {
		every = 500 * time.Millisecond
	}
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		r, err := Current(ctx, store, name)
		if err != nil {
			return r, err
		}
		if fn != nil {
			fn(r)
		}
		if !r.Active() {
			return r, nil
		}
		select {
		case <-ctx.Done():
			return r, ctx.Err()
		case <-ticker.C:
		}
	}
}
