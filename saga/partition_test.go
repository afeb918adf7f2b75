package saga_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/postgres"
)

// TestSagaPartitionsStepsInOrderOnce: the "sla" saga with four partitions
// run by two dispatchers (each its own pool and instance id) and two
// timeout runners, over a backlog in which each ticket's instance hears
// from its ticket stream and from an agent's stream (the assignment, keyed
// by the ticket it names). Partitions follow the correlation key, not the
// stream, so every instance's steps are taken once each and in log order
// (none ignored because the assignment overtook the opening in another
// partition, none late because it came after the close), both dispatchers
// took partitions, and each unassigned ticket's reminder fires once.
func TestSagaPartitionsStepsInOrderOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const tickets = 120
	want := map[string]int{} // event steps per ticket
	for i := range tickets {
		id := fmt.Sprintf("t-%03d", i)
		e.append(projector.Stream("ticket", id), testevents.TicketOpened{Title: id}, testevents.TicketCommented{Body: "hello"})
		want[id] = 2
		if i%3 != 0 {
			e.append(projector.Stream("agent", fmt.Sprintf("a-%d", i%5)), Assigned{Ticket: id, Agent: "ann"})
			want[id]++
		}
		if i%3 == 1 {
			e.append(projector.Stream("ticket", id), testevents.TicketClosed{})
			want[id]++
		}
	}
	clk := newClock()
	opts := slaOptions{now: clk.Now, remindAfter: time.Hour, async: projection.AsyncConfig{BatchSize: 10, Partitions: 4}}
	sagas := []*saga.Saga[slaState]{newSLA(e.types, opts), newSLA(e.types, opts)}
	var ds []*projection.Dispatcher
	for i, s := range sagas {
		store, err := postgres.New(e.ctx, pgtest.NewPool(t, 3), postgres.Config{Schema: e.store.Schema(), Registry: e.types.Registry})
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, e.dispatcher(s, projection.Config{Store: store, InstanceID: fmt.Sprintf("saga-%d", i+1)}))
	}
	for _, d := range ds {
		e.catchUp(d)
	}

	rows, err := e.store.Pool().Query(e.ctx, `SELECT i.key, s.step, ev.tx_id::text::numeric, ev.seq
		FROM `+e.store.Table("projector_saga_steps")+` s
		JOIN `+e.store.Table("projector_saga_instances")+` i ON i.id = s.instance_id
		JOIN `+e.store.Table("projector_events")+` ev ON ev.id = s.cause_id
		WHERE s.cause = 'event' ORDER BY i.key, s.step`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	type pos struct{ tx, seq int64 }
	last := map[string]pos{}
	for rows.Next() {
		var key string
		var step int64
		var p pos
		if err := rows.Scan(&key, &step, &p.tx, &p.seq); err != nil {
			t.Fatal(err)
		}
		if l, ok := last[key]; ok && (p.tx < l.tx || p.tx == l.tx && p.seq <= l.seq) {
			t.Errorf("instance %s: step %d handled event (%d, %d) after (%d, %d): out of log order", key, step, p.tx, p.seq, l.tx, l.seq)
		}
		last[key] = p
		got[key]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for id, n := range want {
		if got[id] != n {
			t.Errorf("instance %s took %d event steps, want %d", id, got[id], n)
		}
	}
	var ignored, late int64
	for _, s := range sagas {
		ignored, late = ignored+s.Ignored(), late+s.Late()
	}
	if ignored != 0 || late != 0 {
		t.Errorf("%d events ignored and %d late: an instance's events were taken out of order", ignored, late)
	}
	owners := map[string]int{}
	states, err := projection.NewAdmin(e.store).List(e.ctx, "sla")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range states {
		if s.Partitions > 0 {
			owners[s.Owner]++
			if s.Processed == 0 {
				t.Errorf("partition %d handled nothing", s.Partition)
			}
		}
	}
	if owners["saga-1"] == 0 || owners["saga-2"] == 0 {
		t.Errorf("partitions owned %v: want both dispatchers to own some", owners)
	}

	// The placement docs/sagas.md gives SQL: the stream hash over the
	// instance's (tenant, saga, key), as projection.KeyHash computes it.
	hashes, err := e.store.Pool().Query(e.ctx, `SELECT tenant_id, key, `+e.store.Schema()+`.projector_stream_hash(tenant_id, saga, key)
		FROM `+e.store.Table("projector_saga_instances"))
	if err != nil {
		t.Fatal(err)
	}
	for hashes.Next() {
		var tenant, key string
		var h int64
		if err := hashes.Scan(&tenant, &key, &h); err != nil {
			t.Fatal(err)
		}
		if uint32(h) != projection.KeyHash(tenant, "sla", key) {
			t.Errorf("instance %s: SQL hash %08x, Go %08x", key, uint32(h), projection.KeyHash(tenant, "sla", key))
		}
	}
	if err := hashes.Err(); err != nil {
		t.Fatal(err)
	}

	// Timeouts: each unassigned ticket's reminder fires once, whichever
	// runner claims it.
	if n := e.pendingTimeouts(); n != tickets/3 {
		t.Fatalf("%d pending reminders, want %d (the unassigned tickets')", n, tickets/3)
	}
	clk.Advance(2 * time.Hour)
	for _, s := range sagas {
		r := e.runner(s)
		if err := r.Start(e.ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Stop(e.ctx) })
	}
	e.waitFor("every reminder fired", 30*time.Second, func() bool { return e.pendingTimeouts() == 0 })
	if n := e.events("sla.reminded"); n != tickets/3 {
		t.Errorf("%d reminders appended, want %d: one per unassigned ticket", n, tickets/3)
	}
}

