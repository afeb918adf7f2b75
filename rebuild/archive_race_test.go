package rebuild_test

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
	"github.com/projectorhq/projector/stores/postgres"
)

// ordered is a projection that counts each stream's events and refuses
// one out of version order: its row for a stream moves from version v-1 to
// v only, so an event applied twice, skipped or out of order fails the
// handler (and the shard goes dead) instead of counting.
func (e *env) ordered(name string, cfg projection.AsyncConfig) *projection.Async {
	table := e.schema + "." + name
	e.exec(`CREATE TABLE IF NOT EXISTS ` + pgx.Identifier{e.schema, name}.Sanitize() + ` (stream_id text PRIMARY KEY, n int NOT NULL, last bigint NOT NULL)`)
	cfg.Tables, cfg.MaxAttempts = []string{table}, 1
	p := projection.NewAsync(name, cfg)
	h := func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		t := projection.Table(ctx, table)
		sql := `UPDATE ` + t + ` SET n = n + 1, last = $2 WHERE stream_id = $1 AND last = $2 - 1`
		if ev.Version == 1 {
			sql = `INSERT INTO ` + t + ` (stream_id, n, last) VALUES ($1, 1, $2) ON CONFLICT DO NOTHING`
		}
		tag, err := tx.Exec(ctx, sql, ev.Stream.ID, ev.Version)
		if err == nil && tag.RowsAffected() != 1 {
			err = fmt.Errorf("%s version %d out of order", ev.Stream, ev.Version)
		}
		return err
	}
	must(projection.OnEvent(p, e.types.Opened, h))
	must(projection.OnEvent(p, e.types.Commented, h))
	return p
}

// model reads an ordered projection's rows: events counted per stream.
func (e *env) model(name string) map[string]int64 {
	e.t.Helper()
	return e.counts(`SELECT stream_id, n FROM ` + pgx.Identifier{e.schema, name}.Sanitize())
}

// logCounts is what a model over the whole log holds: the events of each
// stream, hot or archived.
func (e *env) logCounts() map[string]int64 {
	e.t.Helper()
	return e.counts(`SELECT stream_id, count(*) FROM (SELECT stream_id FROM ` + e.store.Table("projector_events") + `
		UNION ALL SELECT stream_id FROM ` + e.store.Table("projector_events_archive") + `) e GROUP BY stream_id`)
}

func (e *env) counts(sql string) map[string]int64 {
	e.t.Helper()
	rows, err := e.store.Pool().Query(e.ctx, sql)
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]int64{}
	var id string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = n; return nil }); err != nil {
		e.t.Fatal(err)
	}
	return out
}

func (e *env) archivedEvents() int {
	e.t.Helper()
	var n int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+e.store.Table("projector_events_archive")).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// archiveEvery archives the streams pre-i for i = from, from+step, … below
// n, and returns the events moved.
func (e *env) archiveEvery(from, step, n int) int64 {
	e.t.Helper()
	res, err := e.store.Archive(e.ctx, postgres.ArchiveOptions{Streams: preStreams(from, step, n)})
	if err != nil {
		e.t.Fatal(err)
	}
	return res.Events
}

func preStreams(from, step, n int) []projector.StreamRef {
	var out []projector.StreamRef
	for i := from; i < n; i += step {
		out = append(out, projector.Stream("ticket", fmt.Sprintf("pre-%d", i)))
	}
	return out
}

// churn archives and unarchives streams pre-0 … pre-(n-1), a few per
// batch, until done is closed (or for two minutes at most), and returns
// how many streams moved, and a channel closed once one did. Archive
// batches move only what every consumer shard has passed (promise 9).
func (e *env) churn(n int, done <-chan struct{}) (moved func() int64, first <-chan struct{}) {
	var wg sync.WaitGroup
	var total int64
	once := make(chan struct{})
	signal := sync.OnceFunc(func() { close(once) })
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	wg.Go(func() {
		defer cancel()
		for round := 0; ctx.Err() == nil; round++ {
			select {
			case <-done:
				return
			default:
			}
			a, err := e.store.Archive(ctx, postgres.ArchiveOptions{Streams: preStreams(round%2, 2, n), BatchSize: 3})
			if err != nil {
				if ctx.Err() == nil {
					e.t.Error(err)
				}
				return
			}
			u, err := e.store.Unarchive(ctx, postgres.ArchiveOptions{Streams: preStreams((round+1)%2, 2, n), BatchSize: 3})
			if err != nil {
				if ctx.Err() == nil {
					e.t.Error(err)
				}
				return
			}
			if total += a.Streams + u.Streams; total > 0 {
				signal()
			}
		}
	})
	e.t.Cleanup(func() { cancel(); wg.Wait() })
	return func() int64 { wg.Wait(); return total }, once
}

