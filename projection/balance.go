package projection

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/stores/postgres"
)

// Balancing a partitioned consumer's partitions over the processes that run
// it, with no coordinator: every process runs the same rules on the same
// rows (each partition's owner in projector_consumers, and the live
// instances from their heartbeats in projector_instances) and changes only
// its own claims, each a compare-and-set on one row.
//
//   - Affinity: a process keeps the partitions it owns while its share
//     allows, so its prefetch and shared reads stay warm.
//   - Fairness: with P live processes and N partitions each owns at most
//     ceil(N/P); while a process owns fewer than floor(N/P), the most
//     loaded process gives one up. A partition with no live owner (free, or
//     its owner's heartbeats stopped) is claimed by a least-loaded process
//     below its share.
//   - A process that stops gracefully releases its partitions at once; one
//     that dies is passed over once it misses LiveHeartbeats heartbeats
//     (processes running partitioned consumers heartbeat at least every
//     [PartitionHeartbeatEvery]).
//
// The owner steers which process tries a partition; it is not the
// exclusion. Two processes that briefly both think they own one still take
// its advisory lock for every pass, and the pass re-reads the owner after
// the lock and stands aside when it is another's: a process that lost a
// partition stops at its next pass.

// PartitionHeartbeatEvery caps the heartbeat interval of a dispatcher that
// runs a partitioned consumer: a process that dies has its partitions taken
// once LiveHeartbeats of these have passed.
const PartitionHeartbeatEvery = time.Second

// balancer balances one partitioned consumer's partitions for this process.
// The partitions are the consumer's layout as last read (register, then
// every balancing round): a live split or merge (split.go) changes it, and
// the round that sees the change starts the new partitions' loops and ends
// the old ones'.
type balancer struct {
	proj     *Async
	consumer string

	mu     sync.Mutex
	shards map[string]*shard // by instance id
	owned  map[string]bool
	// sets counts, by instance id, the rounds' decisions about it (set):
	// a pass that finds the partition another's stands aside only if
	// no round decided since the pass began (standAside).
	sets map[string]uint64
	// standing, when set (by tests), is called when a pass is about to
	// stand aside from a partition it found another's, or no one's.
	standing func(instance string)
	// local is when this process changed a partition's shard itself,
	// by instance id: a split by its own pass ended the parent's and
	// started the halves' (startHalves). A round whose layout was read
	// before then leaves that shard as it is, rather than stop the
	// halves and start the parent again until its next round.
	local map[string]time.Time
	// warm are the halves' shards a pass about to split its partition
	// made, each with its first batch being read (prefetchHalves), by
	// instance id: whichever starts a half first, the pass's startHalves
	// or a round that saw the split's rows before it, starts this shard
	// and its read rather than a cold one. Once taken from here a shard
	// is its own loop's alone.
	warm map[string]*shard
	// planDelay is how long a new partition leaves its neighbouring
	// reads unplanned (shard.planFrom): planDelay, or less in tests.
	planDelay time.Duration
}

func newBalancer(p *Async) *balancer {
	return &balancer{proj: p, consumer: p.name, shards: map[string]*shard{}, owned: map[string]bool{}, sets: map[string]uint64{}, planDelay: planDelay,
		local: map[string]time.Time{}, warm: map[string]*shard{}}
}

// member is what the instances row lists for a process that balances the
// consumer's partitions: NAME/partitions@vV (V its model version), which
// no consumer name can be (a name has no slash). A process that runs the
// consumer unpartitioned (an older binary, fenced) lists only NAME and is
// not counted in the share; nor is one of another model version (a
// blue/green rebuild's old or new binary), which balances only the
// partitions at its own version.
func (b *balancer) member() string {
	return b.consumer + "/partitions@v" + strconv.Itoa(b.version())
}

// version is the model version of the balanced projection.
func (b *balancer) version() int { return b.proj.cfg.Version }

// owns reports whether this process works the partition, as the last round
// decided.
func (b *balancer) owns(instance string) bool {
	own, _ := b.ownership(instance)
	return own
}

// ownership is owns, and the count of decisions it is as of, for
// standAside.
func (b *balancer) ownership(instance string) (bool, uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.owned[instance], b.sets[instance]
}

