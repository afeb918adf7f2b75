package search_test

import (
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/projectorhq/projector/cli"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
	"github.com/projectorhq/projector/search"
	"github.com/projectorhq/projector/stores/meilisearch/meilisearchtest"
	"github.com/projectorhq/projector/stores/pgsearch"
)

// TestCLISearchVerify: `projector search verify NAME` on an application
// wired the way cli.Config.Wire builds it (pgsearch from the schema name):
// exit 0 when the index holds what the log says, 1 with the planted
// document listed when it does not (in pages too, and with a sample of 1),
// 2 for an unknown name,
// a bad --sample or --page-size.
func TestCLISearchVerify(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	b, err := pgsearch.NewForSchema(e.store.Schema(), pgsearch.Config{})
	must(t, err)
	b.Bind(e.store.Pool())
	p := e.ticketProjection("ticket_search", b, projection.AsyncConfig{})
	d := e.dispatcher(p)
	e.history(rand.New(rand.NewPCG(5, uint64(time.Now().UnixNano()))), model{}, []string{"acme", "globex"}, 20, 150)
	e.catchUp(d)
	async, err := p.Async()
	must(t, err)

	run := func(args ...string) (string, int) {
		t.Helper()
		root := cli.New(cli.Config{Registry: e.types.Registry, Wire: func(string) (cli.Wiring, error) {
			return cli.Wiring{Async: []*projection.Async{async}}, nil
		}})
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(append(args, "--database-url", pgtest.URL(t), "--schema", e.store.Schema()))
		err := root.ExecuteContext(context.Background())
		if err != nil {
			out.WriteString(err.Error())
		}
		return out.String(), cli.ExitCode(err)
	}
	out, code := run("search", "verify", "ticket_search")
	if code != cli.ExitOK || !strings.Contains(out, "holds what the log says") {
		t.Fatalf("verify of a good index: exit %d\n%s", code, out)
	}
	_, err = e.store.Pool().Exec(e.ctx, `INSERT INTO `+e.store.Schema()+`.`+pgsearch.TableName(ticketIndex)+` (tenant_id, id, doc) VALUES ('acme', 'planted', '{"id":"planted"}')`)
	must(t, err)
	out, code = run("search", "verify", "ticket_search")
	if code != cli.ExitError || !strings.Contains(out, "extra    acme/planted") {
		t.Fatalf("verify with a planted document: exit %d\n%s", code, out)
	}
	// A sample of one among 150 documents still finds the extra one: the
	// header says 1 more indexed than expected, and that is a failure.
	for range 3 {
		if out, code = run("search", "verify", "ticket_search", "--sample", "1"); code != cli.ExitError || !strings.Contains(out, "extra    acme/planted") {
			t.Fatalf("verify --sample 1 with a planted document: exit %d\n%s", code, out)
		}
	}
	if out, code = run("search", "verify", "nope"); code != cli.ExitUsage || !strings.Contains(out, "ticket_search") {
		t.Fatalf("verify of an unknown name: exit %d\n%s", code, out)
	}
	if out, code = run("search", "verify", "ticket_search", "--sample", "-1"); code != cli.ExitUsage {
		t.Fatalf("verify --sample -1: exit %d\n%s", code, out)
	}
	for _, bad := range []string{"0", "-3", "10000001"} {
		if out, code = run("search", "verify", "ticket_search", "--page-size", bad); code != cli.ExitUsage {
			t.Fatalf("verify --page-size %s: exit %d\n%s", bad, code, out)
		}
	}
	// A planted document whose id would take over the terminal, and
	// whose contents are long: shown escaped and cut.
	hostile := "\x1b]0;owned\a\x1b[2J" + strings.Repeat("x", 2000)
	_, err = e.store.Pool().Exec(e.ctx, `INSERT INTO `+e.store.Schema()+`.`+pgsearch.TableName(ticketIndex)+` (tenant_id, id, doc)
		VALUES ('acme', $1, jsonb_build_object('id', $1::text))`, hostile)
	must(t, err)
	out, code = run("search", "verify", "ticket_search")
	if code != cli.ExitError || strings.ContainsAny(out, "\x1b\a") || strings.Contains(out, strings.Repeat("x", 600)) || !strings.Contains(out, `extra    acme/"\x1b]0;owned\a`) {
		t.Fatalf("verify with a hostile planted document: exit %d\n%q", code, out)
	}
	// Pages of 5 documents: the same finding and exit code.
	if out, code = run("search", "verify", "ticket_search", "--page-size", "5"); code != cli.ExitError || !strings.Contains(out, "extra    acme/planted") {
		t.Fatalf("paged verify with a planted document: exit %d\n%s", code, out)
	}
}

