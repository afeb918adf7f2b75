package postgres_test

import (
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// A watch hears of every append through its Store, with the newest
// transaction id that appended, and of nothing else: not of an append
// that wrote nothing, not of another Store's appends, not after Close.
func TestWatchAppends(t *testing.T) {
	t.Parallel()
	f := setup(t)
	w := f.store.WatchAppends()
	defer w.Close()
	other, err := postgres.New(f.ctx, f.store.Pool(), postgres.Config{Schema: f.store.Schema(), Registry: f.types.Registry})
	if err != nil {
		t.Fatal(err)
	}
	quiet := func(what string) {
		t.Helper()
		select {
		case <-w.C():
			t.Errorf("%s: signalled", what)
		default:
		}
		if tx := w.Take(); tx != 0 {
			t.Errorf("%s: Take() = %d, want 0", what, tx)
		}
	}
	quiet("before any append")

	// Two appends in one transaction, one in another: one signal, the
	// newest transaction id.
	first := f.appendTx(t, projector.Stream("ticket", "w-1"), projector.NoStream, testevents.TicketOpened{Title: "a"})
	var second postgres.AppendResult
	err = pgx.BeginFunc(f.ctx, f.store.Pool(), func(tx pgx.Tx) error {
		if _, err := f.store.Append(f.ctx, tx, projector.Stream("ticket", "w-2"), projector.NoStream, testevents.TicketOpened{Title: "b"}); err != nil {
			return err
		}
		second, err = f.store.Append(f.ctx, tx, projector.Stream("ticket", "w-3"), projector.NoStream, testevents.TicketOpened{Title: "c"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.C():
	default:
		t.Fatal("no signal after three appends")
	}
	newest := second.Events[0].Position.TxID
	if newest <= first.Events[0].Position.TxID {
		t.Fatalf("transaction ids %d, %d: want increasing", first.Events[0].Position.TxID, newest)
	}
	if tx := w.Take(); tx != newest {
		t.Errorf("Take() = %d, want the newest appending transaction %d", tx, newest)
	}
	quiet("after Take")

	// A refused append and an unknown payload write nothing: no signal.
	err = pgx.BeginFunc(f.ctx, f.store.Pool(), func(tx pgx.Tx) error {
		_, err := f.store.Append(f.ctx, tx, projector.Stream("ticket", "w-1"), projector.NoStream, testevents.TicketOpened{Title: "again"})
		return err
	})
	if err == nil {
		t.Fatal("append to an existing stream with NoStream succeeded")
	}
	err = pgx.BeginFunc(f.ctx, f.store.Pool(), func(tx pgx.Tx) error {
		_, err := f.store.Append(f.ctx, tx, projector.Stream("ticket", "w-4"), projector.NoStream, struct{ X int }{1})
		return err
	})
	if err == nil {
		t.Fatal("append of an undefined type succeeded")
	}
	quiet("after refused appends")

	// Another Store on the same schema and pool is another process's view.
	err = pgx.BeginFunc(f.ctx, other.Pool(), func(tx pgx.Tx) error {
		_, err := other.Append(f.ctx, tx, projector.Stream("ticket", "w-5"), projector.NoStream, testevents.TicketOpened{Title: "d"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	quiet("after another Store's append")

	w.Close()
	w.Close() // twice is fine
	f.appendTx(t, projector.Stream("ticket", "w-6"), projector.NoStream, testevents.TicketOpened{Title: "e"})
	quiet("after Close")
}
