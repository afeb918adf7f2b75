package search_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/search"
	"github.com/projectorhq/projector/stores/meilisearch"
	"github.com/projectorhq/projector/stores/meilisearch/meilisearchtest"
)

// movingBackend moves the consumer while Verify reads: after each of the
// first moves listings since arming it appends an event and waits until
// the consumer applied it, so every attempt of Verify sees the cursor
// move. On the listing after those (Verify's read with the consumer held)
// it appends an event before listing, and records when.
type movingBackend struct {
	*meilisearch.Backend
	listed   atomic.Int64
	moves    int64
	move     func()
	heldFrom time.Time
	heldList time.Duration
}

func (m *movingBackend) EachDocument(ctx context.Context, idx search.Index, fn func(search.Stored) error) error {
	if m.move == nil {
		return m.Backend.EachDocument(ctx, idx, fn)
	}
	n := m.listed.Add(1)
	if n == m.moves+1 {
		m.heldFrom = time.Now()
		m.move() // the consumer cannot apply it while Verify holds it
		start := time.Now()
		err := m.Backend.EachDocument(ctx, idx, fn)
		m.heldList = time.Since(start)
		return err
	}
	err := m.Backend.EachDocument(ctx, idx, fn)
	if n <= m.moves {
		m.move()
	}
	return err
}

// BenchmarkSearchVerifyHeld measures what Verify's last resort costs the
// consumer: on a Meilisearch (fake) index of the backlog's documents, one
// of them tampered with, a consumer that moves through every attempt (an
// event appended and applied after each listing) leaves Verify with a page
// that differs, which it reads again holding the consumer. An event
// appended as that read starts is applied only after it: the time from
// that append to the consumer having applied it is the consumer's pause
// (held-pause-ms), beside, in the same iteration, the same append to
// applied with nothing held (baseline-ms) and the listing of the index on
// its own (list-ms), the part of the hold that grows with the page. And
// the look at the shard's lock every attempt takes (lock-look-ms, a read
// of pg_locks) beside a SELECT 1 round trip (select1-ms).
// Dispatcher defaults (Recheck 1 s): a pass that finds the lock taken
// tries again at the next recheck.
func BenchmarkSearchVerifyHeld(b *testing.B) {
	n := benchEvents()
	ctx := context.Background()
	types := testevents.New()
	store := pgtest.Store(b, types.Registry)
	seedBacklog(b, store, n)
	fake := meilisearchtest.New(b)
	mb, err := meilisearch.New(meilisearch.Config{URL: fake.URL(), IndexPrefix: store.Schema() + "_", PollInterval: 5 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	mv := &movingBackend{Backend: mb}
	p, err := newTicketProjection(types, "bench_verify_held", mv, projection.AsyncConfig{BatchSize: 1000})
	if err != nil {
		b.Fatal(err)
	}
	if err := p.Ensure(ctx); err != nil {
		b.Fatal(err)
	}
	a, err := p.Async()
	if err != nil {
		b.Fatal(err)
	}
	d, err := projection.New(projection.Config{Store: store, Projections: []*projection.Async{a}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	if err := d.Start(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = d.Stop(context.Background()) })
	if err := d.CatchUp(ctx); err != nil {
		b.Fatal(err)
	}
	raw, _ := json.Marshal("tampered")
	if err := mb.Apply(ctx, nil, ticketIndex, []search.Op{{Kind: search.OpPatch, Tenant: "acme", ID: "T-0", Doc: map[string]json.RawMessage{"title": raw}}}); err != nil {
		b.Fatal(err)
	}
	seq := 0
	appendOne := func() {
		seq++
		err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
			_, err := store.Append(ctx, tx, projector.TenantStream("acme", "ticket", fmt.Sprintf("M-%d", seq)), projector.AnyVersion, testevents.TicketOpened{Title: "moving"})
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	catchUp := func() {
		if err := d.CatchUp(ctx); err != nil {
			b.Fatal(err)
		}
	}
	const attempts = 2
	var pause, base, list, look, selectOne time.Duration
	shard := projection.ShardID{Consumer: "bench_verify_held", Instance: projection.SharedInstance}
	for b.Loop() {
		// The look every attempt takes at the shard's lock beside a
		// round trip of SELECT 1, 100 of each, alternating.
		for range 100 {
			start := time.Now()
			if _, err := projection.ShardsLocked(ctx, store, shard); err != nil {
				b.Fatal(err)
			}
			look += time.Since(start)
			start = time.Now()
			if _, err := store.Pool().Exec(ctx, `SELECT 1`); err != nil {
				b.Fatal(err)
			}
			selectOne += time.Since(start)
		}

		// Baseline: an append to applied, nothing held.
		start := time.Now()
		appendOne()
		catchUp()
		base += time.Since(start)
		start = time.Now()
		if err := mv.Backend.EachDocument(ctx, ticketIndex, func(search.Stored) error { return nil }); err != nil {
			b.Fatal(err)
		}
		list += time.Since(start)

		// Listings: the count, then one per attempt, each followed by a
		// move; then the held read.
		mv.listed.Store(0)
		mv.moves = 1 + attempts
		held := false
		mv.move = func() {
			if mv.listed.Load() == mv.moves+1 {
				held = true
				appendOne() // applied once Verify lets the consumer go
				return
			}
			appendOne()
			catchUp()
		}
		r, err := search.Verify(ctx, store, p, search.VerifyOptions{Attempts: attempts, PageSize: 2 * n}) // one page
		if err != nil {
			b.Fatal(err)
		}
		catchUp()
		pause += time.Since(mv.heldFrom)
		mv.move = nil
		if !held || r.Moved || len(r.Differences) != 1 || r.Differences[0].ID != "T-0" {
			b.Fatalf("verify: held read %v, moved %v, differences %+v; want the held read and the tampered T-0 alone", held, r.Moved, r.Differences)
		}
	}
	iters := float64(b.N)
	b.ReportMetric(float64(n), "documents")
	b.ReportMetric(pause.Seconds()*1000/iters, "held-pause-ms")
	b.ReportMetric(base.Seconds()*1000/iters, "baseline-ms")
	b.ReportMetric(list.Seconds()*1000/iters, "list-ms")
	b.ReportMetric(mv.heldList.Seconds()*1000, "held-list-ms(last)")
	b.ReportMetric(look.Seconds()*1000/iters/100, "lock-look-ms")
	b.ReportMetric(selectOne.Seconds()*1000/iters/100, "select1-ms")
}
