package projection

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/stores/postgres"
)

// Telling running dispatchers that a partitioned consumer's layout changed
// (docs/scaling.md, "Splitting and merging live"), or that a shard they
// stood aside from can run again (docs/operations.md, "Waking up").
//
// A split or merge commits new partition rows; the dispatchers running the
// consumer read the layout on their balancing round, every Recheck. Waiting
// for that round paused the partitions a change involves for up to a whole
// Recheck (about ten batches at the default second): the parent's loop had
// stopped, and its halves, or the merged parent, had no loop yet. So every
// layout change also sends a NOTIFY in its transaction, delivered at its
// commit, and each dispatcher LISTENs on a connection of its own and runs
// its balancing round at once. A balancing round that releases partitions,
// and a graceful stop, send the same NOTIFY (balance.go): the process that
// is to take them would otherwise wait for its own round.
//
// A shard's loop that finds its shard disabled, dead, or locked by someone
// else waits a Recheck too; an operator's enable, restart or skip, a dead
// letter's or a park's retry, a rebuild request, `search verify`'s held
// read or a reindex (anything that took the shard's lock from outside a
// pass, WakeShards) ends by sending a shard wake on the same channel once
// its transaction ended, committed or not, so its lock is free by then:
// the loop of that shard, in each dispatcher running it, tries again at
// once.
//
// A retry request (`dead-letters retry` or `parked retry` without --here,
// [RequestDeadLetterRetry], [RequestParkRetry]) is carried out by the
// retry loop of a dispatcher running the consumer, which polls for them
// every Recheck; the request sends a retry wake once it committed, on a
// channel of its own (retryChannel), and that loop looks at once. Not on
// the shard wakes' channel: the retry a loop carries out ends with a
// shard wake of its own, which must not start the loop again (a request
// left to another binary's version would be polled for in a loop).
//
// The notifications only hurry things: a dispatcher that missed one (its
// listening connection dropped, or a pooler in transaction mode that does
// not carry LISTEN) still reads the layout and looks at its shards on its
// next Recheck, and one that starts listening (again) looks at once.
//
// NOTIFY is kept off the append path (its commit-time lock serialises
// committers, docs/performance.md); a layout change or an operator's
// command is rare, where that lock costs nothing.

// layoutChannel is the NOTIFY channel of layout changes, shared by every
// schema: the payload names the schema and the consumer.
const layoutChannel = "projector_partition_layout"

// layoutPayload is a layout change's NOTIFY payload: schema and consumer
// joined by the unit separator, which neither contains.
func layoutPayload(schema, consumer string) string {
	return schema + "\x1f" + consumer
}

// shardWakePayload is a shard wake's NOTIFY payload: schema, consumer and
// instance id (empty for every shard of the consumer) joined by the unit
// separator, which none contains; a third field tells it from a layout
// change's.
func shardWakePayload(schema string, id ShardID) string {
	return schema + "\x1f" + id.Consumer + "\x1f" + id.Instance
}

// retryChannel is the NOTIFY channel of retry requests; the payload is
// retryWakePayload.
const retryChannel = "projector_retry_request"

// retryWakePayload is a retry request's NOTIFY payload: schema and
// consumer joined by the unit separator, which neither contains.
func retryWakePayload(schema, consumer string) string {
	return schema + "\x1f" + consumer
}

// notifyShardsSQL sends one shard wake per payload of $2, in one
// statement (one commit, so the notification lock is taken once).
const notifyShardsSQL = `SELECT count(pg_notify($1, p)) FROM unnest($2::text[]) p`

// wakeTimeout bounds WakeShards' round trip: it runs after the caller's
// work, whose context may have ended.
const wakeTimeout = 5 * time.Second

// WakeShards tells the dispatchers running shards ids of store's schema to
// look at them now rather than at their next Recheck. Call it after the
// transaction that took their locks ([LockShard], [LockPartitions]) or
// changed their state ended, committed or rolled back: a pass that found
// the lock taken, or the shard disabled or dead, stood aside for a whole
// Recheck. Best effort, in a statement of its own (so on no append path
// and in no caller's transaction, which would take a transaction id for
// it): a dispatcher that misses it still looks at its Recheck. It runs
// even when ctx has ended (the work it follows may have been cancelled),
// bounded by a few seconds.
func WakeShards(ctx context.Context, store *postgres.Store, ids ...ShardID) error {
	payloads := make([]string, 0, len(ids))
	for _, id := range ids {
		id = id.normal()
		if validName(id.Consumer) != nil || validInstance(id.Instance) != nil {
			continue // no shard has that id
		}
		payloads = append(payloads, shardWakePayload(store.Schema(), id))
	}
	return sendWakes(ctx, store, payloads)
}

