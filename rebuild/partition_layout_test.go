package rebuild_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
	"github.com/projectorhq/projector/stores/postgres"
)

// Rebuilds of a partitioned consumer beside live layout changes (split and
// merge, projection/split.go) and partitions by key.

// appendTickets appends one opened ticket to each of n new streams named
// prefix-i.
func (e *env) appendTickets(prefix string, n int) {
	e.t.Helper()
	if err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		for i := range n {
			if _, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", fmt.Sprintf("%s-%d", prefix, i)), projector.NoStream,
				testevents.TicketOpened{Title: "t"}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		e.t.Fatal(err)
	}
}

// A merge's holds (a merge killed after setting them leaves the halves
// waiting there) stop both rebuilds from rewinding or moving the held
// partitions: an in-place rebuild is refused (ErrMergeUnderWay), and a
// blue/green switch waits, saying why, until the merge is finished, then
// switches every partition of the merged layout.
func TestPartitionedRebuildWaitsForMerge(t *testing.T) {
	t.Parallel()
	e := partitionedEnv(t)
	startDispatcher(t, e.store, projection.Config{InstanceID: "v1"}, e.counter(1, projection.AsyncConfig{Partitions: 4}))
	e.appendTickets("s", 40)
	eventually(t, time.Minute, "version 1 to serve every stream", func() bool {
		diff, versions, err := e.freshDiff()
		return err == nil && diff == 0 && len(versions) == 1 && versions[0] == 1
	})
	// The merge of 2/4 and 3/4 into 1/2, killed after its holds.
	if _, err := e.store.Pool().Exec(e.ctx, `UPDATE `+e.store.Table("projector_consumers")+` SET hold_tx_id = cursor_tx_id, hold_seq = cursor_seq
		WHERE name = 'counter' AND instance_id = ANY($1)`, []string{projection.PartitionInstance(2, 4), projection.PartitionInstance(3, 4)}); err != nil {
		t.Fatal(err)
	}
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Mode: rebuild.InPlace}); !errors.Is(err, rebuild.ErrMergeUnderWay) {
		t.Fatalf("in place while a merge holds partitions: %v, want ErrMergeUnderWay", err)
	}

	logs := &pgtest.SyncBuffer{}
	startDispatcher(t, e.store, projection.Config{InstanceID: "v2", Logger: slog.New(slog.NewTextHandler(logs, nil))},
		e.counter(2, projection.AsyncConfig{Partitions: 4}))
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the switch to wait for the merge, or be done", func() bool {
		rb, err := rebuild.Current(e.ctx, e.store, "counter")
		return strings.Contains(logs.String(), "rebuild waits to switch: a partition is held for a merge") || (err == nil && !rb.Active())
	})
	if rb, err := rebuild.Current(e.ctx, e.store, "counter"); err != nil || rb.Status != rebuild.Building {
		t.Fatalf("rebuild while a merge holds partitions: %+v, %v; want it building", rb, err)
	}

	// Finishing the merge lets the switch go through, for the merged layout.
	changes, err := projection.NewAdmin(e.store).Merge(e.ctx, "counter", 30*time.Second, postgres.Segment{Value: 2, Bits: 2})
	if err != nil || len(changes) != 1 {
		t.Fatalf("merge: %v, %v", changes, err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	final, err := rebuild.Wait(ctx, e.store, "counter", 20*time.Millisecond, nil)
	if err != nil || final.Status != rebuild.Switched {
		t.Fatalf("rebuild after the merge: %+v, %v", final, err)
	}
	e.appendTickets("after", 40)
	eventually(t, time.Minute, "version 2 to serve a model equal to a fresh build", func() bool {
		diff, versions, err := e.freshDiff()
		return err == nil && diff == 0 && len(versions) == 1 && versions[0] == 2
	})
	var parts []string
	rows, err := e.store.Pool().Query(e.ctx, `SELECT instance_id || '@v' || version FROM `+e.store.Table("projector_consumers")+`
		WHERE name = 'counter' AND starts_with(instance_id, $1) ORDER BY instance_id`, projection.PartitionPrefix)
	if err == nil {
		parts, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	want := []string{projection.PartitionInstance(0, 4) + "@v2", projection.PartitionInstance(1, 2) + "@v2", projection.PartitionInstance(1, 4) + "@v2"} // by instance id
	if err != nil || strings.Join(parts, " ") != strings.Join(want, " ") {
		t.Fatalf("partitions after the switch: %v, %v; want %v", parts, err, want)
	}
}

// An in-place rebuild under way: a split carries each partition's replay
// mark to its halves (each replays its streams up to where the parent
// stood), and a merge of replaying halves is refused (the parent would
// have one mark for two). The rebuild then finishes with a model equal to
// a fresh build.
func TestInPlaceRebuildBesideSplitAndMerge(t *testing.T) {
	t.Parallel()
	e := partitionedEnv(t)
	e.appendTickets("s", 40)
	p := e.counter(1, projection.AsyncConfig{Partitions: 2})
	// Registered, not running: the rebuild's replay stays under way until
	// a dispatcher runs.
	d, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{p}, InstanceID: "reg"})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(e.ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "version 1 to serve every stream", func() bool {
		diff, _, err := e.freshDiff()
		return err == nil && diff == 0
	})
	if err := d.Stop(e.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Mode: rebuild.InPlace}); err != nil {
		t.Fatal(err)
	}
	admin := projection.NewAdmin(e.store)
	if _, err := admin.Split(e.ctx, "counter", postgres.Segment{Value: 1, Bits: 1}); err != nil {
		t.Fatal(err)
	}
	var marked int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+e.store.Table("projector_consumers")+`
		WHERE name = 'counter' AND instance_id = ANY($1) AND replay_until_tx_id IS NOT NULL`,
		[]string{projection.PartitionInstance(2, 4), projection.PartitionInstance(3, 4)}).Scan(&marked); err != nil || marked != 2 {
		t.Fatalf("halves of a replaying partition with a replay mark: %d, %v; want 2", marked, err)
	}
	if _, err := admin.Merge(e.ctx, "counter", time.Second, postgres.Segment{Value: 2, Bits: 2}); !errors.Is(err, projector.ErrInvalidTransition) ||
		!strings.Contains(err.Error(), "replays an in-place rebuild") {
		t.Fatalf("merge of replaying halves: %v, want refused", err)
	}
	startDispatcher(t, e.store, projection.Config{InstanceID: "run"}, e.counter(1, projection.AsyncConfig{Partitions: 2}))
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	final, err := rebuild.Wait(ctx, e.store, "counter", 20*time.Millisecond, nil)
	if err != nil || final.Status != rebuild.Done {
		t.Fatalf("rebuild: %+v, %v", final, err)
	}
	if diff, _, err := e.freshDiff(); err != nil || diff != 0 {
		t.Fatalf("model after the rebuild: %d rows differ from a fresh build, %v", diff, err)
	}
}