// standAside marks the partition not this process's, as its pass found
// it, unless a round decided about it since the pass read ownership at
// as: a round that claimed it after the pass's state read (the pass saw
// it free) must not be undone until its next round, the partition idle
// meanwhile. It reports whether it did.
func (b *balancer) standAside(instance string, as uint64) bool {
	b.mu.Lock()
	hook := b.standing
	b.mu.Unlock()
	if hook != nil {
		hook(instance)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sets[instance] != as {
		return false
	}
	b.owned[instance] = false
	return true
}

func (b *balancer) set(instance string, own bool) {
	b.mu.Lock()
	was := b.owned[instance]
	b.owned[instance] = own
	b.sets[instance]++
	sh := b.shards[instance]
	b.mu.Unlock()
	if own && !was && sh != nil {
		sh.wake()
	}
}

// ownedSet is the partitions this process works, as last decided.
func (b *balancer) ownedSet() map[string]bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]bool, len(b.owned))
	for id, own := range b.owned {
		if own {
			out[id] = true
		}
	}
	return out
}

// logBalance writes one Info line when a round changed which partitions
// this process works (before: those it worked when the round began):
// those it took, those it gave up (released, taken by another, or gone in
// a split or merge), and how many it works now. Nothing on a round that
// changed nothing.
func (d *Dispatcher) logBalance(ctx context.Context, b *balancer, before map[string]bool) {
	after := b.ownedSet()
	var took, gaveUp []string
	for id := range after {
		if !before[id] {
			took = append(took, id)
		}
	}
	for id := range before {
		if !after[id] {
			gaveUp = append(gaveUp, id)
		}
	}
	if len(took) == 0 && len(gaveUp) == 0 {
		return
	}
	slices.Sort(took)
	slices.Sort(gaveUp)
	d.logger.InfoContext(ctx, "projection dispatcher: partitions taken/given up", slog.String("consumer", b.consumer),
		slog.Any("took", took), slog.Any("gave_up", gaveUp), slog.Int("owns", len(after)))
}

// wakeOwned wakes the loop of every partition this process works, but
// an upper half standing at its merge hold (lowerLooks, mergehandoff.go).
func (b *balancer) wakeOwned() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for id, sh := range b.shards {
		if b.owned[id] && !sh.standing.Load() {
			sh.wake()
		}
	}
}

// wake wakes the shard's loop now rather than after its wait.
func (sh *shard) wake() {
	select {
	case sh.kick <- struct{}{}:
	default:
	}
}

// newPartitionShard is the shard of one partition of p.
func newPartitionShard(schema string, p *Async, b *balancer, seg postgres.Segment) *shard {
	id := ShardID{Consumer: p.name, Instance: PartitionInstance(int(seg.Value), seg.Count())}
	return &shard{id: id, proj: p, lockKey: shardLockKey(schema, id), gateKey: gateLockKey(schema, p.name), segment: seg, balancer: b, kick: make(chan struct{}, 1),
		planFrom: time.Now().Add(b.planDelay)}
}

// syncLayout makes b's partitions those of ids (every partition row of the
// consumer): new ones get a shard, started at once when the dispatcher's
// loops run; those split or merged away are told to stop.
func (d *Dispatcher) syncLayout(b *balancer, ids []string, readAt time.Time) {
	want := map[string]postgres.Segment{}
	for _, id := range ids {
		if seg, ok := partitionSegment(id); ok {
			want[id] = seg
		}
	}
	b.mu.Lock()
	for id, at := range b.local {
		switch {
		case at.Before(readAt):
			delete(b.local, id) // the layout read saw it
		case b.shards[id] != nil && !b.shards[id].removed.Load():
			want[id], _ = partitionSegment(id) // a half started since the read
		default:
			delete(want, id) // a parent split since the read
		}
	}
	var added, removed []*shard
	for id, seg := range want {
		cur := b.shards[id]
		if cur != nil && cur.removed.Load() {
			// Its pass found the row gone and its loop ended; the row is
			// back (split, then merged again before this round): a new
			// shard runs it.
			removed = append(removed, cur)
			cur = nil
		}
		if cur == nil {
			sh := b.warm[id] // read while its parent applied its last batch
			delete(b.warm, id)
			if sh == nil {
				sh = newPartitionShard(d.store.Schema(), b.proj, b, seg)
			}
			b.shards[id] = sh
			added = append(added, sh)
		}
	}
	for id, sh := range b.shards {
		if _, ok := want[id]; !ok {
			delete(b.shards, id)
			delete(b.owned, id)
			removed = append(removed, sh)
		}
	}
	b.mu.Unlock()
	for _, sh := range removed {
		sh.removed.Store(true)
		sh.wake()
	}
	if len(added)+len(removed) > 0 {
		d.replaceShards(added, removed)
	}
}

