package rebuild_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
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

// penv is one test's schema with two per-ticket read models (one to
// corrupt and repair, one built live from scratch as the reference) and two
// per-tenant totals (the same, cleared by a ResetScope function).
type penv struct {
	t      *testing.T
	ctx    context.Context
	types  testevents.Types
	store  *postgres.Store
	schema string
	// mails records, per projection, the events whose outside effect (a
	// SkipOnReplay handler) ran; replayed counts handler calls that saw
	// Replaying(ctx).
	mu       sync.Mutex
	mails    map[string]map[string]int
	replayed atomic.Int64
}

func newPartialEnv(t *testing.T) *penv {
	t.Helper()
	types := testevents.New()
	store := pgtest.Store(t, types.Registry)
	e := &penv{t: t, ctx: context.Background(), types: types, store: store, schema: store.Schema(), mails: map[string]map[string]int{}}
	for _, table := range []string{"tickets", "tickets_ref"} {
		e.exec(`CREATE TABLE ` + e.ident(table) + ` (tenant_id text NOT NULL, stream_type text NOT NULL, stream_id text NOT NULL,
			title text NOT NULL, n int NOT NULL, last_version bigint NOT NULL, PRIMARY KEY (tenant_id, stream_type, stream_id))`)
	}
	for _, table := range []string{"totals", "totals_ref"} {
		e.exec(`CREATE TABLE ` + e.ident(table) + ` (tenant_id text PRIMARY KEY, n int NOT NULL)`)
	}
	return e
}

func (e *penv) ident(table string) string { return pgx.Identifier{e.schema, table}.Sanitize() }

