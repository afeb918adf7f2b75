package postgres_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// A scope read returns exactly the scope's events of the given types up to
// the given position, in log order, a batch at a time; and the planner reads
// it through the events' stream index, not the whole log.
func TestScopeReadIsExactAndUsesTheStreamIndex(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var payloads []any
	for i := range 40 {
		payloads = append(payloads, testevents.TicketCommented{Body: "x", N: i})
	}
	err := pgx.BeginFunc(f.ctx, f.store.Pool(), func(tx pgx.Tx) error {
		for i := range 100 {
			if _, err := f.store.Append(f.ctx, tx, projector.TenantStream("big", "ticket", fmt.Sprint(i)), projector.NoStream, payloads...); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var mine []projector.Event
	for i := range 3 {
		for _, s := range []projector.StreamRef{projector.TenantStream("small", "ticket", fmt.Sprint(i)), projector.TenantStream("small", "invoice", fmt.Sprint(i))} {
			res := f.appendTx(t, s, projector.AnyVersion, testevents.TicketOpened{Title: "t"}, testevents.TicketCommented{Body: "c"}, testevents.TicketClosed{})
			mine = append(mine, res.Events...)
		}
	}
	f.appendTx(t, projector.TenantStream("big", "ticket", "late"), projector.NoStream, testevents.TicketOpened{Title: "late"})
	if _, err := f.store.Pool().Exec(f.ctx, `ANALYZE `+f.store.Table("projector_events")); err != nil {
		t.Fatal(err)
	}
	until := mine[len(mine)-4].Position // the last three events are past it
	types := []string{"ticket.opened", "ticket.commented"}

	read := func(q postgres.ScopeQuery, batch int) []projector.Event {
		t.Helper()
		var got []projector.Event
		err := pgx.BeginFunc(f.ctx, f.store.Pool(), func(tx pgx.Tx) error {
			c, err := f.store.OpenScopeTx(f.ctx, tx, q)
			if err != nil {
				return err
			}
			for {
				events, err := c.Next(f.ctx, batch)
				if err != nil {
					return err
				}
				if len(events) == 0 {
					break
				}
				if len(events) > batch {
					t.Fatalf("a batch of %d events, asked for %d", len(events), batch)
				}
				got = append(got, events...)
			}
			if err := c.Close(f.ctx); err != nil {
				return err
			}
			if _, err := c.Next(f.ctx, 1); !errors.Is(err, postgres.ErrScopeCursorClosed) {
				t.Errorf("Next after Close: %v", err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	want := func(keep func(projector.Event) bool) []string {
		var out []string
		for _, ev := range mine {
			if ev.Type != "ticket.closed" && !until.Less(ev.Position) && keep(ev) {
				out = append(out, ev.ID.String())
			}
		}
		return out
	}
	ids := func(events []projector.Event) []string {
		var out []string
		for i, ev := range events {
			if i > 0 && !events[i-1].Position.Less(ev.Position) {
				t.Errorf("not in log order: %s after %s", ev.Position, events[i-1].Position)
			}
			out = append(out, ev.ID.String())
		}
		return out
	}
	tenant := read(postgres.ScopeQuery{Tenant: "small", EventTypes: types, Until: until}, 4)
	if got, w := ids(tenant), want(func(projector.Event) bool { return true }); strings.Join(got, ",") != strings.Join(w, ",") || len(w) != 10 {
		t.Fatalf("tenant scope: got %v\nwant %v", got, w)
	}
	if tenant[0].Payload == nil {
		t.Error("a decoded read came back without payloads")
	}
	stream := read(postgres.ScopeQuery{Tenant: "small", StreamType: "invoice", StreamID: "1", EventTypes: types, Until: until, Raw: true}, 1)
	if got, w := ids(stream), want(func(ev projector.Event) bool { return ev.Stream.Type == "invoice" && ev.Stream.ID == "1" }); strings.Join(got, ",") != strings.Join(w, ",") || len(w) != 2 {
		t.Fatalf("stream scope: got %v\nwant %v", got, w)
	}
	if stream[0].Payload != nil || len(stream[0].Data) == 0 {
		t.Error("a raw read decoded payloads")
	}

	explain := func(stream bool, fraction string, args ...any) string {
		t.Helper()
		var plan []string
		err := pgx.BeginFunc(f.ctx, f.store.Pool(), func(tx pgx.Tx) error {
			if _, err := tx.Exec(f.ctx, `SET LOCAL cursor_tuple_fraction = `+fraction); err != nil {
				return err
			}
			rows, err := tx.Query(f.ctx, `EXPLAIN DECLARE c NO SCROLL CURSOR FOR `+f.store.ScopeSQL(stream), args...)
			if err != nil {
				return err
			}
			plan, err = pgx.CollectRows(rows, pgx.RowTo[string])
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(plan, "\n")
	}
	const index = "projector_events_tenant_id_stream_type_stream_id_version_key"
	for _, c := range []struct {
		stream bool
		args   []any
	}{
		{false, []any{"small", types, until.TxID, until.Seq}},
		{true, []any{"big", types, until.TxID, until.Seq, "ticket", "7"}},
	} {
		plan := explain(c.stream, "1", c.args...)
		if !strings.Contains(plan, index) || strings.Contains(plan, "Seq Scan") || strings.Contains(plan, "projector_events_pkey") {
			t.Errorf("the scope read (stream %v) does not go through the stream index:\n%s", c.stream, plan)
		}
	}
	err = pgx.BeginFunc(f.ctx, f.store.Pool(), func(tx pgx.Tx) error {
		for _, q := range []postgres.ScopeQuery{
			{Tenant: "small", StreamType: "ticket", EventTypes: types},
			{Tenant: "", EventTypes: types},
			{Tenant: "small\x00", EventTypes: types},
			{Tenant: "small"},
		} {
			if _, err := f.store.OpenScopeTx(f.ctx, tx, q); err == nil {
				t.Errorf("%+v: no error", q)
			}
		}
		var one int
		return tx.QueryRow(f.ctx, `SELECT 1`).Scan(&one) // nothing was sent that aborted tx
	})
	if err != nil {
		t.Fatal(err)
	}
}
