package postgres_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// readAll pages through the log from the start with q (its Limit set by
// the caller) to the first batch that is not full: called once the horizon
// has passed every event, that is the whole log.
func readAll(t *testing.T, ctx context.Context, store *postgres.Store, q postgres.LogQuery) []projector.Position {
	t.Helper()
	var got []projector.Position
	for {
		b, err := store.ReadLog(ctx, q)
		if err != nil {
			t.Error(err)
			return got
		}
		for _, ev := range b.Events {
			got = append(got, ev.Position)
		}
		q.After = b.Next(q.After)
		if !b.Full {
			return got
		}
	}
}

// A log read with IncludeArchived returns every event once, in log order,
// hot or archived, while archive and unarchive batches move streams
// between the two tables under it: each page is one statement, so one
// snapshot, and archived events keep their positions. Every read shape is
// checked (the whole log, a few types, one type, a partition). No consumer
// is registered, so nothing guards the moves: they land anywhere, above
// and below the read's position.
func TestReadLogIncludeArchivedRacingMoves(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const streams = 30
	for i := range streams {
		payloads := []any{testevents.TicketOpened{Title: "x"}, testevents.TicketCommented{Body: "b"}}
		if i%3 == 0 {
			payloads = append(payloads, testevents.TicketClosed{})
		}
		f.appendTx(t, projector.Stream("ticket", fmt.Sprint(i)), projector.NoStream, payloads...)
	}
	// Once the horizon has passed every event, a read of any shape from
	// the start returns all its events at once.
	total := streams*2 + streams/3
	readLogN(t, f.ctx, f.store, postgres.LogQuery{Limit: 1000}, total)
	type shape struct {
		name string
		q    postgres.LogQuery
	}
	shapes := []shape{
		{"all", postgres.LogQuery{}},
		{"two types", postgres.LogQuery{EventTypes: []string{"ticket.opened", "ticket.closed"}}},
		{"one type", postgres.LogQuery{EventTypes: []string{"ticket.commented"}}},
		{"stream type", postgres.LogQuery{StreamTypes: []string{"ticket"}}},
		{"partition 0/2", postgres.LogQuery{Partition: postgres.Segment{Bits: 1, Value: 0}}},
		{"partition 1/2", postgres.LogQuery{Partition: postgres.Segment{Bits: 1, Value: 1}}},
		{"partition 3/4 of a type", postgres.LogQuery{Partition: postgres.Segment{Bits: 2, Value: 3}, EventTypes: []string{"ticket.opened"}}},
	}
	// What each shape reads of the whole log, with nothing archived.
	want := make([][]projector.Position, len(shapes))
	for i, s := range shapes {
		q := s.q
		q.Limit = 1000
		want[i] = readAll(t, f.ctx, f.store, q)
		if len(want[i]) == 0 {
			t.Fatalf("%s: reads nothing", s.name)
		}
	}

	// Half the streams archived, a plain read misses them.
	var half []projector.StreamRef
	for i := 0; i < streams; i += 2 {
		half = append(half, projector.Stream("ticket", fmt.Sprint(i)))
	}
	if _, err := f.store.Archive(f.ctx, postgres.ArchiveOptions{Streams: half}); err != nil {
		t.Fatal(err)
	}
	if hot := readAll(t, f.ctx, f.store, postgres.LogQuery{Limit: 1000}); len(hot) >= len(want[0]) {
		t.Fatalf("the hot log reads %d events with half the streams archived, want fewer than %d", len(hot), len(want[0]))
	}

	// Archive and unarchive batches (three streams each) move streams both
	// ways while the reads page through, seven events a page.
	ctx, cancel := context.WithCancel(f.ctx)
	var wg sync.WaitGroup
	var moves int
	wg.Go(func() {
		for round := 0; ctx.Err() == nil; round++ {
			var pick []projector.StreamRef
			for i := round % 3; i < streams; i += 3 {
				pick = append(pick, projector.Stream("ticket", fmt.Sprint(i)))
			}
			a, err := f.store.Archive(ctx, postgres.ArchiveOptions{Streams: pick, BatchSize: 3})
			if err != nil {
				if ctx.Err() == nil {
					t.Error(err)
				}
				return
			}
			u, err := f.store.Unarchive(ctx, postgres.ArchiveOptions{Streams: half, BatchSize: 3})
			if err != nil {
				if ctx.Err() == nil {
					t.Error(err)
				}
				return
			}
			moves += int(a.Streams + u.Streams)
		}
	})
	for round := range 5 {
		for i, s := range shapes {
			q := s.q
			q.Limit, q.IncludeArchived = 7, true
			got := readAll(t, f.ctx, f.store, q)
			if !slices.Equal(got, want[i]) {
				t.Errorf("round %d, %s: read %d events %v, want the %d of the log %v", round, s.name, len(got), got, len(want[i]), want[i])
			}
		}
	}
	cancel()
	wg.Wait()
	if moves == 0 {
		t.Fatal("no stream moved while the reads ran")
	}
	t.Logf("%d streams moved while the reads ran", moves)
}

