package rebuild_test

import (
	"context"
	"errors"
	"fmt"
	"os"
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

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	if os.Getenv(partialChildEnv) != "" {
		os.Exit(runPartialChild())
	}
	if os.Getenv(inlineChildEnv) != "" {
		os.Exit(runInlineChild())
	}
	pgtest.Main(m)
}

// env is one test's schema with a per-stream counting read model.
type env struct {
	t      *testing.T
	ctx    context.Context
	types  testevents.Types
	store  *postgres.Store
	schema string
	table  string // schema.counts, as declared
	// shadowFault, if set, is asked before sideEffects' handlers apply an
	// event in a shadow pass: an error it returns fails the handler.
	shadowFault func(context.Context, projector.Event) error
	// batchTimeout, if set, is sideEffects' version-2 BatchTimeout.
	batchTimeout time.Duration
	// maxAttempts, if set, is sideEffects' version-2 MaxAttempts.
	maxAttempts int
}

func newEnv(t *testing.T) *env {
	t.Helper()
	types := testevents.New()
	store := pgtest.Store(t, types.Registry)
	e := &env{t: t, ctx: context.Background(), types: types, store: store, schema: store.Schema(), table: store.Schema() + ".counts"}
	e.exec(`CREATE TABLE ` + pgx.Identifier{e.schema, "counts"}.Sanitize() + ` (stream_id text PRIMARY KEY, n int NOT NULL, v int NOT NULL)`)
	t.Cleanup(func() { dropRebuildSchemas(t, e.schema) })
	return e
}

func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.store.Pool().Exec(e.ctx, sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

// counter counts every event per stream into the declared table, marking
// each row with the projection's version; its handler qualifies the table
// name, so it goes through projection.Table.
func (e *env) counter(version int, cfg projection.AsyncConfig) *projection.Async {
	return counter(e.types, e.table, version, cfg)
}

func counter(types testevents.Types, table string, version int, cfg projection.AsyncConfig) *projection.Async {
	cfg.Version, cfg.Tables = version, []string{table}
	p := projection.NewAsync("counter", cfg)
	h := func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+projection.Table(ctx, table)+` AS c (stream_id, n, v) VALUES ($1, 1, $2)
			ON CONFLICT (stream_id) DO UPDATE SET n = c.n + 1, v = $2`, ev.Stream.ID, version)
		return err
	}
	must(projection.OnEvent(p, types.Opened, h))
	must(projection.OnEvent(p, types.Commented, h))
	return p
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

func (e *env) dispatcher(ps ...*projection.Async) *projection.Dispatcher {
	e.t.Helper()
	return startDispatcher(e.t, e.store, projection.Config{}, ps...)
}

// startDispatcher starts a dispatcher of ps on store with cfg's options
// and the tests' short poll and recheck, stopped at the end of the test.
func startDispatcher(t *testing.T, store *postgres.Store, cfg projection.Config, ps ...*projection.Async) *projection.Dispatcher {
	t.Helper()
	cfg.Store, cfg.Projections = store, ps
	cfg.PollMax, cfg.Recheck = 20*time.Millisecond, 20*time.Millisecond
	d, err := projection.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = d.Stop(ctx)
	})
	return d
}

// appendsPerWriter bounds a test writer: a rebuild replays more slowly than
// writers flat out on this shared machine append, and a blue/green switch
// waits until the shadow has caught up, so unbounded writers could keep it
// from ever switching (docs/rebuilds.md says so for production too).
const appendsPerWriter = 250

// write has writers append to streams of their own until stop is closed or
// each has appended appendsPerWriter times. The test's end waits for them,
// before its schema is dropped.
func (e *env) write(writers int, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	e.t.Cleanup(wg.Wait)
	for w := range writers {
		wg.Go(func() {
			for i := range appendsPerWriter {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("w%d-%d", w, i)
				err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
					_, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", id), projector.NoStream,
						testevents.TicketOpened{Title: id}, testevents.TicketCommented{Body: "c"})
					return err
				})
				if err != nil {
					e.t.Errorf("append: %v", err)
					return
				}
			}
		})
	}
	return &wg
}

// read is one consistent look at the live model, in one statement: the
// consumer's cursor, how many events the model counted, how many events the
// log has up to the cursor, and the model versions its rows carry.
type read struct {
	cursor            projector.Position
	counted, expected int64
	versions          []int32
}

