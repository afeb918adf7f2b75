package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
	"github.com/projectorhq/projector/stores/postgres"
)

// inlineCLIEnv is a schema whose inline projection "tickets" (declared with
// its table) counts each ticket's events, built by the appends themselves;
// one ticket's count is then spoiled, so only a rebuild makes it right.
type inlineCLIEnv struct {
	t      *testing.T
	ctx    context.Context
	types  testevents.Types
	store  *postgres.Store
	schema string
	p      *projection.Inline
	events int64
}

func newInlineCLIEnv(t *testing.T, tickets int) *inlineCLIEnv {
	t.Helper()
	e := &inlineCLIEnv{t: t, ctx: context.Background(), types: testevents.New()}
	e.p = projection.NewInline("tickets")
	h := func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+projection.Table(ctx, e.schema+".tickets")+` AS c (stream_id, n) VALUES ($1, 1)
			ON CONFLICT (stream_id) DO UPDATE SET n = c.n + 1`, ev.Stream.ID)
		return err
	}
	for _, typ := range []projection.TypeName{e.types.Opened, e.types.Commented} {
		if err := projection.OnEvent(e.p, typ, h); err != nil {
			t.Fatal(err)
		}
	}
	e.store = pgtest.Store(t, e.types.Registry, postgres.Config{Inline: []postgres.InlineProjection{e.p}})
	e.schema = e.store.Schema()
	e.exec(`CREATE TABLE ` + pgx.Identifier{e.schema, "tickets"}.Sanitize() + ` (stream_id text PRIMARY KEY, n int NOT NULL)`)
	if err := e.p.SetTables(e.schema + ".tickets"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The rebuild's old and shadow schemas are not the harness's.
		ctx := context.Background()
		rows, err := pgtest.Pool(t).Query(ctx, `SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1)`, e.schema+"_irb_")
		if err != nil {
			return
		}
		names, _ := pgx.CollectRows(rows, pgx.RowTo[string])
		for _, n := range names {
			_, _ = pgtest.Pool(t).Exec(ctx, `DROP SCHEMA `+pgx.Identifier{n}.Sanitize()+` CASCADE`)
		}
	})
	for i := range tickets {
		if err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
			_, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", fmt.Sprintf("t%02d", i)), projector.NoStream,
				testevents.TicketOpened{Title: "t"}, testevents.TicketCommented{Body: "c"})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		e.events += 2
	}
	e.exec(`UPDATE ` + pgx.Identifier{e.schema, "tickets"}.Sanitize() + ` SET n = n + 50 WHERE stream_id = 't01'`)
	return e
}

