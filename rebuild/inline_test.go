package rebuild_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
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

// ienv is one test's schema with an inline projection to rebuild
// ("tickets") and an identical one built live from the first event and
// never touched ("tickets_ref"), both run by the store on every append.
type ienv struct {
	t       testing.TB
	ctx     context.Context
	types   testevents.Types
	store   *postgres.Store
	schema  string
	p, ref  *projection.Inline
	gate    chan struct{} // when set, replayed handlers wait on it
	entered chan struct{}
	mu      sync.Mutex
	mails   map[string]int // closed event id → live runs of the SkipOnReplay handler
}

func newInlineEnv(t testing.TB) *ienv {
	t.Helper()
	e := &ienv{t: t, ctx: context.Background(), types: testevents.New(), mails: map[string]int{}}
	e.p = e.inline("tickets", "tickets")
	e.ref = e.inline("tickets-ref", "tickets_ref")
	e.store = pgtest.Store(t, e.types.Registry, postgres.Config{Inline: []postgres.InlineProjection{e.p, e.ref}})
	e.schema = e.store.Schema()
	for _, table := range []string{"tickets", "tickets_ref"} {
		e.exec(`CREATE TABLE ` + e.ident(table) + ` (tenant_id text NOT NULL, stream_type text NOT NULL, stream_id text NOT NULL,
			title text NOT NULL, n int NOT NULL, last_version bigint NOT NULL, PRIMARY KEY (tenant_id, stream_type, stream_id))`)
	}
	t.Cleanup(func() {
		// The rebuild's old and shadow schemas are not the harness's.
		rows, err := e.store.Pool().Query(context.Background(), `SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1)`, e.schema+"_irb_")
		if err != nil {
			return
		}
		names, _ := pgx.CollectRows(rows, pgx.RowTo[string])
		for _, n := range names {
			_, _ = e.store.Pool().Exec(context.Background(), `DROP SCHEMA `+pgx.Identifier{n}.Sanitize()+` CASCADE`)
		}
	})
	return e
}

// rebuildToGate starts an inline rebuild of e.p with opts and returns once
// its first replayed handler waits at the gate (e.gate, closed by the
// test to let it through); done gets the rebuild's error.
func (e *ienv) rebuildToGate(opts rebuild.InlineOptions) (done <-chan error) {
	e.t.Helper()
	e.gate, e.entered = make(chan struct{}), make(chan struct{}, 1)
	ch := make(chan error, 1)
	go func() {
		_, err := rebuild.Inline(e.ctx, e.store, e.p, opts)
		ch <- err
	}()
	select {
	case <-e.entered:
	case err := <-ch:
		e.t.Fatalf("the rebuild ended before replaying: %v", err)
	case <-time.After(30 * time.Second):
		e.t.Fatal("the rebuild never replayed")
	}
	return ch
}

func (e *ienv) ident(table string) string { return pgx.Identifier{e.schema, table}.Sanitize() }

func (e *ienv) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.store.Pool().Exec(e.ctx, sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

// inline counts, per ticket, the events applied (n is not idempotent: an
// event applied twice or not at all shows). Handlers write the
// schema-qualified name through projection.Table. ticket.closed also sends
// a "mail", only when not projection.Replaying.
func (e *ienv) inline(name, table string) *projection.Inline {
	p := projection.NewInline(name)
	tableName := func() string { return e.schema + "." + table }
	upsert := func(ctx context.Context, tx pgx.Tx, ev projector.Event, title string) error {
		if projection.Replaying(ctx) && e.gate != nil && name == "tickets" {
			select {
			case e.entered <- struct{}{}:
			default:
			}
			<-e.gate
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+projection.Table(ctx, tableName())+` AS t VALUES ($1, $2, $3, $4, 1, $5)
			ON CONFLICT (tenant_id, stream_type, stream_id) DO UPDATE SET n = t.n + 1, last_version = $5,
				title = CASE WHEN $4 = '' THEN t.title ELSE $4 END`,
			ev.Stream.Tenant, ev.Stream.Type, ev.Stream.ID, title, ev.Version)
		return err
	}
	must(projection.On(p, e.types.Opened, func(ctx context.Context, tx pgx.Tx, ev projector.Event, o testevents.TicketOpened) error {
		return upsert(ctx, tx, ev, o.Title)
	}))
	must(projection.On(p, e.types.Commented, func(ctx context.Context, tx pgx.Tx, ev projector.Event, _ testevents.TicketCommented) error {
		return upsert(ctx, tx, ev, "")
	}))
	must(projection.OnEvent(p, e.types.Closed, func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		if name == "tickets" && !projection.Replaying(ctx) {
			e.mu.Lock()
			e.mails[ev.ID.String()]++
			e.mu.Unlock()
		}
		return upsert(ctx, tx, ev, "")
	}))
	return p
}

