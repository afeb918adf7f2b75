package helpdesk_test

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/examples/helpdesk"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/search"
	"github.com/projectorhq/projector/stores/meilisearch/meilisearchtest"
	"github.com/projectorhq/projector/stores/pgsearch"
)

// TestTicketSearch: tickets opened, assigned, commented on and closed
// through the ticket aggregate are found by the ticket search: "printer"
// finds the printer tickets, and status and agent filters narrow it.
func TestTicketSearch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types, err := helpdesk.Define(projector.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	store := pgtest.Store(t, types.Registry)
	tickets, err := helpdesk.NewTickets(store, types)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		id, subject, agent, comment string
		closed                      bool
	}{
		{"T-1", "printer on fire", "bob", "", false},
		{"T-2", "Printer out of toner", "", "", false},
		{"T-3", "cannot log in", "bob", "the printer works though", false},
		{"T-4", "printer jammed", "alice", "", true},
		{"T-5", "invoice is wrong", "", "", false},
	} {
		stream := projector.Stream(helpdesk.TicketStream, c.id)
		if _, err := tickets.Handle(ctx, stream, helpdesk.OpenTicket("ada", c.subject)); err != nil {
			t.Fatal(err)
		}
		if c.agent != "" {
			if _, err := tickets.Handle(ctx, stream, helpdesk.AssignTicket(c.agent)); err != nil {
				t.Fatal(err)
			}
		}
		if c.comment != "" {
			if _, err := tickets.Handle(ctx, stream, helpdesk.CommentTicket("ada", c.comment)); err != nil {
				t.Fatal(err)
			}
		}
		if c.closed {
			if _, err := tickets.Handle(ctx, stream, helpdesk.CloseTicket("replaced the drum")); err != nil {
				t.Fatal(err)
			}
		}
	}
	b, err := pgsearch.New(store, pgsearch.Config{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := helpdesk.NewTicketSearch(types, helpdesk.TicketSearch, b)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	async, err := p.Async()
	if err != nil {
		t.Fatal(err)
	}
	d, err := projection.New(projection.Config{Store: store, Projections: []*projection.Async{async}})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := d.Stop(context.WithoutCancel(ctx)); err != nil {
			t.Error(err)
		}
	}()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	sctx := search.WithTenant(ctx, projector.SystemTenant)
	find := func(text string, filters ...search.Filter) []string {
		t.Helper()
		docs, err := search.Search[helpdesk.TicketDoc](sctx, p, text, filters...)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, d := range docs {
			ids = append(ids, d.ID)
		}
		slices.Sort(ids)
		return ids
	}
	for _, c := range []struct {
		what string
		got  []string
		want []string
	}{
		{"printer", find("printer"), []string{"T-1", "T-2", "T-3", "T-4"}},
		{"printer, open", find("printer", search.Eq("status", "open")), []string{"T-2"}},
		{"printer, agent bob", find("printer", search.Eq("agent", "bob")), []string{"T-1", "T-3"}},
		{"drum (resolution), closed", find("drum", search.Eq("status", "closed")), []string{"T-4"}},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s: got %v, want %v", c.what, c.got, c.want)
		}
	}
	r, err := search.Verify(ctx, store, p, search.VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK() || r.Compared != 5 {
		t.Fatalf("verify: %+v", r)
	}
}

// TestRunDemoSearchesOnMeilisearchToo: with MEILISEARCH_URL set (here to
// the in-process fake) the demo builds the ticket index on both backends,
// says which is which, and both verify clean against the log.
func TestRunDemoSearchesOnMeilisearchToo(t *testing.T) {
	fake := meilisearchtest.New(t)
	t.Setenv("MEILISEARCH_URL", fake.URL())
	var out bytes.Buffer
	err := helpdesk.RunDemo(context.Background(), pgtest.Pool(t), &out, helpdesk.DemoConfig{Schema: demoSchema(t), Users: 2, Actions: 40})
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	for _, want := range []string{"search projection ticket_search on PostgreSQL", "search projection ticket_search_meili on Meilisearch at " + fake.URL()} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
	if n := strings.Count(out.String(), "the index holds what the log says"); n != 2 {
		t.Errorf("%d clean verifies, want 2:\n%s", n, out.String())
	}
}