// A consumer partitioned by key (as sagas are) is not rebuilt: its
// partitions hold keys, not streams, which the partitioned rebuild's
// hand-over of dead letters and replay assume.
func TestRebuildOfKeyedPartitionsRefused(t *testing.T) {
	t.Parallel()
	e := partitionedEnv(t)
	keyed := projection.AsyncConfig{Partitions: 2, PartitionKey: func(ev projector.Event) (string, error) { return ev.Stream.ID, nil }}
	startDispatcher(t, e.store, projection.Config{InstanceID: "keyed"}, e.counter(1, keyed))
	for _, mode := range []rebuild.Mode{rebuild.BlueGreen, rebuild.InPlace} {
		if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Mode: mode}); !errors.Is(err, rebuild.ErrNotRebuildable) ||
			!strings.Contains(err.Error(), "by key") {
			t.Errorf("%s rebuild of a consumer partitioned by key: %v, want ErrNotRebuildable", mode, err)
		}
	}
	scoped := keyed
	scoped.ResetScope = func(context.Context, pgx.Tx, projection.Scope) error { return nil }
	if _, err := rebuild.Partial(e.ctx, e.store, e.counter(1, scoped), projection.TenantScope("a"), rebuild.PartialOptions{}); !errors.Is(err, rebuild.ErrNotRebuildable) ||
		!strings.Contains(err.Error(), "by key") {
		t.Errorf("partial rebuild of a consumer partitioned by key: %v, want ErrNotRebuildable", err)
	}
}
