package rebuild_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
)

// A switch refused MaxAttempts times over (the new version fails, every
// time, on an event a partition further on had handled live) leaves the
// shadow shard dead, like any failure of a new version after MaxAttempts:
// its cursor where the switching passes found it, the old model serving
// meanwhile at version 1. A restart of the shadow shard, once the handler
// is fixed, switches.
func TestBlueGreenSwitchRefusedMaxAttemptsTimesGoesDead(t *testing.T) {
	t.Parallel()
	e := partitionedEnv(t)
	e.maxAttempts = 3
	var fixed atomic.Bool
	// Each refusal waits, in its failing handler (the switching pass
	// holding every partition's lock), for the test to release it.
	failing := make(chan chan struct{})
	e.shadowFault = func(ctx context.Context, ev projector.Event) error {
		// s4…s7 were appended while partition 1 was disabled: a shadow
		// applies their events (those of partition 0) only in the gap.
		if ev.Stream.ID < "s4" || ev.Stream.ID > "s7" || ev.Version != 2 || fixed.Load() {
			return nil
		}
		release := make(chan struct{})
		select {
		case failing <- release:
		case <-ctx.Done():
			return ctx.Err()
		}
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return errors.New("version 2 fails in the gap")
	}
	before := e.laggingPartitions()
	admin := projection.NewAdmin(e.store)
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()

	v2 := startDispatcher(t, e.store, projection.Config{InstanceID: "v2"}, e.sideEffects(2, 2, 0))
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{}); err != nil {
		t.Fatal(err)
	}
	shadow := projection.ShardID{Consumer: "counter", Instance: projection.RebuildInstance}
	// Between two refusals, a shadow pass that does not switch (live
	// partition 0's lock not free within its wait: the test takes it as
	// the refused pass lets it go) reads nothing past the earliest
	// partition's cursor. It must leave the refusal's failure standing.
	var first, dead projection.ShardState
	var last time.Time
	for round := 1; round <= e.maxAttempts; round++ {
		var release chan struct{}
		select {
		case release = <-failing:
		case <-time.After(45 * time.Second):
			t.Fatalf("no switching pass tried the switch a %d. time", round)
		}
		var held *heldPartition
		if round < e.maxAttempts {
			held = e.holdPartitionAfter("counter", projection.PartitionPrefix+"0/2")
		}
		close(release)
		var s projection.ShardState
		eventually(t, 45*time.Second, fmt.Sprintf("refusal %d to be recorded", round), func() bool {
			var err error
			if s, err = admin.Status(e.ctx, shadow); err != nil {
				t.Fatalf("shadow shard: %v", err)
			}
			return s.Attempts > 0 && s.LastErrorAt.After(last)
		})
		last = s.LastErrorAt
		if round == 1 {
			first = s
		}
		if s.Cursor != first.Cursor {
			t.Fatalf("refusal %d left the shadow's cursor at %v; the first left it at %v", round, s.Cursor, first.Cursor)
		}
		if held == nil {
			dead = s
			break
		}
		after := held.passWithoutSwitch(shadow)
		if after.Attempts != s.Attempts || after.Status != s.Status || after.FailedEventID != s.FailedEventID || after.Cursor != s.Cursor {
			t.Fatalf("a shadow pass that did not switch changed refusal %d's failure: status %s, attempts %d, cursor %v; was %s, %d, %v",
				round, after.Status, after.Attempts, after.Cursor, s.Status, s.Attempts, s.Cursor)
		}
	}
	if dead.Status != projection.StatusDead || dead.Attempts != e.maxAttempts {
		t.Fatalf("after %d refusals the shadow shard is %s with %d attempts; want dead after MaxAttempts", e.maxAttempts, dead.Status, dead.Attempts)
	}
	// The old model keeps serving: the rebuild has not switched, and the
	// live tables are version 1's, unchanged.
	if r, err := rebuild.Current(e.ctx, e.store, "counter"); err != nil || r.Status == rebuild.Switched {
		t.Fatalf("rebuild %+v (%v); want it not switched", r, err)
	}
	if now := e.tryCounts(); !maps.Equal(now, before) {
		t.Fatalf("the live model changed while the switch was refused: %v, was %v", now, before)
	}
	var v2rows int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+pgx.Identifier{e.schema, "counts"}.Sanitize()+` WHERE v <> 1`).
		Scan(&v2rows); err != nil || v2rows != 0 {
		t.Fatalf("%d live rows of another version than 1 (%v)", v2rows, err)
	}

	// The handler is fixed: a restart of the dead shadow switches.
	fixed.Store(true)
	if err := admin.Restart(e.ctx, shadow); err != nil {
		t.Fatal(err)
	}
	eventually(t, 45*time.Second, "the rebuild to switch after the restart", func() bool {
		r, err := rebuild.Current(e.ctx, e.store, "counter")
		return err == nil && r.Status == rebuild.Switched
	})
	if err := v2.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	var diff int64
	if err := e.store.Pool().QueryRow(e.ctx, `WITH fresh AS (
			SELECT stream_id, count(*)::int AS n FROM `+e.store.Table("projector_events")+` WHERE stream_type = 'ticket' GROUP BY stream_id)
		SELECT count(*) FROM fresh f FULL JOIN `+pgx.Identifier{e.schema, "counts"}.Sanitize()+` c USING (stream_id)
		WHERE f.n IS DISTINCT FROM c.n OR c.v IS DISTINCT FROM 2`).Scan(&diff); err != nil || diff != 0 {
		t.Fatalf("after the switch the model differs from the log in %d rows (%v)", diff, err)
	}
}