// append writes one event to stream i, retrying concurrency errors. Some
// transactions stay open a little after appending, so commits land out of
// log order.
func (e *ienv) append(ctx context.Context, i int, linger bool) error {
	stream := projector.StreamRef{Tenant: fmt.Sprintf("t%d", i%3), Type: "ticket", ID: fmt.Sprintf("s%d", i)}
	for {
		err := pgx.BeginFunc(ctx, e.store.Pool(), func(tx pgx.Tx) error {
			v, err := e.store.StreamVersion(ctx, tx, stream)
			if err != nil && !errors.Is(err, projector.ErrNotFound) {
				return err
			}
			expected := projector.ExactVersion(v)
			if v == 0 {
				expected = projector.NoStream
			}
			var payload any = testevents.TicketCommented{Body: "x"}
			switch {
			case v == 0:
				payload = testevents.TicketOpened{Title: stream.ID}
			case v%7 == 0:
				payload = testevents.TicketClosed{}
			}
			if _, err := e.store.Append(ctx, tx, stream, expected, payload); err != nil {
				return err
			}
			if linger {
				if _, err := tx.Exec(ctx, `SELECT pg_sleep(0.003)`); err != nil {
					return err
				}
			}
			return nil
		})
		if !errors.Is(err, projector.ErrConcurrency) {
			return err
		}
	}
}

// settle makes the recorded inline versions old enough for the default
// grace, as if the processes had been running for a while.
func (e *ienv) settle() {
	e.exec(`UPDATE ` + e.ident("projector_inline_projections") + ` SET updated_at = now() - interval '1 hour'`)
}

