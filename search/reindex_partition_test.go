package search_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/search"
	"github.com/projectorhq/projector/stores/meilisearch/meilisearchtest"
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
