package search_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/search"
	"github.com/projectorhq/projector/stores/meilisearch/meilisearchtest"
	"github.com/projectorhq/projector/stores/postgres"
)

// TestReindexPartitioned: a Meilisearch index of a search projection with
// four partitions is rebuilt with search.Reindex while a writer appends: it
// refuses while a partition is stopped, then builds the new index with each
// event up to its own partition's cursor, holds every partition, brings
// the new index to their held cursors, swaps and resumes them all. The
// document planted in the old index is gone, the index equals the log
// (appends made during the reindex included), verify finds nothing and no
// partition is left disabled.
func TestReindexPartitioned(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	must(t, e.store.CreatePartitionIndex(e.ctx))
	fake := meilisearchtest.New(t)
	b := meiliBackend(e, fake.URL(), "")
	p := e.ticketProjection("ticket_search", b, projection.AsyncConfig{BatchSize: 20, Partitions: 4})
	d := e.dispatcher(p)
	m := model{}
	for i := range 60 {
		id := fmt.Sprintf("T-%d", i%30)
		pl := []any{testevents.TicketOpened{Title: "printer " + id}, testevents.TicketCommented{Body: "jammed", N: i}}
		if i%7 == 0 {
			pl = append(pl, testevents.TicketClosed{Reason: "delete"})
		}
		e.append("acme", id, pl...)
		for _, x := range pl {
			m.apply("acme", id, x)
		}
	}
	e.catchUp(d)
	must(t, b.Apply(e.ctx, nil, ticketIndex, []search.Op{{Kind: search.OpUpsert, Tenant: "acme", ID: "planted", Doc: map[string]json.RawMessage{"id": json.RawMessage(`"planted"`)}}}))

	admin := projection.NewAdmin(e.store)
	part2 := projection.ShardID{Consumer: "ticket_search", Instance: projection.PartitionInstance(2, 4)}
	must(t, admin.Disable(e.ctx, part2))
	if _, err := search.Reindex(e.ctx, e.store, p, 0); !errors.Is(err, projector.ErrInvalidTransition) {
		t.Fatalf("reindex with partition 2/4 disabled: %v, want ErrInvalidTransition", err)
	}
	must(t, admin.Enable(e.ctx, part2))

	stop, writerDone := make(chan struct{}), make(chan []string)
	go func() {
		var ids []string
		defer func() { writerDone <- ids }()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id := fmt.Sprintf("R-%d", i)
			err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
				_, err := e.store.Append(e.ctx, tx, projector.TenantStream("acme", "ticket", id), projector.NoStream, testevents.TicketOpened{Title: "during the reindex"})
				return err
			})
			if err != nil {
				t.Errorf("append during the reindex: %v", err)
				return
			}
			ids = append(ids, id)
		}
	}()
	r, err := search.Reindex(e.ctx, e.store, p, 10)
	close(stop)
	written := <-writerDone
	must(t, err)
	for _, id := range written {
		m.apply("acme", id, testevents.TicketOpened{Title: "during the reindex"})
	}
	if len(r.Partitions) != 4 {
		t.Fatalf("reindex report %+v: want the cursors of 4 partitions", r)
	}
	e.catchUp(d)
	sameIndex(t, "after the reindex", m.canonical(t), indexed(t, e.ctx, b))
	report, err := search.Verify(e.ctx, e.store, p, search.VerifyOptions{})
	must(t, err)
	if !report.OK() {
		t.Fatalf("verify after the reindex: %+v", report.Differences)
	}
	states, err := admin.List(e.ctx, "ticket_search")
	must(t, err)
	for _, s := range states {
		if s.Partitions > 0 && s.Status == projection.StatusDisabled {
			t.Errorf("partition %d/%d is still held after the reindex", s.Partition, s.Partitions)
		}
	}
	t.Logf("reindex replayed %d events (built to %s, swapped at %s); %d appends during it", r.Events, r.Built, r.Swapped, len(written))
}