// heldPartition is a live partition's lock, held by the test.
type heldPartition struct {
	e    *env
	tx   pgx.Tx
	pid  uint32
	took chan error
}

// holdPartitionAfter queues the test for the lock of the consumer's live
// partition, which a switching pass holds, and returns once it waits: the
// lock comes to the test as that pass ends, before the next pass can take
// it.
func (e *env) holdPartitionAfter(consumer, partition string) *heldPartition {
	e.t.Helper()
	tx, err := e.store.Pool().Begin(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	h := &heldPartition{e: e, tx: tx, pid: tx.Conn().PgConn().PID(), took: make(chan error, 1)}
	go func() { h.took <- projection.LockPartitions(e.ctx, tx, e.store, consumer, []string{partition}) }()
	eventually(e.t, 45*time.Second, "the test to wait for live "+partition, func() bool {
		var n int
		if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1 AND NOT granted`,
			h.pid).Scan(&n); err != nil {
			e.t.Fatal(err)
		}
		return n > 0
	})
	return h
}

// passWithoutSwitch, once the test holds the partition's lock, waits for
// the shadow shard's next switching try to wait for it, then for that pass
// to end (it gives up the switch after its lock wait and goes on without
// switching), lets the lock go and returns the shadow's state after that
// pass.
func (h *heldPartition) passWithoutSwitch(shadow projection.ShardID) projection.ShardState {
	e := h.e
	e.t.Helper()
	err := <-h.took
	defer func() { _ = h.tx.Rollback(e.ctx) }()
	if err != nil {
		e.t.Fatal(err)
	}
	eventually(e.t, 45*time.Second, "the shadow's switching pass to wait for the held partition", func() bool {
		var n int
		if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM pg_locks h JOIN pg_locks w
				USING (locktype, database, classid, objid, objsubid)
			WHERE h.locktype = 'advisory' AND h.pid = $1 AND h.granted AND NOT w.granted`, h.pid).Scan(&n); err != nil {
			e.t.Fatal(err)
		}
		return n > 0
	})
	// The pass holds the shadow's own lock until it ends.
	if err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		return projection.LockShard(e.ctx, tx, e.store, shadow)
	}); err != nil {
		e.t.Fatal(err)
	}
	s, err := projection.NewAdmin(e.store).Status(e.ctx, shadow)
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

// laggingPartitions sets the stage of the partitioned lagging-live tests:
// streams s0…s3 handled by both partitions of version 1, s4…s7 by
// partition 0 alone (partition 1 disabled meanwhile), version 1's
// dispatcher stopped, and s8…s11 appended after. It returns the model's
// counts.
func (e *env) laggingPartitions() map[string]int {
	t := e.t
	t.Helper()
	e.exec(`CREATE TABLE ` + pgx.Identifier{e.schema, "effects"}.Sanitize() + ` (event text NOT NULL, version int NOT NULL)`)
	appendStreams := func(from, to int) {
		for i := from; i < to; i++ {
			id := fmt.Sprintf("s%d", i)
			e.appendOne(id, testevents.TicketOpened{Title: id})
			e.appendOne(id, testevents.TicketCommented{Body: "2"})
		}
	}
	appendStreams(0, 4)
	v1 := startDispatcher(t, e.store, projection.Config{InstanceID: "v1"}, e.sideEffects(1, 2, 0))
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := v1.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	admin := projection.NewAdmin(e.store)
	lagging := projection.ShardID{Consumer: "counter", Instance: projection.PartitionPrefix + "1/2"}
	if err := admin.Disable(e.ctx, lagging); err != nil {
		t.Fatal(err)
	}
	appendStreams(4, 8)
	if err := v1.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v1.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := admin.Enable(e.ctx, lagging); err != nil {
		t.Fatal(err)
	}
	appendStreams(8, 12)
	counts := e.tryCounts()
	if counts == nil {
		t.Fatal("read the model's counts failed")
	}
	return counts

}