func (e *env) read() (read, error) {
	var r read
	err := e.store.Pool().QueryRow(e.ctx, `SELECT c.cursor_tx_id, c.cursor_seq,
			(SELECT coalesce(sum(n), 0) FROM `+pgx.Identifier{e.schema, "counts"}.Sanitize()+`),
			(SELECT count(*) FROM `+e.store.Table("projector_events")+` ev WHERE (ev.tx_id, ev.seq) <= (c.cursor_tx_id, c.cursor_seq)),
			(SELECT coalesce(array_agg(DISTINCT v ORDER BY v), '{}') FROM `+pgx.Identifier{e.schema, "counts"}.Sanitize()+`)
		FROM `+e.store.Table("projector_consumers")+` c WHERE c.name = 'counter' AND c.instance_id = $1`, projection.SharedInstance).
		Scan(&r.cursor.TxID, &r.cursor.Seq, &r.counted, &r.expected, &r.versions)
	return r, err
}

// eventually is pgtest.Eventually, short for the many waits of these tests.
var eventually = pgtest.Eventually

// Promise 11, blue/green: while writers append and version 1 serves, a
// dispatcher with version 2 builds the new model into shadow tables and
// switches. A reader querying the live model all along never sees a
// half-built model (every read counts exactly the events up to the cursor
// it reads beside), never a position older than the one before, and never
// rows of two versions at once; version 1's binary stands aside after the
// switch.
func TestPromise11_BlueGreenNeverServesHalfBuilt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.dispatcher(e.counter(1, projection.AsyncConfig{BatchSize: 50}))
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

	var reads, sawV1, sawV2 atomic.Int64
	readerDone := make(chan struct{})
	readerStop := make(chan struct{})
	go func() {
		defer close(readerDone)
		var last read
		for {
			select {
			case <-readerStop:
				return
			default:
			}
			r, err := e.read()
			if err != nil {
				t.Errorf("reader: %v", err)
				return
			}
			reads.Add(1)
			if r.counted != r.expected {
				t.Errorf("reader saw a half-built model: %d events counted, %d in the log up to its cursor %s (versions %v)", r.counted, r.expected, r.cursor, r.versions)
				return
			}
			if r.cursor.Less(last.cursor) {
				t.Errorf("reader went back in time: cursor %s after %s", r.cursor, last.cursor)
				return
			}
			if len(r.versions) > 1 || (len(last.versions) == 1 && len(r.versions) == 1 && r.versions[0] < last.versions[0]) {
				t.Errorf("reader saw versions %v after %v", r.versions, last.versions)
				return
			}
			if len(r.versions) == 1 && r.versions[0] == 1 {
				sawV1.Add(1)
			}
			if len(r.versions) == 1 && r.versions[0] == 2 {
				sawV2.Add(1)
			}
			last = r
		}
	}()

	eventually(t, time.Minute, "version 1 to serve", func() bool { return sawV1.Load() > 0 })
	d2 := e.dispatcher(e.counter(2, projection.AsyncConfig{BatchSize: 200}))
	rb, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rb.Version != 2 || rb.Mode != rebuild.BlueGreen || rb.Status != rebuild.Building {
		t.Fatalf("requested %+v", rb)
	}
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{}); !errors.Is(err, rebuild.ErrActive) {
		t.Fatalf("a second rebuild while one runs: %v, want ErrActive", err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	final, err := rebuild.Wait(ctx, e.store, "counter", 20*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	if final.Status != rebuild.Switched || final.OldSchema == "" {
		t.Fatalf("rebuild ended %+v", final)
	}
	eventually(t, time.Minute, "the reader to see version 2", func() bool { return sawV2.Load() > 0 })
	close(stop)
	writers.Wait()
	if err := d2.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	close(readerStop)
	<-readerDone
	r, err := e.read()
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+e.store.Table("projector_events")).Scan(&total); err != nil {
		t.Fatal(err)
	}
	if r.counted != total || len(r.versions) != 1 || r.versions[0] != 2 {
		t.Fatalf("after the switch and catching up: counted %d of %d events, versions %v", r.counted, total, r.versions)
	}
	t.Logf("%d reads during the rebuild (%d of version 1, %d of version 2); %d events; switch held the tables %v",
		reads.Load(), sawV1.Load(), sawV2.Load(), total, final.SwitchTook)

	dropped, err := rebuild.DropOld(e.ctx, e.store, "counter")
	if err != nil || len(dropped) != 1 || pgtest.SchemaExists(t, final.OldSchema) {
		t.Fatalf("drop-old: %v, %v; old schema still there: %v", dropped, err, pgtest.SchemaExists(t, final.OldSchema))
	}
}

// In place: the tables are cleared and the consumer replays from the start;
// a side effect wrapped in SkipOnReplay is not repeated, emitted events are
// not appended twice, and events after the rebuild started are live again.
func TestInPlaceRebuildReplaysWithoutRepeatingEffects(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var mails atomic.Int64
	p := e.counter(1, projection.AsyncConfig{})
	must(projection.OnEvent(p, e.types.Closed, projection.SkipOnReplay(func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		mails.Add(1)
		return nil
	})))
	// Every opened event emits an audit event; a replay must not emit again.
	audit := projection.NewAsync("auditor", projection.AsyncConfig{Tables: []string{e.schema + ".audit"}})
	e.exec(`CREATE TABLE ` + pgx.Identifier{e.schema, "audit"}.Sanitize() + ` (event_id uuid PRIMARY KEY)`)
	must(projection.On(audit, e.types.Opened, func(ctx context.Context, tx pgx.Tx, ev projector.Event, o testevents.TicketOpened) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+projection.Table(ctx, e.schema+".audit")+` (event_id) VALUES ($1)`, ev.ID); err != nil {
			return err
		}
		_, err := projection.Emit(ctx, tx, projector.Stream("audit", ev.ID.String()), projector.NoStream, testevents.TicketClosed{Reason: "audited"})
		return err
	}))
	d := e.dispatcher(p, audit)
	for i := range 20 {
		id := fmt.Sprintf("s%d", i)
		if err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
			_, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", id), projector.NoStream,
				testevents.TicketOpened{Title: id}, testevents.TicketCommented{Body: "c"}, testevents.TicketClosed{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	catchUp := func() {
		t.Helper()
		for range 2 { // the second for the events the first emitted
			if err := d.CatchUp(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	catchUp()
	// counter counts opened and commented; closed events (20 of the tickets,
	// 20 emitted audits) send mails.
	countBefore, _ := e.read()
	if mails.Load() != 40 || countBefore.counted != 40 {
		t.Fatalf("before the rebuild: %d mails, %d counted; want 40 and 40", mails.Load(), countBefore.counted)
	}
	for _, name := range []string{"counter", "auditor"} {
		rb, err := rebuild.Request(e.ctx, e.store, name, rebuild.Options{Mode: rebuild.InPlace})
		if err != nil {
			t.Fatal(err)
		}
		final, err := rebuild.Wait(ctx, e.store, name, 10*time.Millisecond, nil)
		if err != nil || final.Status != rebuild.Done {
			t.Fatalf("%s: rebuild %+v ended %+v, %v", name, rb, final, err)
		}
	}
	catchUp()
	after, _ := e.read()
	var audits, auditRows int
	_ = e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+e.store.Table("projector_events")+` WHERE stream_type = 'audit'`).Scan(&audits)
	_ = e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+pgx.Identifier{e.schema, "audit"}.Sanitize()).Scan(&auditRows)
	if after.counted != 40 || mails.Load() != 40 || audits != 20 || auditRows != 20 {
		t.Fatalf("after the rebuild: counted %d (want 40), mails %d (want 40: none repeated), audit events %d and rows %d (want 20: none emitted twice)",
			after.counted, mails.Load(), audits, auditRows)
	}
	// After the replay, new events are live: their mail goes out.
	if err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		_, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", "late"), projector.NoStream, testevents.TicketOpened{Title: "late"}, testevents.TicketClosed{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	catchUp()
	if mails.Load() != 42 { // the ticket's close, and its audit's
		t.Fatalf("mails after a live event: %d, want 42", mails.Load())
	}
}

// Requests that cannot work say why, and change nothing.
func TestRequestRefusals(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	bare := projection.NewAsync("bare", projection.AsyncConfig{})
	must(projection.OnEvent(bare, e.types.Opened, func(context.Context, pgx.Tx, projector.Event) error { return nil }))
	local := projection.NewAsync("local", projection.AsyncConfig{Delivery: projection.PerInstance, Tables: []string{e.table}})
	must(projection.OnEvent(local, e.types.Opened, func(context.Context, pgx.Tx, projector.Event) error { return nil }))
	e.dispatcher(bare, local, e.counter(1, projection.AsyncConfig{}))
	for _, tc := range []struct {
		name string
		opts rebuild.Options
		want error
	}{
		{"nosuch", rebuild.Options{}, rebuild.ErrUnknownProjection},
		{"Bad Name", rebuild.Options{}, rebuild.ErrUnknownProjection},
		{"counter", rebuild.Options{Version: 7}, rebuild.ErrUnknownProjection},
		{"bare", rebuild.Options{}, rebuild.ErrNoTables},
		{"local", rebuild.Options{}, rebuild.ErrNotRebuildable},
		{"counter", rebuild.Options{Mode: "sideways"}, rebuild.ErrNotRebuildable},
		{"counter", rebuild.Options{Mode: rebuild.InPlace, Hold: true}, rebuild.ErrNotRebuildable},
	} {
		if _, err := rebuild.Request(e.ctx, e.store, tc.name, tc.opts); !errors.Is(err, tc.want) {
			t.Errorf("%s %+v: %v, want %v", tc.name, tc.opts, err, tc.want)
		}
	}
	if err := rebuild.Cancel(e.ctx, e.store, "counter"); !errors.Is(err, rebuild.ErrNotActive) {
		t.Errorf("cancel without a rebuild: %v", err)
	}
	if _, err := rebuild.DropOld(e.ctx, e.store, "nosuch"); !errors.Is(err, rebuild.ErrUnknownProjection) {
		t.Errorf("drop-old of an unknown projection: %v, want ErrUnknownProjection", err)
	}
	if dropped, err := rebuild.DropOld(e.ctx, e.store, "counter"); err != nil || len(dropped) != 0 {
		t.Errorf("drop-old with nothing to drop: %v, %v", dropped, err)
	}
	if rs, err := rebuild.List(e.ctx, e.store, ""); err != nil || len(rs) != 0 {
		t.Errorf("refused requests left rebuilds: %v, %v", rs, err)
	}
	e.exec(`INSERT INTO ` + e.store.Table("projector_pruned") + ` (event_type, deleted) VALUES ('ticket.commented', 3)`)
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{}); !errors.Is(err, rebuild.ErrPruned) {
		t.Errorf("rebuild over pruned events: %v, want ErrPruned", err)
	}
}

// A held rebuild waits at ready until Switch; a cancelled one leaves the
// live model alone and drops its shadow schema.
func TestHoldSwitchAndCancel(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d1 := e.dispatcher(e.counter(1, projection.AsyncConfig{}))
	for i := range 10 {
		if err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
			_, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", fmt.Sprint(i)), projector.NoStream, testevents.TicketOpened{Title: "t"})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d1.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	e.dispatcher(e.counter(2, projection.AsyncConfig{}))
	rb, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Hold: true})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the held rebuild to be ready", func() bool {
		r, err := rebuild.Current(e.ctx, e.store, "counter")
		return err == nil && r.Status == rebuild.Ready
	})
	if r, _ := e.read(); len(r.versions) != 1 || r.versions[0] != 1 {
		t.Fatalf("a held rebuild switched: versions %v", r.versions)
	}
	if err := rebuild.Cancel(e.ctx, e.store, "counter"); err != nil {
		t.Fatal(err)
	}
	if pgtest.SchemaExists(t, rb.ShadowSchema) {
		t.Fatalf("cancel left the shadow schema %s", rb.ShadowSchema)
	}
	if r, _ := e.read(); len(r.versions) != 1 || r.versions[0] != 1 || r.counted != 10 {
		t.Fatalf("cancel touched the live model: %+v", r)
	}
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Hold: true}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the second held rebuild to be ready", func() bool {
		r, err := rebuild.Current(e.ctx, e.store, "counter")
		return err == nil && r.Status == rebuild.Ready
	})
	if err := rebuild.Switch(e.ctx, e.store, "counter"); err != nil {
		t.Fatal(err)
	}
	if final, err := rebuild.Wait(ctx, e.store, "counter", 10*time.Millisecond, nil); err != nil || final.Status != rebuild.Switched {
		t.Fatalf("after switch: %+v, %v", final, err)
	}
	if r, _ := e.read(); len(r.versions) != 1 || r.versions[0] != 2 || r.counted != 10 {
		t.Fatalf("after the switch: %+v", r)
	}
}

