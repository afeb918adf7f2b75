package helpdesk

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/search"
	"github.com/projectorhq/projector/stores/meilisearch"
	"github.com/projectorhq/projector/stores/pgsearch"
	"github.com/projectorhq/projector/stores/postgres"
)

// demoSearch builds the ticket search index from the log on PostgreSQL
// and, when MEILISEARCH_URL is set, on Meilisearch too, then searches it
// and verifies it against the log.
func demoSearch(ctx context.Context, store *postgres.Store, types Types, out io.Writer) error {
	pg, err := pgsearch.New(store, pgsearch.Config{})
	if err != nil {
		return err
	}
	type target struct {
		consumer, where string
		backend         search.Backend
	}
	// Each backend is kept by a consumer of its own.
	backends := []target{{TicketSearch, "PostgreSQL full-text search (table " + pgsearch.TableName(TicketIndex) + ")", pg}}
	if url := os.Getenv("MEILISEARCH_URL"); url != "" {
		ms, err := meilisearch.New(meilisearch.Config{URL: url, IndexPrefix: store.Schema() + "_"})
		if err != nil {
			return err
		}
		backends = append(backends, target{TicketSearch + "_meili", "Meilisearch at " + meilisearch.RedactURL(url), ms})
	} else {
		fmt.Fprintf(out, "\n(MEILISEARCH_URL is not set: the ticket search runs on PostgreSQL only)\n")
	}
	// The demo's tickets belong to no tenant (projector.Stream), so their
	// documents are the system tenant's.
	sctx := search.WithTenant(ctx, projector.SystemTenant)
	for _, b := range backends {
		p, err := NewTicketSearch(types, b.consumer, b.backend)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "\n== Ticket search (search projection %s on %s)\n", p.Name(), b.where)
		if err := p.Ensure(ctx); err != nil {
			return err
		}
		async, err := p.Async()
		if err != nil {
			return err
		}
		if err := catchUpWith(ctx, store, out, async); err != nil {
			return err
		}
		for _, q := range []struct {
			text    string
			filters []search.Filter
			label   string
		}{
			{"printer", nil, `"printer"`},
			{"printer", []search.Filter{search.Eq("status", "open")}, `"printer", status open`},
			{"printer", []search.Filter{search.Eq("agent", "bob")}, `"printer", agent bob`},
			{"dark", []search.Filter{search.Eq("status", "closed")}, `"dark", status closed`},
		} {
			docs, err := search.SearchQuery[TicketDoc](sctx, p, search.Query{Text: q.text, Filters: q.filters, Limit: search.MaxLimit})
			if err != nil {
				return err
			}
			var first []string
			for _, doc := range docs[:min(3, len(docs))] {
				first = append(first, fmt.Sprintf("%s %q (%s)", doc.ID, doc.Subject, doc.Status))
			}
			fmt.Fprintf(out, "%-24s %3d tickets  %s\n", q.label, len(docs), strings.Join(first, ", "))
		}
		r, err := search.Verify(ctx, store, p, search.VerifyOptions{})
		if err != nil {
			return err
		}
		verdict := "the index holds what the log says"
		if !r.OK() {
			verdict = fmt.Sprintf("%d documents differ from the log", len(r.Differences))
		}
		fmt.Fprintf(out, "`projector search verify %s`: %d documents compared, %s\n", p.Name(), r.Compared, verdict)
	}
	return nil
}
