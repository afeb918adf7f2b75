package aggregate_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/aggregate"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// Ticket is the tests' aggregate state. Digest makes the state depend on
// every comment and on their order, so a load that skips, repeats or
// reorders an event cannot come out equal by luck.
type Ticket struct {
	Title    string `json:"title"`
	Customer string `json:"customer,omitempty"`
	Open     bool   `json:"open"`
	Comments int    `json:"comments"`
	Digest   uint64 `json:"digest"`
	// ClosedAt is the version of the last close, set through OnEvent.
	ClosedAt int64  `json:"closed_at,omitempty"`
	Reason   string `json:"reason,omitempty"`
}

func (t *Ticket) opened(e testevents.TicketOpened) {
	t.Title, t.Customer, t.Open = e.Title, e.Customer, true
}

func (t *Ticket) commented(e testevents.TicketCommented) {
	h := fnv.New64a()
	_, _ = h.Write([]byte(e.Body))
	t.Comments++
	t.Digest = (t.Digest*1099511628211 ^ h.Sum64()) + uint64(e.N)
}

func (t *Ticket) closed(version int64, e testevents.TicketClosed) {
	t.Open, t.ClosedAt, t.Reason = false, version, e.Reason
}

// ticketFolds are the aggregate's folds, one per event type.
func ticketFolds(types testevents.Types) []aggregate.Fold[Ticket] {
	return []aggregate.Fold[Ticket]{
		aggregate.On(types.Opened, (*Ticket).opened),
		aggregate.On(types.Commented, (*Ticket).commented),
		aggregate.OnEvent(types.Closed, func(t *Ticket, ev projector.Event, e testevents.TicketClosed) error {
			t.closed(ev.Version, e)
			return nil
		}),
	}
}

// model folds events with a plain type switch: the reference the
// repository's loads are compared with.
func model(events []projector.Event) Ticket {
	var t Ticket
	for _, ev := range events {
		switch p := ev.Payload.(type) {
		case testevents.TicketOpened:
			t.opened(p)
		case testevents.TicketCommented:
			t.commented(p)
		case testevents.TicketClosed:
			t.closed(ev.Version, p)
		}
	}
	return t
}

// quiet discards the warnings of tests that provoke them on purpose.
var quiet = slog.New(slog.DiscardHandler)

type fixture struct {
	ctx   context.Context
	types testevents.Types
	store *postgres.Store
}

func setup(t testing.TB) fixture {
	t.Helper()
	types := testevents.New()
	return fixture{ctx: context.Background(), types: types, store: pgtest.Store(t, types.Registry)}
}

// repo returns a ticket repository on the fixture's store.
func (f fixture) repo(t testing.TB, snaps aggregate.Snapshots) *aggregate.Repository[Ticket] {
	t.Helper()
	r, err := aggregate.New(f.store, aggregate.Config[Ticket]{Name: "ticket", Folds: ticketFolds(f.types), Snapshots: snaps, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// appendTx appends through the store in a transaction of its own.
func (f fixture) appendTx(t testing.TB, stream projector.StreamRef, exp projector.ExpectedVersion, payloads ...any) postgres.AppendResult {
	t.Helper()
	var res postgres.AppendResult
	err := pgx.BeginFunc(f.ctx, f.store.Pool(), func(tx pgx.Tx) error {
		var err error
		res, err = f.store.Append(f.ctx, tx, stream, exp, payloads...)
		return err
	})
	if err != nil {
		t.Fatalf("append: %v", err)
	}
	return res
}

// writeTx fetches stream for writing, appends payloads through the writer
// and commits.
func writeTx[S any](t testing.TB, f fixture, r *aggregate.Repository[S], stream projector.StreamRef, payloads ...any) {
	t.Helper()
	err := pgx.BeginFunc(f.ctx, f.store.Pool(), func(tx pgx.Tx) error {
		w, err := r.FetchForWriting(f.ctx, tx, stream)
		if err != nil {
			return err
		}
		_, err = w.Append(f.ctx, payloads...)
		return err
	})
	if err != nil {
		t.Fatalf("write through aggregate %s: %v", r.Name(), err)
	}
}

// begin opens a transaction rolled back when the test ends, unless it was
// committed before.
func (f fixture) begin(t testing.TB) pgx.Tx {
	t.Helper()
	tx, err := f.store.Pool().Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.WithoutCancel(f.ctx)) })
	return tx
}

// randomPayloads returns n events of a plausible ticket life: opened
// first, then mostly comments, sometimes a close and a reopen.
func randomPayloads(rng *rand.Rand, first bool, n int) []any {
	out := make([]any, 0, n)
	for i := range n {
		switch r := rng.IntN(10); {
		case first && i == 0, r == 0:
			out = append(out, testevents.TicketOpened{Title: fmt.Sprintf("title %d", rng.IntN(1000)), Customer: "c"})
		case r == 1:
			out = append(out, testevents.TicketClosed{Reason: fmt.Sprintf("reason %d", rng.IntN(10))})
		default:
			out = append(out, testevents.TicketCommented{Body: fmt.Sprintf("comment %d", rng.Uint32()), N: rng.IntN(100)})
		}
	}
	return out
}

// newRand returns a seeded generator and logs the seed, so a failure can be
// replayed by pinning it.
func newRand(t testing.TB) *rand.Rand {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
}

func backendPID(t testing.TB, tx pgx.Tx) uint32 {
	t.Helper()
	var pid uint32
	if err := tx.QueryRow(context.Background(), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

func countRows(t testing.TB, db postgres.DBTX, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}