// TestReindexPartitionedHoldsTheLayout: `consumer split` of a partition
// run after the reindex checked the layout and before it swapped (from the
// fake Meilisearch's swap request) waits for the reindex, whose fence lock
// is held by a session without a transaction id (no horizon held back);
// the reindex succeeds and, once the split is done, every partition — the
// split's halves too — is running. Without the lock the split lands in the
// gap: its halves inherit the disabled status, the enables name a
// partition that is gone, and the halves stay disabled.
func TestReindexPartitionedHoldsTheLayout(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	must(t, e.store.CreatePartitionIndex(e.ctx))
	fake := meilisearchtest.New(t)
	b := meiliBackend(e, fake.URL(), "")
	const name = "ticket_layout"
	p := e.ticketProjection(name, b, projection.AsyncConfig{BatchSize: 20, Partitions: 2})
	d := e.dispatcher(p)
	for i := range 10 {
		e.append("acme", fmt.Sprintf("T-%d", i), testevents.TicketOpened{Title: "printer"})
	}
	e.catchUp(d)
	admin := projection.NewAdmin(e.store)
	seg, err := postgres.SegmentOf(0, 2)
	must(t, err)
	fence := func() (waiting, withXID int, err error) { return fenceLock(e, name) }
	split := make(chan error, 1)
	var once sync.Once
	var splitWaited bool
	var gapErr error
	fake.Refuse("POST /swap-indexes", func() bool {
		once.Do(func() {
			go func() {
				_, err := admin.Split(e.ctx, name, seg)
				split <- err
			}()
			// The split either finishes in the gap or waits for the
			// fence lock until the reindex lets go of it.
			for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
				select {
				case err := <-split:
					split <- err
					return
				default:
				}
				waiting, withXID, err := fence()
				if err != nil {
					gapErr = err
					return
				}
				if waiting > 0 {
					splitWaited = true
					if withXID > 0 {
						gapErr = errors.New("the reindex holds the fence lock in a transaction with an id: it holds back every consumer's horizon")
					}
					return
				}
			}
			gapErr = errors.New("timed out waiting for the split to finish or wait for the fence lock")
		})
		return false
	})
	_, err = search.Reindex(e.ctx, e.store, p, 0)
	fake.Refuse("POST /swap-indexes", nil)
	must(t, gapErr)
	if err != nil {
		t.Fatalf("reindex with a split run before its swap: %v", err)
	}
	if !splitWaited {
		t.Errorf("the split ran between the reindex's layout check and its enables instead of waiting for them")
	}
	must(t, <-split)
	states, err := admin.List(e.ctx, name)
	must(t, err)
	var parts []string
	for _, s := range states {
		if s.Partitions == 0 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%d/%d", s.Partition, s.Partitions))
		if s.Status == projection.StatusDisabled {
			t.Errorf("partition %d/%d is disabled after the reindex and the split", s.Partition, s.Partitions)
		}
	}
	if len(parts) != 3 {
		t.Errorf("partitions after the split: %v, want 0/4 2/4 1/2", parts)
	}
}