// An event whose correlation key fails (here: empty) cannot be placed by
// its key: it belongs to its stream's partition, so exactly one partition
// meets the failure and, in continuous mode, dead-letters it once — not
// every partition, and not none.
func TestSagaPartitionsKeylessEventDeadLetteredOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.append(projector.Stream("ticket", "t-1"), testevents.TicketOpened{Title: "a"})
	e.append(projector.Stream("agent", "alice"), Assigned{Ticket: "", Agent: "alice"})
	e.append(projector.Stream("ticket", "t-2"), testevents.TicketOpened{Title: "b"})
	s := newSLA(e.types, slaOptions{remindAfter: time.Hour, async: projection.AsyncConfig{ErrorMode: projection.SkipApplyErrors, Partitions: 4}})
	e.catchUp(e.dispatcher(s, projection.Config{}))
	if n := e.count(`SELECT count(*) FROM ` + e.store.Table("projector_dead_letters") + ` WHERE consumer = 'sla'`); n != 1 {
		t.Fatalf("%d dead letters for the keyless event, want 1", n)
	}
	// Under the partition that dead-lettered it, whose dispatcher retries
	// it (`consumer dead-letters retry`), not under the fence no dispatcher
	// runs.
	if n := e.count(`SELECT count(*) FROM ` + e.store.Table("projector_dead_letters") + ` WHERE consumer = 'sla' AND instance_id LIKE '` + projection.PartitionPrefix + `%'`); n != 1 {
		t.Fatalf("the dead letter is not under a partition's instance id")
	}
	if n := e.instances(); n != 2 {
		t.Fatalf("%d instances, want 2", n)
	}
}

