package projection

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// The wake-ups of balancing: a partition one process gives up must be
// taken, and worked, by the process that gets it at once, not at that
// process's next balancing round or Recheck (wakeRecheck, an hour, here).
// The rig's dispatchers report each step of their balancing loops, so a
// test can order a round of one before a round of the other instead of
// hoping for it.

// balanceRig runs processes of one partitioned consumer whose handler
// reports each comment's body, and blocks on the body "block" until the
// test lets it go.
type balanceRig struct {
	t        *testing.T
	ctx      context.Context
	store    *postgres.Store
	types    testevents.Types
	consumer string
	n        int
	applied  chan string
	entered  chan struct{}
	unblock  func()
	blocked  chan struct{}
	seen     map[string]bool // applied bodies awaitApplied read
}

func newBalanceRig(t *testing.T, consumer string, partitions int) *balanceRig {
	t.Helper()
	ctx := context.Background()
	types := testevents.New()
	store := pgtest.Store(t, types.Registry)
	if err := store.CreatePartitionIndex(ctx); err != nil {
		t.Fatal(err)
	}
	r := &balanceRig{t: t, ctx: ctx, store: store, types: types, consumer: consumer, n: partitions,
		applied: make(chan string, 1000), entered: make(chan struct{}, 10), blocked: make(chan struct{}), seen: map[string]bool{}}
	r.unblock = sync.OnceFunc(func() { close(r.blocked) })
	return r
}

// rigProc is one process of the rig: its dispatcher and what its
// balancing loop and shard loops reported.
type rigProc struct {
	r  *balanceRig
	d  *Dispatcher
	mu sync.Mutex
	// listened: the dispatcher listens for layout NOTIFYs; idle: its
	// balancing loop waits; starts counts the loop's wake-ups.
	listened, idle bool
	starts         int
	layouts        [][]string
	waits          map[ShardID][]passKind
	// onRelease, when set, runs before a round releases ids.
	onRelease func(ids []string)
}

// start starts process id.
func (r *balanceRig) start(id string) *rigProc {
	r.t.Helper()
	p := NewAsync(r.consumer, AsyncConfig{Partitions: r.n, MaxAttempts: 1})
	if err := On(p, r.types.Commented, func(ctx context.Context, _ pgx.Tx, _ projector.Event, c testevents.TicketCommented) error {
		if c.Body == "block" {
			r.entered <- struct{}{}
			select {
			case <-r.blocked:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		r.applied <- c.Body
		return nil
	}); err != nil {
		r.t.Fatal(err)
	}
	d, err := New(Config{Store: r.store, Projections: []*Async{p}, Recheck: wakeRecheck, InstanceID: id})
	if err != nil {
		r.t.Fatal(err)
	}
	rp := &rigProc{r: r, d: d, waits: map[ShardID][]passKind{}}
	d.listened = func() {
		rp.mu.Lock()
		rp.listened = true
		rp.mu.Unlock()
	}
	d.rounds = func(_ string, stage roundStage, ids []string) {
		rp.mu.Lock()
		switch stage {
		case roundIdle:
			rp.idle = true
		case roundStart:
			rp.idle = false
			rp.starts++
		case roundRead:
			rp.layouts = append(rp.layouts, ids)
		}
		hook := rp.onRelease
		rp.mu.Unlock()
		if stage == roundRelease && hook != nil {
			hook(ids)
		}
	}
	d.waiting = func(id ShardID, kind passKind) {
		rp.mu.Lock()
		rp.waits[id] = append(rp.waits[id], kind)
		rp.mu.Unlock()
	}
	if err := d.Start(r.ctx); err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() {
		stop, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = d.Stop(stop)
	})
	r.t.Cleanup(r.unblock) // before the dispatcher stops (cleanups run last first)
	return rp
}

// quiet reports whether p's balancing loop has run a round since it had
// started after rounds (its start count), waits, and has no round asked
// for: it runs no other until its Recheck or a layout NOTIFY.
func (p *rigProc) quiet(after int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.listened && p.idle && p.starts > after && len(p.d.relayout) == 0
}

func (p *rigProc) startCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.starts
}

// read reports whether a round of p read a layout with partition id.
func (p *rigProc) read(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.layouts {
		if slices.Contains(l, id) {
			return true
		}
	}
	return false
}

// stoodAside reports whether p's loop of partition instance waited after
// a pass of kind.
func (p *rigProc) stoodAside(instance string, kind passKind) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Contains(p.waits[ShardID{Consumer: p.r.consumer, Instance: instance}], kind)
}

// await polls cond until it holds, failing the test after 20 s.
func (r *balanceRig) await(what string, cond func() bool) {
	r.t.Helper()
	pgtest.Eventually(r.t, 20*time.Second, what, cond)
}

// pollUntil is pgtest.Eventually for a goroutine other than the test's,
// which may not end the test: it reports whether cond came to hold.
func pollUntil(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}