// appendBatch appends one stream of n events in one transaction.
func (e *env) appendBatch(t *testing.T, i, n int) {
	t.Helper()
	payloads := []any{testevents.TicketOpened{Title: "t"}}
	for len(payloads) < n {
		payloads = append(payloads, testevents.TicketCommented{Body: "c"})
	}
	if err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		_, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", fmt.Sprintf("pre-%d", i)), projector.NoStream, payloads...)
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// A version that changes the tables' shape says so in PrepareShadow: the
// shadow copies get the new column before the replay, the new handlers
// fill it, and after the switch readers see it; the live table kept its
// old shape until then.
func TestPrepareShadowGivesTheNewShape(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d1 := e.dispatcher(e.counter(1, projection.AsyncConfig{}))
	for i := range 5 {
		e.appendBatch(t, i, 3)
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d1.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	v2 := projection.NewAsync("counter", projection.AsyncConfig{Version: 2, Tables: []string{e.table},
		PrepareShadow: func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `ALTER TABLE counts ADD COLUMN last_type text`) // unqualified: the shadow copy
			return err
		}})
	h := func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+projection.Table(ctx, e.table)+` AS c (stream_id, n, v, last_type) VALUES ($1, 1, 2, $2)
			ON CONFLICT (stream_id) DO UPDATE SET n = c.n + 1, v = 2, last_type = $2`, ev.Stream.ID, ev.Type)
		return err
	}
	must(projection.OnEvent(v2, e.types.Opened, h))
	must(projection.OnEvent(v2, e.types.Commented, h))
	e.dispatcher(v2)
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{}); err != nil {
		t.Fatal(err)
	}
	final, err := rebuild.Wait(ctx, e.store, "counter", 10*time.Millisecond, nil)
	if err != nil || final.Status != rebuild.Switched {
		t.Fatalf("rebuild ended %+v, %v", final, err)
	}
	var rows, filled int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*), count(last_type) FROM `+pgx.Identifier{e.schema, "counts"}.Sanitize()).Scan(&rows, &filled); err != nil {
		t.Fatalf("the live table after the switch: %v", err)
	}
	if rows != 5 || filled != 5 {
		t.Fatalf("after the switch: %d rows, %d with the new column filled; want 5 and 5", rows, filled)
	}
	var oldHasColumn bool
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT EXISTS (SELECT 1 FROM information_schema.columns
		WHERE table_schema = $1 AND table_name = 'counts' AND column_name = 'last_type')`, final.OldSchema).Scan(&oldHasColumn); err != nil || oldHasColumn {
		t.Fatalf("the old table gained the new column (%v): PrepareShadow altered the live table", err)
	}
}