// fenceLock reports how many sessions wait for the fence lock of consumer
// name (its unpartitioned shard's lock) and how many hold it in a
// transaction with an id.
func fenceLock(e *env, name string) (waiting, withXID int, err error) {
	key := "projector.shard\x1f" + e.store.Schema() + "\x1f" + name + "\x1f" + projection.SharedInstance
	err = e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FILTER (WHERE NOT l.granted), count(*) FILTER (WHERE l.granted AND a.backend_xid IS NOT NULL)
		FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		WHERE l.locktype = 'advisory' AND l.objsubid = 1
			AND ((l.classid::text::bigint << 32) | l.objid::text::bigint) = hashtextextended($1, 0)`, key).Scan(&waiting, &withXID)
	return waiting, withXID, err
}

// TestReindexHoldsAgainstPartitioning: a dispatcher declaring partitions
// starts while the reindex of the unpartitioned consumer holds it (from
// the fake Meilisearch's swap request), and events are appended. Its
// registration, which would turn the held consumer into running
// partitions indexing into the old index, waits for the reindex; the
// reindex succeeds and the index, once the partitions caught up, holds
// every event. Without the lock the partitions index the appended events
// into the index the swap then deletes, and the enable finds the fence.
func TestReindexHoldsAgainstPartitioning(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	must(t, e.store.CreatePartitionIndex(e.ctx))
	fake := meilisearchtest.New(t)
	b := meiliBackend(e, fake.URL(), "")
	const name = "ticket_topart"
	p := e.ticketProjection(name, b, projection.AsyncConfig{BatchSize: 20})
	d := e.dispatcher(p)
	m := model{}
	for i := range 10 {
		id := fmt.Sprintf("T-%d", i)
		e.append("acme", id, testevents.TicketOpened{Title: "printer"})
		m.apply("acme", id, testevents.TicketOpened{Title: "printer"})
	}
	e.catchUp(d)
	pp := e.ticketProjection(name, b, projection.AsyncConfig{BatchSize: 20, Partitions: 2})
	a, err := pp.Async()
	must(t, err)
	started := make(chan *projection.Dispatcher, 1)
	startErr := make(chan error, 1)
	var once sync.Once
	var gapErr error
	var startedInGap bool
	fake.Refuse("POST /swap-indexes", func() bool {
		once.Do(func() {
			go func() {
				d2, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{a}, PollMax: 50 * time.Millisecond, Recheck: 50 * time.Millisecond})
				if err == nil {
					err = d2.Start(e.ctx)
				}
				startErr <- err
				started <- d2
			}()
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					gapErr = errors.New("timed out waiting for the partitioned dispatcher to start or wait for the fence lock")
					return
				}
				if len(startErr) > 0 {
					break
				}
				waiting, _, err := fenceLock(e, name)
				if err != nil {
					gapErr = err
					return
				}
				if waiting > 0 {
					break
				}
			}
			for i := range 10 {
				id := fmt.Sprintf("N-%d", i)
				e.append("acme", id, testevents.TicketOpened{Title: "during the hold"})
				m.apply("acme", id, testevents.TicketOpened{Title: "during the hold"})
			}
			if len(startErr) > 0 {
				startedInGap = true
				// Started in the gap: let its partitions index what
				// was appended (into the live index the swap replaces).
				ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
				defer cancel()
				if err := <-startErr; err != nil {
					gapErr = err
					return
				}
				startErr <- nil
				d2 := <-started
				started <- d2
				gapErr = d2.CatchUp(ctx)
			}
		})
		return false
	})
	_, err = search.Reindex(e.ctx, e.store, p, 0)
	fake.Refuse("POST /swap-indexes", nil)
	must(t, gapErr)
	must(t, <-startErr)
	d2 := <-started
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = d2.Stop(ctx)
	})
	if err != nil {
		t.Errorf("reindex while a partitioned dispatcher starts: %v", err)
	}
	if startedInGap {
		t.Errorf("the partitioned dispatcher's registration ran while the reindex held the consumer instead of waiting for it")
	}
	must(t, d.Stop(e.ctx))
	e.catchUp(d2)
	sameIndex(t, "after the reindex and the partitioning", m.canonical(t), indexed(t, e.ctx, b))
}

// TestReindexPartitionedSplitWhileBuilding: a split while the reindex
// builds the new index (before it takes the fence lock) fails it with
// projection.ErrLayoutChanged before any partition is disabled: every
// partition, the split's halves included, runs afterwards and the new
// index is dropped.
func TestReindexPartitionedSplitWhileBuilding(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	must(t, e.store.CreatePartitionIndex(e.ctx))
	fake := meilisearchtest.New(t)
	b := meiliBackend(e, fake.URL(), "")
	const name = "ticket_building"
	p := e.ticketProjection(name, b, projection.AsyncConfig{BatchSize: 20, Partitions: 2})
	d := e.dispatcher(p)
	for i := range 10 {
		e.append("acme", fmt.Sprintf("T-%d", i), testevents.TicketOpened{Title: "printer"})
	}
	e.catchUp(d)
	admin := projection.NewAdmin(e.store)
	seg, err := postgres.SegmentOf(0, 2)
	must(t, err)
	var once sync.Once
	var splitErr error
	fake.Refuse("POST /indexes/{uid}/documents", func() bool {
		once.Do(func() { _, splitErr = admin.Split(e.ctx, name, seg) })
		return false
	})
	_, err = search.Reindex(e.ctx, e.store, p, 0)
	fake.Refuse("POST /indexes/{uid}/documents", nil)
	must(t, splitErr)
	if !errors.Is(err, projection.ErrLayoutChanged) {
		t.Fatalf("reindex with a split while it built: %v, want ErrLayoutChanged", err)
	}
	states, err := admin.List(e.ctx, name)
	must(t, err)
	for _, s := range states {
		if s.Partitions > 0 && s.Status == projection.StatusDisabled {
			t.Errorf("partition %d/%d is disabled after the failed reindex", s.Partition, s.Partitions)
		}
	}
	if exists, _ := fake.Index(b.UID(ticketIndex) + "__reindex"); exists {
		t.Errorf("the new index was left behind")
	}
}
