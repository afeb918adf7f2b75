package projection

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// wakeRecheck is the dispatchers' Recheck in the shard wake tests: far
// above wakeWithin, so a shard (or a retry request) that is not woken
// fails the test instead of running at its Recheck.
const (
	wakeRecheck = time.Hour
	wakeWithin  = 5 * time.Second
)

// wakeRig is a running dispatcher of one unpartitioned consumer "w" whose
// handler reports each comment's body, and which reports each wait of its
// shard's loop after a pass that did not leave it caught up.
type wakeRig struct {
	t       *testing.T
	ctx     context.Context
	store   *postgres.Store
	d       *Dispatcher
	id      ShardID
	applied chan string
	waits   chan passKind
	// waitIDs are the shards of those waits, one for one.
	waitIDs chan ShardID
	// failing makes the handler fail the comment "bad".
	failing atomic.Bool
}

func newWakeRig(t *testing.T) *wakeRig { return newWakeRigOf(t, 0, HaltOnError) }

// newWakeRigOf is newWakeRig of a consumer with partitions partitions
// (none when below 2), whose handler errors do what mode says; its waits
// are reported for each of them.
func newWakeRigOf(t *testing.T, partitions int, mode ErrorMode) *wakeRig {
	t.Helper()
	ctx := context.Background()
	types := testevents.New()
	store := pgtest.Store(t, types.Registry)
	if partitions > 1 {
		if err := store.CreatePartitionIndex(ctx); err != nil {
			t.Fatal(err)
		}
	}
	r := &wakeRig{t: t, ctx: ctx, store: store, id: ShardID{Consumer: "w", Instance: SharedInstance},
		applied: make(chan string, 100), waits: make(chan passKind, 100), waitIDs: make(chan ShardID, 100)}
	p := NewAsync("w", AsyncConfig{MaxAttempts: 1, Partitions: partitions, ErrorMode: mode})
	if err := On(p, types.Commented, func(_ context.Context, _ pgx.Tx, _ projector.Event, c testevents.TicketCommented) error {
		if c.Body == "bad" && r.failing.Load() {
			return errors.New("bad comment")
		}
		r.applied <- c.Body
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{Store: store, Projections: []*Async{p}, Recheck: wakeRecheck})
	if err != nil {
		t.Fatal(err)
	}
	d.waiting = func(id ShardID, kind passKind) {
		if id.Consumer != r.id.Consumer || (partitions < 2 && id != r.id) || kind == passCaughtUp || kind == passMore {
			return
		}
		select {
		case r.waits <- kind:
			r.waitIDs <- id
		default: // the test looks for the first few only
		}
	}
	listening := make(chan struct{}, 1)
	d.listened = func() {
		select {
		case listening <- struct{}{}:
		default:
		}
	}
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stop, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = d.Stop(stop)
	})
	r.d = d
	// A wake sent before the dispatcher listens is missed (it looks at
	// every shard once when it starts listening): the tests' wakes come
	// after.
	select {
	case <-listening:
	case <-time.After(10 * time.Second):
		t.Fatal("the dispatcher never listened for shard wakes")
	}
	return r
}

// append commits one comment, in a stream of its own.
func (r *wakeRig) append(body string) {
	r.t.Helper()
	stream := projector.Stream("ticket", body)
	if err := pgx.BeginFunc(r.ctx, r.store.Pool(), func(tx pgx.Tx) error {
		_, err := r.store.Append(r.ctx, tx, stream, projector.ExactVersion(0), testevents.TicketCommented{Body: body})
		return err
	}); err != nil {
		r.t.Fatal(err)
	}
}

// awaitApplied waits up to within for body to be applied.
func (r *wakeRig) awaitApplied(body string, within time.Duration, why string) {
	r.t.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	for {
		select {
		case got := <-r.applied:
			if got == body {
				return
			}
		case <-timer.C:
			r.t.Fatalf("%s not applied within %v (Recheck %v): %s", body, within, wakeRecheck, why)
		}
	}
}

// awaitWait waits for the shard's loop to stand aside with kind, that is
// to wait for its Recheck or a wake.
func (r *wakeRig) awaitWait(kind passKind) {
	r.t.Helper()
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	var seen []passKind
	for {
		select {
		case got := <-r.waits:
			<-r.waitIDs
			if got == kind {
				return
			}
			seen = append(seen, got)
		case <-timer.C:
			r.t.Fatalf("the shard's loop never stood aside with pass kind %d; it did with %v (%d: locked elsewhere)", kind, seen, passLocked)
		}
	}
}

// An operator's enable wakes the dispatcher at once: the event appended
// while the shard was disabled is applied well before the Recheck the
// dispatcher's loop was waiting for.
func TestEnableWakesDispatcher(t *testing.T) {
	t.Parallel()
	r := newWakeRig(t)
	r.append("e1")
	r.awaitApplied("e1", 10*time.Second, "the dispatcher does not run")
	admin := NewAdmin(r.store)
	if err := admin.Disable(r.ctx, r.id); err != nil {
		t.Fatal(err)
	}
	r.append("e2")
	r.awaitWait(passDisabled)
	if err := admin.Enable(r.ctx, r.id); err != nil {
		t.Fatal(err)
	}
	r.awaitApplied("e2", wakeWithin, "the enable did not wake the dispatcher")
}

