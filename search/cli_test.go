package search_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/projectorhq/projector/cli"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/pgsearch"
)

// TestCLISearchVerify: `projector search verify NAME` on an application
// wired the way cli.Config.Wire builds it (pgsearch from the schema name):
// exit 0 when the index holds what the log says, 1 with the planted
// document listed when it does not, 2 for an unknown name or a bad
// --sample.
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
	if out, code = run("search", "verify", "nope"); code != cli.ExitUsage || !strings.Contains(out, "ticket_search") {
		t.Fatalf("verify of an unknown name: exit %d\n%s", code, out)
	}
	if out, code = run("search", "verify", "ticket_search", "--sample", "-1"); code != cli.ExitUsage {
		t.Fatalf("verify --sample -1: exit %d\n%s", code, out)
	}
}
