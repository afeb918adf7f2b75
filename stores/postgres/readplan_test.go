package postgres_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// TestPlanLogRead: PlanLogRead leaves on its connection the generic plan
// of the read it was given (a partition's merged read of that size),
// reads nothing, and does not plan it twice; the read that follows on
// that connection runs on that plan, with no planning of its own.
func TestPlanLogRead(t *testing.T) {
	t.Parallel()
	f := setup(t)
	if err := f.store.CreatePartitionIndex(f.ctx); err != nil {
		t.Fatal(err)
	}
	var last postgres.AppendResult
	for i := range 20 {
		last = f.appendTx(t, projector.Stream("ticket", fmt.Sprint("s", i)), projector.AnyVersion, testevents.TicketOpened{Title: "x"})
	}
	conn, err := f.store.Pool().Acquire(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// plans counts the executions of this schema's partition reads'
	// statements on conn, by plan kind (the pool is the test binary's).
	plans := func() (custom, generic int64) {
		t.Helper()
		if err := conn.QueryRow(f.ctx, `SELECT coalesce(sum(custom_plans), 0), coalesce(sum(generic_plans), 0) FROM pg_prepared_statements
			WHERE strpos(statement, $1) > 0 AND statement NOT LIKE '%pg_prepared_statements%'`,
			pgx.Identifier{f.store.Schema()}.Sanitize()+".projector_stream_bucket(").Scan(&custom, &generic); err != nil {
			t.Fatal(err)
		}
		return custom, generic
	}
	seg, _ := postgres.SegmentOf(3, 8)
	q := postgres.LogQuery{Partition: seg, EventTypes: []string{"ticket.opened"}, Raw: true}
	if f.store.LogReadPlanned(conn.Conn(), q) {
		t.Fatal("a partition read is reported planned on a connection that never ran it")
	}
	if !f.store.LogReadPlanned(conn.Conn(), postgres.LogQuery{}) {
		t.Fatal("the whole log's read, planned at each run, is reported not planned")
	}
	if err := f.store.PlanLogRead(f.ctx, conn.Conn(), q); err != nil {
		t.Fatal(err)
	}
	if !f.store.LogReadPlanned(conn.Conn(), q) {
		t.Fatal("PlanLogRead did not mark its read planned")
	}
	if custom, generic := plans(); custom != 0 || generic != 1 {
		t.Fatalf("after PlanLogRead: %d custom and %d generic executions of a partition read, want 0 and 1", custom, generic)
	}
	other, _ := postgres.SegmentOf(5, 8) // the same size: the same statement
	if !f.store.LogReadPlanned(conn.Conn(), postgres.LogQuery{Partition: other, EventTypes: q.EventTypes, Raw: true}) {
		t.Fatal("another partition of the same size is reported not planned")
	}
	if err := f.store.PlanLogRead(f.ctx, conn.Conn(), q); err != nil {
		t.Fatal(err)
	}
	if _, generic := plans(); generic != 1 {
		t.Fatalf("a second PlanLogRead ran the statement again: %d executions, want 1", generic)
	}
	// The read runs on the plan made ahead, and returns its events (read
	// again while another session's transaction holds the horizon below
	// the last append).
	q.Limit = 50
	want := 0
	for i := range 20 {
		if seg.Contains(postgres.StreamHash(projector.SystemTenant, "ticket", fmt.Sprint("s", i))) {
			want++
		}
	}
	reads := int64(0)
	for deadline := time.Now().Add(20 * time.Second); ; {
		batch, err := f.store.ReadLogTx(f.ctx, conn, q)
		if err != nil {
			t.Fatal(err)
		}
		reads++
		if batch.Horizon > last.Events[0].Position.TxID || time.Now().After(deadline) {
			if len(batch.Events) != want {
				t.Fatalf("the read after PlanLogRead returned %d events, want the partition's %d", len(batch.Events), want)
			}
			break
		}
	}
	if custom, generic := plans(); custom != 0 || generic != 1+reads {
		t.Fatalf("after %d reads: %d custom and %d generic executions, want 0 and %d", reads, custom, generic, 1+reads)
	}
	// Another size is another statement, planned apart.
	wide, _ := postgres.SegmentOf(1, 4)
	if f.store.LogReadPlanned(conn.Conn(), postgres.LogQuery{Partition: wide, EventTypes: q.EventTypes}) {
		t.Fatal("a partition of 4 is reported planned where only partitions of 8 were")
	}
}