type balanceSQL struct {
	owners, live, claim, release, releaseAll string
}

func buildBalanceSQL(store *postgres.Store) balanceSQL {
	c, i := store.Table("projector_consumers"), store.Table("projector_instances")
	return balanceSQL{
		owners: `SELECT instance_id, coalesce(owner, ''), version FROM ` + c + ` WHERE name = $1 AND instance_id LIKE '` + PartitionPrefix + `%' ORDER BY instance_id`,
		live: `SELECT instance_id FROM ` + i + ` WHERE $1 = ANY(consumers) AND stopped_at IS NULL
			AND last_seen_at > now() - ` + fmt.Sprint(LiveHeartbeats) + ` * heartbeat_every`,
		claim:   `UPDATE ` + c + ` SET owner = $3 WHERE name = $1 AND instance_id = $2 AND coalesce(owner, '') = $4`,
		release: `UPDATE ` + c + ` SET owner = NULL WHERE name = $1 AND instance_id = $2 AND owner = $3`,
		releaseAll: `WITH r AS (UPDATE ` + c + ` SET owner = NULL WHERE name = ANY($1) AND instance_id LIKE '` + PartitionPrefix + `%' AND owner = $2 RETURNING name)
			SELECT DISTINCT name FROM r`,
	}
}

// balanceLoop runs a balancing round for every partitioned consumer every
// Recheck, at once at start so a new process takes its share on its first
// passes, and at once when a split or merge commits (layoutnotify.go), so
// the partitions it made start without waiting for the next round.
func (d *Dispatcher) balanceLoop(ctx context.Context) {
	if len(d.balancers) == 0 {
		return
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	relayout := false
	for {
		d.round("", roundIdle, nil)
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-d.relayout: // a split, merge or merge hold committed (layoutnotify.go)
			relayout = true
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
			// The partitions that stay (a merge's halves after its hold,
			// those a change of some partitions did not touch) need no
			// round to go on: wake them before its round trip too.
			for _, b := range d.balancers {
				b.wakeOwned()
			}
		}
		d.round("", roundStart, nil)
		for _, b := range d.balancers {
			if err := d.balance(ctx, b); err != nil && ctx.Err() == nil {
				d.logger.WarnContext(ctx, "projection dispatcher: balancing partitions failed; will retry",
					slog.String("consumer", b.consumer), slog.Any("error", err))
			}
			if relayout {
				// A pass that found its partition locked by the change
				// waits a Recheck before it tries again: the change is
				// done, so try now.
				b.wakeOwned()
			}
		}
		relayout = false
		timer.Reset(d.cfg.Recheck)
	}
}