// WakeConsumer is [WakeShards] for every shard of consumer (its
// partitions, its per-instance shards): for a holder that locked shards
// of it it did not name one by one.
func WakeConsumer(ctx context.Context, store *postgres.Store, consumer string) error {
	if validName(consumer) != nil {
		return nil
	}
	return sendWakes(ctx, store, []string{shardWakePayload(store.Schema(), ShardID{Consumer: consumer, Instance: ""})})
}

// wakeRetries tells the dispatchers running consumers that retry requests
// of theirs were committed, so their retry loops look now rather than at
// their next Recheck. Best effort, like WakeShards: a dispatcher that
// misses it carries the request out at its Recheck.
func wakeRetries(ctx context.Context, store *postgres.Store, consumers ...string) error {
	payloads := make([]string, 0, len(consumers))
	for _, c := range consumers {
		if p := retryWakePayload(store.Schema(), c); validName(c) == nil && !slices.Contains(payloads, p) {
			payloads = append(payloads, p)
		}
	}
	return notifyAll(ctx, store, retryChannel, payloads)
}

// sendWakes sends the shard wakes payloads (see WakeShards).
func sendWakes(ctx context.Context, store *postgres.Store, payloads []string) error {
	return notifyAll(ctx, store, layoutChannel, payloads)
}

// notifyAll sends payloads on channel in one statement of its own.
func notifyAll(ctx context.Context, store *postgres.Store, channel string, payloads []string) error {
	if len(payloads) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), wakeTimeout)
	defer cancel()
	if _, err := store.Pool().Exec(ctx, notifyShardsSQL, channel, payloads); err != nil {
		return fmt.Errorf("wake the dispatchers: %w", err)
	}
	return nil
}

// notifyLayout tells, at tx's commit, every dispatcher running consumer
// that its partitions changed.
func notifyLayout(ctx context.Context, tx pgx.Tx, store *postgres.Store, consumer string) error {
	if _, err := tx.Exec(ctx, notifyLayoutSQL, layoutChannel, layoutPayload(store.Schema(), consumer)); err != nil {
		return fmt.Errorf("notify the layout change: %w", err)
	}
	return nil
}

// queueNotifyLayout queues notifyLayout's statement on b, to go out with a
// layout change's writes in one round trip.
func queueNotifyLayout(b *pgx.Batch, store *postgres.Store, consumer string) {
	b.Queue(notifyLayoutSQL, layoutChannel, layoutPayload(store.Schema(), consumer))
}

const notifyLayoutSQL = `SELECT pg_notify($1, $2)`

// relayoutNow asks the balancing loop for a round now.
func (d *Dispatcher) relayoutNow() {
	select {
	case d.relayout <- struct{}{}:
	default: // one is pending already
	}
}

// layoutListenEvery bounds how long a listening session that failed waits
// before it connects again; the balancing round every Recheck goes on
// meanwhile.
const layoutListenEvery = 30 * time.Second

// kickShard wakes the loop of this dispatcher's shard id, if it runs it;
// of every shard of its consumer if id.Instance is empty (WakeConsumer).
func (d *Dispatcher) kickShard(id ShardID) {
	for _, sh := range d.allShards() {
		if sh.id == id || (id.Instance == "" && sh.id.Consumer == id.Consumer) {
			sh.wake()
		}
	}
}

// kickRetries wakes this dispatcher's retry loop if it runs consumer.
func (d *Dispatcher) kickRetries(consumer string) {
	for _, sh := range d.allShards() {
		if sh.id.Consumer == consumer && sh.shadow == nil {
			select {
			case d.retryKick <- struct{}{}:
			default: // one is pending already
			}
			return
		}
	}
}

