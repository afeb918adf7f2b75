package rebuild_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
	"github.com/projectorhq/projector/stores/postgres"
)

// shardKey is the advisory lock key of a shard, as projection.LockShard
// builds it.
func shardKey(schema, consumer, instance string) string {
	return "projector.shard\x1f" + schema + "\x1f" + consumer + "\x1f" + instance
}

// holdShardLock takes a shard's advisory lock in a transaction of its own,
// as a long live batch holds it, until the returned release is called (or
// the test ends).
func holdShardLock(t *testing.T, store *postgres.Store, consumer string) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := store.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := projection.LockShard(ctx, tx, store, projection.ShardID{Consumer: consumer}); err != nil {
		_ = tx.Rollback(ctx)
		t.Fatal(err)
	}
	released := false
	release = func() {
		if !released {
			released = true
			_ = tx.Rollback(ctx)
		}
	}
	t.Cleanup(release)
	return release
}

// waitAdvisoryWaiter waits until a session waits for the advisory lock key
// (or done has something to say, which the caller then reads).
func waitAdvisoryWaiter(t *testing.T, store *postgres.Store, key string, done chan error) {
	t.Helper()
	eventually(t, time.Minute, "the request to wait for the live shard's lock", func() bool {
		if len(done) > 0 {
			return true
		}
		var n int
		err := store.Pool().QueryRow(context.Background(), `WITH k AS (SELECT hashtextextended($1, 0) AS h)
			SELECT count(*) FROM pg_locks l, k WHERE l.locktype = 'advisory' AND NOT l.granted AND l.objsubid = 1
				AND l.classid::text::bigint = ((k.h >> 32) & 4294967295) AND l.objid::text::bigint = (k.h & 4294967295)`, key).Scan(&n)
		return err == nil && n > 0
	})
}

// pruneTickets deletes every ticket event (aggregate history, asked for)
// older than a nanosecond, as `events prune --older-than 1ns --stream-type
// ticket --include-aggregates` does, and returns how many went.
func pruneTickets(t *testing.T, store *postgres.Store) int64 {
	t.Helper()
	res, err := store.Prune(context.Background(), postgres.PruneOptions{OlderThan: time.Nanosecond, StreamTypes: []string{"ticket"}, IncludeAggregates: true})
	if err != nil {
		t.Fatal(err)
	}
	return res.Deleted
}

// A rebuild request waiting for the live shard's lock (a long batch holds
// it) while `events prune` deletes events the projection reads must be
// refused with ErrPruned: the prune, seeing only the live cursor past them,
// deletes them, and a replay from the start of the log would build (and, blue/green,
// switch in) a model without them. Neither mode may leave anything behind.
func TestRequestRacingPruneIsRefused(t *testing.T) {
	t.Parallel()
	for _, mode := range []rebuild.Mode{rebuild.BlueGreen, rebuild.InPlace} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			d := e.dispatcher(e.counter(1, projection.AsyncConfig{}))
			for i := range 25 {
				e.appendBatch(t, i, 2)
			}
			ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
			defer cancel()
			if err := d.CatchUp(ctx); err != nil {
				t.Fatal(err)
			}
			release := holdShardLock(t, e.store, "counter")
			done := make(chan error, 1)
			go func() {
				_, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Mode: mode})
				done <- err
			}()
			waitAdvisoryWaiter(t, e.store, shardKey(e.schema, "counter", projection.SharedInstance), done)
			deleted := pruneTickets(t, e.store)
			release()
			err := <-done
			if deleted != 50 {
				t.Fatalf("the prune in the gap deleted %d events, want 50 (the request: %v)", deleted, err)
			}
			if !errors.Is(err, rebuild.ErrPruned) {
				final, werr := rebuild.Wait(ctx, e.store, "counter", 10*time.Millisecond, nil)
				r, _ := e.read()
				t.Fatalf("a request racing a prune of 50 of its events: %v, want ErrPruned; the rebuild ended %s (%v) with %d events counted",
					err, final.Status, werr, r.counted)
			}
			if rs, err := rebuild.List(e.ctx, e.store, "counter"); err != nil || len(rs) != 0 {
				t.Fatalf("the refused request left rebuilds: %+v, %v", rs, err)
			}
			if r, err := e.read(); err != nil || r.counted != 50 {
				t.Fatalf("the refused request changed the live model: %+v, %v", r, err)
			}
		})
	}
}