// An operator's restart of a dead shard wakes the dispatcher at once: the
// event that killed it, fixed meanwhile, is applied well before the
// Recheck the dispatcher's loop was waiting for.
func TestRestartWakesDispatcher(t *testing.T) {
	t.Parallel()
	r := newWakeRig(t)
	r.failing.Store(true)
	r.append("bad")
	r.awaitWait(passDead)
	r.failing.Store(false) // the handler is fixed
	if err := NewAdmin(r.store).Restart(r.ctx, r.id); err != nil {
		t.Fatal(err)
	}
	r.awaitApplied("bad", wakeWithin, "the restart did not wake the dispatcher")
}

// A shard whose lock someone else held (an operator's command, a search
// verify's held read, a rebuild request) is looked at again as soon as the
// holder, done, sends its wake: the event appended meanwhile is applied
// well before the Recheck the loop was waiting for. Both the wake naming
// the shard and the one naming its consumer do it.
func TestReleasedLockWakesDispatcher(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		wake func(r *wakeRig) error
	}{
		{"shard", func(r *wakeRig) error { return WakeShards(r.ctx, r.store, ShardID{Consumer: "w"}) }},
		{"consumer", func(r *wakeRig) error { return WakeConsumer(r.ctx, r.store, "w") }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := newWakeRig(t)
			r.append("e1")
			r.awaitApplied("e1", 10*time.Second, "the dispatcher does not run")
			tx, err := r.store.Pool().Begin(r.ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(r.ctx) }()
			if err := LockShard(r.ctx, tx, r.store, r.id); err != nil {
				t.Fatal(err)
			}
			r.append("e2")
			r.awaitWait(passLocked)
			// A held read writes nothing and rolls back.
			if err := tx.Rollback(r.ctx); err != nil {
				t.Fatal(err)
			}
			if err := c.wake(r); err != nil {
				t.Fatal(err)
			}
			r.awaitApplied("e2", wakeWithin, "the released lock's wake did not wake the dispatcher")
		})
	}
}

// The same for a partition: an operator's enable of a partitioned
// consumer's partitions wakes their loops at once.
func TestEnablePartitionWakesDispatcher(t *testing.T) {
	t.Parallel()
	r := newWakeRigOf(t, 2, HaltOnError)
	r.append("e1")
	r.awaitApplied("e1", 10*time.Second, "the dispatcher does not run")
	admin := NewAdmin(r.store)
	parts := []ShardID{{Consumer: "w", Instance: PartitionInstance(0, 2)}, {Consumer: "w", Instance: PartitionInstance(1, 2)}}
	for _, id := range parts {
		if err := admin.Disable(r.ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	r.append("e2")
	// Both partitions' loops stand aside, so whichever holds e2 waits.
	disabled := map[ShardID]bool{}
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	for len(disabled) < len(parts) {
		select {
		case kind := <-r.waits:
			if id := <-r.waitIDs; kind == passDisabled {
				disabled[id] = true
			}
		case <-timer.C:
			t.Fatalf("only %v of the partitions stood aside disabled", disabled)
		}
	}
	for _, id := range parts {
		if err := admin.Enable(r.ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	r.awaitApplied("e2", wakeWithin, "the partitions' enable did not wake the dispatcher")
}

// A dead letter's retry request (`dead-letters retry` without --here)
// wakes the dispatchers' retry loop at once: the dead-lettered event,
// fixed meanwhile, is applied well before the Recheck the loop polls at.
func TestDeadLetterRetryRequestWakesDispatcher(t *testing.T) {
	t.Parallel()
	r := newWakeRigOf(t, 0, SkipApplyErrors)
	r.failing.Store(true)
	r.append("bad")
	var dls []DeadLetter
	pgtest.Eventually(t, 10*time.Second, "the dead letter of \"bad\"", func() bool {
		var err error
		if dls, err = ListDeadLetters(r.ctx, r.store, DeadLetterFilter{Consumer: "w", Status: DeadLetterOpen}); err != nil {
			t.Fatal(err)
		}
		return len(dls) == 1
	})
	r.failing.Store(false) // the handler is fixed
	if err := RequestDeadLetterRetry(r.ctx, r.store, []int64{dls[0].ID}); err != nil {
		t.Fatal(err)
	}
	r.awaitApplied("bad", wakeWithin, "the retry request did not wake the dispatcher")
}

// A park's retry request (`parked retry` without --here) wakes the
// dispatchers' retry loop at once, the same.
func TestParkRetryRequestWakesDispatcher(t *testing.T) {
	t.Parallel()
	r := newWakeRigOf(t, 0, ParkStream)
	r.failing.Store(true)
	r.append("bad")
	var parks []Park
	pgtest.Eventually(t, 10*time.Second, "the park of \"bad\"'s stream", func() bool {
		var err error
		if parks, err = ListParks(r.ctx, r.store, ParkFilter{Consumer: "w", Status: ParkOpen}); err != nil {
			t.Fatal(err)
		}
		return len(parks) == 1
	})
	r.failing.Store(false)
	if err := RequestParkRetry(r.ctx, r.store, parks[0].ID, "wake test"); err != nil {
		t.Fatal(err)
	}
	r.awaitApplied("bad", wakeWithin, "the retry request did not wake the dispatcher")
}
