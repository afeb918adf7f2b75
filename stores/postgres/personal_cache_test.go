package postgres_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// TestKeyCacheNeverServesForgottenKey: store A has the subject's key in
// its cache (it appended and read), store B — another process's store,
// with a cache of its own — forgets the subject. From B's commit on, A's
// reads find the fields forgotten and A's appends write them as null,
// never sealed under the key A still remembers.
func TestKeyCacheNeverServesForgottenKey(t *testing.T) {
	t.Parallel()
	f := personalSetup(t)
	a, b := f.store, f.storeOn(t, masterKey(t, "k1", "one"))
	ada := testevents.CustomerRegistered{Customer: "c-1", Name: "Ada", Email: "ada@x", Plan: "pro"}
	for range 2 { // the second append and the read run with the key cached
		if err := f.register(t, a, "acme", ada); err != nil {
			t.Fatal(err)
		}
	}
	if evs := readCustomer(t, a, "acme", "c-1"); len(evs) != 2 || evs[1].Payload != ada {
		t.Fatalf("before the forget: %+v", evs)
	}
	if _, err := b.Forget(f.ctx, postgres.SubjectRef{Tenant: "acme", ID: "c-1"}); err != nil {
		t.Fatal(err)
	}
	for _, ev := range readCustomer(t, a, "acme", "c-1") {
		if p := ev.Payload.(testevents.CustomerRegistered); !ev.Forgotten || p.Name != "" || p.Email != "" {
			t.Fatalf("a read through the store that cached the key: %+v (forgotten %v)", p, ev.Forgotten)
		}
	}
	for _, ev := range readLogN(t, f.ctx, a, postgres.LogQuery{}, 3) {
		if strings.Contains(string(ev.Data), "ada@") {
			t.Fatalf("a log read through the store that cached the key: %s", ev.Data)
		}
	}
	before := f.rawData(t)
	if err := f.register(t, a, "acme", ada); err != nil {
		t.Fatal(err)
	}
	for id, data := range f.rawData(t) {
		if _, ok := before[id]; ok {
			continue
		}
		// Written forgotten: the empty envelope no key opens, not one
		// sealed under the cached key.
		if !strings.Contains(data, `"name": "pjx1."`) || !strings.Contains(data, `"email": "pjx1."`) || strings.Count(data, "pjx") != 2 {
			t.Fatalf("an append after the forget, through the store that cached the key, stored %s", data)
		}
	}
}

// TestKeyCacheRolledBackKey: a key created by a transaction that rolls
// back never commits, so the next append must not seal under it: the
// event it writes opens in a store that never saw the rolled-back key.
func TestKeyCacheRolledBackKey(t *testing.T) {
	t.Parallel()
	f := personalSetup(t)
	ada := testevents.CustomerRegistered{Customer: "c-2", Name: "Ada", Email: "ada@x", Plan: "pro"}
	tx, err := f.store.Pool().Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Append(f.ctx, tx, projector.TenantStream("acme", "customer", "c-2"), projector.AnyVersion, ada); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(f.ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.register(t, f.store, "acme", ada); err != nil {
		t.Fatal(err)
	}
	fresh := f.storeOn(t, masterKey(t, "k1", "one"))
	for _, s := range []*postgres.Store{f.store, fresh} {
		if evs := readCustomer(t, s, "acme", "c-2"); len(evs) != 1 || evs[0].Payload != ada || evs[0].Forgotten {
			t.Fatalf("after a rolled-back key: %+v", evs)
		}
	}
}

// statementCounter counts the round trips a pool makes, a statement or a
// pipelined batch of them each, and keeps the last one's SQL (a batch's
// statements joined).
type statementCounter struct {
	n    atomic.Int64
	last atomic.Pointer[string]
	// only, when set, limits the count to one connection's statements:
	// the store's own background work on other connections of the pool
	// (a post-commit NOTIFY of an earlier append) is not the read's.
	only atomic.Pointer[pgx.Conn]
}

func (c *statementCounter) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if only := c.only.Load(); only != nil && only != conn {
		return ctx
	}
	c.n.Add(1)
	c.last.Store(&d.SQL)
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *statementCounter) TraceBatchStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	if only := c.only.Load(); only != nil && only != conn {
		return ctx
	}
	c.n.Add(1)
	var sql []string
	if d.Batch != nil {
		for _, q := range d.Batch.QueuedQueries {
			sql = append(sql, q.SQL)
		}
	}
	all := strings.Join(sql, ";\n")
	c.last.Store(&all)
	return ctx
}

