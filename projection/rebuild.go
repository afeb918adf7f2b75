package projection

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/clientcheck"
	"github.com/projectorhq/projector/stores/postgres"
)

// RebuildInstance is the instance id of the shadow shard of a blue/green
// rebuild: the consumer's second cursor, building the new version into
// shadow tables while the live shard keeps serving. It is reserved.
const RebuildInstance = "__rebuild__"

// SwitchLockTimeout bounds how long a blue/green switch waits for the
// ACCESS EXCLUSIVE locks on the live tables (readers in the middle of a
// query hold them off); past it the switch is postponed to the next pass,
// so readers are never queued behind it for longer.
const SwitchLockTimeout = time.Second

// shadow is what a shadow shard knows of its rebuild.
type shadow struct {
	rebuildID int64
	schema    string
	// tables are the live tables, "schema.table".
	tables []string
	replay *replayState
	// final is set after a pass caught up: the next pass tries the switch.
	final bool
	// retrySoon is set when a pass wanted to switch and could not.
	retrySoon bool
	// live are the live shards the last switching pass locked
	// (rebuild_partition.go).
	live []ShardID
	// misfit is set once a switch was refused because the live consumer
	// is partitioned otherwise than this version (said once).
	misfit bool
	// heldSaid is set once a switch was postponed for a merge's hold
	// (said once until it switches or the hold is gone).
	heldSaid bool
}

// replayState returns what handlers of sh see while replaying.
func (sh *shard) replayState() *replayState {
	if sh.shadow != nil {
		return sh.shadow.replay
	}
	return &replayState{}
}

// superseded is a live shard whose recorded model version is not this
// projection's: an older binary after a switch, or a newer one before its
// rebuild switched. Either way it must not write the tables, so it stands
// aside like a shard locked elsewhere, saying why once.
func (d *Dispatcher) superseded(ctx context.Context, sh *shard, live int) passResult {
	if sh.warnedVersion != live {
		sh.warnedVersion = live
		hint := "request a rebuild to build this version (projector rebuild " + sh.id.Consumer + "); if one is in progress, the switch hands the consumer to this version"
		if live > sh.proj.cfg.Version {
			hint = "a newer version switched in; this binary is out of date and leaves the consumer alone"
		}
		d.logger.WarnContext(ctx, "projection dispatcher: consumer's model is of another version; not running it here",
			slog.String("consumer", sh.id.String()), slog.Int("live_version", live), slog.Int("this_version", sh.proj.cfg.Version),
			slog.String("hint", hint))
	}
	return passResult{kind: passSuperseded}
}

// shadowPass prepares a shadow shard's transaction: its handlers' unqualified
// table names resolve to the shadow schema first, and its commits do not wait
// for the WAL flush (a lost commit is read again from the cursor; no reader
// uses these tables yet). After a pass that caught up, it also decides
// whether this pass may switch: the rebuild is not held for a diff, the
// live shard's lock is free (taken here, so the live model cannot move
// until this transaction ends), and the live shards fit (liveFits).
func (d *Dispatcher) shadowPass(ctx context.Context, tx pgx.Tx, sh *shard) (bool, error) {
	if _, err := tx.Exec(ctx, `SELECT set_config('search_path', $1 || ', ' || current_setting('search_path'), true),
		set_config('synchronous_commit', 'off', true)`, pgx.Identifier{sh.shadow.schema}.Sanitize()); err != nil {
		return false, fmt.Errorf("shadow pass: %w", err)
	}
	sh.shadow.retrySoon = false
	if !sh.shadow.final {
		return false, nil
	}
	var hold, locked bool
	var status string
	err := tx.QueryRow(ctx, `SELECT status, hold FROM `+d.store.Table("projector_rebuilds")+` WHERE id = $1`, sh.shadow.rebuildID).Scan(&status, &hold)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("shadow pass: read rebuild: %w", err)
	}
	if hold {
		if status == "building" {
			if _, err := tx.Exec(ctx, `UPDATE `+d.store.Table("projector_rebuilds")+` SET status = 'ready' WHERE id = $1`, sh.shadow.rebuildID); err != nil {
				return false, fmt.Errorf("shadow pass: mark rebuild ready: %w", err)
			}
			d.logger.InfoContext(ctx, "projection dispatcher: rebuild caught up; holding the switch until an operator runs `projector rebuild switch`",
				slog.String("consumer", sh.id.Consumer))
		}
		return false, nil
	}
	if locked, err = d.tryLockLive(ctx, tx, sh); err != nil {
		return false, err
	}
	// A live pass holds the lock for now: try again shortly, not after
	// Recheck (a quiet log would not wake the shadow shard sooner).
	sh.shadow.retrySoon = !locked
	if !locked {
		return false, nil
	}
	// Read under the locks, before the batch: a switching pass of a
	// partitioned consumer must switch once it read past the earliest
	// partition (rebuild_live.go).
	return d.liveFits(ctx, tx, sh)
}