// Rebuilds replay the archive (issue 26: archived events stay readable
// for rebuilds): with half the streams archived, a blue/green rebuild held
// for a diff shows no difference from the live model built over the whole
// log, switches, and an in-place rebuild rebuilds the same model.
func TestRebuildsReplayTheArchive(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const streams = 40
	for i := range streams {
		e.appendBatch(t, i, 3)
	}
	p := e.ordered("ordered", projection.AsyncConfig{BatchSize: 7, RebuildBatchSize: 9})
	d := e.dispatcher(p)
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	full := e.logCounts()
	if got := e.model("ordered"); !maps.Equal(got, full) || len(full) != streams {
		t.Fatalf("the live model %v, want %v", got, full)
	}
	if moved := e.archiveEvery(0, 2, streams); moved != 60 {
		t.Fatalf("archived %d events, want 60", moved)
	}
	if !maps.Equal(e.logCounts(), full) {
		t.Fatal("archiving changed the log")
	}

	rb, err := rebuild.Request(e.ctx, e.store, "ordered", rebuild.Options{Hold: true})
	if err != nil {
		t.Fatalf("a blue/green rebuild with archived events: %v", err)
	}
	if rb.TotalEvents != 120 {
		t.Errorf("the rebuild measures its progress against %d events, want the 120 of the log and the archive", rb.TotalEvents)
	}
	e.waitReady("ordered")
	diff, err := rebuild.Diff(e.ctx, e.store, "ordered", 10)
	if err != nil {
		t.Fatal(err)
	}
	if diff.EventsBetween != 0 || !diff.Same() || diff.Tables[0].ShadowRows != streams {
		t.Fatalf("diff of the rebuild over the archive: %+v", diff)
	}
	if err := rebuild.Switch(e.ctx, e.store, "ordered"); err != nil {
		t.Fatal(err)
	}
	if final, err := rebuild.Wait(ctx, e.store, "ordered", 10*time.Millisecond, nil); err != nil || final.Status != rebuild.Switched {
		t.Fatalf("switch: %+v, %v", final, err)
	}
	if got := e.model("ordered"); !maps.Equal(got, full) {
		t.Fatalf("after the blue/green rebuild: %v, want %v", got, full)
	}

	if _, err := rebuild.Request(e.ctx, e.store, "ordered", rebuild.Options{Mode: rebuild.InPlace}); err != nil {
		t.Fatalf("an in-place rebuild with archived events: %v", err)
	}
	if final, err := rebuild.Wait(ctx, e.store, "ordered", 10*time.Millisecond, nil); err != nil || final.Status != rebuild.Done {
		t.Fatalf("in place: %+v, %v", final, err)
	}
	if got := e.model("ordered"); !maps.Equal(got, full) {
		t.Fatalf("after the in-place rebuild: %v, want %v", got, full)
	}
	if n := e.archivedEvents(); n != 60 {
		t.Fatalf("%d events archived after the rebuilds, want 60", n)
	}
}

