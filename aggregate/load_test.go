package aggregate_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/aggregate"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// ticketViewed is an event the ticket aggregate has no fold for.
type ticketViewed struct {
	By string `json:"by"`
}

func TestLoad(t *testing.T) {
	t.Parallel()
	f := setup(t)
	projector.MustDefine[ticketViewed](f.types.Registry, "ticket.viewed")
	tickets := f.repo(t, aggregate.Snapshots{})
	s := projector.TenantStream("acme", "ticket", "T-1")
	f.appendTx(t, s, projector.NoStream, testevents.TicketOpened{Title: "printer on fire", Customer: "ada"})
	f.appendTx(t, s, projector.ExactVersion(1), ticketViewed{By: "bob"}, testevents.TicketCommented{Body: "water?", N: 1})
	f.appendTx(t, s, projector.ExactVersion(3), testevents.TicketClosed{Reason: "extinguished"})

	got, err := tickets.Load(f.ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	events, err := f.store.ReadStream(f.ctx, s, postgres.StreamQuery{})
	if err != nil {
		t.Fatal(err)
	}
	want := model(events)
	if got.State != want || got.Version != 4 || got.Stream != s || got.FromSnapshot != 0 || !got.Exists() {
		t.Fatalf("load: %+v, want state %+v at version 4", got, want)
	}
	if got.State.Open || got.State.ClosedAt != 4 || got.State.Comments != 1 {
		t.Fatalf("folds did not run as written: %+v", got.State)
	}

	// The same load inside a transaction sees that transaction's own
	// uncommitted events.
	tx := f.begin(t)
	if _, err := f.store.Append(f.ctx, tx, s, projector.ExactVersion(4), testevents.TicketOpened{Title: "again"}); err != nil {
		t.Fatal(err)
	}
	inTx, err := tickets.LoadTx(f.ctx, tx, s, aggregate.Query{})
	if err != nil || inTx.Version != 5 || !inTx.State.Open {
		t.Fatalf("load inside the writing transaction: %+v, %v", inTx, err)
	}

	for _, tc := range []struct {
		name string
		err  error
	}{
		{"missing stream", second(tickets.Load(f.ctx, projector.TenantStream("acme", "ticket", "nope")))},
		{"other tenant", second(tickets.Load(f.ctx, projector.TenantStream("other", "ticket", "T-1")))},
		{"version past the head", second(tickets.LoadVersion(f.ctx, s, 5))},
		{"before the first event", second(tickets.LoadAsOf(f.ctx, s, events[0].RecordedAt.Add(-time.Microsecond)))},
	} {
		if !errors.Is(tc.err, projector.ErrNotFound) {
			t.Errorf("%s: %v, want ErrNotFound", tc.name, tc.err)
		}
	}
}

// As-of loads equal folding the first N events: by version for every N, and
// by time for every event's recorded time and for instants between events,
// over random streams written in random-sized transactions.
func TestLoadAsOfEqualsFoldOfPrefix(t *testing.T) {
	t.Parallel()
	f := setup(t)
	rng := newRand(t)
	tickets := f.repo(t, aggregate.Snapshots{})
	for i := range 10 {
		s := projector.Stream("ticket", fmt.Sprintf("p-%d", i))
		n := 1 + rng.IntN(30)
		for version := 0; version < n; {
			chunk := min(1+rng.IntN(4), n-version)
			f.appendTx(t, s, projector.ExactVersion(int64(version)), randomPayloads(rng, version == 0, chunk)...)
			version += chunk
		}
		events, err := f.store.ReadStream(f.ctx, s, postgres.StreamQuery{})
		if err != nil {
			t.Fatal(err)
		}
		check := func(what string, got aggregate.Loaded[Ticket], err error, prefix int) {
			t.Helper()
			if err != nil {
				t.Fatalf("%s: %s: %v", s, what, err)
			}
			if want := model(events[:prefix]); got.State != want || got.Version != int64(prefix) {
				t.Fatalf("%s: %s: version %d state %+v, want version %d state %+v", s, what, got.Version, got.State, prefix, want)
			}
		}
		// recordedPrefix is how many events were recorded at or before at.
		recordedPrefix := func(at time.Time) int {
			k := 0
			for k < len(events) && !events[k].RecordedAt.After(at) {
				k++
			}
			return k
		}
		for k := 1; k <= n; k++ {
			got, err := tickets.LoadVersion(f.ctx, s, int64(k))
			check(fmt.Sprintf("version %d", k), got, err, k)

			at := events[k-1].RecordedAt
			got, err = tickets.LoadAsOf(f.ctx, s, at)
			check(fmt.Sprintf("as of event %d's time", k), got, err, recordedPrefix(at))
			if k < n {
				between := at.Add(events[k].RecordedAt.Sub(at) / 2)
				got, err = tickets.LoadAsOf(f.ctx, s, between)
				check(fmt.Sprintf("as of between events %d and %d", k, k+1), got, err, recordedPrefix(between))
			}
			// Both bounds: whichever comes first.
			j := 1 + rng.IntN(n)
			got, err = tickets.LoadTx(f.ctx, f.store.Pool(), s, aggregate.Query{Version: int64(k), Until: events[j-1].RecordedAt})
			check(fmt.Sprintf("version %d until event %d's time", k, j), got, err, min(k, recordedPrefix(events[j-1].RecordedAt)))
		}
		got, err := tickets.Load(f.ctx, s)
		check("current", got, err, n)
		if _, err := tickets.LoadVersion(f.ctx, s, int64(n+1)); !errors.Is(err, projector.ErrNotFound) {
			t.Fatalf("%s: version %d of %d: %v, want ErrNotFound", s, n+1, n, err)
		}
	}
}

func TestFoldErrors(t *testing.T) {
	t.Parallel()
	f := setup(t)
	// A fold that refuses negative comment numbers.
	strict, err := aggregate.New(f.store, aggregate.Config[Ticket]{Name: "strict_ticket", Folds: []aggregate.Fold[Ticket]{
		aggregate.On(f.types.Opened, (*Ticket).opened),
		aggregate.OnEvent(f.types.Commented, func(t *Ticket, _ projector.Event, e testevents.TicketCommented) error {
			if e.N < 0 {
				return fmt.Errorf("comment number %d is negative", e.N)
			}
			t.commented(e)
			return nil
		}),
	}})
	if err != nil {
		t.Fatal(err)
	}
	s := projector.Stream("ticket", "strict")
	writeTx(t, f, strict, s, testevents.TicketOpened{Title: "x"})

	// Appending an event the aggregate cannot fold aborts the transaction:
	// even a careless commit writes nothing.
	tx := f.begin(t)
	w, err := strict.FetchForWriting(f.ctx, tx, s)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Append(f.ctx, testevents.TicketCommented{Body: "bad", N: -1}); err == nil {
		t.Fatal("append of an unfoldable event succeeded")
	}
	if _, err := w.Append(f.ctx, testevents.TicketCommented{Body: "fine"}); err == nil {
		t.Fatal("writer still usable after a fold failure")
	}
	if err := tx.Commit(f.ctx); err == nil {
		t.Fatal("commit after a fold failure succeeded")
	}
	if v, err := f.store.StreamVersion(f.ctx, f.store.Pool(), s); err != nil || v != 1 {
		t.Fatalf("stream version %d, %v; want 1 (nothing committed)", v, err)
	}

	// Written past the aggregate, the same event makes loads fail loudly.
	f.appendTx(t, s, projector.ExactVersion(1), testevents.TicketCommented{Body: "bad", N: -1})
	if _, err := strict.Load(f.ctx, s); err == nil || !strings.Contains(err.Error(), "comment number -1 is negative") {
		t.Fatalf("load of an unfoldable stream: %v, want the fold's error", err)
	}
	if got, err := strict.LoadVersion(f.ctx, s, 1); err != nil || got.State.Title != "x" {
		t.Fatalf("load before the bad event: %+v, %v", got, err)
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tickets := f.repo(t, aggregate.Snapshots{})
	good := projector.Stream("ticket", "x")
	noTenant := projector.StreamRef{Type: "ticket", ID: "x"}
	other := projector.NewRegistry()
	undefinedHere := projector.MustDefine[ticketViewed](other, "ticket.viewed")
	folds := ticketFolds(f.types)

	newCases := map[string]struct {
		store *postgres.Store
		cfg   aggregate.Config[Ticket]
	}{
		"nil store":        {nil, aggregate.Config[Ticket]{Name: "t", Folds: folds}},
		"no name":          {f.store, aggregate.Config[Ticket]{Folds: folds}},
		"bad name":         {f.store, aggregate.Config[Ticket]{Name: "Ticket!", Folds: folds}},
		"no folds":         {f.store, aggregate.Config[Ticket]{Name: "t"}},
		"two folds":        {f.store, aggregate.Config[Ticket]{Name: "t", Folds: append(folds, aggregate.On(f.types.Opened, (*Ticket).opened))}},
		"zero event type":  {f.store, aggregate.Config[Ticket]{Name: "t", Folds: []aggregate.Fold[Ticket]{aggregate.On(projector.EventType[testevents.TicketOpened]{}, (*Ticket).opened)}}},
		"nil fold":         {f.store, aggregate.Config[Ticket]{Name: "t", Folds: []aggregate.Fold[Ticket]{aggregate.On[Ticket](f.types.Opened, nil)}}},
		"zero fold":        {f.store, aggregate.Config[Ticket]{Name: "t", Folds: []aggregate.Fold[Ticket]{{}}}},
		"foreign type":     {f.store, aggregate.Config[Ticket]{Name: "t", Folds: []aggregate.Fold[Ticket]{aggregate.On(undefinedHere, func(*Ticket, ticketViewed) {})}}},
		"negative every":   {f.store, aggregate.Config[Ticket]{Name: "t", Folds: folds, Snapshots: aggregate.Snapshots{Every: -1}}},
		"negative version": {f.store, aggregate.Config[Ticket]{Name: "t", Folds: folds, Snapshots: aggregate.Snapshots{Every: 1, Version: -1}}},
		// Accepted until the first snapshot (an API audit): a 100 kB name,
		// and a version pgx cannot encode as PostgreSQL's integer.
		"100 kB name":          {f.store, aggregate.Config[Ticket]{Name: strings.Repeat("t", 100_000), Folds: folds}},
		"version over an int4": {f.store, aggregate.Config[Ticket]{Name: "t", Folds: folds, Snapshots: aggregate.Snapshots{Every: 1, Version: math.MaxInt32 + 1}}},
	}
	for name, tc := range newCases {
		if _, err := aggregate.New(tc.store, tc.cfg); !errors.Is(err, aggregate.ErrInvalidConfig) || len(err.Error()) > 1000 {
			t.Errorf("New with %s: %.200v; want ErrInvalidConfig, short", name, err)
		}
	}
	if _, err := aggregate.New(f.store, newCases["foreign type"].cfg); !errors.Is(err, projector.ErrUnknownEventType) {
		t.Errorf("New with a fold for an undefined type: %v, want ErrUnknownEventType", err)
	}

	tx := f.begin(t)
	cases := []struct {
		name    string
		err     error
		wantErr error // nil: any error
	}{
		{"Load without tenant", second(tickets.Load(f.ctx, noTenant)), projector.ErrInvalidStream},
		{"LoadVersion 0", second(tickets.LoadVersion(f.ctx, good, 0)), aggregate.ErrInvalidQuery},
		{"LoadVersion -1", second(tickets.LoadVersion(f.ctx, good, -1)), aggregate.ErrInvalidQuery},
		{"LoadAsOf zero time", second(tickets.LoadAsOf(f.ctx, good, time.Time{})), aggregate.ErrInvalidQuery},
		{"LoadTx negative version", second(tickets.LoadTx(f.ctx, f.store.Pool(), good, aggregate.Query{Version: -3})), aggregate.ErrInvalidQuery},
		{"LoadTx nil connection", second(tickets.LoadTx(f.ctx, nil, good, aggregate.Query{})), nil},
		{"FetchForWriting nil tx", second(tickets.FetchForWriting(f.ctx, nil, good)), nil},
		{"FetchForWriting without tenant", second(tickets.FetchForWriting(f.ctx, tx, noTenant)), projector.ErrInvalidStream},
		{"FetchExclusive nil tx", second(tickets.FetchExclusive(f.ctx, nil, good)), nil},
		{"FetchExclusive without id", second(tickets.FetchExclusive(f.ctx, tx, projector.Stream("ticket", ""))), projector.ErrInvalidStream},
		{"FetchExclusive two options", second(tickets.FetchExclusive(f.ctx, tx, good, aggregate.ExclusiveOptions{}, aggregate.ExclusiveOptions{})), nil},
		{"Handle nil decide", second(tickets.Handle(f.ctx, good, nil)), nil},
		{"Handle without tenant", second(tickets.Handle(f.ctx, noTenant, nothing)), projector.ErrInvalidStream},
		{"Handle negative attempts", second(tickets.Handle(f.ctx, good, nothing, aggregate.HandleOptions{MaxAttempts: -1})), nil},
		{"Handle two options", second(tickets.Handle(f.ctx, good, nothing, aggregate.HandleOptions{}, aggregate.HandleOptions{})), nil},
	}
	for _, tc := range cases {
		if tc.err == nil || (tc.wantErr != nil && !errors.Is(tc.err, tc.wantErr)) {
			t.Errorf("%s: %v, want %v", tc.name, tc.err, tc.wantErr)
		}
	}
	if n := countRows(t, f.store.Pool(), `SELECT count(*) FROM `+f.store.Table("projector_streams")); n != 0 {
		t.Errorf("bad input wrote %d streams", n)
	}
	// The transaction the bad calls were given is still usable.
	if err := tx.Commit(f.ctx); err != nil {
		t.Errorf("commit after refused calls: %v", err)
	}
}

// second returns the error of a call that returns a value and an error.
func second[T any](_ T, err error) error { return err }

// nothing is a command that decides nothing needs to change.
func nothing(context.Context, aggregate.Loaded[Ticket]) ([]any, error) { return nil, nil }
