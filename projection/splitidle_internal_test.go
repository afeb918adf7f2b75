package projection

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
)

// A caught-up partition marked to split whose pass cannot split it yet
// (the consumer's fence is taken: here by the test, as by a command or a
// registration) reads nothing and changes nothing, so its passes write
// nothing: no new row version, WAL or dead tuple per pass. Once the fence
// is free, a pass carries the split out.
func TestIdleMarkedPartitionWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.New()
	store := pgtest.Store(t, types.Registry)
	if err := store.CreatePartitionIndex(ctx); err != nil {
		t.Fatal(err)
	}
	p := NewAsync("w", AsyncConfig{Partitions: 2})
	if err := On(p, types.Commented, func(context.Context, pgx.Tx, projector.Event, testevents.TicketCommented) error { return nil }); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "c", "d"} {
		if err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
			_, err := store.Append(ctx, tx, projector.Stream("ticket", id), projector.ExactVersion(0), testevents.TicketCommented{Body: id})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	marked := ShardID{Consumer: "w", Instance: PartitionPrefix + "0/2"}
	d, err := New(Config{Store: store, Projections: []*Async{p}, Recheck: 20 * time.Millisecond, PollMax: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	passes := make(chan passKind, 100)
	d.waiting = func(id ShardID, kind passKind) {
		if id == marked {
			select {
			case passes <- kind:
			default:
			}
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
	caughtUp := func(n int, what string) {
		t.Helper()
		timeout := time.After(45 * time.Second)
		for n > 0 {
			select {
			case kind := <-passes:
				if kind == passCaughtUp {
					n--
				}
			case <-timeout:
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	caughtUp(1, "partition 0/2 to catch up")

	// The test takes the fence, as a command would, and marks the
	// partition. Its transaction also takes an id, which holds the
	// horizon (an idle shard's cursor follows it: a move is a change the
	// pass writes) once the transactions older than it ended.
	fence, err := store.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = fence.Rollback(ctx) }()
	if _, err := fence.Exec(ctx, waitShardLockSQL, shardLockKey(store.Schema(), ShardID{Consumer: "w", Instance: SharedInstance})); err != nil {
		t.Fatal(err)
	}
	if _, err := fence.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
		t.Fatal(err)
	}
	c := store.Table("projector_consumers")
	type version struct {
		xmin   string
		cursor projector.Position
	}
	row := func() version {
		t.Helper()
		var v version
		if err := store.Pool().QueryRow(ctx, `SELECT xmin::text, cursor_tx_id, cursor_seq FROM `+c+` WHERE name = $1 AND instance_id = $2`,
			marked.Consumer, marked.Instance).Scan(&v.xmin, &v.cursor.TxID, &v.cursor.Seq); err != nil {
			t.Fatal(err)
		}
		return v
	}
	if _, err := store.Pool().Exec(ctx, `UPDATE `+c+` SET split_requested_at = now() WHERE name = $1 AND instance_id = $2`,
		marked.Consumer, marked.Instance); err != nil {
		t.Fatal(err)
	}
	// A pass may have begun before the mark; the ones after it see it.
	caughtUp(1, "a pass of the marked partition")
	was := row()
	for try := 0; ; try++ {
		caughtUp(2, "two more passes of the marked partition")
		now := row()
		if now.cursor == was.cursor {
			if now.xmin != was.xmin {
				t.Fatalf("an idle partition marked to split that could not split wrote its row unchanged (xmin %s, then %s)", was.xmin, now.xmin)
			}
			break
		}
		if try == 20 {
			t.Fatalf("the partition's cursor never stood still (the horizon moved on): %v", now.cursor)
		}
		was = now // an older transaction ended: the horizon moved, and the cursor with it
	}

	// The fence is free: a pass splits the partition.
	if err := fence.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	pgtest.Eventually(t, 45*time.Second, "the marked partition to be split by its pass", func() bool {
		var halves int
		if err := store.Pool().QueryRow(ctx, `SELECT count(*) FROM `+c+` WHERE name = 'w' AND instance_id = ANY($1)`,
			[]string{PartitionPrefix + "0/4", PartitionPrefix + "1/4"}).Scan(&halves); err != nil {
			t.Fatal(err)
		}
		return halves == 2
	})
}