// TestCLISearchReindex: `projector search reindex NAME` swaps a
// Meilisearch index rebuilt from the log in (exit 0, the planted document
// gone), refuses a PostgreSQL one with exit 3, and a bad --batch with 2;
// `projector rebuild NAME --in-place` of the Meilisearch one is refused
// (3), and `rebuild cancel` of a blue/green one deletes its shadow index.
func TestCLISearchReindex(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	fake := meilisearchtest.New(t)
	b := meiliBackend(e, fake.URL(), "")
	p := e.ticketProjection("ticket_search", b, projection.AsyncConfig{})
	pg, err := pgsearch.New(e.store, pgsearch.Config{})
	must(t, err)
	pp := e.ticketProjection("ticket_search_pg", pg, projection.AsyncConfig{})
	d := e.dispatcher(p, pp)
	m := e.history(rand.New(rand.NewPCG(6, uint64(time.Now().UnixNano()))), model{}, []string{"acme", "globex"}, 20, 150)
	e.catchUp(d)
	must(t, b.Apply(e.ctx, nil, ticketIndex, []search.Op{{Kind: search.OpDelete, Tenant: "acme", ID: "T-1"},
		{Kind: search.OpUpsert, Tenant: "acme", ID: "planted", Doc: map[string]json.RawMessage{"id": json.RawMessage(`"planted"`)}}}))
	a1, err := p.Async()
	must(t, err)
	a2, err := pp.Async()
	must(t, err)
	run := func(args ...string) (string, int) {
		t.Helper()
		root := cli.New(cli.Config{Registry: e.types.Registry, Wire: func(string) (cli.Wiring, error) {
			return cli.Wiring{Async: []*projection.Async{a1, a2}}, nil
		}})
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(append(args, "--database-url", pgtest.URL(t), "--schema", e.store.Schema()))
		err := root.ExecuteContext(context.Background())
		if err != nil {
			out.WriteString(err.Error())
		}
		return out.String(), cli.ExitCode(err)
	}
	if out, code := run("search", "reindex", "ticket_search"); code != cli.ExitOK || !strings.Contains(out, "reindexed search projection ticket_search") {
		t.Fatalf("reindex: exit %d\n%s", code, out)
	}
	e.catchUp(d)
	sameIndex(t, "after the reindex", m.canonical(t), indexed(t, e.ctx, b))
	if out, code := run("search", "reindex", "ticket_search_pg"); code != cli.ExitRefused || !strings.Contains(out, "rebuild") {
		t.Fatalf("reindex of a PostgreSQL index: exit %d\n%s", code, out)
	}
	// rebuild NAME of the Meilisearch projection: in place is refused (an
	// index cannot be cleared in place); blue/green is requested, the
	// running dispatcher (same version) prepares the shadow index, and
	// rebuild cancel deletes it.
	if out, code := run("rebuild", "ticket_search", "--in-place"); code != cli.ExitRefused || !strings.Contains(out, "meilisearch") {
		t.Fatalf("in-place rebuild of a Meilisearch search projection: exit %d\n%s", code, out)
	}
	if out, code := run("rebuild", "ticket_search", "--hold"); code != cli.ExitOK {
		t.Fatalf("rebuild --hold of a Meilisearch search projection: exit %d\n%s", code, out)
	}
	rb, err := rebuild.Current(e.ctx, e.store, "ticket_search")
	must(t, err)
	shadow := b.UID(ticketIndex) + "__rebuild_" + strconv.FormatInt(rb.ID, 10)
	eventually(t, 30*time.Second, "the dispatcher to prepare the shadow index", func() bool { exists, _ := fake.Index(shadow); return exists })
	if out, code := run("rebuild", "cancel", "ticket_search"); code != cli.ExitOK {
		t.Fatalf("rebuild cancel: exit %d\n%s", code, out)
	}
	if exists, _ := fake.Index(shadow); exists {
		t.Fatalf("rebuild cancel left the shadow index %s", shadow)
	}
	sameIndex(t, "after the cancelled rebuild", m.canonical(t), indexed(t, e.ctx, b))
	if out, code := run("search", "reindex", "ticket_search", "--batch", "0"); code != cli.ExitUsage {
		t.Fatalf("reindex --batch 0: exit %d\n%s", code, out)
	}
}