// skippedNoSwitch is the result of a switching pass that left events to
// their partitions and then could not switch (readers held the live
// tables): its transaction rolls back, since its cursor passed events it
// did not apply, and the switch is tried again shortly.
func (sh *shard) skippedNoSwitch() passResult {
	return passResult{kind: passRetryAt, retryAt: time.Now().Add(switchRetry)}
}

// switchRetry is how soon a shadow shard that could not switch (a live pass
// held the live shard, or readers the tables) tries again.
const switchRetry = 50 * time.Millisecond

// shadowResult turns a caught-up shadow pass that wanted to switch and
// could not into a retry shortly.
func (sh *shard) shadowResult(res passResult) passResult {
	if sh.shadow != nil && sh.shadow.retrySoon && res.kind == passCaughtUp {
		res.kind, res.retryAt = passRetryAt, time.Now().Add(switchRetry)
	}
	return res
}

// switchShadow makes the shadow tables live, in the pass's transaction,
// which holds the shadow's and the live shards' locks (every partition's,
// for a partitioned consumer: rebuild_partition.go) and has just applied,
// after the shadow's cursor from, every event up to next that the live
// model had handled live (rebuild_live.go): the events up to the live
// cursors, which cannot move while their locks are held, so readers do not
// go back in time. Each live shard goes on from its own cursor, live
// (moveLiveCursors). The live
// tables move to an "_old" schema, kept for `projector rebuild drop-old`.
// If readers hold the live tables past SwitchLockTimeout, the switch is
// rolled back to a savepoint and tried again by a later pass.
func (d *Dispatcher) switchShadow(ctx context.Context, tx pgx.Tx, sh *shard, from, next projector.Position) (bool, error) {
	sw := sh.shadow
	c := d.store.Table("projector_consumers")
	if _, err := tx.Exec(ctx, `SAVEPOINT projector_switch`); err != nil {
		return false, fmt.Errorf("switch: %w", err)
	}
	started := time.Now()
	old := sw.schema + "_old"
	stmts := []string{fmt.Sprintf(`SET LOCAL lock_timeout = '%dms'`, SwitchLockTimeout.Milliseconds())}
	if len(sw.tables) > 0 {
		stmts = append(stmts, `CREATE SCHEMA `+pgx.Identifier{old}.Sanitize())
	}
	for _, t := range sw.tables {
		schema, rel, _ := strings.Cut(t, ".")
		stmts = append(stmts,
			`ALTER TABLE `+pgx.Identifier{schema, rel}.Sanitize()+` SET SCHEMA `+pgx.Identifier{old}.Sanitize(),
			`ALTER TABLE `+pgx.Identifier{sw.schema, rel}.Sanitize()+` SET SCHEMA `+pgx.Identifier{schema}.Sanitize())
	}
	for _, q := range stmts {
		if _, err := tx.Exec(ctx, q); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available
				if _, rerr := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT projector_switch`); rerr != nil {
					return false, fmt.Errorf("switch: %w", rerr)
				}
				sh.shadow.retrySoon = true
				d.logger.InfoContext(ctx, "projection dispatcher: rebuild switch postponed: readers hold the live tables",
					slog.String("consumer", sh.id.Consumer), slog.Duration("lock_timeout", SwitchLockTimeout))
				return false, nil
			}
			return false, fmt.Errorf("switch: %s: %w", q, err)
		}
	}
	took := time.Since(started)
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = 0`); err != nil {
		return false, fmt.Errorf("switch: %w", err)
	}
	// Before the live cursors move: what the live model applied of the
	// streams the shadow parked (rebuild_park.go).
	if err := d.markLiveThrough(ctx, tx, sh); err != nil {
		return false, err
	}
	if err := d.moveLiveCursors(ctx, tx, sh, from, next); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM `+c+` WHERE name = $1 AND instance_id = $2`, sh.id.Consumer, RebuildInstance); err != nil {
		return false, fmt.Errorf("switch: remove the shadow shard: %w", err)
	}
	// The shadow shard's dead letters are now the live model's.
	if err := d.handOverDeadLetters(ctx, tx, sh); err != nil {
		return false, err
	}
	// The live shards' open parks (ParkStream) are resolved, the shadow's
	// handed over (rebuild_park.go).
	if err := d.handOverParks(ctx, tx, sh); err != nil {
		return false, err
	}
	// A projection with an External target is not switched until its
	// target is swapped, after this commit (the swap cannot be part of
	// it): 'swapping' until then, and the live shard stands aside.
	status := "switched"
	if sh.proj.cfg.External != nil {
		status = "swapping"
	}
	var oldSchema *string
	if len(sw.tables) > 0 {
		oldSchema = &old
	}
	if _, err := tx.Exec(ctx, `UPDATE `+d.store.Table("projector_rebuilds")+` SET status = $4, old_schema = $2,
		finished_at = CASE WHEN $4 = 'switched' THEN now() END, switch_ms = $3 WHERE id = $1`,
		sw.rebuildID, oldSchema, float64(took.Microseconds())/1000, status); err != nil {
		return false, fmt.Errorf("switch: record: %w", err)
	}
	if _, err := tx.Exec(ctx, `DROP SCHEMA `+pgx.Identifier{sw.schema}.Sanitize()); err != nil {
		return false, fmt.Errorf("switch: drop the emptied shadow schema: %w", err)
	}
	return true, nil
}

// registerProjections records what each projection version declares, so an
// ops binary without the code can request its rebuild. Declared tables are
// resolved here, in a session like the handlers', to schema-qualified names.
func (d *Dispatcher) registerProjections(ctx context.Context) error {
	for _, sh := range d.allShards() {
		p := sh.proj
		tables := make([]string, 0, len(p.cfg.Tables))
		for _, t := range p.cfg.Tables {
			var q *string
			err := d.store.Pool().QueryRow(ctx, `SELECT n.nspname || '.' || c.relname FROM pg_class c
				JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)`, t).Scan(&q)
			if errors.Is(err, pgx.ErrNoRows) || (err == nil && q == nil) {
				return fmt.Errorf("projection dispatcher: projection %s declares table %q, which does not exist: create the read-model tables before starting the dispatcher", p.name, t)
			}
			if err != nil {
				return fmt.Errorf("projection dispatcher: resolve table %q of %s: %w", t, p.name, err)
			}
			tables = append(tables, *q)
		}
		var external *string
		if p.cfg.External != nil {
			kind := p.cfg.External.Kind()
			external = &kind
		}
		if _, err := d.store.Pool().Exec(ctx, `INSERT INTO `+d.store.Table("projector_projections")+`
				(name, version, tables, event_types, delivery, external) VALUES ($1, $2, $3, $4, $5, $6)
			ON CONFLICT (name, version) DO UPDATE SET tables = $3, event_types = $4, delivery = $5, external = $6, updated_at = now()`,
			p.name, p.cfg.Version, tables, p.t.types, p.cfg.Delivery.String(), external); err != nil {
			return fmt.Errorf("projection dispatcher: record projection %s: %w", p.name, err)
		}
	}
	return nil
}

// rebuildLoop looks for blue/green rebuilds of this dispatcher's
// projections at this dispatcher's versions and runs their shadow shards
// here (several dispatchers may: the shard lock lets one pass at a time).
func (d *Dispatcher) rebuildLoop(soft, hard context.Context) {
	var mu sync.Mutex
	running := map[int64]bool{}
	byName := map[string]*shard{}
	names := make([]string, 0)
	for _, sh := range d.allShards() {
		if sh.proj.cfg.Delivery == Shared {
			byName[sh.id.Consumer] = sh
			names = append(names, sh.id.Consumer)
		}
	}
	if len(names) == 0 {
		return
	}
	q := `SELECT id, name, version, shadow_schema, tables FROM ` + d.store.Table("projector_rebuilds") + `
		WHERE status IN ('building', 'ready') AND mode = 'blue-green' AND name = ANY($1)`
	ticker := time.NewTicker(d.cfg.Recheck)
	defer ticker.Stop()
	for {
		rows, err := d.store.Pool().Query(soft, q, names)
		if err == nil {
			for rows.Next() {
				var id int64
				var name, schema string
				var version int
				var tables []string
				if err = rows.Scan(&id, &name, &version, &schema, &tables); err != nil {
					break
				}
				live := byName[name]
				mu.Lock()
				skip := running[id] || live.proj.cfg.Version != version
				if !skip {
					running[id] = true
				}
				mu.Unlock()
				if skip {
					continue
				}
				sh := newShadowShard(d.store.Schema(), live, id, schema, tables)
				if err := d.prepareShadow(soft, sh); err != nil {
					d.logger.ErrorContext(soft, "projection dispatcher: preparing a rebuild's shadow tables failed; trying again later",
						slog.String("consumer", name), slog.Int("version", version), slog.Any("error", err))
					mu.Lock()
					delete(running, id)
					mu.Unlock()
					continue
				}
				d.logger.InfoContext(soft, "projection dispatcher: running a rebuild's shadow shard",
					slog.String("consumer", name), slog.Int("version", version), slog.String("shadow_schema", schema))
				d.wg.Go(func() {
					d.runShard(soft, hard, sh)
					d.dropCancelledShadow(soft, sh)
					mu.Lock()
					delete(running, id)
					mu.Unlock()
				})
			}
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
		if err != nil && soft.Err() == nil {
			d.logger.WarnContext(soft, "projection dispatcher: looking for rebuilds failed", slog.Any("error", err))
		}
		select {
		case <-soft.Done():
			return
		case <-ticker.C:
		}
	}
}

func newShadowShard(storeSchema string, live *shard, rebuildID int64, schema string, tables []string) *shard {
	id := ShardID{Consumer: live.id.Consumer, Instance: RebuildInstance}
	names := map[string]string{}
	for _, t := range tables {
		_, rel, _ := strings.Cut(t, ".")
		ident := pgx.Identifier{schema, rel}.Sanitize()
		names[t], names[rel] = ident, ident
	}
	return &shard{id: id, proj: live.proj, lockKey: shardLockKey(storeSchema, id), shadow: &shadow{
		rebuildID: rebuildID, schema: schema, tables: tables, replay: &replayState{tables: names, rebuildID: rebuildID},
	}}
}

// LockShard waits, in tx, for the advisory lock of a shard of store's
// schema: the lock every pass of that shard holds for its transaction. An
// operation that changes a shard's row or its tables from outside a pass
// (a rebuild's rewind, a cancel, a retry run in an operator's process)
// takes it first, so it never races a batch. Like a pass, tx then checks
// its client every second (internal/clientcheck), in the same round trip:
// an operator's process killed while tx waits, or while a handler it runs
// waits, must not leave a backend holding the shard's lock until the wait
// ends, when no pass of the shard could run.
func LockShard(ctx context.Context, tx pgx.Tx, store *postgres.Store, id ShardID) error {
	key := shardLockKey(store.Schema(), id.normal())
	var err error
	if clientcheck.Supported(tx.Conn().PgConn()) {
		b := &pgx.Batch{}
		b.Queue(clientcheck.SQL)
		b.Queue(waitShardLockSQL, key)
		err = tx.SendBatch(ctx, b).Close()
	} else {
		_, err = tx.Exec(ctx, waitShardLockSQL, key)
	}
	if err != nil {
		return fmt.Errorf("lock consumer %s: %w", id, err)
	}
	return nil
}

// prepareShadow runs the projection's PrepareShadow on a rebuild's shadow
// tables once, under the shadow shard's lock (so no pass writes them
// meanwhile), and records it in the same transaction.
func (d *Dispatcher) prepareShadow(ctx context.Context, sh *shard) error {
	return pgx.BeginFunc(ctx, d.store.Pool(), func(tx pgx.Tx) error {
		if err := LockShard(ctx, tx, d.store, sh.id); err != nil {
			return err
		}
		// No FOR UPDATE: the shard lock keeps other preparers and Cancel
		// out, and a row lock would give the transaction an id, holding back
		// every reader's horizon while an External target is prepared over
		// the network.
		var prepared, active bool
		err := tx.QueryRow(ctx, `SELECT prepared, status IN ('building', 'ready') FROM `+d.store.Table("projector_rebuilds")+` WHERE id = $1`,
			sh.shadow.rebuildID).Scan(&prepared, &active)
		if errors.Is(err, pgx.ErrNoRows) || prepared || (err == nil && !active) {
			return nil // gone or cancelled (the shadow loop will see it), or done already
		}
		if err != nil {
			return fmt.Errorf("read rebuild: %w", err)
		}
		if ext := sh.proj.cfg.External; ext != nil {
			if err := ext.PrepareShadow(ctx, sh.shadow.rebuildID); err != nil {
				return fmt.Errorf("prepare the shadow %s target of %s: %w", ext.Kind(), sh.id.Consumer, err)
			}
		}
		if fn := sh.proj.cfg.PrepareShadow; fn != nil {
			if _, err := tx.Exec(ctx, `SELECT set_config('search_path', $1 || ', ' || current_setting('search_path'), true)`,
				pgx.Identifier{sh.shadow.schema}.Sanitize()); err != nil {
				return fmt.Errorf("set search_path: %w", err)
			}
			ctx := withReplay(ctx, sh.shadow.replay)
			if err := fn(ctx, tx); err != nil {
				return fmt.Errorf("PrepareShadow of %s: %w", sh.id.Consumer, err)
			}
		}
		if _, err := tx.Exec(ctx, `UPDATE `+d.store.Table("projector_rebuilds")+` SET prepared = true WHERE id = $1`, sh.shadow.rebuildID); err != nil {
			return fmt.Errorf("record the shadow prepared: %w", err)
		}
		return nil
	})
}
