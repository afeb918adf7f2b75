package rebuild_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
)

// sideEffects is a projection that counts every event per stream into the
// declared table and has a side effect outside its model for each: an
// opened event Emits an echo (stream "echo"/"<stream>-<version>"), a
// commented one runs a SkipOnReplay handler that records it in an effects
// table no rebuild shadows. So the log and that table show, per event,
// how often a version handled it live.
func (e *env) sideEffects(version, partitions, rebuildBatch int) *projection.Async {
	effects := pgx.Identifier{e.schema, "effects"}.Sanitize()
	cfg := projection.AsyncConfig{Version: version, Tables: []string{e.table}, Partitions: partitions,
		RebuildBatchSize: rebuildBatch, RetryBackoff: 10 * time.Millisecond}
	if version == 2 {
		cfg.BatchTimeout, cfg.MaxAttempts = e.batchTimeout, e.maxAttempts
	}
	p := projection.NewAsync("counter", cfg)
	count := func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		_, shadow := projection.ShadowRebuild(ctx)
		if shadow && e.shadowFault != nil {
			if err := e.shadowFault(ctx, ev); err != nil {
				return err
			}
		}
		if projection.Replaying(ctx) && !shadow {
			// A live shard replaying: what it applied was behind the
			// model readers saw a moment before.
			if _, err := tx.Exec(ctx, `INSERT INTO `+effects+` (event, version) VALUES ($1, $2)`,
				fmt.Sprintf("%s-%d", ev.Stream.ID, ev.Version), -version); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+projection.Table(ctx, e.table)+` AS c (stream_id, n, v) VALUES ($1, 1, $2)
			ON CONFLICT (stream_id) DO UPDATE SET n = c.n + 1, v = $2`, ev.Stream.ID, version)
		return err
	}
	effect := projection.SkipOnReplay(func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (event, version) VALUES ($1, $2)`,
			fmt.Sprintf("%s-%d", ev.Stream.ID, ev.Version), version)
		return err
	})
	must(projection.OnEvent(p, e.types.Opened, func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		if ev.Stream.Type == "echo" {
			return nil
		}
		if err := count(ctx, tx, ev); err != nil {
			return err
		}
		_, err := projection.Emit(ctx, tx, projector.Stream("echo", fmt.Sprintf("%s-%d", ev.Stream.ID, ev.Version)), projector.AnyVersion,
			testevents.TicketOpened{Title: "echo"})
		return err
	}))
	must(projection.OnEvent(p, e.types.Commented, func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		if err := count(ctx, tx, ev); err != nil {
			return err
		}
		return effect(ctx, tx, ev)
	}))
	return p
}

// tryCounts returns the model's count per stream, nil if the read failed
// (a reader's statement may fail once across a switch: docs/rebuilds.md).
func (e *env) tryCounts() map[string]int {
	rows, err := e.store.Pool().Query(e.ctx, `SELECT stream_id, n FROM `+pgx.Identifier{e.schema, "counts"}.Sanitize())
	if err != nil {
		return nil
	}
	out := map[string]int{}
	var id string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = n; return nil }); err != nil {
		return nil
	}
	return out
}

// effects returns how often each commented event's SkipOnReplay handler
// ran, by the version that ran it.
func (e *env) effects() map[string]int {
	e.t.Helper()
	rows, err := e.store.Pool().Query(e.ctx, `SELECT event || '@v' || version, count(*)::int FROM `+
		pgx.Identifier{e.schema, "effects"}.Sanitize()+` GROUP BY 1`)
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]int{}
	var id string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = n; return nil }); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// The effects table also records, at version -V, each event a live shard
// of version V applied as a replay after a switch.

// A blue/green rebuild whose live consumer stopped at cursor C (the old
// version's processes are gone) while events were appended after C: the
// shadow replays up to C only, switches there, and the new version handles
// every later event live. So each event's side effects happen once over the
// life of the consumer: those up to C by version 1, those after C by
// version 2 — none lost (the shadow replaying them as replays, with no
// version live for them) and none repeated.
func TestBlueGreenSwitchAtLaggingLiveCursorHandlesTheRestLive(t *testing.T) {
	t.Parallel()
	testLaggingLive(t, newEnv(t), 1, 0)
}

// The same for a partitioned consumer: each partition stopped at a cursor
// of its own, and an event is a replay for the new version only if it is
// at or below its own partition's cursor. The switching pass applies those
// of the partition further on too, so no partition replays after the
// switch: readers never see its streams go back.
func TestBlueGreenSwitchAtLaggingLivePartitionsHandlesTheRestLive(t *testing.T) {
	t.Parallel()
	testLaggingLive(t, partitionedEnv(t), 2, 0)
}

// With more events between the partitions' cursors than one shadow batch
// (a partition stopped far behind the other), the switching pass reads the
// whole gap, batch after batch, under every partition's lock: no partition
// replays after the switch, each effect happens once, and a reader never
// sees a stream's count go back across the switch.
func TestBlueGreenSwitchAtLaggingLivePartitionsBeyondOneBatch(t *testing.T) {
	t.Parallel()
	testLaggingLive(t, partitionedEnv(t), 2, 2)
}

// A handler of the new version failing in the switching pass's gap (on
// an event the partition further on had handled live) refuses the switch:
// the pass rolls back, the failure is retried on the shadow shard, and the
// switch that follows still leaves no partition to replay after it.
func TestBlueGreenSwitchRefusedWhileAGapEventFails(t *testing.T) {
	t.Parallel()
	e := partitionedEnv(t)
	var failures atomic.Int32
	e.shadowFault = func(_ context.Context, ev projector.Event) error {
		// s4…s7 were appended while partition 1 was stopped: a shadow
		// applies their events (those of partition 0) only in the gap.
		if ev.Stream.ID >= "s4" && ev.Stream.ID <= "s7" && ev.Version == 2 && failures.Load() < 2 {
			failures.Add(1)
			return errors.New("version 2 fails in the gap")
		}
		return nil
	}
	testLaggingLive(t, e, 2, 2)
	if n := failures.Load(); n != 2 {
		t.Fatalf("the gap event failed %d times; want 2 (the switch retried after each)", n)
	}
}

// A gap event whose handler outlasts the switching pass's BatchTimeout,
// alone in its batch, is recorded as a failure with the shadow's cursor
// where the pass found it, not just before that event: the events before
// it in the gap include partition 1's, which the pass left to it, and a
// cursor past them would leave them to no version.
func TestBlueGreenSwitchGapTimeoutKeepsTheShadowCursor(t *testing.T) {
	t.Parallel()
	e := partitionedEnv(t)
	e.batchTimeout = time.Second
	var blocked atomic.Bool
	e.shadowFault = func(ctx context.Context, ev projector.Event) error {
		if ev.Stream.ID >= "s4" && ev.Stream.ID <= "s7" && ev.Version == 2 && blocked.CompareAndSwap(false, true) {
			<-ctx.Done() // the batch deadline
			return ctx.Err()
		}
		return nil
	}
	testLaggingLive(t, e, 2, 1)
	if !blocked.Load() {
		t.Fatal("no gap event's handler was held past the deadline")
	}
}

func testLaggingLive(t *testing.T, e *env, partitions, rebuildBatch int) {
	e.exec(`CREATE TABLE ` + pgx.Identifier{e.schema, "effects"}.Sanitize() + ` (event text NOT NULL, version int NOT NULL)`)
	var streams []string
	for i := range 12 {
		streams = append(streams, fmt.Sprintf("s%d", i))
	}
	appendStreams := func(ids []string) {
		for _, id := range ids {
			e.appendOne(id, testevents.TicketOpened{Title: id})
			e.appendOne(id, testevents.TicketCommented{Body: "2"})
		}
	}
	appendStreams(streams[:4])
	v1 := startDispatcher(t, e.store, projection.Config{InstanceID: "v1"}, e.sideEffects(1, partitions, 0))
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := v1.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	admin := projection.NewAdmin(e.store)
	lagging := projection.ShardID{Consumer: "counter", Instance: projection.PartitionPrefix + "1/2"}
	if partitions > 1 {
		// One partition stops (disabled) while the other goes on: their
		// cursors differ at the switch.
		if err := admin.Disable(e.ctx, lagging); err != nil {
			t.Fatal(err)
		}
		appendStreams(streams[4:8])
		if err := v1.CatchUp(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Version 1's processes are gone: what it handled live is what it
	// emitted and ran until now.
	if err := v1.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if partitions > 1 {
		if err := admin.Enable(e.ctx, lagging); err != nil {
			t.Fatal(err)
		}
	}
	echoesByV1, effectsByV1 := e.echoes(), e.effects()
	switch {
	case partitions == 1 && len(effectsByV1) != 4:
		t.Fatalf("version 1 ran %d effects before it stopped; want 4: %v", len(effectsByV1), effectsByV1)
	case partitions > 1 && (len(effectsByV1) <= 4 || len(effectsByV1) >= 8):
		t.Fatalf("version 1's partitions ran %d effects before they stopped; want one partition further on than the other: %v",
			len(effectsByV1), effectsByV1)
	}
	appendStreams(streams[8:])
	e.appendOne("s0", testevents.TicketCommented{Body: "3"})
	if partitions == 1 {
		appendStreams(streams[4:8])
	}

	// A reader of the model from before the rebuild until the new version
	// caught up: no stream's count may go back (promise 11).
	wentBack := e.watchCounts()
	v2 := startDispatcher(t, e.store, projection.Config{InstanceID: "v2"}, e.sideEffects(2, partitions, rebuildBatch))
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 45*time.Second, "the rebuild to switch", func() bool {
		r, err := rebuild.Current(e.ctx, e.store, "counter")
		return err == nil && r.Status == rebuild.Switched
	})
	if err := v2.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if msg := wentBack(); msg != "" {
		t.Fatalf("a reader saw the model go back in time across the switch: %s", msg)
	}

	// Every event's side effect happened exactly once: by version 1 if it
	// handled the event live, else by version 2.
	wantEchoes, wantEffects := map[string]int{}, map[string]int{}
	for _, id := range streams {
		wantEchoes[id+"-1"] = 1
		v := 1
		if effectsByV1[id+"-2@v1"] == 0 {
			v = 2
		}
		wantEffects[fmt.Sprintf("%s-2@v%d", id, v)] = 1
	}
	wantEffects["s0-3@v2"] = 1
	if got := e.echoes(); !maps.Equal(got, wantEchoes) {
		t.Fatalf("echoes emitted per event %v; want each once %v (version 1 emitted %v)", got, wantEchoes, echoesByV1)
	}
	got := e.effects()
	for k := range got {
		if strings.HasSuffix(k, "@v-2") {
			t.Errorf("%s: a live partition replayed it after the switch, its streams' rows behind what readers saw", k)
		}
	}
	if !maps.Equal(got, wantEffects) {
		t.Fatalf("SkipOnReplay effects per event %v (@v-2: replayed by a live shard after the switch); want each once %v (version 1 ran %v)", got, wantEffects, effectsByV1)
	}
	// The new model counts every event of the tickets.
	var diff int64
	if err := e.store.Pool().QueryRow(e.ctx, `WITH fresh AS (
			SELECT stream_id, count(*)::int AS n FROM `+e.store.Table("projector_events")+` WHERE stream_type = 'ticket' GROUP BY stream_id)
		SELECT count(*) FROM fresh f FULL JOIN `+pgx.Identifier{e.schema, "counts"}.Sanitize()+` c USING (stream_id)
		WHERE f.n IS DISTINCT FROM c.n OR c.v IS DISTINCT FROM 2`).Scan(&diff); err != nil || diff != 0 {
		t.Fatalf("after the switch the model differs from the log in %d rows (%v)", diff, err)
	}
}

// An in-place rebuild requested while a shard still replays up to a mark a
// blue/green switch gave it (past its cursor) replays up to that mark, not
// just its cursor: the events between were handled live before, and
// handling them live again would repeat their effects.
func TestInPlaceRebuildKeepsAReplayMarkPastTheCursor(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for i := range 4 {
		e.appendOne(fmt.Sprintf("s%d", i), testevents.TicketOpened{Title: "t"})
	}
	d := e.dispatcher(e.counter(1, projection.AsyncConfig{}))
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// As a switch leaves a shard further on than the shadow: its cursor
	// back at the second event, its mark where it stood.
	c := e.store.Table("projector_consumers")
	var mark, second projector.Position
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT cursor_tx_id, cursor_seq FROM `+c+` WHERE name = 'counter' AND instance_id = $1`,
		projection.SharedInstance).Scan(&mark.TxID, &mark.Seq); err != nil {
		t.Fatal(err)
	}
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT tx_id, seq FROM `+e.store.Table("projector_events")+` ORDER BY tx_id, seq OFFSET 1 LIMIT 1`).
		Scan(&second.TxID, &second.Seq); err != nil {
		t.Fatal(err)
	}
	e.exec(`UPDATE `+c+` SET cursor_tx_id = $2, cursor_seq = $3, replay_until_tx_id = $4, replay_until_seq = $5
		WHERE name = 'counter' AND instance_id = $1`, projection.SharedInstance, second.TxID, second.Seq, mark.TxID, mark.Seq)
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Mode: rebuild.InPlace}); err != nil {
		t.Fatal(err)
	}
	var until projector.Position
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT replay_until_tx_id, replay_until_seq FROM `+c+` WHERE name = 'counter' AND instance_id = $1`,
		projection.SharedInstance).Scan(&until.TxID, &until.Seq); err != nil {
		t.Fatal(err)
	}
	if until != mark {
		t.Fatalf("in-place rebuild replays up to %v; want the shard's mark %v (its cursor was %v)", until, mark, second)
	}
}

// watchCounts reads the model's counts over and over until the returned
// function is called, which says how a stream's count went back, if one
// did ("" if none).
func (e *env) watchCounts() func() string {
	e.t.Helper()
	stop, wentBack := make(chan struct{}), make(chan string, 1)
	seen := e.tryCounts()
	if seen == nil {
		e.t.Fatal("read the model's counts failed")
	}
	go func() {
		defer close(wentBack)
		for {
			select {
			case <-stop:
				return
			default:
			}
			now := e.tryCounts()
			if now == nil {
				continue
			}
			for id, n := range seen {
				if now[id] < n {
					wentBack <- fmt.Sprintf("stream %s: count %d after %d", id, now[id], n)
					return
				}
			}
			seen = now
		}
	}()
	return func() string {
		close(stop)
		return <-wentBack
	}
}
