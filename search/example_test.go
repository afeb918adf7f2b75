package search_test

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/search"
	"github.com/projectorhq/projector/stores/pgsearch"
	"github.com/projectorhq/projector/stores/postgres"
)

type IssueOpened struct {
	Title string `json:"title"`
}

type IssueClosed struct{}

// IssueDoc is what the index holds per issue.
type IssueDoc struct {
	ID     string `json:"id"`
	Title  string `json:"title"`
	Status string `json:"status"`
}

// A search projection keeps an index up to date from the log; Search asks
// it, always within the tenant of its context. Here on PostgreSQL
// (stores/pgsearch), written in the dispatcher's transaction.
func ExampleSearch() {
	ctx := context.Background()
	url, schema := pgtest.ExampleDatabase() // an application: its own URL and schema

	reg := projector.NewRegistry()
	issueOpened, err := projector.Define[IssueOpened](reg, "issue.opened")
	if err != nil {
		fmt.Println(err)
		return
	}
	issueClosed, err := projector.Define[IssueClosed](reg, "issue.closed")
	if err != nil {
		fmt.Println(err)
		return
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	if _, err := postgres.Migrate(ctx, pool, schema); err != nil {
		fmt.Println(err)
		return
	}
	store, err := postgres.New(ctx, pool, postgres.Config{Schema: schema, Registry: reg})
	if err != nil {
		fmt.Println(err)
		return
	}

	backend, err := pgsearch.New(store, pgsearch.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	issues := search.New("issue_search", search.Config{
		Index:   search.Index{Name: "issues", Searchable: []string{"title"}, Filterable: []string{"status"}},
		Backend: backend,
	})
	err = search.On(issues, issueOpened, func(ctx context.Context, ev projector.Event, e IssueOpened, w *search.Writer) error {
		return w.Upsert(IssueDoc{ID: ev.Stream.ID, Title: e.Title, Status: "open"})
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	err = search.On(issues, issueClosed, func(ctx context.Context, ev projector.Event, _ IssueClosed, w *search.Writer) error {
		return w.Patch(ev.Stream.ID, map[string]string{"status": "closed"})
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := issues.Ensure(ctx); err != nil { // creates the index table
		fmt.Println(err)
		return
	}
	async, err := issues.Async()
	if err != nil {
		fmt.Println(err)
		return
	}

	for _, a := range []struct {
		tenant, id, title string
		closed            bool
	}{{"acme", "I-1", "Printer on fire", false}, {"acme", "I-2", "Printer out of paper", true}, {"globex", "I-1", "Printer jammed", false}} {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			payloads := []any{IssueOpened{Title: a.title}}
			if a.closed {
				payloads = append(payloads, IssueClosed{})
			}
			_, err := store.Append(ctx, tx, projector.TenantStream(a.tenant, "issue", a.id), projector.NoStream, payloads...)
			return err
		})
		if err != nil {
			fmt.Println(err)
			return
		}
	}

	d, err := projection.New(projection.Config{Store: store, Projections: []*projection.Async{async}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := d.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = d.Stop(ctx) }()
	if err := d.CatchUp(ctx); err != nil { // a test's way to wait for the index
		fmt.Println(err)
		return
	}

	acme := search.WithTenant(ctx, "acme") // where a request's tenant is known
	docs, err := search.Search[IssueDoc](acme, issues, "print", search.Eq("status", "open"))
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, doc := range docs {
		fmt.Printf("%s %q %s\n", doc.ID, doc.Title, doc.Status)
	}
	// Output: I-1 "Printer on fire" open
}