// differences counts rows that differ between the two models, both ways.
func (e *ienv) differences() int {
	e.t.Helper()
	var n int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM (
		(SELECT * FROM `+e.ident("tickets")+` EXCEPT SELECT * FROM `+e.ident("tickets_ref")+`)
		UNION ALL
		(SELECT * FROM `+e.ident("tickets_ref")+` EXCEPT SELECT * FROM `+e.ident("tickets")+`)) d`).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

func (e *ienv) count(sql string) int {
	e.t.Helper()
	var n int
	if err := e.store.Pool().QueryRow(e.ctx, sql).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// TestInlineRebuildExactUnderWriters rebuilds a corrupted inline model while
// 8 writers append throughout (with out-of-order commits), and checks the
// result against the same projection built live from the first event, and
// against the log itself: every event applied exactly once, whether it was
// replayed in a batch, in the locked catch-up, or applied live by an append
// before or after the switch (one blocked by the lock writes the new
// tables). The SkipOnReplay "mail" never runs during the rebuild.
func TestInlineRebuildExactUnderWriters(t *testing.T) {
	t.Parallel()
	e := newInlineEnv(t)
	for i := range 300 {
		if err := e.append(e.ctx, i%40, false); err != nil {
			t.Fatal(err)
		}
	}
	// Corrupt the live model: a rebuild must repair it, not keep it.
	e.exec(`DELETE FROM ` + e.ident("tickets") + ` WHERE stream_id IN ('s1', 's2', 's3')`)
	e.exec(`UPDATE ` + e.ident("tickets") + ` SET n = n + 1000000 WHERE stream_id = 's4'`)
	if e.differences() == 0 {
		t.Fatal("the corruption did not take")
	}
	e.settle()

	ctx, stop := context.WithCancel(e.ctx)
	var appended atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 9)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for ctx.Err() == nil {
				if err := e.append(ctx, r.IntN(60), w%2 == 0); err != nil {
					if ctx.Err() == nil {
						errs <- err
					}
					return
				}
				appended.Add(1)
			}
		}()
	}
	// A reader with pgx's statement cache (the default) selects * all
	// along: the new tables have the old ones' shape, so its cached plan is
	// replanned on the new table, never fails (no SQLSTATE 0A000).
	var reads atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		conn, err := e.store.Pool().Acquire(ctx)
		if err != nil {
			return
		}
		defer conn.Release()
		for ctx.Err() == nil {
			rows, err := conn.Query(ctx, `SELECT * FROM `+e.ident("tickets"))
			if err == nil {
				for rows.Next() {
				}
				rows.Close()
				err = rows.Err()
			}
			if err != nil {
				if ctx.Err() == nil {
					errs <- fmt.Errorf("reader: %w", err)
				}
				return
			}
			reads.Add(1)
		}
	}()
	// Writers are under way before the rebuild starts, and go on after.
	eventually(t, time.Minute, "writers under way", func() bool { return appended.Load() >= 100 })
	res, err := rebuild.Inline(e.ctx, e.store, e.p, rebuild.InlineOptions{Tables: []string{e.schema + ".tickets"}, BatchSize: 50})
	if err != nil {
		stop()
		wg.Wait()
		t.Fatal(err)
	}
	after := appended.Load()
	eventually(t, time.Minute, "writers going on after the switch", func() bool { return appended.Load() >= after+100 })
	stop()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("writer: %v", err)
	}
	t.Logf("inline rebuild: %d events in batches, %d under the lock, %d attempt(s), lock wait %v, lock held %v (catch-up %v); %d appends and %d reads during the run",
		res.Replayed, res.CaughtUp, res.Attempts, res.LockWait, res.LockHeld, res.LockCatchUp, appended.Load(), reads.Load())

	// Batches or the locked catch-up: which took how many depends on
	// whether another session of the cluster held the horizon back (then
	// the batches read nothing and all is caught up under the lock, exact
	// but slow: docs/rebuilds.md). Together they applied the whole log.
	if res.Replayed+res.CaughtUp < 300 || res.LockHeld <= 0 || res.Attempts < 1 {
		t.Fatalf("result %+v: want ≥ 300 events applied by the rebuild and a measured lock", res)
	}
	if d := e.differences(); d != 0 {
		rows, _ := e.store.Pool().Query(e.ctx, `SELECT r.stream_id, r.n, t.n, o.n, r.last_version, t.last_version FROM `+e.ident("tickets_ref")+` r
			LEFT JOIN `+e.ident("tickets")+` t USING (stream_id) LEFT JOIN `+pgx.Identifier{res.OldSchema, "tickets"}.Sanitize()+` o USING (stream_id) WHERE t.n IS DISTINCT FROM r.n LIMIT 10`)
		for rows.Next() {
			vals, _ := rows.Values()
			t.Log(vals...)
		}
		rows.Close()
		t.Fatalf("rebuilt model differs from the live-built reference in %d rows", d)
	}
	// And from the log: n is the number of events of each stream.
	if d := e.count(`SELECT count(*) FROM ` + e.ident("tickets") + ` t FULL JOIN (SELECT tenant_id, stream_type, stream_id, count(*) AS n, max(version) AS v
			FROM ` + e.ident("projector_events") + ` GROUP BY 1, 2, 3) l USING (tenant_id, stream_type, stream_id)
		WHERE t.n IS DISTINCT FROM l.n OR t.last_version IS DISTINCT FROM l.v`); d != 0 {
		t.Fatalf("rebuilt model differs from the log in %d streams", d)
	}
	if n := e.count(`SELECT count(*) FROM ` + e.ident("tickets")); n != 60 {
		t.Fatalf("rebuilt model has %d tickets, want 60", n)
	}
	// The old tables are kept, corruption and all; the shadow schema is gone.
	if n := e.count(`SELECT count(*) FROM ` + pgx.Identifier{res.OldSchema, "tickets"}.Sanitize() + ` WHERE n > 1000000`); n != 1 {
		t.Fatalf("old tickets: %d corrupted rows, want the 1 left there", n)
	}
	if n := e.count(`SELECT count(*) FROM pg_namespace WHERE starts_with(nspname, '` + e.schema + `_irb_') AND nspname <> '` + res.OldSchema + `'`); n != 0 {
		t.Fatalf("%d shadow schemas left", n)
	}
	// Each committed closed event's mail ran once, live; never on replay.
	// (A mail of an append rolled back when the writers stopped has no
	// event: effects outside the database are the handler's to make safe.)
	rows, err := e.store.Pool().Query(e.ctx, `SELECT id::text FROM `+e.ident("projector_events")+` WHERE type = 'ticket.closed'`)
	if err != nil {
		t.Fatal(err)
	}
	closed, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(closed) == 0 {
		t.Fatalf("closed events: %d, %v", len(closed), err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, id := range closed {
		if n := e.mails[id]; n != 1 {
			t.Fatalf("mail of %s ran %d times", id, n)
		}
	}
}

// TestInlineRebuildRefusals: each refusal is a typed error and leaves the
// live tables and the schema as they were.
func TestInlineRebuildRefusals(t *testing.T) {
	t.Parallel()
	e := newInlineEnv(t)
	if err := e.append(e.ctx, 1, false); err != nil {
		t.Fatal(err)
	}
	tables := []string{e.schema + ".tickets"}
	newer := func() *projection.Inline {
		p := e.inline("tickets", "tickets")
		must(p.SetVersion(2))
		return p
	}

	// The record was made just now: processes may not have seen it yet.
	_, err := rebuild.Inline(e.ctx, e.store, e.p, rebuild.InlineOptions{Tables: tables})
	if !errors.Is(err, rebuild.ErrInlineVersion) {
		t.Fatalf("fresh record: got %v, want ErrInlineVersion", err)
	}
	e.settle()

	other := projection.NewInline("other")
	must(projection.OnEvent(other, e.types.Closed, func(context.Context, pgx.Tx, projector.Event) error { return nil }))
	cases := []struct {
		name string
		p    *projection.Inline
		opts rebuild.InlineOptions
		prep func()
		want error
	}{
		{name: "no tables", p: e.p, want: rebuild.ErrNoTables},
		{name: "unknown table", p: e.p, opts: rebuild.InlineOptions{Tables: []string{e.schema + ".nope"}}, want: rebuild.ErrNotRebuildable},
		{name: "never recorded", p: other, opts: rebuild.InlineOptions{Tables: tables}, want: rebuild.ErrUnknownProjection},
		{name: "this binary is newer than the record", p: newer(), opts: rebuild.InlineOptions{Tables: tables}, want: rebuild.ErrInlineVersion},
		{name: "the record is newer than this binary", p: e.p, opts: rebuild.InlineOptions{Tables: tables},
			prep: func() {
				e.exec(`UPDATE ` + e.ident("projector_inline_projections") + ` SET version = 2 WHERE name = 'tickets'`)
			}, want: rebuild.ErrInlineVersion},
	}
	before := e.count(`SELECT count(*) FROM ` + e.ident("tickets"))
	for _, c := range cases {
		if c.prep != nil {
			c.prep()
		}
		_, err := rebuild.Inline(e.ctx, e.store, c.p, c.opts)
		if !errors.Is(err, c.want) {
			t.Fatalf("%s: got %v, want %v", c.name, err, c.want)
		}
		t.Logf("%s: %v", c.name, err)
		if n := e.count(`SELECT count(*) FROM pg_namespace WHERE starts_with(nspname, '` + e.schema + `_irb_')`); n != 0 {
			t.Fatalf("%s: left %d schemas", c.name, n)
		}
		if n := e.count(`SELECT count(*) FROM ` + e.ident("tickets")); n != before {
			t.Fatalf("%s: live table changed", c.name)
		}
	}
	for _, bad := range []rebuild.InlineOptions{{Tables: tables, BatchSize: -1}, {Tables: tables, BatchSize: 100001}, {Tables: tables, LockAttempts: -1}} {
		if _, err := rebuild.Inline(e.ctx, e.store, e.p, bad); err == nil {
			t.Fatalf("options %+v accepted", bad)
		}
	}
}

// TestInlineRebuildOneAtATime: a second rebuild of the projection while one
// runs is ErrActive, and the first still completes.
func TestInlineRebuildOneAtATime(t *testing.T) {
	t.Parallel()
	e := newInlineEnv(t)
	if err := e.append(e.ctx, 1, false); err != nil {
		t.Fatal(err)
	}
	e.settle()
	opts := rebuild.InlineOptions{Tables: []string{e.schema + ".tickets"}}
	done := e.rebuildToGate(opts)
	_, err := rebuild.Inline(e.ctx, e.store, e.p, opts)
	close(e.gate)
	if !errors.Is(err, rebuild.ErrActive) {
		t.Fatalf("second rebuild: got %v, want ErrActive", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("first rebuild: %v", err)
	}
	if d := e.differences(); d != 0 {
		t.Fatalf("rebuilt model differs in %d rows", d)
	}
}

// TestInlineRebuildWaitsForOpenAppend: an append that has written the live
// table and not committed holds the switch back (its lock attempts time
// out) until it commits; its event is then in the new model once.
func TestInlineRebuildWaitsForOpenAppend(t *testing.T) {
	t.Parallel()
	e := newInlineEnv(t)
	for i := range 20 {
		if err := e.append(e.ctx, i, false); err != nil {
			t.Fatal(err)
		}
	}
	e.settle()
	tx, err := e.store.Pool().Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(e.ctx) }()
	stream := projector.StreamRef{Tenant: "t9", Type: "ticket", ID: "held"}
	if _, err := e.store.Append(e.ctx, tx, stream, projector.NoStream, testevents.TicketOpened{Title: "held"}); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct {
		res rebuild.InlineResult
		err error
	}, 1)
	go func() {
		res, err := rebuild.Inline(e.ctx, e.store, e.p, rebuild.InlineOptions{Tables: []string{e.schema + ".tickets"}, LockTimeout: 20 * time.Millisecond, LockAttempts: 1000})
		done <- struct {
			res rebuild.InlineResult
			err error
		}{res, err}
	}()
	// The rebuild queues for the lock the open append holds.
	pgtest.WaitForLockOn(t, e.store.Pool(), e.ident("tickets"))
	select {
	case r := <-done:
		t.Fatalf("rebuild switched past an open append that wrote the live table: %+v, %v", r.res, r.err)
	default:
	}
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if n := e.count(`SELECT n FROM ` + e.ident("tickets") + ` WHERE stream_id = 'held'`); n != 1 {
		t.Fatalf("held append applied %d times", n)
	}
	if d := e.differences(); d != 0 {
		t.Fatalf("rebuilt model differs in %d rows", d)
	}
}

// TestInlineRebuildNaiveSwapLosesHeldAppend gives the open-append test its
// teeth: on the same schedule, a rebuild that replays the log gap-safely
// and swaps the tables without the locked catch-up loses the held append's
// event (it commits into the old table after the last read), so the test
// above would fail if Inline stopped catching up under the lock.
func TestInlineRebuildNaiveSwapLosesHeldAppend(t *testing.T) {
	t.Parallel()
	e := newInlineEnv(t)
	for i := range 20 {
		if err := e.append(e.ctx, i, false); err != nil {
			t.Fatal(err)
		}
	}
	tx, err := e.store.Pool().Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(e.ctx) }()
	stream := projector.StreamRef{Tenant: "t9", Type: "ticket", ID: "held"}
	if _, err := e.store.Append(e.ctx, tx, stream, projector.NoStream, testevents.TicketOpened{Title: "held"}); err != nil {
		t.Fatal(err)
	}
	shadow := e.schema + "_irb_naive"
	e.exec(`CREATE SCHEMA ` + pgx.Identifier{shadow}.Sanitize())
	e.exec(`CREATE TABLE ` + pgx.Identifier{shadow, "tickets"}.Sanitize() + ` (LIKE ` + e.ident("tickets") + ` INCLUDING ALL)`)
	tables := map[string]string{e.schema + ".tickets": pgx.Identifier{shadow, "tickets"}.Sanitize()}
	var cursor projector.Position
	for {
		var batch postgres.LogBatch
		if err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(rtx pgx.Tx) error {
			var err error
			if batch, err = e.store.ReadLogTx(e.ctx, rtx, postgres.LogQuery{After: cursor, EventTypes: e.p.EventTypes()}); err != nil {
				return err
			}
			return projection.ReplayInline(e.ctx, rtx, e.p, batch.Events, tables)
		}); err != nil {
			t.Fatal(err)
		}
		cursor = batch.Next(cursor)
		if !batch.Full {
			break
		}
	}
	swapped := make(chan error, 1)
	go func() {
		swapped <- pgx.BeginFunc(e.ctx, e.store.Pool(), func(stx pgx.Tx) error {
			for _, q := range []string{
				`CREATE SCHEMA ` + pgx.Identifier{shadow + "_old"}.Sanitize(),
				`ALTER TABLE ` + e.ident("tickets") + ` SET SCHEMA ` + pgx.Identifier{shadow + "_old"}.Sanitize(),
				`ALTER TABLE ` + pgx.Identifier{shadow, "tickets"}.Sanitize() + ` SET SCHEMA ` + pgx.Identifier{e.schema}.Sanitize(),
			} {
				if _, err := stx.Exec(e.ctx, q); err != nil {
					return err
				}
			}
			return nil
		})
	}()
	pgtest.WaitForLockOn(t, e.store.Pool(), e.ident("tickets"))
	if err := tx.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-swapped; err != nil {
		t.Fatal(err)
	}
	if n := e.count(`SELECT count(*) FROM ` + e.ident("tickets") + ` WHERE stream_id = 'held'`); n != 0 {
		t.Fatalf("the naive swap kept the held append (%d rows): this schedule no longer shows the race", n)
	}
	if d := e.differences(); d == 0 {
		t.Fatal("the naive swap lost nothing: this schedule no longer shows the race")
	}
}

// TestInlineRebuildFenceAtSwitch: a store with a newer version starting
// while the rebuild replays (its record is raised) makes the switch refuse
// with ErrInlineVersion; the live tables stay as they were and the shadow
// schema is dropped.
func TestInlineRebuildFenceAtSwitch(t *testing.T) {
	t.Parallel()
	e := newInlineEnv(t)
	for i := range 10 {
		if err := e.append(e.ctx, i, false); err != nil {
			t.Fatal(err)
		}
	}
	e.settle()
	e.exec(`UPDATE ` + e.ident("tickets") + ` SET n = 99 WHERE stream_id = 's1'`)
	done := e.rebuildToGate(rebuild.InlineOptions{Tables: []string{e.schema + ".tickets"}})
	// The first events are normally replayed in a batch. If another
	// session of the cluster holds the gap-safe horizon back, they are
	// replayed by the switch's catch-up instead, under the lock: then the
	// record is held FOR SHARE, the raise waits for the switch, and the
	// switch wins.
	inSwitch := e.count(`SELECT count(*) FROM pg_locks WHERE granted AND mode = 'AccessExclusiveLock' AND relation = '`+e.ident("tickets")+`'::regclass`) > 0
	raised := make(chan error, 1)
	go func() {
		_, err := e.store.Pool().Exec(e.ctx, `UPDATE `+e.ident("projector_inline_projections")+` SET version = 2, updated_at = now() WHERE name = 'tickets'`)
		raised <- err
	}()
	if inSwitch {
		close(e.gate)
		if err := <-done; err != nil {
			t.Fatalf("switch under way when the version was raised: got %v, want it to finish first", err)
		}
		if err := <-raised; err != nil {
			t.Fatal(err)
		}
		t.Log("the horizon was held back: checked the switch's side of the fence")
		return
	}
	if err := <-raised; err != nil {
		t.Fatal(err)
	}
	close(e.gate)
	if err := <-done; !errors.Is(err, rebuild.ErrInlineVersion) {
		t.Fatalf("got %v, want ErrInlineVersion", err)
	}
	if n := e.count(`SELECT n FROM ` + e.ident("tickets") + ` WHERE stream_id = 's1'`); n != 99 {
		t.Fatalf("live table changed (n = %d)", n)
	}
	if n := e.count(`SELECT count(*) FROM pg_namespace WHERE starts_with(nspname, '` + e.schema + `_irb_')`); n != 0 {
		t.Fatalf("left %d schemas", n)
	}
}

// TestInlineRebuildRefusesWhileHorizonHeld: a transaction elsewhere holding
// the gap-safe horizon back keeps the batches from reaching the log, so the
// switch would apply everything since under its lock. With more than
// MaxUnderLock such events it waits, then refuses with ErrHorizonHeld and
// switches nothing; once the transaction ends, the rebuild goes through.
// Not parallel: the transaction it holds open holds the horizon of the whole
// server, which every gap-safe read of the package's parallel tests would
// wait behind, so it runs before them, with the other serial tests.
func TestInlineRebuildRefusesWhileHorizonHeld(t *testing.T) {
	e := newInlineEnv(t)
	for i := range 5 {
		if err := e.append(e.ctx, i, false); err != nil {
			t.Fatal(err)
		}
	}
	e.settle()
	holder, err := pgtest.Pool(t).Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(context.Background()) }()
	if _, err := holder.Exec(e.ctx, `SELECT pg_current_xact_id()`); err != nil { // an id: it holds the horizon
		t.Fatal(err)
	}
	for i := range 40 {
		if err := e.append(e.ctx, 100+i, false); err != nil {
			t.Fatal(err)
		}
	}
	tables := []string{e.schema + ".tickets"}
	before := e.count(`SELECT count(*) FROM ` + e.ident("tickets"))
	_, err = rebuild.Inline(e.ctx, e.store, e.p, rebuild.InlineOptions{Tables: tables, MaxUnderLock: 10, SettleTimeout: 300 * time.Millisecond})
	if !errors.Is(err, rebuild.ErrHorizonHeld) {
		t.Fatalf("with the horizon held: %v, want ErrHorizonHeld", err)
	}
	if n := e.count(`SELECT count(*) FROM pg_namespace WHERE starts_with(nspname, '` + e.schema + `_irb_')`); n != 0 {
		t.Fatalf("the refused rebuild left %d schemas", n)
	}
	if n := e.count(`SELECT count(*) FROM ` + e.ident("tickets")); n != before {
		t.Fatalf("the refused rebuild changed the live table: %d rows, had %d", n, before)
	}
	if err := holder.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	res, err := rebuild.Inline(e.ctx, e.store, e.p, rebuild.InlineOptions{Tables: tables, MaxUnderLock: 10})
	if err != nil {
		t.Fatalf("after the holder ended: %v", err)
	}
	if res.CaughtUp > 10 || e.differences() != 0 {
		t.Fatalf("after the holder ended: %+v, %d differences", res, e.differences())
	}
}