// In place and blue/green, with eight writers appending throughout — one of
// them holding each transaction open a while, so commits land out of log
// order — the rebuilt model ends equal to what a live build counts: every
// stream's events, each once.
func TestPromise11_RebuildsEqualLiveWhileWritersAppend(t *testing.T) {
	t.Parallel()
	for _, mode := range []rebuild.Mode{rebuild.InPlace, rebuild.BlueGreen} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.dispatcher(e.counter(1, projection.AsyncConfig{BatchSize: 50}))
			version := 1
			if mode == rebuild.BlueGreen {
				version = 2
				e.dispatcher(e.counter(2, projection.AsyncConfig{BatchSize: 50}))
			}
			stop := make(chan struct{})
			writers := e.write(7, stop)
			slow := e.slowWriter(stop)
			for i := range 20 {
				e.appendBatch(t, i, 10)
			}
			if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Mode: mode, Version: version}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
			defer cancel()
			final, err := rebuild.Wait(ctx, e.store, "counter", 20*time.Millisecond, nil)
			if err != nil || (final.Status != rebuild.Done && final.Status != rebuild.Switched) {
				t.Fatalf("rebuild ended %+v, %v", final, err)
			}
			close(stop)
			writers.Wait()
			slow.Wait()
			eventually(t, time.Minute, "the model to count every stream's events once", func() bool {
				var wrong int
				err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+e.store.Table("projector_streams")+` s
					FULL JOIN `+pgx.Identifier{e.schema, "counts"}.Sanitize()+` c ON c.stream_id = s.stream_id
					WHERE c.n IS DISTINCT FROM s.version OR c.v IS DISTINCT FROM $1`, version).Scan(&wrong)
				return err == nil && wrong == 0
			})
		})
	}
}

// slowWriter appends in transactions it keeps open a few milliseconds after
// writing, so its commits land after younger transactions' — out of log
// order — until stop is closed.
func (e *env) slowWriter(stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	e.t.Cleanup(wg.Wait)
	wg.Go(func() {
		for i := range appendsPerWriter / 2 {
			select {
			case <-stop:
				return
			default:
			}
			err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
				if _, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", fmt.Sprintf("slow-%d", i)), projector.NoStream,
					testevents.TicketOpened{Title: "slow"}); err != nil {
					return err
				}
				_, err := tx.Exec(e.ctx, `SELECT pg_sleep(0.02)`) // open while younger transactions commit
				return err
			})
			if err != nil {
				e.t.Errorf("slow append: %v", err)
				return
			}
		}
	})
	return &wg
}
