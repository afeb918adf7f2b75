package rebuild_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
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

// A shadow pass reads RebuildBatchSize events at a time, the live shard
// BatchSize: the rebuild's batches are the larger ones, every event is
// applied once, and the switched model is exact.
func TestShadowPassesUseRebuildBatchSize(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const streams = 300 // two events each
	err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		for i := range streams {
			if _, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", fmt.Sprint(i)), projector.NoStream,
				testevents.TicketOpened{Title: "t"}, testevents.TicketCommented{Body: "c"}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var batches []int
	taken := func() []int {
		mu.Lock()
		defer mu.Unlock()
		out := batches
		batches = nil
		return out
	}
	p := e.counter(1, projection.AsyncConfig{BatchSize: 10, RebuildBatchSize: 250, AfterCommit: func(evs []projector.Event) {
		mu.Lock()
		defer mu.Unlock()
		batches = append(batches, len(evs))
	}})
	d := e.dispatcher(p)
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	// AfterCommit runs just after each commit, which CatchUp may see first.
	eventually(t, time.Minute, "the last batch's AfterCommit", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return sum(batches) >= 2*streams
	})
	live := taken()
	if sum(live) != 2*streams || slices.Max(live) != 10 {
		t.Fatalf("live catch-up applied batches %v (sum %d), want batches of at most 10 summing to %d", live, sum(live), 2*streams)
	}

	// Spoil the live model, so only a rebuild from the log can make it whole.
	e.exec(`UPDATE ` + pgx.Identifier{e.schema, "counts"}.Sanitize() + ` SET n = 0`)
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{}); err != nil {
		t.Fatal(err)
	}
	final, err := rebuild.Wait(ctx, e.store, "counter", 10*time.Millisecond, nil)
	if err != nil || final.Status != rebuild.Switched {
		t.Fatalf("rebuild ended %+v, %v", final, err)
	}
	eventually(t, time.Minute, "the shadow passes' AfterCommit", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return sum(batches) >= 2*streams
	})
	shadow := taken() // the live shard had nothing to apply meanwhile
	if sum(shadow) != 2*streams || slices.Max(shadow) != 250 {
		t.Fatalf("shadow passes applied batches %v (sum %d), want batches of 250 summing to %d", shadow, sum(shadow), 2*streams)
	}
	r, err := e.read()
	if err != nil {
		t.Fatal(err)
	}
	if r.counted != 2*streams || r.expected != 2*streams {
		t.Fatalf("switched model counted %d events of %d", r.counted, r.expected)
	}
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

// RebuildBatchSize defaults to DefaultRebuildBatchFactor times BatchSize,
// capped at MaxBatchSize; out of range it is a definition error.
func TestRebuildBatchSizeDefaults(t *testing.T) {
	t.Parallel()
	types := testevents.New()
	cases := []struct {
		cfg     projection.AsyncConfig
		want    int
		invalid bool
	}{
		{projection.AsyncConfig{}, projection.DefaultRebuildBatchFactor * projection.DefaultBatchSize, false},
		{projection.AsyncConfig{BatchSize: 20}, projection.DefaultRebuildBatchFactor * 20, false},
		{projection.AsyncConfig{BatchSize: 50_000}, projection.MaxBatchSize, false},
		{projection.AsyncConfig{RebuildBatchSize: 7}, 7, false},
		{projection.AsyncConfig{RebuildBatchSize: -1}, -1, true},
		{projection.AsyncConfig{RebuildBatchSize: projection.MaxBatchSize + 1}, projection.MaxBatchSize + 1, true},
	}
	for _, tc := range cases {
		p := projection.NewAsync("sized", tc.cfg)
		must(projection.OnEvent(p, types.Opened, func(context.Context, pgx.Tx, projector.Event) error { return nil }))
		err := p.Validate(types.Registry)
		if got := p.Config().RebuildBatchSize; got != tc.want || (err != nil) != tc.invalid ||
			(tc.invalid && !errors.Is(err, projection.ErrInvalidDefinition)) {
			t.Errorf("%+v: RebuildBatchSize %d, Validate %v; want %d, invalid %v", tc.cfg, got, err, tc.want, tc.invalid)
		}
	}
}