// The same race for a partial rebuild: a prune committing while it waits
// for the live shard's lock would leave the scope rebuilt without the
// pruned events. It must be refused, the scope left as it was.
func TestPartialRebuildRacingPruneIsRefused(t *testing.T) {
	t.Parallel()
	e := newPartialEnv(t)
	p := e.tickets("tickets", "tickets", 1)
	d := e.dispatcher(p)
	for i := range 5 {
		if err := e.ticket(projector.TenantStream("a", "ticket", fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	before := e.rows("tickets", "true")
	release := holdShardLock(t, e.store, "tickets")
	done := make(chan error, 1)
	go func() {
		_, err := rebuild.Partial(e.ctx, e.store, e.tickets("tickets", "tickets", 1), projection.TenantScope("a"), rebuild.PartialOptions{})
		done <- err
	}()
	waitAdvisoryWaiter(t, e.store, shardKey(e.schema, "tickets", projection.SharedInstance), done)
	deleted := pruneTickets(t, e.store)
	release()
	err := <-done
	if deleted != 20 {
		t.Fatalf("the prune in the gap deleted %d events, want 20 (the partial rebuild: %v)", deleted, err)
	}
	if !errors.Is(err, rebuild.ErrPruned) {
		t.Fatalf("a partial rebuild racing a prune of its scope's events: %v, want ErrPruned; the scope now holds %v, was %v",
			err, e.rows("tickets", "true"), before)
	}
	if after := e.rows("tickets", "true"); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("the refused partial rebuild changed the scope: %v, was %v", after, before)
	}
}

// The same race for an inline rebuild: a prune committing between its
// check for pruned events and its cursor (here, while it waits to copy a
// live table a migration holds) would let the replay miss the pruned
// events and switch in a model without them. It must be refused.
func TestInlineRebuildRacingPruneIsRefused(t *testing.T) {
	t.Parallel()
	e := newInlineEnv(t)
	for i := range 10 {
		if err := e.append(e.ctx, i, false); err != nil {
			t.Fatal(err)
		}
	}
	e.settle()
	before := e.count(`SELECT coalesce(sum(n), 0) FROM ` + e.ident("tickets"))

	tx, err := e.store.Pool().Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(e.ctx) }()
	if _, err := tx.Exec(e.ctx, `LOCK TABLE `+e.ident("tickets")+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := rebuild.Inline(e.ctx, e.store, e.p, rebuild.InlineOptions{Tables: []string{e.schema + ".tickets"}})
		done <- err
	}()
	eventually(t, time.Minute, "the rebuild to wait to copy the live table", func() bool {
		if len(done) > 0 {
			return true
		}
		var n int
		err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = $1::regclass`, e.ident("tickets")).Scan(&n)
		return err == nil && n > 0
	})
	deleted := pruneTickets(t, e.store)
	_ = tx.Rollback(e.ctx)
	err = <-done
	if deleted != 10 {
		t.Fatalf("the prune in the gap deleted %d events, want 10 (the rebuild: %v)", deleted, err)
	}
	if !errors.Is(err, rebuild.ErrPruned) {
		t.Fatalf("an inline rebuild racing a prune of its events: %v, want ErrPruned; the model now counts %d events, counted %d",
			err, e.count(`SELECT coalesce(sum(n), 0) FROM `+e.ident("tickets")), before)
	}
	if n := e.count(`SELECT coalesce(sum(n), 0) FROM ` + e.ident("tickets")); n != before {
		t.Fatalf("the refused inline rebuild changed the live model: %d events counted, was %d", n, before)
	}
}
