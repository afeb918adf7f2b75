package projection

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector/stores/postgres"
)

// planReadTimeout bounds the planning of a connection's neighbouring reads
// (planReads): a few milliseconds of the server's work, which a stuck
// server must not turn into a connection held for long.
const planReadTimeout = 10 * time.Second

// planDelay is how long after it was made a partition's passes leave
// planning its neighbouring reads alone (shard.planFrom). A split 4 → 8
// whose halves planned their own neighbours (partitions of 16) at once
// loaded the server in the very window the planning ahead is meant to
// spare.
const planDelay = 2 * time.Second

// neighbourReads returns the reads a pass of sh that read with q leaves to
// plan on its connection, conn, once it is done (postgres.PlanLogRead): the
// reads of the segments sh would split into and merge into, of q's shape,
// those not planned on conn yet. Each is planned once per connection, so
// after a split or a merge the partitions' first reads find their
// statements planned, whichever connection they take, instead of planning
// them all at once, in the change's window (stores/postgres/readplan.go).
// Only partitions by stream split or merge by their segments.
func (d *Dispatcher) neighbourReads(conn *pgxpool.Conn, sh *shard, q postgres.LogQuery) []postgres.LogQuery {
	if sh.balancer == nil || sh.shadow != nil || sh.keyed() || time.Now().Before(sh.planFrom) {
		return nil
	}
	var out []postgres.LogQuery
	add := func(seg postgres.Segment) {
		n := q
		n.Partition = seg
		if !d.store.LogReadPlanned(conn.Conn(), n) {
			out = append(out, n)
		}
	}
	if lo, _, ok := sh.segment.Children(); ok {
		add(lo)
	}
	if parent, ok := sh.segment.Parent(); ok {
		add(parent)
	}
	return out
}

// planReads plans qs on conn (neighbourReads), then gives the connection
// back to the pool. It runs after the pass that held conn returned, so no
// pass waits for it; a failure only leaves a statement to be planned by
// its first read, as without this.
func (d *Dispatcher) planReads(ctx context.Context, conn *pgxpool.Conn, qs []postgres.LogQuery) {
	defer conn.Release()
	ctx, cancel := context.WithTimeout(ctx, planReadTimeout)
	defer cancel()
	for _, q := range qs {
		if err := d.store.PlanLogRead(ctx, conn.Conn(), q); err != nil {
			d.logger.DebugContext(ctx, "projection dispatcher: plan a neighbouring partition read", slog.String("partition", q.Partition.String()), slog.Any("error", err))
			return
		}
	}
}
