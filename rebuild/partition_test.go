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

// partitionedEnv is newEnv with the log's partition index, which
// partitioned consumers need.
func partitionedEnv(t *testing.T) *env {
	t.Helper()
	e := newEnv(t)
	if err := e.store.CreatePartitionIndex(e.ctx); err != nil {
		t.Fatal(err)
	}
	return e
}

// freshDiff compares the live counts table with what a fresh build of the
// whole log gives (every opened and commented event counted per stream),
// in one statement: the rows that differ, and the versions the rows carry.
func (e *env) freshDiff() (diff int64, versions []int32, err error) {
	counts := pgx.Identifier{e.schema, "counts"}.Sanitize()
	err = e.store.Pool().QueryRow(e.ctx, `WITH fresh AS (
			SELECT stream_id, count(*)::int AS n FROM `+e.store.Table("projector_events")+`
			WHERE type IN ('ticket.opened', 'ticket.commented') GROUP BY stream_id)
		SELECT (SELECT count(*) FROM fresh f FULL JOIN `+counts+` c USING (stream_id) WHERE f.n IS DISTINCT FROM c.n),
			(SELECT coalesce(array_agg(DISTINCT v ORDER BY v), '{}') FROM `+counts+`)`).Scan(&diff, &versions)
	return diff, versions, err
}