func (e *inlineCLIEnv) exec(sql string) {
	e.t.Helper()
	if _, err := e.store.Pool().Exec(e.ctx, sql); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

// exact fails unless the live model counts every event of the log once.
func (e *inlineCLIEnv) exact() {
	e.t.Helper()
	var rows, counted, over int64
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*), coalesce(sum(n), 0), count(*) FILTER (WHERE n <> 2) FROM `+
		pgx.Identifier{e.schema, "tickets"}.Sanitize()).Scan(&rows, &counted, &over); err != nil {
		e.t.Fatal(err)
	}
	if counted != e.events || over != 0 || rows != e.events/2 {
		e.t.Fatalf("live model: %d rows, %d events counted, %d rows not at 2; want %d events over %d rows", rows, counted, over, e.events, e.events/2)
	}
}

// run runs the command tree to its end in a binary wired with w.
func (e *inlineCLIEnv) run(w Wiring, args ...string) *cliRun {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	r := startCLI(ctx, e.t, e.types.Registry, e.schema, w, args...)
	<-r.done
	return r
}

// listed returns `rebuild list -o json`'s rebuilds of tickets.
func (e *inlineCLIEnv) listed() []RebuildJSON {
	e.t.Helper()
	r := e.run(Wiring{}, "rebuild", "list", "tickets", "-o", "json")
	r.want(e.t, ExitOK)
	var rs []RebuildJSON
	if err := json.Unmarshal([]byte(r.out.String()), &rs); err != nil {
		e.t.Fatalf("%v:\n%s", err, r.out.String())
	}
	return rs
}

// An inline projection's rebuild through the command tree: requested by
// name from an ops binary without the projection's code, listed as inline,
// cancelled (twice: the second is refused, exit 3), then carried out by
// `rebuild tickets --here` in the binary that has the code, which switches
// it and leaves the live model exact.
func TestInlineRebuildCommands(t *testing.T) {
	t.Parallel()
	e := newInlineCLIEnv(t, 10)
	ops := Wiring{}
	e.run(ops, "rebuild", "tickets").want(t, ExitOK, "of tickets v1 requested (inline, 20 events in the log)")
	e.run(ops, "rebuild", "list").want(t, ExitOK, "tickets", "inline", "building", "0% (0/20)")
	if rs := e.listed(); len(rs) != 1 || rs[0].Mode != "inline" || rs[0].Status != "building" || rs[0].Total != 20 {
		t.Fatalf("rebuild list -o json: %+v", rs)
	}
	e.run(ops, "rebuild", "tickets").want(t, ExitRefused, "in progress")
	e.run(ops, "rebuild", "cancel", "tickets").want(t, ExitOK, "rebuild of tickets: cancel done")
	e.run(ops, "rebuild", "cancel", "tickets").want(t, ExitRefused)
	if rs := e.listed(); len(rs) != 1 || rs[0].Mode != "inline" || rs[0].Status != "cancelled" {
		t.Fatalf("after cancel: %+v", rs)
	}
	var spoiled int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT n FROM `+pgx.Identifier{e.schema, "tickets"}.Sanitize()+` WHERE stream_id = 't01'`).Scan(&spoiled); err != nil || spoiled != 52 {
		t.Fatalf("a cancelled rebuild touched the live model: n = %d (%v)", spoiled, err)
	}

	// The version was recorded a moment ago: a store of an older version
	// might still append, so --here refuses (exit 3) until the grace has
	// passed, which an hour-old record has.
	// (Recorded now, not when the test set up: a loaded machine can take
	// longer than the grace between the two.)
	code := Wiring{Inline: []postgres.InlineProjection{e.p}}
	e.exec(`UPDATE ` + e.store.Table("projector_inline_projections") + ` SET updated_at = now()`)
	e.run(code, "rebuild", "tickets", "--here").want(t, ExitRefused, "wait until")
	e.exec(`UPDATE ` + e.store.Table("projector_inline_projections") + ` SET updated_at = now() - interval '1 hour'`)
	e.run(code, "rebuild", "tickets", "--here").want(t, ExitOK, "of inline tickets v1", "running it in this process",
		"switched", "events replayed in batches")
	e.exact()
	rs := e.listed()
	if len(rs) != 2 || rs[0].Mode != "inline" || rs[1].Mode != "inline" {
		t.Fatalf("after --here: %+v", rs)
	}
	statuses := []string{rs[0].Status, rs[1].Status}
	if !strings.Contains(strings.Join(statuses, ","), "switched") || !strings.Contains(strings.Join(statuses, ","), "cancelled") {
		t.Fatalf("after --here, statuses %v, want one switched and one cancelled", statuses)
	}
	// Nothing left to cancel; --in-place is refused for an inline
	// projection, as a usage error.
	e.run(ops, "rebuild", "cancel", "tickets").want(t, ExitRefused)
	e.run(code, "rebuild", "tickets", "--here", "--in-place").want(t, ExitUsage, "inline projection")
}

// `run` in a binary whose only projection is inline (no async projections,
// no sagas) still starts and carries out the inline rebuild an ops binary
// requested, then stops cleanly.
func TestRunServesInlineRebuildsAlone(t *testing.T) {
	t.Parallel()
	e := newInlineCLIEnv(t, 8)
	e.run(Wiring{}, "rebuild", "tickets").want(t, ExitOK, "requested (inline")
	// Past the version's grace, so the first try switches.
	e.exec(`UPDATE ` + e.store.Table("projector_inline_projections") + ` SET updated_at = now() - interval '1 hour'`)
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	r := startCLI(ctx, t, e.types.Registry, e.schema, Wiring{Inline: []postgres.InlineProjection{e.p}}, "run", "--http-addr", "")
	r.waitFor(t, "serving rebuilds of 1 inline projections")
	pgtest.Eventually(t, time.Minute, "the requested inline rebuild to switch", func() bool {
		rb, err := rebuild.Current(e.ctx, e.store, "tickets")
		return err == nil && rb.Status == rebuild.Switched
	})
	cancel()
	<-r.done
	r.want(t, ExitOK, "no async consumers to dispatch", "run: stopped")
	e.exact()
}
