package projection_test

import (
	"maps"
	"testing"
	"time"

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

	started := time.Now()
	changes, err := projection.NewAdmin(e.store).Split(e.ctx, "splitcommit")
	if err != nil {
		t.Fatal(err)
	}
	// The command splits what the passes did not after 5 s: quicker, the
	// passes split both.
	if took := time.Since(started); len(changes) != 2 || took > 4*time.Second {
		t.Fatalf("split %v in %v: not handed to the passes", changes, took)
	}
	maps.Copy(want, appendWith(t, e.ctx, e.store, 2, 40, 12, "b"))
	e.catchUp(d)
	e.checkCounts("splitcommit", want)
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
