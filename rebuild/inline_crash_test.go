package rebuild_test

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
	"github.com/projectorhq/projector/stores/postgres"
)

// An inline child is this test binary running rebuild.Inline of the
// "tickets" projection in small batches, so a test can SIGKILL a real
// process mid-rebuild.
const inlineChildEnv = "PROJECTOR_TEST_INLINE_REBUILD_CHILD"

func runInlineChild() int {
	ctx := context.Background()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	pool, err := pgxpool.New(ctx, os.Getenv(childURLEnv))
	if err != nil {
		logger.Error("inline child: pool", "error", err)
		return 1
	}
	defer pool.Close()
	e := &ienv{ctx: ctx, types: testevents.New(), schema: os.Getenv(childSchemaEnv), mails: map[string]int{}}
	e.p = e.inline("tickets", "tickets")
	e.ref = e.inline("tickets-ref", "tickets_ref")
	e.store, err = postgres.New(ctx, pool, postgres.Config{Schema: e.schema, Registry: e.types.Registry, Logger: logger,
		Inline: []postgres.InlineProjection{e.p, e.ref}})
	if err != nil {
		logger.Error("inline child: store", "error", err)
		return 1
	}
	if _, err := rebuild.Inline(ctx, e.store, e.p, rebuild.InlineOptions{Tables: []string{e.schema + ".tickets"}, BatchSize: 5}); err != nil {
		logger.Error("inline child: rebuild", "error", err)
		return 1
	}
	return 0
}

