package projection_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// partitioned is newEnv with the log's partition index, which partitioned
// consumers need (it is opt-in: Store.CreatePartitionIndex).
func partitioned(t testing.TB) *env {
	t.Helper()
	e := newEnv(t)
	if err := e.store.CreatePartitionIndex(e.ctx); err != nil {
		t.Fatal(err)
	}
	return e
}

// partitionShards returns consumer's partition shards from the admin's
// list, by partition number.
func (e *env) partitionShards(consumer string) map[int]projection.ShardState {
	e.t.Helper()
	states, err := projection.NewAdmin(e.store).List(e.ctx, consumer)
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[int]projection.ShardState{}
	for _, s := range states {
		if p, _, ok := projection.ParsePartition(s.Instance); ok {
			out[p] = s
		}
	}
	return out
}

// owners counts the partitions of consumer each instance owns.
func (e *env) owners(consumer string) map[string]int {
	e.t.Helper()
	rows, err := e.store.Pool().Query(e.ctx, `SELECT coalesce(owner, '') FROM `+e.store.Table("projector_consumers")+`
		WHERE name = $1 AND instance_id LIKE '`+projection.PartitionPrefix+`%'`, consumer)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var o string
		if err := rows.Scan(&o); err != nil {
			e.t.Fatal(err)
		}
		out[o]++
	}
	return out
}

// One process, four partitions, concurrent writers: every event applied
// once and in stream order, each partition applied only its own streams
// (and some), and the unpartitioned row is the fence.
func TestPartitionsApplyEachEventOnce(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	versions := e.appendMany(4, 3000, 200)
	p := counting(e.schema, e.types, "parted", projection.AsyncConfig{BatchSize: 50, Partitions: 4})
	e.dispatcher(projection.Config{Projections: []*projection.Async{p}, InstanceID: "solo"})
	want := total(versions)
	eventually(t, time.Minute, "every event applied", func() bool { return e.applied("parted") >= want })
	e.checkCounts("parted", versions)

	shards := e.partitionShards("parted")
	if len(shards) != 4 {
		t.Fatalf("%d partition shards, want 4", len(shards))
	}
	var sum int64
	for i, s := range shards {
		if s.Processed == 0 {
			t.Errorf("partition %d applied nothing", i)
		}
		sum += s.Processed
	}
	if sum != want {
		t.Errorf("partitions applied %d events in all, want %d", sum, want)
	}
	// Each stream's events are counted by the partition its hash names.
	rows, err := e.store.Pool().Query(e.ctx, `SELECT stream_id FROM `+e.table("counts")+` WHERE consumer = 'parted'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		h := postgres.StreamHash("", "ticket", id)
		seg, _ := postgres.SegmentOf(int(h>>30), 4)
		if !seg.Contains(h) {
			t.Fatalf("stream %s: hash %08x not in its own segment", id, h)
		}
	}
	// WaitFor waits for the partitions, not for the fence (which never moves).
	var last projector.Position
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT tx_id, seq FROM `+e.store.Table("projector_events")+` ORDER BY tx_id DESC, seq DESC LIMIT 1`).Scan(&last.TxID, &last.Seq); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
	defer cancel()
	if err := projection.WaitFor(wctx, e.store, "parted", last); err != nil {
		t.Fatalf("WaitFor a partitioned consumer: %v", err)
	}
	st, err := projection.NewAdmin(e.store).Status(e.ctx, projection.ShardID{Consumer: "parted"})
	if err != nil {
		t.Fatal(err)
	}
	if st.Status != projection.StatusDisabled || !strings.Contains(st.LastError, "partitioned into 4") {
		t.Errorf("unpartitioned row: %s %q, want the disabled fence", st.Status, st.LastError)
	}
}

// Promise 16, rolling deploy: a consumer that ran unpartitioned is
// partitioned by a new binary, its partitions start at its cursor, and a
// binary that does not know partitions, running beside it (here: the same
// projection declared without partitions, which registers and reads the
// unpartitioned row exactly as an older release does), applies nothing
// twice: it finds the fence's version and stands aside.
func TestPromise16_UnpartitionedBinaryFenced(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	versions := e.appendMany(2, 600, 40)
	before := counting(e.schema, e.types, "fenced", projection.AsyncConfig{BatchSize: 50})
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{before}, InstanceID: "old-1"})
	eventually(t, time.Minute, "the unpartitioned consumer caught up", func() bool { return e.applied("fenced") >= total(versions) })
	if err := d.Stop(e.ctx); err != nil {
		t.Fatal(err)
	}

	parted := counting(e.schema, e.types, "fenced", projection.AsyncConfig{BatchSize: 20, Partitions: 8})
	e.dispatcher(projection.Config{Store: e.storeOn(pgtest.NewPool(t, 4)), Projections: []*projection.Async{parted}, InstanceID: "new-1"})
	old := counting(e.schema, e.types, "fenced", projection.AsyncConfig{BatchSize: 20})
	e.dispatcher(projection.Config{Store: e.storeOn(pgtest.NewPool(t, 2)), Projections: []*projection.Async{old}, InstanceID: "old-2"})

	for id, v := range appendWith(t, e.ctx, e.store, 3, 1500, 60, "late") {
		versions[id] = v
	}
	want := total(versions)
	eventually(t, time.Minute, "every event applied", func() bool { return e.applied("fenced") >= want })
	e.checkCounts("fenced", versions)
	// The partitions started at the cursor the unpartitioned consumer had:
	// none of them replayed what it had applied.
	var sum int64
	for _, s := range e.partitionShards("fenced") {
		sum += s.Processed
	}
	if sum != want-600 && sum >= want {
		t.Errorf("partitions applied %d events; the unpartitioned consumer had applied the first part already", sum)
	}
}

