package projection

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/stores/postgres"
)

// Telling running dispatchers that a partitioned consumer's layout changed
// (docs/scaling.md, "Splitting and merging live").
//
// A split or merge commits new partition rows; the dispatchers running the
// consumer read the layout on their balancing round, every Recheck. Waiting
// for that round paused the partitions a change involves for up to a whole
// Recheck (about ten batches at the default second): the parent's loop had
// stopped, and its halves, or the merged parent, had no loop yet. So every
// layout change also sends a NOTIFY in its transaction, delivered at its
// commit, and each dispatcher running a partitioned consumer LISTENs on a
// connection of its own and runs its balancing round at once. The
// notification only hurries the round: a dispatcher that missed it (its
// listening connection dropped, or a pooler in transaction mode that does
// not carry LISTEN) still reads the layout on its next Recheck.
//
// NOTIFY is kept off the append path (its commit-time lock serialises
// committers, docs/performance.md); a layout change is an operator's rare
// command, where that lock costs nothing.

// layoutChannel is the NOTIFY channel of layout changes, shared by every
// schema: the payload names the schema and the consumer.
const layoutChannel = "projector_partition_layout"

// layoutPayload is a layout change's NOTIFY payload: schema and consumer
// joined by the unit separator, which neither contains.
func layoutPayload(schema, consumer string) string {
	return schema + "\x1f" + consumer
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

// layoutListenLoop keeps a session LISTENing for layout changes of this
// dispatcher's partitioned consumers and asks for a balancing round on
// each (see above).
func (d *Dispatcher) layoutListenLoop(ctx context.Context) {
	if len(d.balancers) == 0 {
		return
	}
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
		d.logger.Log(ctx, level, "projection dispatcher: listening for partition layout changes failed; the balancing round every Recheck still sees them",
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
	if _, err := conn.Exec(ctx, `LISTEN `+layoutChannel); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	listening()
	// A change committed before this session listened (at start, or while
	// it reconnected) is read by a round now.
	d.relayoutNow()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if n.Channel == layoutChannel && mine[n.Payload] {
			d.relayoutNow()
		}
	}
}