// TestSagaPartitionsCrashExactlyOnce is TestPromise12_CrashExactlyOnce
// with the saga in four partitions over two processes at a time: one of
// them is SIGKILLed at a random moment or from inside a step (transaction
// open) and a new one started, while events and timeouts flow. Afterwards
// every event took exactly one step, in its instance's order, and every
// reminder fired exactly once.
func TestSagaPartitionsCrashExactlyOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills child processes")
	}
	t.Parallel()
	e := newEnv(t)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 16))
	// Every round assigns a ticket, through one of three agents' streams.
	load := newSLALoad(e, rng, func() string { return fmt.Sprintf("a-%d", rng.IntN(3)) })
	running := []*pgtest.Child{e.startPartitionedChild(0, 4)}
	// Four kills (two mid-step) by default, PROJECTOR_SOAK six.
	wantKills := 6
	kills := 0
	for round := 0; kills < wantKills; round++ {
		if round > 5*wantKills {
			t.Fatalf("only %d of %d kills in %d rounds", kills, wantKills, round)
		}
		killStep := 0
		if round%2 == 1 {
			killStep = 1 + rng.IntN(6)
		}
		c := e.startPartitionedChild(killStep, 4)
		running = append(running, c)
		load.appendSome()
		victim := running[rng.IntN(len(running))]
		select {
		case <-victim.Done():
		case <-time.After(time.Duration(50+rng.IntN(200)) * time.Millisecond):
			victim.Kill(t)
		}
		var alive []*pgtest.Child
		for _, c := range running {
			select {
			case <-c.Done():
				if !c.Killed() {
					t.Fatalf("child exited without being killed:\n%s", c.Output())
				}
				kills++
			default:
				alive = append(alive, c)
			}
		}
		running = alive
	}
	// The survivors may kill themselves mid-step (killStep): kill them
	// too, and let two children that do not converge the run.
	for _, c := range running {
		c.Kill(t)
	}
	running = []*pgtest.Child{e.startPartitionedChild(0, 4), e.startPartitionedChild(0, 4)}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		rows, _ := e.store.Pool().Query(e.ctx, `SELECT instance_id, status, coalesce(owner, ''), cursor_tx_id::text, cursor_seq, attempts, coalesce(last_error, '') FROM `+e.store.Table("projector_consumers"))
		for rows.Next() {
			var inst, st, owner, tx, lastErr string
			var seq int64
			var att int
			_ = rows.Scan(&inst, &st, &owner, &tx, &seq, &att, &lastErr)
			t.Logf("shard %s %s owner %s cursor %s/%d attempts %d %s", inst, st, owner, tx, seq, att, lastErr)
		}
		rows.Close()
		t.Logf("instances %d pending timeouts %d", e.instances(), e.pendingTimeouts())
	})
	load.waitConverged()
	for _, c := range running {
		c.Terminate(t)
	}
	load.checkExactlyOnce()
	// An assignment never overtook its ticket's opening: none was ignored.
	var ignoredAssignments int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+e.store.Table("projector_events")+` a
		WHERE a.type = 'agent.assigned' AND NOT EXISTS (SELECT 1 FROM `+e.store.Table("projector_saga_steps")+` s WHERE s.cause_id = a.id)`).Scan(&ignoredAssignments); err != nil {
		t.Fatal(err)
	}
	if ignoredAssignments != 0 {
		t.Errorf("%d assignments took no step (ignored: taken before their ticket's opening)", ignoredAssignments)
	}
	t.Logf("%d SIGKILLs, %d tickets", kills, load.tickets)
}

// A keyed partition reads every event after its cursor, whatever stream
// it is in, so that is its lag in status: not its own streams' buckets,
// which for a saga say nothing of where its instances' events are.
func TestSagaPartitionsLagCountsEveryEvent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	s := newSLA(e.types, slaOptions{remindAfter: time.Hour, async: projection.AsyncConfig{Partitions: 4}})
	d := e.dispatcher(s, projection.Config{})
	e.catchUp(d)
	if err := d.Stop(e.ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		e.append(projector.Stream("ticket", fmt.Sprintf("t-%d", i)), testevents.TicketOpened{Title: "x"})
	}
	states, err := projection.NewAdmin(e.store).List(e.ctx, "sla")
	if err != nil {
		t.Fatal(err)
	}
	parts := 0
	for _, st := range states {
		if st.Partitions == 0 {
			continue
		}
		parts++
		if st.LagEvents != 40 {
			t.Errorf("partition %d: lag %d events, want 40 (every event after its cursor)", st.Partition, st.LagEvents)
		}
	}
	if parts != 4 {
		t.Fatalf("%d partitions", parts)
	}
}