// owners lists each partition's owner ("-" for none), by instance id.
func (r *balanceRig) owners() string {
	r.t.Helper()
	rows, err := r.store.Pool().Query(r.ctx, `SELECT coalesce(owner, '-') FROM `+r.store.Table("projector_consumers")+`
		WHERE name = $1 AND instance_id LIKE '`+PartitionPrefix+`%' ORDER BY instance_id`, r.consumer)
	if err != nil {
		r.t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		r.t.Fatal(err)
	}
	return strings.Join(got, " ")
}

// setOwners sets the owner of each partition in owners (by instance id).
func (r *balanceRig) setOwners(owners map[string]string) {
	r.t.Helper()
	for id, o := range owners {
		if _, err := r.store.Pool().Exec(r.ctx, `UPDATE `+r.store.Table("projector_consumers")+` SET owner = NULLIF($3, '') WHERE name = $1 AND instance_id = $2`,
			r.consumer, id, o); err != nil {
			r.t.Fatal(err)
		}
	}
}

// append commits a comment body in a stream of its own in partition p of n.
func (r *balanceRig) append(p, n int, body string) {
	r.t.Helper()
	seg, err := postgres.SegmentOf(p, n)
	if err != nil {
		r.t.Fatal(err)
	}
	id := ""
	for i := 0; id == ""; i++ {
		if c := fmt.Sprintf("%s-%d", body, i); seg.Contains(postgres.StreamHash(projector.SystemTenant, "ticket", c)) {
			id = c
		}
	}
	if err := pgx.BeginFunc(r.ctx, r.store.Pool(), func(tx pgx.Tx) error {
		_, err := r.store.Append(r.ctx, tx, projector.Stream("ticket", id), projector.ExactVersion(0), testevents.TicketCommented{Body: body})
		return err
	}); err != nil {
		r.t.Fatal(err)
	}
}

// awaitApplied waits up to within for body to be applied.
func (r *balanceRig) awaitApplied(body string, within time.Duration, why string) {
	r.t.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	for !r.seen[body] {
		select {
		case got := <-r.applied:
			r.seen[got] = true
		case <-timer.C:
			r.t.Fatalf("%s not applied within %v (Recheck %v; owners %s): %s", body, within, wakeRecheck, r.owners(), why)
		}
	}
}

// A process whose pass of a partition holds its lock while its balancing
// round releases the partition wakes the partition's new owner once that
// pass ended: the new owner's pass found the lock taken and otherwise
// waited its Recheck (an hour here). Here a's pass of 1/2 is held in its
// handler while a's round gives 1/2 up and b's round takes it; b's pass
// of 1/2 stands aside (locked), and the event appended once a's pass
// committed must be applied by b at once. Before, it was not applied
// within the test's deadline.
func TestReleasedPartitionsNewOwnerWokenWhenTheOldPassEnds(t *testing.T) {
	t.Parallel()
	r := newBalanceRig(t, "rp", 2)
	a := r.start("a")
	r.await("a alone owns both partitions", func() bool { return r.owners() == "a a" && a.quiet(0) })
	r.append(1, 2, "block")
	select {
	case <-r.entered:
	case <-time.After(20 * time.Second):
		t.Fatal("a's pass of 1/2 never ran")
	}
	b := r.start("b")
	r.await("b's first rounds are over", func() bool { return b.quiet(0) })
	na := a.startCount()
	a.d.relayoutNow() // a round that sees b: a gives up 1/2, the last of its two
	r.await("a released 1/2", func() bool { o := r.owners(); return (o == "a -" || o == "a b") && a.quiet(na) })
	b.d.relayoutNow() // whether or not a's release told b
	r.await("b's pass of 1/2 found a's lock", func() bool { return b.stoodAside(PartitionInstance(1, 2), passLocked) })
	if got := r.owners(); got != "a b" {
		t.Fatalf("owners %s, want a b", got)
	}
	r.unblock()
	r.awaitApplied("block", wakeWithin, "a's pass did not end")
	r.append(1, 2, "after")
	r.awaitApplied("after", wakeWithin, "b, the new owner of 1/2, was not woken when a's pass let its lock go")
}