// ArchivedAfter tells a position below the archive's last event from one
// at or after it.
func TestArchivedAfter(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a := f.appendTx(t, projector.Stream("ticket", "a"), projector.NoStream, testevents.TicketOpened{Title: "x"})
	b := f.appendTx(t, projector.Stream("ticket", "b"), projector.NoStream, testevents.TicketOpened{Title: "x"})
	check := func(pos projector.Position, want bool) {
		t.Helper()
		got, err := f.store.ArchivedAfter(f.ctx, f.store.Pool(), pos)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("archived after %s: %v, want %v", pos, got, want)
		}
	}
	check(projector.Start, false)
	if _, err := f.store.Archive(f.ctx, postgres.ArchiveOptions{Streams: []projector.StreamRef{projector.Stream("ticket", "a")}}); err != nil {
		t.Fatal(err)
	}
	check(projector.Start, true)
	check(a.Events[0].Position, false)
	check(b.Events[0].Position, false)
}

// Promise 19 across the archive: a log or stream read with IncludeArchived
// opens an archived event's personal fields with its subject's key, and
// once the subject is forgotten returns them as forgotten, like the hot
// log's (a rebuild or a late consumer replaying the archive gets nothing of
// a forgotten subject back). The reads after the first carry the key epoch
// alone (readEpoch), the forget moves it.
func TestReadLogArchivedForgotten(t *testing.T) {
	t.Parallel()
	f := personalSetup(t)
	ada := testevents.CustomerRegistered{Customer: "c-1", Name: "Ada", Email: "ada@x", Plan: "pro"}
	bob := testevents.CustomerRegistered{Customer: "c-2", Name: "Bob", Email: "bob@x", Plan: "free"}
	for _, c := range []testevents.CustomerRegistered{ada, bob} {
		if err := f.register(t, f.store, "acme", c); err != nil {
			t.Fatal(err)
		}
	}
	readLogN(t, f.ctx, f.store, postgres.LogQuery{Limit: 100}, 2)
	if _, err := f.store.Archive(f.ctx, postgres.ArchiveOptions{Streams: []projector.StreamRef{
		projector.TenantStream("acme", "customer", "c-1"), projector.TenantStream("acme", "customer", "c-2")}}); err != nil {
		t.Fatal(err)
	}
	read := func() map[string]projector.Event {
		t.Helper()
		out := map[string]projector.Event{}
		for _, q := range []postgres.LogQuery{
			{Limit: 100, IncludeArchived: true},
			{Limit: 100, IncludeArchived: true, EventTypes: []string{"customer.registered"}},
		} {
			b, err := f.store.ReadLog(f.ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range b.Events {
				if ev.Type == "customer.registered" {
					out[ev.Stream.ID+"/"+fmt.Sprint(len(q.EventTypes))] = ev
				}
			}
		}
		for _, id := range []string{"c-1", "c-2"} { // and each stream, as an aggregate load with archived streams does
			evs, err := f.store.ReadStream(f.ctx, projector.TenantStream("acme", "customer", id), postgres.StreamQuery{IncludeArchived: true})
			if err != nil || len(evs) != 1 {
				t.Fatalf("read archived stream %s: %d events, %v", id, len(evs), err)
			}
			out[id+"/stream"] = evs[0]
		}
		return out
	}
	got := read()
	if len(got) != 6 {
		t.Fatalf("read %d archived customer events, want 2 per read", len(got))
	}
	for k, ev := range got {
		if p := ev.Payload.(testevents.CustomerRegistered); ev.Forgotten || p.Name == "" || p.Email == "" {
			t.Fatalf("%s before forget: %+v (forgotten %v)", k, p, ev.Forgotten)
		}
	}
	if _, err := f.store.Forget(f.ctx, postgres.SubjectRef{Tenant: "acme", ID: "c-1"}); err != nil {
		t.Fatal(err)
	}
	for k, ev := range read() {
		p := ev.Payload.(testevents.CustomerRegistered)
		forgotten := ev.Stream.ID == "c-1"
		if ev.Forgotten != forgotten || (forgotten && (p.Name != "" || p.Email != "" || p.Plan != "pro")) || (!forgotten && p.Name != "Bob") {
			t.Fatalf("%s after forgetting c-1: %+v (forgotten %v)", k, p, ev.Forgotten)
		}
	}
}