// A rebuild's replay reads the hot log and the archive in one statement
// per batch, so archive and unarchive batches moving streams between the
// two while it runs neither repeat nor lose an event: the rebuilt model,
// whose handler fails any event out of version order, equals the log.
// Archive batches move a stream once the replay has passed it (the
// shadow's or the rewound cursor holds them back before), unarchive
// batches anything archived.
func TestRebuildReplayRacingArchiveMoves(t *testing.T) {
	t.Parallel()
	for _, mode := range []rebuild.Mode{rebuild.BlueGreen, rebuild.InPlace} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			const streams = 120
			for i := range streams {
				e.appendBatch(t, i, 3)
			}
			p := e.ordered("ordered", projection.AsyncConfig{BatchSize: 5, RebuildBatchSize: 5})
			d := e.dispatcher(p)
			ctx, cancel := context.WithTimeout(e.ctx, 3*time.Minute)
			defer cancel()
			if err := d.CatchUp(ctx); err != nil {
				t.Fatal(err)
			}
			full := e.logCounts()
			e.archiveEvery(0, 2, streams)

			if _, err := rebuild.Request(e.ctx, e.store, "ordered", rebuild.Options{Mode: mode}); err != nil {
				t.Fatal(err)
			}
			// The replaying shard (the live one rewound in place, or the
			// shadow) stands still until a stream moved: a replay that
			// finished before the churn's first move (it did, under load)
			// raced nothing.
			replaying := projection.ShardID{Consumer: "ordered", Instance: projection.RebuildInstance}
			if mode == rebuild.InPlace {
				replaying.Instance = projection.SharedInstance
			}
			hold, err := e.store.Pool().Begin(e.ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = hold.Rollback(e.ctx) }()
			if err := projection.LockShard(e.ctx, hold, e.store, replaying); err != nil {
				t.Fatal(err)
			}
			var done sync.WaitGroup
			var final rebuild.Rebuild
			var werr error
			finished := make(chan struct{})
			done.Go(func() {
				defer close(finished)
				final, werr = rebuild.Wait(ctx, e.store, "ordered", 5*time.Millisecond, nil)
			})
			moved, first := e.churn(streams, finished)
			select {
			case <-first:
			case <-finished:
				t.Fatalf("the rebuild ended while its shard's lock was held: %+v, %v", final, werr)
			case <-time.After(3 * time.Minute):
				t.Fatal("no stream moved in three minutes")
			}
			if err := hold.Rollback(e.ctx); err != nil {
				t.Fatal(err)
			}
			done.Wait()
			n := moved()
			if werr != nil || (final.Status != rebuild.Switched && final.Status != rebuild.Done) {
				t.Fatalf("rebuild: %+v, %v", final, werr)
			}
			if got := e.model("ordered"); !maps.Equal(got, full) {
				t.Fatalf("the rebuilt model differs from the log (%d streams moved during the replay):\n got %v\nwant %v", n, got, full)
			}
			if n == 0 {
				t.Fatal("no stream moved while the rebuild replayed")
			}
			t.Logf("%d streams moved while the rebuild replayed", n)
		})
	}
}

// A consumer registered after streams were archived (its cursor below
// them) reads them too, while archive and unarchive batches move streams
// under it: its model, whose handler fails any event out of version order
// or repeated, equals the whole log (promises 3 and 4).
func TestLateConsumerReadsTheArchive(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const streams = 120
	for i := range streams {
		e.appendBatch(t, i, 3)
	}
	full := e.logCounts()
	// No consumer yet: nothing holds the archive back.
	if moved := e.archiveEvery(0, 2, streams); moved != 180 {
		t.Fatalf("archived %d events, want 180", moved)
	}
	p := e.ordered("late", projection.AsyncConfig{BatchSize: 5})
	d := e.dispatcher(p)
	caughtUp := make(chan struct{})
	moved, _ := e.churn(streams, caughtUp)
	ctx, cancel := context.WithTimeout(e.ctx, 3*time.Minute)
	defer cancel()
	err := d.CatchUp(ctx)
	close(caughtUp)
	n := moved()
	if err != nil {
		t.Fatal(err)
	}
	if got := e.model("late"); !maps.Equal(got, full) {
		t.Fatalf("the late consumer's model differs from the log (%d streams moved meanwhile):\n got %v\nwant %v", n, got, full)
	}
	t.Logf("%d streams moved while the late consumer caught up", n)
	st, err := projection.NewAdmin(e.store).Status(e.ctx, projection.ShardID{Consumer: "late"})
	if err != nil {
		t.Fatal(err)
	}
	if st.Status == projection.StatusDead {
		t.Fatalf("the late consumer went dead: %s", st.LastError)
	}
}