// aliveLockKey is the key of the session advisory lock each dispatcher's
// listening session holds: a sign of life that, unlike the heartbeat,
// PostgreSQL drops the moment the process's connection goes, when it is
// SIGKILLed or its machine dies. A split command hands a partition to its
// owner's pass only while the owner holds it (splithandoff.go): a killed
// owner's heartbeat stays recent for LiveHeartbeats heartbeats, during
// which the partition would wait for a pass that never comes. Behind a
// pooler in transaction mode the lock may stay with a pooled server
// connection, which only makes the owner look alive, as the heartbeat did.
func aliveLockKey(schema, instance string) string {
	return aliveLockPrefix(schema) + instance
}

func aliveLockPrefix(schema string) string { return "projector.alive\x1f" + schema + "\x1f" }

// kickAll wakes the loop of every shard this dispatcher runs.
func (d *Dispatcher) kickAll() {
	for _, sh := range d.allShards() {
		sh.wake()
	}
}

// layoutListenLoop keeps a session LISTENing for layout changes of this
// dispatcher's partitioned consumers, asking for a balancing round on
// each, and for wakes of its shards, waking their loops (see above).
func (d *Dispatcher) layoutListenLoop(ctx context.Context) {
	mine := map[string]bool{}
	for _, b := range d.balancers {
		mine[layoutPayload(d.store.Schema(), b.consumer)] = true
	}
	failures := 0
	for {
		err := d.listenLayout(ctx, mine, func() { failures = 0 })
		if ctx.Err() != nil {
			return
		}
		failures++
		wait := min(dbBackoff(failures), layoutListenEvery)
		level := slog.LevelWarn
		if failures > 1 {
			level = slog.LevelDebug // said once per outage, not every retry
		}
		d.logger.Log(ctx, level, "projection dispatcher: listening for partition layout changes and shard wakes failed; the balancing round and the shards' looks every Recheck still see them",
			slog.Any("error", err), slog.Duration("retry_in", wait))
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
	}
}

// listenLayout runs one listening session until it fails or ctx ends.
func (d *Dispatcher) listenLayout(ctx context.Context, mine map[string]bool, listening func()) error {
	// A connection of its own for as long as the dispatcher runs: taken
	// out of the pool, so the pool's connect hooks (credentials, session
	// settings) made it, and never given back.
	pooled, err := d.store.Pool().Acquire(ctx)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	conn := pooled.Hijack()
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	for _, ch := range []string{layoutChannel, retryChannel} {
		if _, err := conn.Exec(ctx, `LISTEN `+ch); err != nil {
			return fmt.Errorf("listen: %w", err)
		}
	}
	// The session's sign of life (aliveLockKey): held while it is open,
	// dropped by PostgreSQL with the connection when the process dies.
	var alive bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtextextended($1, 0))`, aliveLockKey(d.store.Schema(), d.instance)).Scan(&alive); err != nil {
		return fmt.Errorf("take the instance's alive lock: %w", err)
	}
	if !alive {
		d.logger.DebugContext(ctx, "projection dispatcher: another session holds this instance id's alive lock (an instance id used twice?)",
			slog.String("instance_id", d.instance))
	}
	listening()
	// A change committed, or a wake sent, before this session listened (at
	// start, or while it reconnected) is seen by a round and a look now.
	if len(d.balancers) > 0 {
		d.relayoutNow()
	}
	d.kickAll()
	select {
	case d.retryKick <- struct{}{}:
	default:
	}
	if d.listened != nil {
		d.listened()
	}
	schema := d.store.Schema()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if n.Channel == retryChannel {
			if s, consumer, ok := strings.Cut(n.Payload, "\x1f"); ok && s == schema {
				d.kickRetries(consumer)
			}
			continue
		}
		if n.Channel != layoutChannel {
			continue
		}
		if mine[n.Payload] {
			d.relayoutNow()
			continue
		}
		if s, consumer, instance, ok := parseShardWake(n.Payload); ok && s == schema {
			d.kickShard(ShardID{Consumer: consumer, Instance: instance})
		}
	}
}

// parseShardWake splits a shardWakePayload; ok is false for any other
// payload (a layout change's).
func parseShardWake(payload string) (schema, consumer, instance string, ok bool) {
	schema, rest, ok := strings.Cut(payload, "\x1f")
	if !ok {
		return "", "", "", false
	}
	consumer, instance, ok = strings.Cut(rest, "\x1f")
	return schema, consumer, instance, ok
}
