package projection_test

import (
	"context"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
)

// A pass that splits its partition sends its last pipeline (the cursor
// advance, the halves' rows, the moves, the removal, the NOTIFY, the
// COMMIT) in one round trip, with no Describe of the split's statements
// after its batch's writes gave it a transaction id (execbatch.go): that
// round trip held the horizon of every partition of every consumer. pgx
// describes a statement new to a connection by preparing it under a name
// it keeps on the connection, so the split's statements are found among
// pg_prepared_statements of the dispatcher's connections when it did.
// Before, the connection that split kept them (the test failed so:
// "prepared on a dispatcher connection").
func TestSplittingPassDescribesNoStatementAfterItsWrites(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	pool := pgtest.NewPool(t, 4)
	p := counting(e.schema, e.types, "splitcommit", projection.AsyncConfig{Partitions: 2, BatchSize: 5})
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}, Store: e.storeOn(pool), Recheck: time.Second})
	want := e.appendMany(2, 60, 12)
	e.catchUp(d)

	e.splitByThePasses(projection.NewAdmin(e.store), d, "splitcommit", want)
	if err := d.Stop(e.ctx); err != nil {
		t.Fatal(err)
	}

	conns := pool.AcquireAllIdle(e.ctx)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	if len(conns) == 0 {
		t.Fatal("no idle connection in the dispatcher's pool")
	}
	for _, c := range conns {
		var n int
		if err := c.QueryRow(e.ctx, `SELECT count(*) FROM pg_prepared_statements
			WHERE (statement LIKE '%SELECT name, $3, cursor_tx_id, cursor_seq%' OR statement LIKE '%projector_parks" SET instance_id%')
				AND statement NOT LIKE '%pg_prepared_statements%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			t.Errorf("a split's statements were prepared on a dispatcher connection (pid %d): described in a round trip of their own", c.Conn().PgConn().PID())
		}
	}
}

// markTrace records how a split command's marks were sent: in a batch
// whose last statement is the COMMIT, or in a statement of their own.
type markTrace struct {
	mu                   sync.Mutex
	withCommit, separate int
}

func (m *markTrace) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, "SET split_requested_at = now()") {
		m.mu.Lock()
		m.separate++
		m.mu.Unlock()
	}
	return ctx
}

func (m *markTrace) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (m *markTrace) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	qs := data.Batch.QueuedQueries
	for _, q := range qs {
		if strings.Contains(q.SQL, "SET split_requested_at = now()") {
			m.mu.Lock()
			if strings.EqualFold(qs[len(qs)-1].SQL, "COMMIT") {
				m.withCommit++
			} else {
				m.separate++
			}
			m.mu.Unlock()
		}
	}
	return ctx
}

func (m *markTrace) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (m *markTrace) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// A split handed to the passes commits its marks in the round trip that
// writes them (splitHandedOff): the marks lock the partitions' rows and
// give the command's transaction an id, and a pass that ended its batch
// while they waited for a COMMIT a round trip later waited for it at its
// cursor advance, holding its own id, with every partition reading below
// both. Before, the marks were a statement of their own and the COMMIT
// another (the test failed so: "sent apart from the COMMIT").
func TestSplitMarksCommitInTheirRoundTrip(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	p := counting(e.schema, e.types, "splitmark", projection.AsyncConfig{Partitions: 2, BatchSize: 5})
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}, Recheck: time.Second})
	want := e.appendMany(2, 40, 12)
	e.catchUp(d)

	cfg := pgtest.PoolConfig(t)
	trace := &markTrace{}
	cfg.ConnConfig.Tracer = trace
	admin := projection.NewAdmin(e.storeOn(pgtest.PoolFromConfig(t, cfg)))
	e.splitByThePasses(admin, d, "splitmark", want)
	trace.mu.Lock()
	defer trace.mu.Unlock()
	if trace.withCommit != 1 || trace.separate != 0 {
		t.Errorf("the marks were sent %d times with the COMMIT, %d times apart from the COMMIT; want once, with it", trace.withCommit, trace.separate)
	}
	if len(e.partitionShards("splitmark")) != 4 {
		t.Errorf("partitions after the split: %v", e.partitionShards("splitmark"))
	}
}

// splitByThePasses splits consumer's two partitions with admin and fails
// unless the passes did it (the command splits what the passes did not
// only after 5 s: quicker, the passes split both); then appends more,
// catches d up and checks that every event of want and of the new ones was
// applied once.
func (e *env) splitByThePasses(admin *projection.Admin, d *projection.Dispatcher, consumer string, want map[string]int64) {
	e.t.Helper()
	started := time.Now()
	changes, err := admin.Split(e.ctx, consumer)
	if err != nil {
		e.t.Fatal(err)
	}
	if took := time.Since(started); len(changes) != 2 || took > 4*time.Second {
		e.t.Fatalf("split %v in %v: not handed to the passes", changes, took)
	}
	maps.Copy(want, appendWith(e.t, e.ctx, e.store, 2, 40, 12, "b"))
	e.catchUp(d)
	e.checkCounts(consumer, want)
}
