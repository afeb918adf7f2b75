package projectiontest_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/projection/projectiontest"
)

// 500 specs in parallel against one database and one set of tables: each
// sees only its own rows (the query has no WHERE), and when they are done
// nothing is left behind, in the read model or in the log.
func TestSpec_ManyInParallel(t *testing.T) {
	t.Parallel()
	k := setup(t)
	const specs = 500
	t.Run("specs", func(t *testing.T) {
		for i := range specs {
			t.Run(strconv.Itoa(i), func(t *testing.T) {
				t.Parallel()
				cfg := projectiontest.Config{Store: k.store, Async: k.async, Deterministic: true}
				if i%2 == 1 {
					cfg = projectiontest.Config{Store: k.store, Inline: k.inline, Tenant: "t" + strconv.Itoa(i%7)}
				}
				id := "p-" + strconv.Itoa(i)
				payloads := []any{testevents.TicketOpened{Title: id}}
				for range i % 4 {
					payloads = append(payloads, testevents.TicketCommented{Body: "c"})
				}
				projectiontest.New(t, cfg).Given(projector.Stream("ticket", id), payloads...).
					ThenRows(`SELECT id, title, comments FROM `+k.tickets, projectiontest.Row{id, id, i % 4})
			})
		}
	})
	var rows, events int
	if err := k.store.Pool().QueryRow(context.Background(), `SELECT (SELECT count(*) FROM `+k.tickets+`),
		(SELECT count(*) FROM `+k.store.Table("projector_events")+`)`).Scan(&rows, &events); err != nil {
		t.Fatal(err)
	}
	if rows != 0 || events != 0 {
		t.Fatalf("after %d specs: %d read-model rows and %d events left behind, want none", specs, rows, events)
	}
}

// Promise 20: a spec that passes in the kit passes in production. The same
// events go through the kit (rolled back) and through appends and a real
// dispatcher (committed); the read models they build are the same, row for
// row, for per-event handlers with Queue and for a batch handler, across
// tenants.
func TestPromise20_KitMatchesDispatcher(t *testing.T) {
	t.Parallel()
	k := setup(t)
	type given struct {
		stream   projector.StreamRef
		payloads []any
	}
	scenario := []given{
		{projector.TenantStream("acme", "ticket", "1"), []any{testevents.TicketOpened{Title: "Printer"}, testevents.TicketCommented{Body: "a"}}},
		{projector.TenantStream("globex", "ticket", "1"), []any{testevents.TicketOpened{Title: "VPN"}}},
		{projector.Stream("ticket", "2"), []any{testevents.TicketOpened{Title: "Mail"}, testevents.TicketClosed{}}},
		{projector.TenantStream("acme", "ticket", "1"), []any{testevents.TicketCommented{Body: "b"}, testevents.TicketClosed{}}},
		{projector.TenantStream("globex", "ticket", "1"), []any{testevents.TicketCommented{Body: "c"}}},
	}
	queries := []string{
		`SELECT tenant, id, title, comments, status, replaying FROM ` + k.tickets + ` ORDER BY tenant, id`,
		`SELECT tenant, stream, events FROM ` + k.counts + ` ORDER BY tenant, stream`,
	}
	read := func(ctx context.Context, q pgx.Tx) ([][]string, error) {
		var all [][]string
		for _, query := range queries {
			rows, err := q.Query(ctx, query)
			if err != nil {
				return nil, err
			}
			got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([]string, error) {
				v, err := r.Values()
				return []string{fmt.Sprintf("%v", v)}, err
			})
			if err != nil {
				return nil, err
			}
			all = append(all, slices.Concat(got...), []string{"--"})
		}
		return all, nil
	}

	var kit [][]string
	// The specs run in a subtest, whose end rolls them back: an open
	// transaction that wrote would hold back the dispatcher's horizon.
	t.Run("kit", func(t *testing.T) {
		for i, p := range []*projection.Async{k.async, k.batch} {
			s := projectiontest.New(t, projectiontest.Config{Store: k.store, Async: p})
			for _, g := range scenario {
				s.Given(g.stream, g.payloads...)
			}
			s.Then(func(ctx context.Context, tx pgx.Tx) error {
				rows, err := read(ctx, tx)
				if err == nil {
					kit = append(kit, rows[2*i:2*i+2]...) // the rows of p's table
				}
				return err
			})
		}
	})
	ctx := context.Background()
	for _, g := range scenario {
		if err := pgx.BeginFunc(ctx, k.store.Pool(), func(tx pgx.Tx) error {
			_, err := k.store.Append(ctx, tx, g.stream, projector.AnyVersion, g.payloads...)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	d, err := projection.New(projection.Config{Store: k.store, Projections: []*projection.Async{k.async, k.batch},
		PollMax: 20 * time.Millisecond, Recheck: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := d.Stop(ctx); err != nil {
			t.Error(err)
		}
	}()
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(cctx); err != nil {
		t.Fatal(err)
	}
	var prod [][]string
	if err := pgx.BeginFunc(ctx, k.store.Pool(), func(tx pgx.Tx) (err error) {
		prod, err = read(ctx, tx)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(kit) != fmt.Sprint(prod) || len(prod[0]) != 3 || len(prod[2]) != 3 {
		t.Fatalf("the kit built\n%q\nthe dispatcher built\n%q", kit, prod)
	}
}
