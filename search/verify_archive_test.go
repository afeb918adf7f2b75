package search_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/search"
	"github.com/projectorhq/projector/stores/postgres"
)

// Verify compares an index with the whole log, archived streams included:
// their documents were indexed from events now in the archive, and are not
// extra.
func TestVerifyReadsTheArchive(t *testing.T) {
	for _, bc := range backends() {
		t.Run(bc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			b := bc.make(e)
			p := e.ticketProjection("ticket_search", b, projection.AsyncConfig{})
			d := e.dispatcher(p)
			rng := rand.New(rand.NewPCG(7, uint64(time.Now().UnixNano())))
			e.history(rng, model{}, []string{"acme", "globex"}, 20, 150)
			e.catchUp(d)
			res, err := e.store.Archive(e.ctx, postgres.ArchiveOptions{StreamType: "ticket", Tenant: "acme", OlderThan: time.Nanosecond})
			must(t, err)
			if res.Streams == 0 {
				t.Fatalf("archived nothing: %+v", res)
			}
			report, err := search.Verify(e.ctx, e.store, p, search.VerifyOptions{})
			must(t, err)
			if !report.OK() || report.Expected != report.Indexed || report.Events == 0 {
				t.Fatalf("verify with %d of acme's streams archived: %+v", res.Streams, report)
			}
		})
	}
}