// A blue/green rebuild of a partitioned consumer, under concurrent writers,
// with two processes of version 1 serving and two of version 2 building:
// the shadow builds unpartitioned, switches in with every partition at its
// cursor, and the model version 2 serves once the writers stop equals a
// fresh build of the log. The processes of version 1 keep running after
// the switch, so version 2's must get every partition from them (the
// balancing is per model version).
func TestBlueGreenRebuildOfPartitionedConsumer(t *testing.T) {
	t.Parallel()
	e := partitionedEnv(t)
	cfg := func(id string) projection.Config { return projection.Config{InstanceID: id} }
	startDispatcher(t, e.store, cfg("old-a"), e.counter(1, projection.AsyncConfig{BatchSize: 50, Partitions: 4}))
	startDispatcher(t, e.store, cfg("old-b"), e.counter(1, projection.AsyncConfig{BatchSize: 50, Partitions: 4}))
	stop := make(chan struct{})
	writers := e.write(4, stop)
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		writers.Wait()
	}()
	eventually(t, time.Minute, "version 1 to serve", func() bool {
		_, versions, err := e.freshDiff()
		return err == nil && len(versions) == 1 && versions[0] == 1
	})
	startDispatcher(t, e.store, cfg("new-a"), e.counter(2, projection.AsyncConfig{BatchSize: 200, Partitions: 4}))
	startDispatcher(t, e.store, cfg("new-b"), e.counter(2, projection.AsyncConfig{BatchSize: 200, Partitions: 4}))

	rb, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rb.Version != 2 || rb.Mode != rebuild.BlueGreen {
		t.Fatalf("requested %+v", rb)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 3*time.Minute)
	defer cancel()
	final, err := rebuild.Wait(ctx, e.store, "counter", 20*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	if final.Status != rebuild.Switched {
		t.Fatalf("rebuild ended %+v", final)
	}
	close(stop)
	writers.Wait()
	// Events after the switch (the writers may have finished before it):
	// streams enough that every partition gets some, which version 2's
	// processes apply while version 1's still run.
	if err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		for i := range 64 {
			if _, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", fmt.Sprintf("after-%d", i)), projector.NoStream,
				testevents.TicketOpened{Title: "after"}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	var diff int64
	var versions []int32
	eventually(t, 2*time.Minute, "version 2 to serve a model equal to a fresh build", func() bool {
		diff, versions, err = e.freshDiff()
		return err == nil && diff == 0 && len(versions) == 1 && versions[0] == 2
	})
	// Every partition switched to version 2; the fence stays.
	rows, err := e.store.Pool().Query(e.ctx, `SELECT instance_id, version FROM `+e.store.Table("projector_consumers")+` WHERE name = 'counter'`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for rows.Next() {
		var id string
		var v int
		if err := rows.Scan(&id, &v); err != nil {
			t.Fatal(err)
		}
		got[id] = v
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if len(got) != 5 || got[projection.SharedInstance] != projection.PartitionedVersion {
		t.Fatalf("consumer rows after the switch: %v, want the fence and 4 partitions", got)
	}
	for p := range 4 {
		if v := got[projection.PartitionInstance(p, 4)]; v != 2 {
			t.Fatalf("partition %d at version %d after the switch, want 2 (%v)", p, v, got)
		}
	}
}

// An in-place rebuild of a partitioned consumer, under concurrent writers,
// with two processes running it: the tables are cleared and every
// partition rewound under every partition's lock, each replays its own
// streams, the rebuild is done once every partition has replayed up to
// where it stood, and the model equals a fresh build of the log. A
// disabled partition refuses it (its streams would stay empty).
func TestInPlaceRebuildOfPartitionedConsumer(t *testing.T) {
	t.Parallel()
	e := partitionedEnv(t)
	startDispatcher(t, e.store, projection.Config{InstanceID: "one"}, e.counter(1, projection.AsyncConfig{BatchSize: 50, Partitions: 4}))
	startDispatcher(t, e.store, projection.Config{InstanceID: "two"}, e.counter(1, projection.AsyncConfig{BatchSize: 50, Partitions: 4}))
	stop := make(chan struct{})
	writers := e.write(4, stop)
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		writers.Wait()
	}()
	eventually(t, time.Minute, "the model to fill", func() bool {
		_, versions, err := e.freshDiff()
		return err == nil && len(versions) == 1
	})
	admin := projection.NewAdmin(e.store)
	p2 := projection.ShardID{Consumer: "counter", Instance: projection.PartitionInstance(2, 4)}
	if err := admin.Disable(e.ctx, p2); err != nil {
		t.Fatal(err)
	}
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Mode: rebuild.InPlace}); !errors.Is(err, rebuild.ErrDisabled) {
		t.Fatalf("in place with a disabled partition: %v, want ErrDisabled", err)
	}
	if err := admin.Enable(e.ctx, p2); err != nil {
		t.Fatal(err)
	}
	rb, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Mode: rebuild.InPlace})
	if err != nil {
		t.Fatal(err)
	}
	if rb.Mode != rebuild.InPlace || rb.Status != rebuild.Building {
		t.Fatalf("requested %+v", rb)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 3*time.Minute)
	defer cancel()
	final, err := rebuild.Wait(ctx, e.store, "counter", 20*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	if final.Status != rebuild.Done {
		t.Fatalf("rebuild ended %+v", final)
	}
	close(stop)
	writers.Wait()
	var diff int64
	eventually(t, 2*time.Minute, "a model equal to a fresh build", func() bool {
		diff, _, err = e.freshDiff()
		return err == nil && diff == 0
	})
	var fence int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT version FROM `+e.store.Table("projector_consumers")+` WHERE name = 'counter' AND instance_id = $1`,
		projection.SharedInstance).Scan(&fence); err != nil || fence != projection.PartitionedVersion {
		t.Fatalf("the fence after an in-place rebuild: version %d, %v", fence, err)
	}
}

// A version that declares no partitions never switches in for a
// partitioned consumer: its shadow builds and catches up, the switch is
// refused with an error saying why, and the partitions and their
// fence stay as they were, so the processes of the live version are not
// left writing the tables the new version would serve.
func TestRebuildOfPartitionedConsumerByUnpartitionedVersionRefused(t *testing.T) {
	t.Parallel()
	e := partitionedEnv(t)
	startDispatcher(t, e.store, projection.Config{InstanceID: "parted"}, e.counter(1, projection.AsyncConfig{Partitions: 4}))
	for i := range 20 {
		if err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
			_, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", fmt.Sprintf("s%d", i)), projector.NoStream, testevents.TicketOpened{Title: "t"})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	logs := &pgtest.SyncBuffer{}
	startDispatcher(t, e.store, projection.Config{InstanceID: "flat", Logger: slog.New(slog.NewTextHandler(logs, nil))}, e.counter(2, projection.AsyncConfig{}))
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the switch refused, or done", func() bool {
		rb, err := rebuild.Current(e.ctx, e.store, "counter")
		return strings.Contains(logs.String(), "rebuild cannot switch: the live consumer is partitioned differently") || (err == nil && !rb.Active())
	})
	rb, err := rebuild.Current(e.ctx, e.store, "counter")
	if err != nil || rb.Status != rebuild.Building {
		t.Fatalf("rebuild after the refused switch: %+v, %v", rb, err)
	}
	var fence, parts int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT max(version) FILTER (WHERE instance_id = $1), count(*) FILTER (WHERE starts_with(instance_id, $2) AND version = 1)
		FROM `+e.store.Table("projector_consumers")+` WHERE name = 'counter'`, projection.SharedInstance, projection.PartitionPrefix).Scan(&fence, &parts); err != nil {
		t.Fatal(err)
	}
	if fence != projection.PartitionedVersion || parts != 4 {
		t.Fatalf("after the refused switch: fence at version %d, %d partitions at version 1; want the fence and 4", fence, parts)
	}
}