func (c *statementCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *statementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// TestPersonalRoundTrips: once a subject's key exists, an append of a
// personal event is one statement, as a plain one is (the key comes from
// the process's cache, checked by the insert itself), and a read of sealed
// events is one statement (the keys come with the rows).
func TestPersonalRoundTrips(t *testing.T) {
	t.Parallel()
	f, count, conn := countedPersonalSetup(t)
	ctx, store, types := f.ctx, f.store, f.types
	stream := projector.TenantStream("acme", "customer", "c-3")
	ada := testevents.CustomerRegistered{Customer: "c-3", Name: "Ada", Email: "ada@x", Plan: "pro"}
	var appended string // the SQL of the last append
	appendOne := func() int64 {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		start := count.n.Load()
		if _, err := store.Append(ctx, tx, stream, projector.AnyVersion, ada); err != nil {
			t.Fatal(err)
		}
		n := count.n.Load() - start
		appended = *count.last.Load()
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return n
	}
	appendOne() // creates the key
	if n := appendOne(); n != 1 {
		t.Errorf("an append with the subject's key cached sent %d statements, want 1", n)
	}
	// One subject's key is guarded by a probe with scalars, not by arrays
	// encoded, sent and unnested.
	if strings.Contains(appended, "unnest(") {
		t.Errorf("the append of one subject's event guards its key with arrays:\n%s", appended)
	}
	start := count.n.Load()
	evs, err := store.ReadStreamTx(ctx, conn, stream, postgres.StreamQuery{})
	if err != nil || len(evs) != 2 || evs[1].Payload != ada {
		t.Fatalf("read %+v: %v", evs, err)
	}
	if n := count.n.Load() - start; n != 1 {
		t.Errorf("a stream read of sealed events sent %d statements, want 1", n)
	}
	var b postgres.LogBatch
	pgtest.Eventually(t, 30*time.Second, "the log reads both events", func() bool {
		start = count.n.Load()
		if b, err = store.ReadLogTx(ctx, conn, postgres.LogQuery{EventTypes: []string{types.Registered.Name()}}); err != nil {
			t.Fatal(err)
		}
		return len(b.Events) == 2
	})
	for _, ev := range b.Events {
		if ev.Payload != ada {
			t.Fatalf("log read %+v", ev.Payload)
		}
	}
	if n := count.n.Load() - start; n != 1 {
		t.Errorf("a log read of sealed events sent %d statements, want 1", n)
	}
	// The process knows the key epoch now, and trusts the key the stream
	// read saw: the log read brought the epoch alone, no key row per event.
	if last := *count.last.Load(); strings.Contains(last, "projector_subject_keys") {
		t.Errorf("a read whose keys the process trusts joined the key table:\n%s", last)
	}

	// Two subjects' cached keys in one append: the guard with arrays.
	bob := testevents.CustomerRegistered{Customer: "c-4", Name: "Bob", Email: "bob@x", Plan: "pro"}
	both := func(payloads ...any) int64 {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		start := count.n.Load()
		if _, err := store.Append(ctx, tx, stream, projector.AnyVersion, payloads...); err != nil {
			t.Fatal(err)
		}
		n := count.n.Load() - start
		appended = *count.last.Load()
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return n
	}
	both(bob) // creates c-4's key
	if n := both(ada, bob); n != 1 || !strings.Contains(appended, "projector_subject_keys") {
		t.Errorf("an append of two subjects' events with their keys cached sent %d statements, the last:\n%s", n, appended)
	}
	evs, err = store.ReadStreamTx(ctx, conn, stream, postgres.StreamQuery{FromVersion: 4})
	if err != nil || len(evs) != 2 || evs[0].Payload != ada || evs[1].Payload != bob {
		t.Fatalf("read %+v: %v", evs, err)
	}
}

// gapTracer runs hook once, synchronously, just before the first statement
// whose SQL contains match is sent once armed: an actor run in the gap
// between a check made in Go and the statement that acts on it.
type gapTracer struct {
	match string
	armed atomic.Bool
	once  sync.Once
	hook  func()
}

func (g *gapTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if g.armed.Load() && strings.Contains(d.SQL, g.match) {
		g.once.Do(g.hook)
	}
	return ctx
}

func (g *gapTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestKeyCacheForgetInTheGap: the forget commits in another store after
// this store sealed an event under its cached key and before the insert
// that carries the guard is sent. The guard sees the forget: the append
// writes the fields as null, nothing sealed under the forgotten key.
func TestKeyCacheForgetInTheGap(t *testing.T) {
	t.Parallel()
	f := personalSetup(t)
	other := f.storeOn(t, masterKey(t, "k1", "one"))
	ref := postgres.SubjectRef{Tenant: "acme", ID: "c-4"}
	// The events insert, guarded or not: the append has sealed by then.
	gap := &gapTracer{match: ".projector_events\n\t(id, tenant_id"}
	forgot := false
	var forgetErr error
	gap.hook = func() { _, forgetErr = other.Forget(f.ctx, ref); forgot = true }
	cfg := pgtest.PoolConfig(t)
	cfg.ConnConfig.Tracer = gap
	store, err := postgres.New(f.ctx, pgtest.PoolFromConfig(t, cfg), postgres.Config{Schema: f.store.Schema(), Registry: f.types.Registry,
		MasterKey: masterKey(t, "k1", "one")})
	if err != nil {
		t.Fatal(err)
	}
	ada := testevents.CustomerRegistered{Customer: "c-4", Name: "Ada", Email: "ada@x", Plan: "pro"}
	if err := f.register(t, store, "acme", ada); err != nil { // creates and caches the key
		t.Fatal(err)
	}
	before := f.rawData(t)
	gap.armed.Store(true)
	if err := f.register(t, store, "acme", ada); err != nil { // sealed under the cached key; the forget runs before its insert
		t.Fatal(err)
	}
	if !forgot || forgetErr != nil {
		t.Fatalf("the forget in the gap: ran %v, %v", forgot, forgetErr)
	}
	n := 0
	for id, data := range f.rawData(t) {
		if _, ok := before[id]; ok || !strings.Contains(data, `"c-4"`) || strings.Contains(data, "subject") {
			continue
		}
		n++
		if strings.Count(data, "pjx") != 2 || !strings.Contains(data, `"name": "pjx1."`) || !strings.Contains(data, `"email": "pjx1."`) {
			t.Fatalf("an append whose insert ran after the forget stored %s", data)
		}
	}
	if n != 1 {
		t.Fatalf("%d new customer events, want 1", n)
	}
}