// Merging two pairs whose lower halves one process works gives that
// process both merged parents; its next round gives one up. The other
// process, below its share, must take it at once: here its own round of
// the merge's NOTIFY is over before the release (the release waits for
// it, which the two processes otherwise race for), so only a NOTIFY of the
// release gets it a round before its Recheck. Before the balancing round
// that released sent one, the parent it gave up applied nothing within
// the test's deadline (its events waited for an hour's Recheck); without
// the ordering it failed so 2 runs of 3.
func TestMergedParentPickedUpAtOnceByTheProcessThatGetsIt(t *testing.T) {
	t.Parallel()
	r := newBalanceRig(t, "mp", 4)
	a := r.start("a")
	r.await("a alone owns the four partitions", func() bool { return r.owners() == "a a a a" && a.quiet(0) })
	b := r.start("b")
	r.await("b's first rounds are over", func() bool { return b.quiet(0) })
	// Each works one half of each pair: a the lower ones, which the
	// merged parents inherit the owner of.
	r.setOwners(map[string]string{PartitionInstance(0, 4): "a", PartitionInstance(1, 4): "b", PartitionInstance(2, 4): "a", PartitionInstance(3, 4): "b"})
	na, nb := a.startCount(), b.startCount()
	a.d.relayoutNow()
	b.d.relayoutNow()
	r.await("both processes read the owners set", func() bool { return a.quiet(na) && b.quiet(nb) })
	for p := range 4 {
		body := fmt.Sprintf("before-%d", p)
		r.append(p, 4, body)
		r.awaitApplied(body, wakeWithin, "the partitions do not run")
	}
	var once sync.Once
	a.mu.Lock()
	a.onRelease = func(ids []string) {
		if !slices.ContainsFunc(ids, func(id string) bool { return strings.HasSuffix(id, "/2") }) {
			return
		}
		once.Do(func() {
			if !pollUntil(20*time.Second, func() bool { return b.read(PartitionInstance(0, 2)) && b.quiet(0) }) {
				t.Errorf("b never ran its round of the merged layout")
			}
		})
	}
	a.mu.Unlock()
	if _, err := NewAdmin(r.store).Merge(r.ctx, r.consumer, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	r.append(0, 2, "after-0")
	r.append(1, 2, "after-1")
	r.awaitApplied("after-0", wakeWithin, "the merged parent 0/2 does not run")
	r.awaitApplied("after-1", wakeWithin, "the merged parent 1/2 does not run")
	r.await("one merged parent each", func() bool { return r.owners() == "a b" || r.owners() == "b a" })
}

// A process that stops gracefully releases its partitions, and the one
// left takes all of them at once: the stop's layout NOTIFY, sent once the
// instance is marked stopped, runs its round. Before, it took them at its
// next Recheck (an hour here), and the events appended meanwhile were not
// applied within the test's deadline.
func TestStoppedProcessPartitionsTakenAtOnce(t *testing.T) {
	t.Parallel()
	r := newBalanceRig(t, "gs", 2)
	a := r.start("a")
	r.await("a alone owns both partitions", func() bool { return r.owners() == "a a" && a.quiet(0) })
	b := r.start("b")
	r.await("b's first rounds are over", func() bool { return b.quiet(0) })
	stop, cancel := context.WithTimeout(r.ctx, 10*time.Second)
	defer cancel()
	if err := a.d.Stop(stop); err != nil {
		t.Fatal(err)
	}
	r.append(0, 2, "after-0")
	r.append(1, 2, "after-1")
	r.awaitApplied("after-0", wakeWithin, "b did not take 0/2")
	r.awaitApplied("after-1", wakeWithin, "b did not take 1/2")
	r.await("b owns both", func() bool { return r.owners() == "b b" })
}

// A pass that read its partition's row before this process's balancing
// round claimed the partition (it saw it free) does not undo the claim
// when it stands aside: the partition is worked at once, not left idle
// until the next round. Here a's pass of 1/2 finds 1/2 released behind
// a's back, and a's round runs in the gap between that pass's state read
// and its standing aside, claiming 1/2 again. Before, the pass then marked
// 1/2 not a's, though a owned its row, and the event it was woken for was
// not applied within the test's deadline (Recheck an hour).
func TestPassStandingAsideKeepsARoundsClaim(t *testing.T) {
	t.Parallel()
	r := newBalanceRig(t, "sa", 2)
	a := r.start("a")
	r.await("a owns both partitions", func() bool { return r.owners() == "a a" && a.quiet(0) })
	b := a.d.balancers[0]
	var once sync.Once
	b.mu.Lock()
	b.standing = func(instance string) {
		if instance != PartitionInstance(1, 2) {
			return
		}
		once.Do(func() {
			if err := a.d.balance(r.ctx, b); err != nil {
				t.Errorf("balancing round: %v", err)
			}
		})
	}
	b.mu.Unlock()
	// 1/2 released behind a's back and an event appended, under 1/2's
	// lock: a pass of 1/2 running now ends first, and none reads 1/2's
	// row before the release or x after it.
	id := ShardID{Consumer: r.consumer, Instance: PartitionInstance(1, 2)}
	tx, err := r.store.Pool().Begin(r.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(r.ctx) }()
	if err := LockShard(r.ctx, tx, r.store, id); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(r.ctx, `UPDATE `+r.store.Table("projector_consumers")+` SET owner = NULL WHERE name = $1 AND instance_id = $2`, id.Consumer, id.Instance); err != nil {
		t.Fatal(err)
	}
	r.append(1, 2, "x")
	if err := tx.Commit(r.ctx); err != nil {
		t.Fatal(err)
	}
	if err := WakeShards(r.ctx, r.store, id); err != nil {
		t.Fatal(err)
	}
	r.awaitApplied("x", wakeWithin, "a's pass undid its round's claim of 1/2")
	if got := r.owners(); got != "a a" {
		t.Fatalf("owners %s, want a a", got)
	}
}