// The shadow's dead letters go, at the switch of a partitioned consumer, to
// the partition their stream belongs to: the live shard whose lock a retry
// of them takes.
func TestPartitionedSwitchHandsDeadLettersToTheirPartition(t *testing.T) {
	t.Parallel()
	e := partitionedEnv(t)
	startDispatcher(t, e.store, projection.Config{InstanceID: "v1"}, e.counter(1, projection.AsyncConfig{Partitions: 4}))
	streams := []string{"poison-a", "poison-b", "poison-c", "poison-d", "poison-e", "poison-f"}
	for _, id := range streams {
		if err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
			_, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", id), projector.NoStream,
				testevents.TicketOpened{Title: "t"}, testevents.TicketClosed{Reason: "r"})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	// Version 2 also reads closed events, and fails on every one of them.
	v2 := e.counter(2, projection.AsyncConfig{Partitions: 4, ErrorMode: projection.SkipApplyErrors})
	must(projection.OnEvent(v2, e.types.Closed, func(context.Context, pgx.Tx, projector.Event) error {
		return errors.New("closing refused")
	}))
	startDispatcher(t, e.store, projection.Config{InstanceID: "v2"}, v2)
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	if final, err := rebuild.Wait(ctx, e.store, "counter", 20*time.Millisecond, nil); err != nil || final.Status != rebuild.Switched {
		t.Fatalf("rebuild ended %+v, %v", final, err)
	}
	// The shadow may switch below the last events (a transaction elsewhere
	// holding the horizon back): the partitions dead-letter the rest.
	var dls []projection.DeadLetter
	eventually(t, time.Minute, "a dead letter for every stream", func() bool {
		var err error
		dls, err = projection.ListDeadLetters(e.ctx, e.store, projection.DeadLetterFilter{Consumer: "counter"})
		return err == nil && len(dls) >= len(streams)
	})
	if len(dls) != len(streams) {
		t.Fatalf("%d dead letters, want %d: %+v", len(dls), len(streams), dls)
	}
	parts := map[string]bool{}
	for _, dl := range dls {
		h := postgres.StreamHash(dl.Tenant, dl.StreamType, dl.StreamID)
		want := projection.PartitionInstance(int(h>>30), 4)
		if dl.Instance != want {
			t.Errorf("dead letter of stream %s on %s, want its partition %s", dl.StreamID, dl.Instance, want)
		}
		parts[dl.Instance] = true
	}
	if len(parts) < 2 {
		t.Logf("the streams fell in %d partition(s) only", len(parts))
	}
}

// An in-place rebuild runs on a partitioned consumer's partitions: status
// and the console show it beside each of them (and the consumer's row);
// a blue/green one beside the shadow alone.
func TestForShardFindsInPlaceRebuildOnPartitions(t *testing.T) {
	t.Parallel()
	rbs := []rebuild.Rebuild{{ID: 1, Name: "c", Mode: rebuild.InPlace, Status: rebuild.Building}}
	for _, inst := range []string{projection.PartitionInstance(0, 4), projection.PartitionInstance(3, 4), projection.SharedInstance} {
		if rebuild.ForShard(rbs, projection.ShardID{Consumer: "c", Instance: inst}) == nil {
			t.Errorf("in place: no rebuild beside %s", inst)
		}
	}
	rbs[0].Mode = rebuild.BlueGreen
	if rebuild.ForShard(rbs, projection.ShardID{Consumer: "c", Instance: projection.PartitionInstance(1, 4)}) != nil {
		t.Error("blue/green: a rebuild beside a partition")
	}
}