// Changing the declared partition count is never a silent reshuffle: a
// raised count is carried out at start as splits (each half at its
// parent's cursor), a lowered one is refused with the merge to run, and a
// layout operators changed live is run as it is while the code's count
// stays the same.
func TestPartitionCountChange(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	e.appendMany(2, 200, 40)
	declare := func(n int) *projection.Async {
		return counting(e.schema, e.types, "four", projection.AsyncConfig{Partitions: n})
	}
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{declare(4)}})
	e.catchUp(d)
	if err := d.Stop(e.ctx); err != nil {
		t.Fatal(err)
	}
	before := e.partitionShards("four")
	d8 := e.dispatcher(projection.Config{Projections: []*projection.Async{declare(8)}})
	if err := d8.Stop(e.ctx); err != nil {
		t.Fatal(err)
	}
	after := e.partitionShards("four")
	if len(after) != 8 {
		t.Fatalf("code raised to 8 partitions: the consumer has %d", len(after))
	}
	for p, s := range after {
		if parent := before[p/2]; s.Partitions != 8 || s.Cursor != parent.Cursor {
			t.Errorf("partition %d/%d starts at %s, its parent %d/4 stood at %s", p, s.Partitions, s.Cursor, p/2, parent.Cursor)
		}
	}
	d4, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{declare(4)}})
	if err != nil {
		t.Fatal(err)
	}
	err = d4.Start(e.ctx)
	if !errors.Is(err, projection.ErrPartitionsChanged) || !strings.Contains(err.Error(), "has 8 partitions") ||
		!strings.Contains(err.Error(), "`projector consumer merge four`") {
		t.Fatalf("start declaring 4 after code declared 8: %v, want ErrPartitionsChanged naming the merge to run", err)
	}
	// Merged live to 4, the code declaring 4 starts (the partitions have
	// its count); split live to 8 again, the code still declaring 4 runs
	// the 8 (operators changed the layout, not the code).
	admin := projection.NewAdmin(e.store)
	if _, err := admin.Merge(e.ctx, "four", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	d4 = e.dispatcher(projection.Config{Projections: []*projection.Async{declare(4)}})
	if err := d4.Stop(e.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Split(e.ctx, "four"); err != nil {
		t.Fatal(err)
	}
	d4 = e.dispatcher(projection.Config{Projections: []*projection.Async{declare(4)}})
	if n := len(d4.Shards()); n != 8 {
		t.Errorf("code declaring 4 runs %d partitions after a live split to 8", n)
	}
	if err := d4.Stop(e.ctx); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []int{-1, 3, 6, 128} {
		bp := counting(e.schema, e.types, "bad"+strconv.Itoa(bad+1), projection.AsyncConfig{Partitions: bad})
		if _, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{bp}}); err == nil {
			t.Errorf("Partitions %d accepted", bad)
		}
	}
	// Without the partition index a partitioned consumer does not start:
	// every partition's read would walk the whole log.
	bare := newEnv(t)
	np := counting(bare.schema, bare.types, "noindex", projection.AsyncConfig{Partitions: 2})
	dn, err := projection.New(projection.Config{Store: bare.store, Projections: []*projection.Async{np}})
	if err != nil {
		t.Fatal(err)
	}
	if err := dn.Start(e.ctx); !errors.Is(err, postgres.ErrNoPartitionIndex) {
		t.Fatalf("start without the partition index: %v, want ErrNoPartitionIndex", err)
	}
	pi := counting(e.schema, e.types, "perinst", projection.AsyncConfig{Partitions: 2, Delivery: projection.PerInstance})
	if _, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{pi}}); err == nil {
		t.Error("partitions with per-instance delivery accepted")
	}
}

