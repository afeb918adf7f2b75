package rebuild_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/cli"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
	"github.com/projectorhq/projector/stores/postgres"
)

// Partial rebuilds of a partitioned consumer (4 partitions, worked by two
// dispatchers) while 4 writers append (commits out of log order) and an
// operator splits every partition (4 → 8) and merges them back, over and
// over: each partial rebuild — a tenant (every partition), a stream (one)
// — repairs its corrupted rows, and once the writers stop the model equals
// one built live from scratch by an unpartitioned consumer, with the
// tickets' non-idempotent counters saying that no event was applied twice
// or missed, by the rebuilds or by the live partitions around them. The
// splits and merges serialise with the rebuilds on the consumer's fence
// lock: both sides all succeed.
func TestPartialRebuildOfPartitionedConsumerBesideSplitAndMerge(t *testing.T) {
	t.Parallel()
	e := newPartialEnv(t)
	if err := e.store.CreatePartitionIndex(e.ctx); err != nil {
		t.Fatal(err)
	}
	hot := projector.TenantStream("b", "ticket", "hot")
	for _, s := range []projector.StreamRef{hot, projector.TenantStream("d", "ticket", "d1")} {
		if err := e.ticket(s); err != nil {
			t.Fatal(err)
		}
	}
	partitioned := projection.AsyncConfig{Version: 1, BatchSize: 20, Partitions: 4}
	tickets := e.ticketsWith("tickets", "tickets", partitioned)
	startDispatcher(t, e.store, projection.Config{InstanceID: "one"}, tickets, e.tickets("tickets_ref", "tickets_ref", 1))
	startDispatcher(t, e.store, projection.Config{InstanceID: "two"}, e.ticketsWith("tickets", "tickets", partitioned))
	stop := make(chan struct{})
	writers := e.write(4, hot, stop)
	stopWriters := sync.OnceFunc(func() { close(stop); writers.Wait() })
	defer stopWriters()

	eventually(t, time.Minute, "tenant a's tickets, some closed, in the live model", func() bool {
		return e.count(`SELECT count(*) FROM `+e.ident("tickets")+` WHERE tenant_id = 'a' AND n = 3`) >= 20
	})

	// The operator: split every partition, then merge them back, until
	// told to stop; each change is counted, and any error fails the test.
	admin := projection.NewAdmin(e.store)
	var changes atomic.Int64
	opStop := make(chan struct{})
	var op sync.WaitGroup
	op.Go(func() {
		for {
			select {
			case <-opStop:
				return
			default:
			}
			if _, err := admin.Split(e.ctx, "tickets"); err != nil {
				t.Errorf("split: %v", err)
				return
			}
			changes.Add(1)
			// The partial rebuilds of every partition hold the halves back
			// meanwhile, on a loaded machine: a generous wait.
			if _, err := admin.Merge(e.ctx, "tickets", 3*time.Minute); err != nil {
				t.Errorf("merge: %v", err)
				return
			}
			changes.Add(1)
		}
	})
	stopOp := sync.OnceFunc(func() { close(opStop); op.Wait() })
	defer stopOp()

	sizes := map[int]int{} // partitions touched by a tenant scope: 4 or 8 (or between, mid-change)
	left := 0
	for round := 0; round < 4 || changes.Load() < 3; round++ {
		if round > 40 {
			t.Fatalf("after %d rounds of partial rebuilds, only %d splits and merges: they do not interleave", round, changes.Load())
		}
		corrupt(t, e, `UPDATE `+e.ident("tickets")+` SET title = 'corrupt', n = n + 100 WHERE tenant_id = 'a'`)
		corrupt(t, e, `INSERT INTO `+e.ident("tickets")+` VALUES ('a', 'ticket', 'bogus', 'bogus', 1, 1) ON CONFLICT DO NOTHING`)
		corrupt(t, e, `UPDATE `+e.ident("tickets")+` SET n = n + 100, title = 'corrupt' WHERE tenant_id = 'b' AND stream_id = 'hot'`)
		res, err := rebuild.Partial(e.ctx, e.store, tickets, projection.TenantScope("a"), rebuild.PartialOptions{})
		if err != nil {
			t.Fatalf("round %d, tenant a: %v", round, err)
		}
		if res.Events < 20 || len(res.Partitions) < 4 {
			t.Fatalf("round %d, tenant a: %+v", round, res)
		}
		sizes[len(res.Partitions)]++
		t.Logf("round %d, tenant a: %d events over %d partitions, %d left to them; waited %v, held %v", round, res.Events, len(res.Partitions), res.LeftToLive, res.LockWait, res.Held)
		left += res.LeftToLive
		if got := e.count(`SELECT count(*) FROM ` + e.ident("tickets") + ` WHERE tenant_id = 'a' AND (title = 'corrupt' OR stream_id = 'bogus')`); got != 0 {
			t.Fatalf("round %d: %d corrupt rows of tenant a left", round, got)
		}
		res, err = rebuild.Partial(e.ctx, e.store, tickets, projection.StreamScope(hot), rebuild.PartialOptions{BatchSize: 7})
		if err != nil {
			t.Fatalf("round %d, stream %s: %v", round, hot, err)
		}
		want := postgres.StreamHash(hot.Tenant, hot.Type, hot.ID)
		if len(res.Partitions) != 1 || !res.Partitions[0].Partition.Contains(want) || res.Events < 4 {
			t.Fatalf("round %d, stream %s: %+v, want its one partition", round, hot, res)
		}
		if got := e.count(`SELECT count(*) FROM ` + e.ident("tickets") + ` WHERE tenant_id = 'b' AND stream_id = 'hot' AND title = 'corrupt'`); got != 0 {
			t.Fatalf("round %d: stream hot still corrupt", round)
		}
	}
	stopOp()
	t.Logf("%d splits and merges beside the partial rebuilds; partitions a tenant scope touched: %v; %d events of the scope past their partition's cursor left to it", changes.Load(), sizes, left)

	stopWriters()
	for deadline := time.Now().Add(2 * time.Minute); ; {
		diff := e.diff("tickets", "tickets_ref", "true")
		if len(diff) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the partitioned model differs from the one built from scratch (%d rows; n counts each stream's events):\n%s",
				len(diff), strings.Join(diff[:min(len(diff), 10)], "\n"))
		}
		time.Sleep(100 * time.Millisecond) // poll the catching-up partitions
	}
	if n := e.count(`SELECT count(*) FROM ` + e.ident("tickets") + ` WHERE tenant_id = 'a'`); n < 20 {
		t.Fatalf("tenant a has %d rows: the comparison proves little", n)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for id, n := range e.mails["tickets"] {
		if n != 1 {
			t.Errorf("the mail of event %s went out %d times", id, n)
		}
	}
}