// On a quiet log nothing wakes a caught-up shard before Recheck: the
// shadow shard's first caught-up pass goes straight on to the switch
// instead of waiting that long (the switch used to wait a whole Recheck).
func TestQuietLogRebuildSwitchesBeforeRecheck(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		_, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", "quiet"), projector.NoStream,
			testevents.TicketOpened{Title: "t"}, testevents.TicketCommented{Body: "c"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// The live model counts both events first (another test's transaction
	// may hold the horizon back for a while).
	live := e.dispatcher(e.counter(1, projection.AsyncConfig{}))
	eventually(t, time.Minute, "the live model to count both events", func() bool {
		r, err := e.read()
		return err == nil && r.counted == 2
	})
	ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second) // well below Recheck
	defer cancel()
	if err := live.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{}); err != nil {
		t.Fatal(err)
	}
	// Its rebuild loop looks for rebuilds at once; nothing else would wake
	// its shards within the test: the log probe's first wake-up comes after
	// PollMin.
	d, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{e.counter(1, projection.AsyncConfig{})},
		Recheck: 5 * time.Minute, PollMin: 5 * time.Minute, PollMax: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(e.ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := d.Stop(context.WithoutCancel(ctx)); err != nil {
			t.Error(err)
		}
	}()
	final, err := rebuild.Wait(ctx, e.store, "counter", 10*time.Millisecond, nil)
	if err != nil || final.Status != rebuild.Switched {
		t.Fatalf("rebuild on a quiet log: %+v, %v", final, err)
	}
	if r, err := e.read(); err != nil || r.counted != 2 || r.expected != 2 {
		t.Fatalf("switched model %+v, %v", r, err)
	}
}

// Shadow passes commit with synchronous_commit off (a commit lost in a
// crash is read again from the shadow cursor; no reader uses the shadow
// tables), live passes with the session's setting; and writes queued with
// projection.Queue are pipelined in shadow passes as in live ones: the
// switched model, built only from queued writes, is exact.
func TestShadowPassesCommitAsynchronouslyAndPipelineQueuedWrites(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// The test sessions run with synchronous_commit off (pgtest); live
	// passes here run on sessions with it on, to tell them from shadow ones.
	cfg := pgtest.PoolConfig(t)
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	store, err := postgres.New(e.ctx, pgtest.PoolFromConfig(t, cfg), postgres.Config{Schema: e.schema, Registry: e.types.Registry})
	if err != nil {
		t.Fatal(err)
	}
	e.store = store
	const streams = 40
	for i := range streams {
		e.appendBatch(t, i, 1)
	}
	var mu sync.Mutex
	seen := map[bool]map[string]bool{false: {}, true: {}} // by Replaying: synchronous_commit values
	p := projection.NewAsync("counter", projection.AsyncConfig{Version: 1, Tables: []string{e.table}, BatchSize: 7})
	must(projection.OnEvent(p, e.types.Opened, func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		var sc string
		if err := tx.QueryRow(ctx, `SELECT current_setting('synchronous_commit')`).Scan(&sc); err != nil {
			return err
		}
		mu.Lock()
		seen[projection.Replaying(ctx)][sc] = true
		mu.Unlock()
		return projection.Queue(ctx, `INSERT INTO `+projection.Table(ctx, e.table)+` AS c (stream_id, n, v) VALUES ($1, 1, 1)
			ON CONFLICT (stream_id) DO UPDATE SET n = c.n + 1`, ev.Stream.ID)
	}))
	var session string
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT current_setting('synchronous_commit')`).Scan(&session); err != nil {
		t.Fatal(err)
	}
	if session == "off" {
		t.Fatal("the test database's sessions run with synchronous_commit off: nothing to tell shadow passes from live ones by")
	}
	d := e.dispatcher(p)
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	e.exec(`UPDATE ` + pgx.Identifier{e.schema, "counts"}.Sanitize() + ` SET n = 0`)
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{}); err != nil {
		t.Fatal(err)
	}
	if final, err := rebuild.Wait(ctx, e.store, "counter", 10*time.Millisecond, nil); err != nil || final.Status != rebuild.Switched {
		t.Fatalf("rebuild ended %+v, %v", final, err)
	}
	var rows, counted int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*), coalesce(sum(n), 0) FROM `+pgx.Identifier{e.schema, "counts"}.Sanitize()+` WHERE n = 1`).
		Scan(&rows, &counted); err != nil || rows != streams || counted != streams {
		t.Fatalf("switched model: %d rows counting one event each (%v), want %d", rows, err, streams)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen[false]) != 1 || !seen[false][session] || len(seen[true]) != 1 || !seen[true]["off"] {
		t.Fatalf("synchronous_commit seen by live passes %v (want only %q), by shadow passes %v (want only off)", seen[false], session, seen[true])
	}
}