// Fairness: three processes share sixteen partitions (counts are powers of
// two) five or six each; a fourth that joins takes its share, four each, on
// its first balancing rounds, and the partitions of one that stops are
// taken by the others.
func TestPartitionsBalanceFairly(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	versions := e.appendMany(2, 1200, 120)
	start := func(id string) *projection.Dispatcher {
		p := counting(e.schema, e.types, "fair", projection.AsyncConfig{BatchSize: 20, Partitions: 16})
		return e.dispatcher(projection.Config{Store: e.storeOn(pgtest.NewPool(t, 3)), Projections: []*projection.Async{p}, InstanceID: id,
			Recheck: 20 * time.Millisecond})
	}
	balanced := func(ids []string, lo, hi int) func() bool {
		return func() bool {
			o := e.owners("fair")
			for _, id := range ids {
				if o[id] < lo || o[id] > hi {
					return false
				}
			}
			return o[""] == 0
		}
	}
	start("p1")
	start("p2")
	p3 := start("p3")
	eventually(t, 30*time.Second, "three processes own 16/3 partitions each (5 or 6)", balanced([]string{"p1", "p2", "p3"}, 5, 6))
	eventually(t, time.Minute, "every event applied", func() bool { return e.applied("fair") >= total(versions) })

	start("p4")
	eventually(t, 30*time.Second, "the fourth process took its share: four each", balanced([]string{"p1", "p2", "p3", "p4"}, 4, 4))
	more := appendWith(t, e.ctx, e.store, 2, 600, 120, "more")
	for id, v := range more {
		versions[id] = v
	}
	if err := p3.Stop(e.ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the stopped process's partitions were taken", balanced([]string{"p1", "p2", "p4"}, 5, 6))
	eventually(t, time.Minute, "every event applied", func() bool { return e.applied("fair") >= total(versions) })
	e.checkCounts("fair", versions)
}

// The race of a rolling deploy's first minute: a binary that does not know
// partitions registers the consumer's unpartitioned row (an insert that
// takes no advisory lock) while a partitioned one registers it. Here the
// old binary's insert is held uncommitted until the new one's registration
// is seen waiting on it; the new one must then fence the row the old one
// committed, not take its own insert's DO NOTHING for a fence.
func TestPartitionRegistrationRacingUnpartitionedInsert(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	old, err := e.store.Pool().Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = old.Rollback(e.ctx) }()
	if _, err := old.Exec(e.ctx, `INSERT INTO `+e.store.Table("projector_consumers")+` (name, instance_id, version) VALUES ('gap', $1, 1)`, projection.SharedInstance); err != nil {
		t.Fatal(err)
	}
	p := counting(e.schema, e.types, "gap", projection.AsyncConfig{Partitions: 2})
	d, err := projection.New(projection.Config{Store: e.storeOn(pgtest.NewPool(t, 4)), Projections: []*projection.Async{p}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan error, 1)
	go func() { started <- d.Start(e.ctx) }()
	eventually(t, 30*time.Second, "the partitioned registration waits on the unpartitioned insert", func() bool {
		var n int
		err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO%projector_consumers%disabled%'`).Scan(&n)
		return err == nil && n > 0
	})
	if err := old.Commit(e.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Stop(context.Background()) })
	st, err := projection.NewAdmin(e.store).Status(e.ctx, projection.ShardID{Consumer: "gap"})
	if err != nil {
		t.Fatal(err)
	}
	if !st.Fence() || st.Status != projection.StatusDisabled {
		t.Fatalf("the unpartitioned row is version %d, %s: not fenced, so the old binary would run it beside the partitions", st.Version, st.Status)
	}
	if n := len(e.partitionShards("gap")); n != 2 {
		t.Fatalf("%d partitions registered, want 2", n)
	}
}

// A consumer partitioned by key (as sagas are) keeps the layout it started
// with: a live split or merge would carry its dead letters and parks by
// stream, not by their events' keys, so both are refused, and so is a
// start declaring another count.
func TestKeyedPartitionsKeepTheirLayout(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.appendMany(2, 100, 20)
	declare := func(n int) *projection.Async {
		return counting(e.schema, e.types, "keyed", projection.AsyncConfig{Partitions: n,
			PartitionKey: func(ev projector.Event) (string, error) { return ev.Stream.ID, nil }})
	}
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{declare(4)}})
	e.catchUp(d)
	if err := d.Stop(e.ctx); err != nil {
		t.Fatal(err)
	}
	admin := projection.NewAdmin(e.store)
	if _, err := admin.Split(e.ctx, "keyed"); !errors.Is(err, projector.ErrInvalidTransition) || !strings.Contains(err.Error(), "partitioned by key") {
		t.Fatalf("split of a keyed consumer: %v, want a refusal", err)
	}
	if _, err := admin.Merge(e.ctx, "keyed", time.Second); !errors.Is(err, projector.ErrInvalidTransition) || !strings.Contains(err.Error(), "partitioned by key") {
		t.Fatalf("merge of a keyed consumer: %v, want a refusal", err)
	}
	d8, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{declare(8)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := d8.Start(e.ctx); !errors.Is(err, projection.ErrPartitionsChanged) || !strings.Contains(err.Error(), "partitioned by key") {
		t.Fatalf("start declaring 8 for a keyed consumer of 4: %v, want ErrPartitionsChanged", err)
	}
	if n := len(e.partitionShards("keyed")); n != 4 {
		t.Fatalf("the keyed consumer has %d partitions after the refusals, want 4", n)
	}
}