// balance runs one round for b: read the layout, who owns what and who is
// alive; follow a split or merge; release what is over this process's
// share, claim what is free and within it.
func (d *Dispatcher) balance(ctx context.Context, b *balancer) error {
	before := b.ownedSet()
	defer d.logBalance(ctx, b, before)
	var all, ids, owners []string
	var versions []int
	var live []string
	readAt := time.Now()
	batch := &pgx.Batch{}
	batch.Queue(d.bsql.owners, b.consumer).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var id, owner string
			var version int
			if err := rows.Scan(&id, &owner, &version); err != nil {
				return err
			}
			if _, ok := partitionSegment(id); ok {
				all, versions = append(all, id), append(versions, version)
				if version == b.version() {
					ids, owners = append(ids, id), append(owners, owner)
				}
			}
		}
		return rows.Err()
	})
	batch.Queue(d.bsql.live, b.member()).Query(func(rows pgx.Rows) error {
		var err error
		live, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err := d.store.Pool().SendBatch(ctx, batch).Close(); err != nil {
		return err
	}
	d.round(b.consumer, roundRead, all)
	d.syncLayout(b, all, readAt)
	// Partitions at another model version (a blue/green rebuild has not
	// switched them to this one yet, or switched them past it) are not
	// this process's to work: it balances the others among the processes
	// of its version.
	for i, id := range all {
		if versions[i] != b.version() {
			b.set(id, false)
		}
	}
	if !slices.Contains(live, d.instance) {
		live = append(live, d.instance) // this process runs, whatever its last heartbeat says
	}
	plan := planBalance(d.instance, owners, partitionWeights(ids), live)
	if len(plan.release) > 0 {
		released := make([]string, len(plan.release))
		for i, p := range plan.release {
			released[i] = ids[p]
		}
		d.round(b.consumer, roundRelease, released)
		// The releases and one layout NOTIFY, in one round trip and one
		// commit: the process that is to take a partition (below its
		// share, or the one a merge's parent is to go to) runs its round
		// at once rather than at its Recheck. Its pass may still find the
		// lock of a pass of this process's (runShard wakes it then).
		batch := &pgx.Batch{}
		for _, p := range plan.release {
			b.set(ids[p], false) // before the commit: a pass ending after it sees the partition gone
			batch.Queue(d.bsql.release, b.consumer, ids[p], d.instance)
		}
		queueNotifyLayout(batch, d.store, b.consumer)
		if err := d.store.Pool().SendBatch(ctx, batch).Close(); err != nil {
			return err // the next round finds what it still owns
		}
		for _, p := range plan.release {
			d.logger.DebugContext(ctx, "projection dispatcher: partition released", slog.String("consumer", b.consumer+"@"+ids[p]))
		}
	}
	for _, p := range plan.claim {
		tag, err := d.store.Pool().Exec(ctx, d.bsql.claim, b.consumer, ids[p], d.instance, owners[p])
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 1 {
			b.set(ids[p], true)
		}
	}
	for p, owner := range owners {
		if owner == d.instance && !slices.Contains(plan.release, p) {
			b.set(ids[p], true)
		} else if owner != d.instance && owner != "" && !slices.Contains(plan.claim, p) {
			b.set(ids[p], false)
		}
	}
	return nil
}

// roundStage is a step of the balancing loop, told to Dispatcher.rounds.
type roundStage int

const (
	roundIdle    roundStage = iota // the loop waits for its timer or a layout NOTIFY
	roundStart                     // it woke: a round of every partitioned consumer follows
	roundRead                      // a round read the consumer's partitions (ids)
	roundRelease                   // a round is about to release ids
)

// round tells the test hook Dispatcher.rounds, when set.
func (d *Dispatcher) round(consumer string, stage roundStage, ids []string) {
	if d.rounds != nil {
		d.rounds(consumer, stage, ids)
	}
}

// balancePlan is what one process does in a round: partitions to give up
// and partitions to claim.
type balancePlan struct {
	release, claim []int
}

// planBalance decides me's round from owners (each partition's owner, ""
// for none) and the live instances: pure, so every process reaching the
// same view decides consistently, and tested on its own.
//
// Shares are counted in weights (partitionWeights; nil: every partition
// weighs one): a partition's share of the hash space, in units of the
// layout's smallest partition. In a layout of one size that is the count
// of partitions, as before. While a split or merge runs (or after a change
// of some partitions) the layout mixes sizes, and a count took a process
// whose parents had split for the most loaded: it gave halves up, the
// other took them, and gave them back once its own parents split, each
// move a half's pass refused and started again elsewhere in the change's
// window (issue 21: a split under two dispatchers).
func planBalance(me string, owners []string, weights []int, live []string) balancePlan {
	w := func(p int) int {
		if weights == nil {
			return 1
		}
		return weights[p]
	}
	alive := len(live)
	count := map[string]int{}
	for _, l := range live {
		count[l] = 0
	}
	var mine, free []int
	total, have := 0, 0
	for p, o := range owners {
		total += w(p)
		if _, ok := count[o]; ok {
			count[o] += w(p)
			if o == me {
				mine = append(mine, p)
				have += w(p)
			}
		} else {
			free = append(free, p)
		}
	}
	floor, ceil := total/alive, (total+alive-1)/alive
	var plan balancePlan
	switch {
	case have > ceil:
		// Keep the first (affinity, and the same choice every round) as
		// far as the ceiling allows, the heaviest first and always one:
		// a partition heavier than any share stays where it is, and the
		// lighter ones go to the others.
		kept := 0
		slices.SortStableFunc(mine, func(x, y int) int { return w(y) - w(x) })
		for i, p := range mine {
			if i == 0 || kept+w(p) <= ceil {
				kept += w(p)
			} else {
				plan.release = append(plan.release, p)
			}
		}
	case have > floor:
		// Give one up while someone is below its floor and could take it
		// within the ceiling, if this process is the most loaded (ties:
		// the greatest id), so only one does; never below the floor.
		least, top := -1, me
		for l, c := range count {
			if least < 0 || c < least {
				least = c
			}
			if c > count[top] || (c == count[top] && l > top) {
				top = l
			}
		}
		if least < floor && top == me && len(free) == 0 {
			for i := len(mine) - 1; i >= 0; i-- {
				if p := mine[i]; have-w(p) >= floor && least+w(p) <= ceil {
					plan.release = []int{p}
					break
				}
			}
		}
	}
	if len(plan.release) > 0 {
		return plan
	}
	// Claim free partitions up to the floor, and up to the ceiling while
	// no live process owns less than this one; one at least while it owns
	// nothing.
	least := true
	for l, c := range count {
		if l != me && c < have {
			least = false
		}
	}
	want := floor
	if least {
		want = ceil
	}
	if have < want && len(free) > 0 {
		free = slices.Clone(free)
		rand.Shuffle(len(free), func(i, j int) { free[i], free[j] = free[j], free[i] }) // processes claiming at once spread out
		for _, p := range free {
			if have == 0 || have+w(p) <= want {
				plan.claim = append(plan.claim, p)
				have += w(p)
			}
		}
		if len(plan.claim) == 0 && least {
			// Every free partition is heavier than this process's room
			// (a dead owner's parent in a mixed layout): the least loaded
			// takes the lightest all the same, or no one would, and
			// releases what puts it over its ceiling next round. With
			// partitions of one size this never happens.
			lightest := free[0]
			for _, p := range free {
				if w(p) < w(lightest) {
					lightest = p
				}
			}
			plan.claim = []int{lightest}
		}
		slices.Sort(plan.claim)
	}
	return plan
}

// partitionWeights returns each partition's weight for planBalance: its
// share of the hash space in units of the smallest partition among ids.
func partitionWeights(ids []string) []int {
	segs := make([]postgres.Segment, len(ids))
	most := uint8(0)
	for i, id := range ids {
		segs[i], _ = partitionSegment(id)
		most = max(most, segs[i].Bits)
	}
	out := make([]int, len(ids))
	for i, s := range segs {
		out[i] = 1 << (most - s.Bits)
	}
	return out
}

// releasePartitions gives up every partition this process owns, at a
// graceful stop, so the others take them at once rather than after missed
// heartbeats; it returns the consumers it released partitions of, for
// notifyReleased once the instance is marked stopped.
func (d *Dispatcher) releasePartitions(ctx context.Context) []string {
	if len(d.balancers) == 0 {
		return nil
	}
	names := make([]string, len(d.balancers))
	for i, b := range d.balancers {
		names[i] = b.consumer
	}
	rows, err := d.store.Pool().Query(ctx, d.bsql.releaseAll, names, d.instance)
	if err == nil {
		names, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		d.logger.WarnContext(ctx, "projection dispatcher: release partitions", slog.Any("error", err))
		return nil
	}
	return names
}

// notifyReleased sends the layout NOTIFY of each consumer a graceful stop
// released partitions of, once its instance is marked stopped: the other
// processes' rounds then count it out and take all of them, rather than
// their share of a fleet it still seemed part of, at once rather than at
// their Recheck.
func (d *Dispatcher) notifyReleased(ctx context.Context, consumers []string) {
	payloads := make([]string, len(consumers))
	for i, c := range consumers {
		payloads[i] = layoutPayload(d.store.Schema(), c)
	}
	if err := notifyAll(ctx, d.store, layoutChannel, payloads); err != nil {
		d.logger.WarnContext(ctx, "projection dispatcher: tell the others of the partitions released", slog.Any("error", err))
	}
}
