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
	for _, seg := range neighbours(sh.segment) {
		n := q
		n.Partition = seg
		if !d.store.LogReadPlanned(conn.Conn(), n) {
			out = append(out, n)
		}
	}
	return out
}

// neighbours returns a segment of the size seg splits into and the segment
// it merges into, those it has: a read's plan depends on the segment's
// size only.
func neighbours(seg postgres.Segment) []postgres.Segment {
	var out []postgres.Segment
	if lo, _, ok := seg.Children(); ok {
		out = append(out, lo)
	}
	if parent, ok := seg.Parent(); ok {
		out = append(out, parent)
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

// planEvery is how often the dispatcher plans, on the idle connections of
// its pool, the reads its partitions would need after a split or merge
// (planLoop).
const planEvery = 2 * time.Second

// planLoop plans, every planEvery, the neighbouring reads on the pool's
// idle connections (planIdle): the passes plan them on the connections
// they use, but a half's first pass may take any connection of the pool,
// one the probe, a prefetch or the application's writers (a pool shared
// with them) used until then. It stops with soft; a statement under way
// is cancelled only with hard, as a pass's is: a cancelled statement costs
// its connection.
func (d *Dispatcher) planLoop(soft, hard context.Context) {
	if len(d.balancers) == 0 {
		return
	}
	ticker := time.NewTicker(planEvery)
	defer ticker.Stop()
	for {
		select {
		case <-soft.Done():
			return
		case <-ticker.C:
			d.planIdle(soft, hard)
		}
	}
}

// planIdle plans the reads of planShapes on every idle connection of the
// pool that lacks one of them, one connection at a time, until soft ends;
// the others go back to the pool at once.
func (d *Dispatcher) planIdle(soft, hard context.Context) {
	qs := d.planShapes()
	if len(qs) == 0 {
		return
	}
	var todo []*pgxpool.Conn
	for _, c := range d.store.Pool().AcquireAllIdle(soft) {
		missing := false
		for _, q := range qs {
			missing = missing || !d.store.LogReadPlanned(c.Conn(), q)
		}
		if missing {
			todo = append(todo, c)
		} else {
			c.Release()
		}
	}
	for i, c := range todo {
		if soft.Err() != nil {
			for _, rest := range todo[i:] {
				rest.Release()
			}
			return
		}
		d.planReads(hard, c, qs) // releases c
	}
}

// planShapes returns the reads of every partition size the dispatcher's
// partitioned consumers (by stream) have, and of the sizes they would
// split and merge into, one per size: the shape of a plan. Partitions a
// split or merge made less than their planDelay ago count for nothing
// yet: the change's own passes need the server then.
func (d *Dispatcher) planShapes() []postgres.LogQuery {
	var out []postgres.LogQuery
	now := time.Now()
	for _, b := range d.balancers {
		if b.proj.cfg.PartitionKey != nil {
			continue
		}
		seen := map[uint8]bool{}
		add := func(seg postgres.Segment) {
			if !seen[seg.Bits] {
				seen[seg.Bits] = true
				out = append(out, postgres.LogQuery{Partition: seg, EventTypes: b.proj.t.types, Raw: true})
			}
		}
		b.mu.Lock()
		for _, sh := range b.shards {
			if sh.removed.Load() || now.Before(sh.planFrom) {
				continue
			}
			add(sh.segment)
			for _, seg := range neighbours(sh.segment) {
				add(seg)
			}
		}
		b.mu.Unlock()
	}
	return out
}
