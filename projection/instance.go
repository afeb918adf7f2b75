package projection

// A dispatcher's instance: its heartbeat row in projector_instances, the
// registration of its shards before the first pass, and the clean-up once
// its loops have ended.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/stores/postgres"
)

// instanceSQL is what a dispatcher writes about its instance in
// projector_instances (migration 0005).
type instanceSQL struct {
	heartbeat, stopped, forget string
}

func buildInstanceSQL(store *postgres.Store) instanceSQL {
	i := store.Table("projector_instances")
	return instanceSQL{
		// One statement for the first heartbeat and every later one:
		// started_at is kept on conflict, everything else is this process's.
		heartbeat: `INSERT INTO ` + i + ` AS i (instance_id, random_id, consumers, heartbeat_every, expire_after)
			VALUES ($1, $2, $3, make_interval(secs => $4), make_interval(secs => $5))
			ON CONFLICT (instance_id) DO UPDATE SET random_id = EXCLUDED.random_id, consumers = EXCLUDED.consumers,
				heartbeat_every = EXCLUDED.heartbeat_every, expire_after = EXCLUDED.expire_after,
				last_seen_at = now(), stopped_at = NULL,
				started_at = CASE WHEN $6 THEN now() ELSE i.started_at END`,
		stopped: `UPDATE ` + i + ` SET stopped_at = now(), last_seen_at = now() WHERE instance_id = $1`,
		forget:  `DELETE FROM ` + i + ` WHERE instance_id = $1`,
	}
}

// heartbeat records that this instance is alive and which consumers it
// runs; start says it is the first of this process.
func (d *Dispatcher) heartbeat(ctx context.Context, db postgres.DBTX, start bool) error {
	names := make([]string, 0)
	for _, sh := range d.allShards() {
		if !slices.Contains(names, sh.id.Consumer) {
			names = append(names, sh.id.Consumer, versionMember(sh.id.Consumer, sh.proj.cfg.Version))
		}
	}
	for _, b := range d.balancers {
		names = append(names, b.member())
	}
	_, err := db.Exec(ctx, d.isql.heartbeat, d.instance, d.randomID, names, d.cfg.HeartbeatEvery.Seconds(), d.cfg.InstanceExpiry.Seconds(), start)
	if err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	return nil
}

// versionMember is what the instances row lists, beside NAME, for the
// model version of consumer NAME a process runs: NAME@vV, which no
// consumer name can be (a name has no '@'). Status shows a shard live only
// while a process of the shard's own version runs it
// (dispatcherColumns): a process of another version stands aside
// (superseded), and a blue/green rebuild's shadow, at the new version, is
// run only by processes of the new version.
func versionMember(consumer string, version int) string {
	return consumer + "@v" + strconv.Itoa(version)
}

// register creates the state rows of this dispatcher's shards that do not
// exist yet, with the cursor where each projection says to start, and
// writes the instance's first heartbeat, in one transaction. The inserts
// lock the consumers table against a concurrent prune (which holds it in
// SHARE mode), so a prune either sees this instance as alive or has
// committed, and marked what it pruned past, before the first pass.
func (d *Dispatcher) register(ctx context.Context) error {
	horizon, err := d.store.Horizon(ctx)
	if err != nil {
		return fmt.Errorf("projection dispatcher: %w", err)
	}
	startOf := func(p *Async) projector.Position {
		if p.cfg.StartFrom == FromNow {
			return horizon
		}
		return projector.Start
	}
	layouts := make([][]string, len(d.balancers))
	err = pgx.BeginFunc(ctx, d.store.Pool(), func(tx pgx.Tx) error {
		if err := d.lockToRegister(ctx, tx); err != nil {
			return fmt.Errorf("register partitioned consumers: %w", err)
		}
		for i, b := range d.balancers {
			ids, err := d.registerPartitioned(ctx, tx, b.proj, startOf(b.proj))
			if err != nil {
				return fmt.Errorf("register consumer %s: %w", b.consumer, err)
			}
			layouts[i] = ids
		}
		for _, sh := range d.allShards() {
			start := startOf(sh.proj)
			if sh.balancer != nil {
				continue
			}
			if _, err := tx.Exec(ctx, d.sql.register, sh.id.Consumer, sh.id.Instance, start.TxID, start.Seq, sh.proj.cfg.Version); err != nil {
				return fmt.Errorf("register consumer %s: %w", sh.id, err)
			}
		}
		return d.heartbeat(ctx, tx, true)
	})
	if errors.Is(err, ErrPartitionsChanged) {
		return err
	}
	if err != nil {
		return fmt.Errorf("projection dispatcher: %w", err)
	}
	for i, b := range d.balancers {
		d.syncLayout(b, layouts[i], time.Time{}) // the layout the consumer has, live splits and merges included
	}
	return nil
}

