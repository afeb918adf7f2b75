package search_test

import (
	"encoding/json"
	"maps"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/search"
)

// TestVerify: after a random history, Verify finds the index equal to the
// log on each backend; then three planted drifts — a document changed, one
// deleted, one added behind the projection's back — are reported as
// exactly one difference each, and a sample compares only that many.
func TestVerify(t *testing.T) {
	for _, bc := range backends() {
		t.Run(bc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			b := bc.make(e)
			p := e.ticketProjection("ticket_search", b, projection.AsyncConfig{})
			d := e.dispatcher(p)
			rng := rand.New(rand.NewPCG(99, uint64(time.Now().UnixNano())))
			m := e.history(rng, model{}, []string{"acme", "globex"}, 30, 300)
			e.catchUp(d)
			report, err := search.Verify(e.ctx, e.store, p, search.VerifyOptions{})
			must(t, err)
			if !report.OK() || report.Expected != report.Indexed || report.Compared != report.Expected || report.Events == 0 {
				t.Fatalf("verify of an index built from the log: %+v", report)
			}

			// Plant: change one acme document, delete another, add an extra.
			var changed, deleted string
			for id := range m["acme"] {
				switch {
				case changed == "":
					changed = id
				case deleted == "":
					deleted = id
				}
			}
			if deleted == "" {
				t.Fatal("the history left fewer than two acme documents")
			}
			raw := func(v any) json.RawMessage { return mustJSON(t, v) }
			plant := []search.Op{
				{Kind: search.OpPatch, Tenant: "acme", ID: changed, Doc: map[string]json.RawMessage{"id": raw(changed), "title": raw("tampered")}},
				{Kind: search.OpDelete, Tenant: "acme", ID: deleted},
				{Kind: search.OpUpsert, Tenant: "globex", ID: "planted", Doc: map[string]json.RawMessage{"id": raw("planted"), "title": raw("not in the log")}},
			}
			must(t, pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error { return b.Apply(e.ctx, tx, ticketIndex, plant) }))
			report, err = search.Verify(e.ctx, e.store, p, search.VerifyOptions{})
			must(t, err)
			got := map[string]search.DiffKind{}
			for _, d := range report.Differences {
				got[d.Tenant+"/"+d.ID] = d.Kind
			}
			want := map[string]search.DiffKind{"acme/" + changed: search.Differs, "acme/" + deleted: search.Missing, "globex/planted": search.Extra}
			if len(got) != len(want) {
				t.Fatalf("differences %v, want %v", got, want)
			}
			for k, kind := range want {
				if got[k] != kind {
					t.Fatalf("differences %v, want %v", got, want)
				}
			}
			// Paged (pages of 7 documents: several pages, each replayed and
			// listed on its own): the same counts and differences.
			paged, err := search.Verify(e.ctx, e.store, p, search.VerifyOptions{PageSize: 7})
			must(t, err)
			if paged.Expected != report.Expected || paged.Indexed != report.Indexed || paged.Compared != report.Compared ||
				paged.Events != report.Events || len(paged.Differences) != len(report.Differences) {
				t.Fatalf("paged verify: expected %d, indexed %d, compared %d, events %d, %d differences; whole: %d, %d, %d, %d, %d",
					paged.Expected, paged.Indexed, paged.Compared, paged.Events, len(paged.Differences),
					report.Expected, report.Indexed, report.Compared, report.Events, len(report.Differences))
			}
			for i, d := range paged.Differences {
				if w := report.Differences[i]; d.Kind != w.Kind || d.Tenant != w.Tenant || d.ID != w.ID {
					t.Fatalf("paged verify's difference %d: %+v, want %+v", i, d, w)
				}
			}
			if paged, err = search.Verify(e.ctx, e.store, p, search.VerifyOptions{PageSize: 7, Sample: 5}); err != nil || paged.Compared == 0 || paged.Compared > 5 {
				t.Fatalf("a paged sample of 5: %+v, %v", paged, err)
			}
			if _, err := search.Verify(e.ctx, e.store, p, search.VerifyOptions{PageSize: -1}); err == nil {
				t.Fatal("a negative page size was accepted")
			}
			report, err = search.Verify(e.ctx, e.store, p, search.VerifyOptions{Sample: 5})
			must(t, err)
			if report.Compared != 5 || len(report.Differences) > 3 {
				t.Fatalf("a sample of 5: %+v", report)
			}
		})
	}
}

// TestVerifySampleFindsEveryMissingAndExtra: a sample samples the
// comparison of contents only. An index with one document missing and
// one extra (the counts even out) or with one extra (the counts differ)
// fails verification whatever the sample, in one page or many: a sample
// of 1 among dozens once passed it.
func TestVerifySampleFindsEveryMissingAndExtra(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	b := backends()[0].make(e)
	p := e.ticketProjection("ticket_search", b, projection.AsyncConfig{})
	d := e.dispatcher(p)
	m := e.history(rand.New(rand.NewPCG(7, uint64(time.Now().UnixNano()))), model{}, []string{"acme", "globex"}, 40, 200)
	e.catchUp(d)
	var deleted string
	for id := range m["acme"] {
		deleted = id
		break
	}
	if deleted == "" {
		t.Fatal("the history left no acme document")
	}
	raw := func(v any) json.RawMessage { return mustJSON(t, v) }
	extra := search.Op{Kind: search.OpUpsert, Tenant: "globex", ID: "planted", Doc: map[string]json.RawMessage{"id": raw("planted"), "title": raw("not in the log")}}
	must(t, pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error { return b.Apply(e.ctx, tx, ticketIndex, []search.Op{extra}) }))
	check := func(what string, want map[string]search.DiffKind) {
		t.Helper()
		for _, opts := range []search.VerifyOptions{{Sample: 1}, {Sample: 1, PageSize: 7}, {Sample: 3, PageSize: 5}} {
			report, err := search.Verify(e.ctx, e.store, p, opts)
			must(t, err)
			got := map[string]search.DiffKind{}
			for _, d := range report.Differences {
				if d.Kind != search.Differs {
					got[d.Tenant+"/"+d.ID] = d.Kind
				}
			}
			if report.OK() || !maps.Equal(got, want) {
				t.Fatalf("%s, %+v: OK %v, %d expected, %d indexed, %d compared; missing and extra %v, want %v",
					what, opts, report.OK(), report.Expected, report.Indexed, report.Compared, got, want)
			}
			if report.Compared > opts.Sample {
				t.Fatalf("%s, %+v: %d documents' contents compared, more than the sample", what, opts, report.Compared)
			}
		}
	}
	check("one extra document", map[string]search.DiffKind{"globex/planted": search.Extra})
	must(t, pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		return b.Apply(e.ctx, tx, ticketIndex, []search.Op{{Kind: search.OpDelete, Tenant: "acme", ID: deleted}})
	}))
	check("one extra and one missing document", map[string]search.DiffKind{"globex/planted": search.Extra, "acme/" + deleted: search.Missing})
}