func (e *penv) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.store.Pool().Exec(e.ctx, sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

// tickets is a per-ticket model whose rows carry the stream they come from,
// declared as its ScopeColumns. ticket.closed sends a "mail" (skipped on
// replay); its counter n is not idempotent, so an event applied twice or
// not at all shows.
func (e *penv) tickets(name, table string, version int) *projection.Async {
	qualified := e.schema + "." + table
	p := projection.NewAsync(name, projection.AsyncConfig{
		Version: version, BatchSize: 20, Tables: []string{qualified},
		ScopeColumns: projection.ScopeColumns{Tenant: "tenant_id", StreamType: "stream_type", StreamID: "stream_id"},
	})
	upsert := func(ctx context.Context, tx pgx.Tx, ev projector.Event, title string) error {
		if projection.Replaying(ctx) {
			e.replayed.Add(1)
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+projection.Table(ctx, qualified)+` AS t VALUES ($1, $2, $3, $4, 1, $5)
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
	must(projection.OnEvent(p, e.types.Closed, projection.SkipOnReplay(func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.mails[name] == nil {
			e.mails[name] = map[string]int{}
		}
		e.mails[name][ev.ID.String()]++
		return nil
	})))
	return p
}

// totals counts events per tenant: a row no stream scope can rebuild, so
// its ResetScope clears tenant scopes only.
func (e *penv) totals(name, table string) *projection.Async {
	qualified := e.schema + "." + table
	p := projection.NewAsync(name, projection.AsyncConfig{
		BatchSize: 50, Tables: []string{qualified},
		ResetScope: func(ctx context.Context, tx pgx.Tx, s projection.Scope) error {
			if _, stream := s.Stream(); stream {
				return fmt.Errorf("%w: totals are per tenant", projection.ErrScopeUnsupported)
			}
			_, err := tx.Exec(ctx, `DELETE FROM `+projection.Table(ctx, qualified)+` WHERE tenant_id = $1`, s.Tenant)
			return err
		},
	})
	h := func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+projection.Table(ctx, qualified)+` AS t VALUES ($1, 1)
			ON CONFLICT (tenant_id) DO UPDATE SET n = t.n + 1`, ev.Stream.Tenant)
		return err
	}
	must(projection.OnEvent(p, e.types.Opened, h))
	must(projection.OnEvent(p, e.types.Commented, h))
	must(projection.OnEvent(p, e.types.Closed, h))
	return p
}

func (e *penv) dispatcher(ps ...*projection.Async) *projection.Dispatcher {
	e.t.Helper()
	d, err := projection.New(projection.Config{Store: e.store, Projections: ps, PollMax: 20 * time.Millisecond, Recheck: 20 * time.Millisecond})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := d.Start(e.ctx); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = d.Stop(ctx)
	})
	return d
}

// ticket appends a whole ticket's life to stream in two transactions.
func (e *penv) ticket(stream projector.StreamRef) error {
	err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		_, err := e.store.Append(e.ctx, tx, stream, projector.NoStream,
			testevents.TicketOpened{Title: stream.ID}, testevents.TicketCommented{Body: "c"})
		return err
	})
	if err != nil {
		return err
	}
	return pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		_, err := e.store.Append(e.ctx, tx, stream, projector.ExactVersion(2), testevents.TicketCommented{Body: "d"}, testevents.TicketClosed{})
		return err
	})
}

// write has writers append tickets of tenants a, b and c, and comments to
// the stream hot, until stop is closed. Writer 0 holds each of its
// transactions open until others have committed after it began, so commits
// land out of log order throughout.
func (e *penv) write(writers int, hot projector.StreamRef, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	var commits atomic.Int64
	tenants := []string{"a", "b", "c"}
	for w := range writers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				stream := projector.TenantStream(tenants[(w+i)%len(tenants)], "ticket", fmt.Sprintf("w%d-%d", w, i))
				var err error
				if w == 0 {
					err = pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
						if _, err := e.store.Append(e.ctx, tx, stream, projector.NoStream, testevents.TicketOpened{Title: stream.ID}); err != nil {
							return err
						}
						began := commits.Load()
						for commits.Load() < began+3 {
							select {
							case <-stop:
								return nil
							case <-time.After(time.Millisecond): // poll the other writers' progress
							}
						}
						return nil
					})
				} else {
					err = e.ticket(stream)
				}
				if err == nil && i%3 == 0 {
					for {
						err = pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
							_, err := e.store.Append(e.ctx, tx, hot, projector.AnyVersion, testevents.TicketCommented{Body: "hot"})
							return err
						})
						if !errors.Is(err, projector.ErrConcurrency) {
							break
						}
					}
				}
				if err != nil {
					e.t.Errorf("append: %v", err)
					return
				}
				commits.Add(1)
			}
		})
	}
	return &wg
}

// rows returns a table's rows matching where, as text, with the
// transaction that wrote each row version: equal only if never rewritten.
func (e *penv) rows(table, where string, args ...any) []string {
	e.t.Helper()
	rows, err := e.store.Pool().Query(e.ctx, `SELECT t::text || ' xmin=' || t.xmin::text FROM `+e.ident(table)+` t WHERE `+where+` ORDER BY t::text`, args...)
	if err != nil {
		e.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// diff lists the rows matching where that differ between table and its
// reference, both ways.
func (e *penv) diff(table, ref, where string) []string {
	e.t.Helper()
	q := `(SELECT 'only in ` + table + `: ' || t::text FROM (SELECT * FROM ` + e.ident(table) + ` WHERE ` + where + ` EXCEPT SELECT * FROM ` + e.ident(ref) + ` WHERE ` + where + `) t)
		UNION ALL
		(SELECT 'only in ` + ref + `: ' || t::text FROM (SELECT * FROM ` + e.ident(ref) + ` WHERE ` + where + ` EXCEPT SELECT * FROM ` + e.ident(table) + ` WHERE ` + where + `) t)`
	rows, err := e.store.Pool().Query(e.ctx, q)
	if err != nil {
		e.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

func (e *penv) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.store.Pool().QueryRow(e.ctx, sql, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// A partial rebuild while 4 writers append (commits out of log order, the
// live dispatcher running): one tenant's and one stream's corrupted rows are
// rebuilt to equal a model built live from scratch; rows of another tenant
// and another stream, corrupted too, are not touched (byte-equal, same row
// versions); outside effects are not repeated; a tenant with no events is
// cleared to empty; a ResetScope clears a tenant and refuses a stream.
func TestPartialRebuildEqualsLiveWhileWritersAppend(t *testing.T) {
	t.Parallel()
	e := newPartialEnv(t)
	still := projector.TenantStream("b", "ticket", "still")
	hot := projector.TenantStream("b", "ticket", "hot")
	for _, s := range []projector.StreamRef{still, hot, projector.TenantStream("d", "ticket", "d1"), projector.TenantStream("d", "ticket", "d2")} {
		if err := e.ticket(s); err != nil {
			t.Fatal(err)
		}
	}
	tickets, totals := e.tickets("tickets", "tickets", 1), e.totals("totals", "totals")
	d := e.dispatcher(tickets, e.tickets("tickets_ref", "tickets_ref", 1), totals, e.totals("totals_ref", "totals_ref"))
	stop := make(chan struct{})
	writers := e.write(4, hot, stop)
	stopWriters := sync.OnceFunc(func() { close(stop); writers.Wait() })
	defer stopWriters()

	eventually(t, time.Minute, "tenant a's tickets, some closed, in the live model", func() bool {
		return e.count(`SELECT count(*) FROM `+e.ident("tickets")+` WHERE tenant_id = 'a' AND n = 3`) >= 30 &&
			e.count(`SELECT count(*) FROM `+e.ident("tickets")+` WHERE tenant_id = 'd'`) == 2
	})
	// Corrupt: tenant a's rows, stream b/hot, and (to be left alone) tenant
	// d's rows and stream b/still; tenant e has rows but no events.
	e.exec(`UPDATE ` + e.ident("tickets") + ` SET title = 'corrupt', n = n + 100 WHERE tenant_id = 'a'`)
	e.exec(`DELETE FROM ` + e.ident("tickets") + ` WHERE (tenant_id, stream_id) IN (SELECT tenant_id, stream_id FROM ` + e.ident("tickets") + ` WHERE tenant_id = 'a' LIMIT 3)`)
	e.exec(`INSERT INTO ` + e.ident("tickets") + ` VALUES ('a', 'ticket', 'bogus', 'bogus', 1, 1), ('e', 'ticket', 'e1', 'bogus', 1, 1)`)
	e.exec(`UPDATE ` + e.ident("tickets") + ` SET n = n + 100 WHERE tenant_id = 'b' AND stream_id IN ('hot', 'still')`)
	e.exec(`UPDATE ` + e.ident("tickets") + ` SET title = 'corrupt' WHERE tenant_id = 'd'`)
	e.exec(`UPDATE ` + e.ident("totals") + ` SET n = n + 1000 WHERE tenant_id IN ('a', 'd')`)
	untouched := func() []string {
		return append(e.rows("tickets", `tenant_id = 'd' OR (tenant_id = 'b' AND stream_id = 'still')`), e.rows("totals", `tenant_id = 'd'`)...)
	}
	before := untouched()
	if len(before) != 4 {
		t.Fatalf("rows to leave alone: %v", before)
	}

	res, err := rebuild.Partial(e.ctx, e.store, tickets, projection.TenantScope("a"), rebuild.PartialOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Events < 30 || res.Until == projector.Start {
		t.Fatalf("tenant a: %+v", res)
	}
	t.Logf("tenant a: %d events replayed up to %s; waited %v for the live shard, held it %v", res.Events, res.Until, res.LockWait, res.Held)
	if got := e.count(`SELECT count(*) FROM ` + e.ident("tickets") + ` WHERE tenant_id = 'a' AND (title = 'corrupt' OR stream_id = 'bogus')`); got != 0 {
		t.Fatalf("%d corrupt rows of tenant a left", got)
	}
	if res, err = rebuild.Partial(e.ctx, e.store, tickets, projection.StreamScope(hot), rebuild.PartialOptions{BatchSize: 7}); err != nil || res.Events < 4 {
		t.Fatalf("stream %s: %+v, %v", hot, res, err)
	}
	if res, err = rebuild.Partial(e.ctx, e.store, tickets, projection.TenantScope("e"), rebuild.PartialOptions{}); err != nil || res.Events != 0 {
		t.Fatalf("tenant e: %+v, %v", res, err)
	}
	if got := e.count(`SELECT count(*) FROM ` + e.ident("tickets") + ` WHERE tenant_id = 'e'`); got != 0 {
		t.Fatalf("tenant e without events keeps %d rows", got)
	}
	if _, err := rebuild.Partial(e.ctx, e.store, totals, projection.TenantScope("a"), rebuild.PartialOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err = rebuild.Partial(e.ctx, e.store, totals, projection.StreamScope(hot), rebuild.PartialOptions{})
	if !errors.Is(err, rebuild.ErrNotRebuildable) || !errors.Is(err, projection.ErrScopeUnsupported) {
		t.Fatalf("a stream scope of a per-tenant total: %v, want ErrNotRebuildable and ErrScopeUnsupported", err)
	}
	if after := untouched(); strings.Join(after, "\n") != strings.Join(before, "\n") {
		t.Fatalf("rows outside the scopes changed:\nbefore %v\nafter  %v", before, after)
	}

	stopWriters()
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	rebuilt := `tenant_id IN ('a', 'c', 'e') OR (tenant_id = 'b' AND stream_id <> 'still')`
	if diff := e.diff("tickets", "tickets_ref", rebuilt); len(diff) > 0 {
		t.Fatalf("the rebuilt scopes differ from the model built live from scratch:\n%s", strings.Join(diff, "\n"))
	}
	if diff := e.diff("totals", "totals_ref", `tenant_id <> 'd'`); len(diff) > 0 {
		t.Fatalf("totals differ from the reference:\n%s", strings.Join(diff, "\n"))
	}
	if e.count(`SELECT count(*) FROM `+e.ident("tickets")+` WHERE tenant_id = 'a'`) < 10 {
		t.Fatal("tenant a has almost no rows: the comparison proves little")
	}
	// The two scopes left corrupt are still so; rebuilt, the whole model
	// is the reference.
	if len(e.diff("tickets", "tickets_ref", "true")) != 6 { // three rows, each seen from both sides
		t.Fatalf("want tenant d's two rows and b/still to differ before their rebuild: %v", e.diff("tickets", "tickets_ref", "true"))
	}
	for _, s := range []projection.Scope{projection.TenantScope("d"), projection.StreamScope(still)} {
		if _, err := rebuild.Partial(e.ctx, e.store, tickets, s, rebuild.PartialOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if diff := e.diff("tickets", "tickets_ref", "true"); len(diff) > 0 {
		t.Fatalf("after rebuilding every corrupted scope:\n%s", strings.Join(diff, "\n"))
	}

	e.mu.Lock()
	defer e.mu.Unlock()
	for id, n := range e.mails["tickets"] {
		if n != 1 {
			t.Errorf("the mail of event %s went out %d times", id, n)
		}
	}
	if len(e.mails["tickets"]) != len(e.mails["tickets_ref"]) || len(e.mails["tickets"]) < 10 {
		t.Errorf("mails: %d sent by the rebuilt projection, %d by the reference", len(e.mails["tickets"]), len(e.mails["tickets_ref"]))
	}
	if e.replayed.Load() < int64(res.Events) || e.replayed.Load() == 0 {
		t.Errorf("%d handler calls saw Replaying(ctx)", e.replayed.Load())
	}
}