// cleanup runs once the loops have ended. It removes the per-instance shards
// of a random instance id, and its instance row: no later process can ever
// resume them, and left behind they would hold retention back until they
// expire. A fixed id's instance is marked stopped, so status shows its
// shards unattended at once rather than after missed heartbeats.
func (d *Dispatcher) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	released := d.releasePartitions(ctx)
	defer d.notifyReleased(ctx, released) // after the instance is marked stopped or removed
	if !d.randomID {
		if _, err := d.store.Pool().Exec(ctx, d.isql.stopped, d.instance); err != nil {
			d.logger.WarnContext(ctx, "projection dispatcher: mark instance stopped", slog.String("instance_id", d.instance), slog.Any("error", err))
		}
		return
	}
	for _, sh := range d.allShards() {
		if sh.id.Instance != d.instance {
			continue
		}
		if _, err := d.store.Pool().Exec(ctx, d.sql.unregister, sh.id.Consumer, sh.id.Instance); err != nil {
			d.logger.WarnContext(ctx, "projection dispatcher: remove per-instance shard", slog.String("consumer", sh.id.String()), slog.Any("error", err))
		}
	}
	if _, err := d.store.Pool().Exec(ctx, d.isql.forget, d.instance); err != nil {
		d.logger.WarnContext(ctx, "projection dispatcher: remove instance", slog.String("instance_id", d.instance), slog.Any("error", err))
	}
}

// logStarted says what this dispatcher runs: its consumers, the shards it
// runs whatever other processes do, and the partitions it declared, which
// balancing rounds share among the processes running their consumer (each
// round that takes or gives up some says so, logBalance). It said shards=N
// counting every declared partition, so two processes of a consumer in 4
// partitions each said 4 while each worked 2.
func (d *Dispatcher) logStarted(ctx context.Context) {
	consumers := map[string]bool{}
	shards, partitions := 0, 0
	for _, sh := range d.allShards() {
		consumers[sh.id.Consumer] = true
		if sh.balancer != nil {
			partitions++
		} else {
			shards++
		}
	}
	attrs := []any{slog.String("instance_id", d.instance), slog.Int("consumers", len(consumers)), slog.Int("shards", shards)}
	if partitions > 0 {
		attrs = append(attrs, slog.Int("partitions_declared", partitions),
			slog.String("partitions_owned", "as balancing rounds decide (partitions taken/given up lines)"))
	}
	d.logger.InfoContext(ctx, "projection dispatcher: started", attrs...)
}

// logStopped is the dispatcher's last line, written by the goroutine that
// closes Stopped just before it does, so nothing logs after Stop returns.
func (d *Dispatcher) logStopped(rolledBack bool) {
	ctx := context.Background()
	if rolledBack {
		d.logger.InfoContext(ctx, "projection dispatcher: stopped; batches running at the stop deadline were rolled back",
			slog.String("instance_id", d.instance))
		return
	}
	d.logger.InfoContext(ctx, "projection dispatcher: stopped", slog.String("instance_id", d.instance))
}