// corrupt runs a statement that corrupts the model, again when it deadlocks
// with a live pass writing the same rows in another order.
func corrupt(t *testing.T, e *penv, sql string) {
	t.Helper()
	for {
		_, err := e.store.Pool().Exec(e.ctx, sql)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "40P01" {
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return
	}
}

// A partial rebuild of a partitioned consumer waits for a running batch of
// the partitions it touches only: with one partition's lock held (a batch
// in progress), a stream of another partition is rebuilt at once, and a
// stream of the held one waits for it. A partition at another model
// version refuses it.
func TestPartialRebuildOfPartitionedConsumerLocksItsPartitions(t *testing.T) {
	t.Parallel()
	e := newPartialEnv(t)
	if err := e.store.CreatePartitionIndex(e.ctx); err != nil {
		t.Fatal(err)
	}
	// Two streams in different partitions of 4.
	var streams []projector.StreamRef
	seen := map[uint32]bool{}
	for i := 0; len(streams) < 2; i++ {
		s := projector.TenantStream("a", "ticket", "s"+string(rune('a'+i)))
		part := postgres.StreamHash(s.Tenant, s.Type, s.ID) >> 30
		if !seen[part] {
			seen[part] = true
			streams = append(streams, s)
		}
	}
	for _, s := range streams {
		if err := e.ticket(s); err != nil {
			t.Fatal(err)
		}
	}
	tickets := e.ticketsWith("tickets", "tickets", projection.AsyncConfig{Version: 1, BatchSize: 20, Partitions: 4})
	d := e.dispatcher(tickets)
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	held := projection.PartitionInstance(int(postgres.StreamHash(streams[0].Tenant, streams[0].Type, streams[0].ID)>>30), 4)
	tx, err := e.store.Pool().Begin(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(e.ctx) }()
	if err := projection.LockShard(e.ctx, tx, e.store, projection.ShardID{Consumer: "tickets", Instance: held}); err != nil {
		t.Fatal(err)
	}
	quick, cancelQuick := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancelQuick()
	if res, err := rebuild.Partial(quick, e.store, tickets, projection.StreamScope(streams[1]), rebuild.PartialOptions{}); err != nil || res.Events != 4 {
		t.Fatalf("a stream of a partition nobody holds: %+v, %v", res, err)
	}
	short, cancelShort := context.WithTimeout(e.ctx, 300*time.Millisecond)
	defer cancelShort()
	if _, err := rebuild.Partial(short, e.store, tickets, projection.StreamScope(streams[0]), rebuild.PartialOptions{}); !errors.Is(err, context.DeadlineExceeded) &&
		!strings.Contains(err.Error(), "cancel") {
		t.Fatalf("a stream of the held partition: %v, want it to wait for the lock", err)
	}
	if err := tx.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	if res, err := rebuild.Partial(quick, e.store, tickets, projection.StreamScope(streams[0]), rebuild.PartialOptions{}); err != nil || res.Events != 4 {
		t.Fatalf("a stream of the partition once released: %+v, %v", res, err)
	}
	if err := d.Stop(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.exec(`UPDATE `+e.store.Table("projector_consumers")+` SET version = 2 WHERE name = 'tickets' AND instance_id = $1`, held)
	if _, err := rebuild.Partial(quick, e.store, tickets, projection.TenantScope("a"), rebuild.PartialOptions{}); !errors.Is(err, rebuild.ErrNotRebuildable) ||
		!strings.Contains(err.Error(), "version 2") {
		t.Fatalf("a partition at another version: %v, want ErrNotRebuildable", err)
	}
}

// `rebuild NAME --here --tenant X` (and a stream) of a partitioned
// consumer: rebuilt each stream up to its partition's cursor, and said so.
func TestPartialRebuildCLIOfPartitionedConsumer(t *testing.T) {
	t.Parallel()
	e := newPartialEnv(t)
	if err := e.store.CreatePartitionIndex(e.ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		if err := e.ticket(projector.TenantStream("a", "ticket", fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	cfg := projection.AsyncConfig{Version: 1, BatchSize: 20, Partitions: 4}
	d := e.dispatcher(e.ticketsWith("tickets", "tickets", cfg))
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	e.exec(`UPDATE ` + e.ident("tickets") + ` SET title = 'corrupt'`)
	wired := cli.Config{Registry: e.types.Registry, Wire: func(string) (cli.Wiring, error) {
		return cli.Wiring{Async: []*projection.Async{e.ticketsWith("tickets", "tickets", cfg)}}, nil
	}}
	run := func(args ...string) string {
		t.Helper()
		root := cli.New(wired)
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(append([]string{"--database-url", pgtest.URL(t), "--schema", e.schema}, args...))
		if err := root.ExecuteContext(ctx); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out.String())
		}
		return out.String()
	}
	if out := run("rebuild", "tickets", "--here", "--stream-type", "ticket", "--stream-id", "3", "--tenant", "a"); !strings.Contains(out, "4 events replayed, each stream up to its partition's cursor (1 partitions") {
		t.Errorf("a stream: %s", out)
	}
	if n := e.count(`SELECT count(*) FROM ` + e.ident("tickets") + ` WHERE title = 'corrupt'`); n != 7 {
		t.Errorf("after the stream's rebuild, %d corrupt rows; want the 7 others", n)
	}
	if out := run("rebuild", "tickets", "--here", "--tenant", "a"); !strings.Contains(out, "32 events replayed, each stream up to its partition's cursor (4 partitions") {
		t.Errorf("a tenant: %s", out)
	}
	if n := e.count(`SELECT count(*) FROM ` + e.ident("tickets") + ` WHERE title = 'corrupt'`); n != 0 {
		t.Errorf("after the tenant's rebuild, %d corrupt rows", n)
	}
}