// TestInlineRebuildSIGKILL kills a real process rebuilding an inline
// projection three times, at random points of its replay, while 4 writers
// append (8 writers over a longer log in a soak run, see pgtest.EnvSoak),
// each pausing a little between appends so that the rebuild, and not the
// writers, gets most of a loaded machine: the live model stays live and
// exact throughout (the writers'
// appends keep landing in it, the corrupted row stays as it was: nothing of
// a killed rebuild is ever live), each child resumes from the cursor the
// killed one committed (it never starts over: the rebuild's record and
// cursor survive, and every child replays further), a rebuild is never
// refused because of a dead one, and the rebuild that finally runs to the
// end resumes too and ends equal to the model built live.
func TestInlineRebuildSIGKILL(t *testing.T) {
	t.Parallel()
	e := newInlineEnv(t)
	// A log long enough for three kills of at most 55 events each and the
	// final resumed run.
	for i := range pgtest.Size(600, 1500) {
		if err := e.append(e.ctx, i%60, false); err != nil {
			t.Fatal(err)
		}
	}
	e.exec(`UPDATE ` + e.ident("tickets") + ` SET n = n + 1000 WHERE stream_id = 's7'`)
	e.settle()

	ctx, stop := context.WithCancel(e.ctx)
	var wg sync.WaitGroup
	var appended atomic.Int64
	writers := pgtest.Size(4, 8)
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 3))
			for ctx.Err() == nil {
				if err := e.append(ctx, r.IntN(60), w%2 == 0); err != nil {
					if ctx.Err() == nil {
						errs <- err
					}
					return
				}
				appended.Add(1)
				if !pgtest.Soak() {
					time.Sleep(5 * time.Millisecond) // pacing the writer, not a synchronisation
				}
			}
		}()
	}
	defer func() {
		stop()
		wg.Wait()
	}()
	shadow := e.schema + "_irb_"
	r := rand.New(rand.NewPCG(9, 9))
	// processed counts the events the rebuild's cursor has passed, batch by
	// batch; a rebuild that started over would reset it.
	processed := func() int {
		var n int
		err := e.store.Pool().QueryRow(e.ctx, `SELECT processed FROM `+e.ident("projector_consumers")+` WHERE name = 'tickets' AND instance_id = $1`,
			projection.RebuildInstance).Scan(&n)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0
		}
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	var rebuildID int64
	for kill := range 3 {
		from := processed()
		child := pgtest.StartChild(t, inlineChildEnv+"=1", childURLEnv+"="+pgtest.URL(t), childSchemaEnv+"="+e.schema)
		// Kill it once it has replayed a random number of events more.
		want := 1 + r.IntN(55)
		// Up to three minutes: a -race child starting on a loaded CI machine
		// has been seen to need more than one before its first batch.
		pgtest.EventuallyExplained(t, 3*time.Minute, "the child to replay", func() bool { return processed() >= from+want },
			func() string { return pgtest.Activity(e.store.Pool()) })
		child.Kill(t)
		rb, err := rebuild.Current(e.ctx, e.store, "tickets")
		if err != nil {
			t.Fatal(err)
		}
		if rb.Status != rebuild.Building || rb.Mode != rebuild.InlineRebuild || (rebuildID != 0 && rb.ID != rebuildID) {
			t.Fatalf("kill %d: record %+v, want rebuild %d still building inline", kill, rb, rebuildID)
		}
		rebuildID = rb.ID
		if rb.Cursor == projector.Start || rb.Progress() <= 0 {
			t.Fatalf("kill %d: the killed rebuild's cursor is not recorded: %+v", kill, rb)
		}
		before := appended.Load()
		eventually(t, time.Minute, "appends to go on after the kill", func() bool { return appended.Load() > before+20 })
		// Nothing of the killed rebuild is live: the corrupted row is still
		// there, and only it differs from the reference.
		// One statement, one snapshot: writers append to s7 meanwhile.
		if e.count(`SELECT count(*) FROM `+e.ident("tickets")+` l JOIN `+e.ident("tickets_ref")+` r USING (stream_id)
			WHERE stream_id = 's7' AND l.n - 1000 = r.n`) != 1 {
			t.Fatalf("kill %d: live model changed by a killed rebuild", kill)
		}
		if d := e.differences(); d != 2 {
			t.Fatalf("kill %d: live model differs from the reference in %d rows, want only the corrupted one (2)", kill, d)
		}
		t.Logf("kill %d: after %d more events (cursor %s, %.0f%%)", kill, want, rb.Cursor, 100*rb.Progress())
	}
	resumedFrom := processed()
	// The last killed child's session may still hold the one-at-a-time lock
	// until its backend notices the closed connection: wait for that.
	var res rebuild.InlineResult
	var err error
	eventually(t, time.Minute, "the killed rebuilds' sessions to end", func() bool {
		res, err = rebuild.Inline(e.ctx, e.store, e.p, rebuild.InlineOptions{Tables: []string{e.schema + ".tickets"}, BatchSize: 100})
		return !errors.Is(err, rebuild.ErrActive)
	})
	if err != nil {
		t.Fatalf("rebuild after the kills: %v", err)
	}
	if !res.Resumed || res.ID != rebuildID || resumedFrom == 0 {
		t.Fatalf("the last rebuild started over (%+v), want it to resume rebuild %d from %d events", res, rebuildID, resumedFrom)
	}
	if rb, err := rebuild.Current(e.ctx, e.store, "tickets"); err != nil || rb.Status != rebuild.Switched || rb.OldSchema != res.OldSchema {
		t.Fatalf("record after the switch: %+v, %v", rb, err)
	}
	if n := e.count(`SELECT count(*) FROM ` + e.ident("projector_consumers") + ` WHERE instance_id = '` + projection.RebuildInstance + `'`); n != 0 {
		t.Fatalf("the switched rebuild left its cursor row")
	}
	after := appended.Load()
	eventually(t, time.Minute, "appends after the switch", func() bool { return appended.Load() > after+50 })
	stop()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("writer: %v", err)
	}
	if d := e.differences(); d != 0 {
		t.Fatalf("rebuilt model differs from the reference in %d rows", d)
	}
	if n := e.count(`SELECT count(*) FROM pg_namespace WHERE starts_with(nspname, '` + shadow + `') AND nspname <> '` + res.OldSchema + `'`); n != 0 {
		t.Fatalf("%d leftover schemas", n)
	}
	t.Logf("final rebuild: %+v", res)
}
