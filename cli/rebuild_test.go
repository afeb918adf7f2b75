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

// rebuildEnv is a schema whose counter projection (version 1) has built
// its live model from a few tickets, with no dispatcher running.
type rebuildEnv struct {
	t      *testing.T
	ctx    context.Context
	types  testevents.Types
	store  *postgres.Store
	schema string
}

func newRebuildEnv(t *testing.T, tickets int) *rebuildEnv {
	t.Helper()
	types := testevents.New()
	store := pgtest.Store(t, types.Registry)
	e := &rebuildEnv{t: t, ctx: context.Background(), types: types, store: store, schema: store.Schema()}
	if _, err := store.Pool().Exec(e.ctx, `CREATE TABLE `+pgx.Identifier{e.schema, "counts"}.Sanitize()+` (stream_id text PRIMARY KEY, n int NOT NULL, v int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		rows, err := pgtest.Pool(t).Query(ctx, `SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1)`, e.schema+"_rebuild_")
		if err != nil {
			return
		}
		names, _ := pgx.CollectRows(rows, pgx.RowTo[string])
		for _, n := range names {
			_, _ = pgtest.Pool(t).Exec(ctx, `DROP SCHEMA `+pgx.Identifier{n}.Sanitize()+` CASCADE`)
		}
	})
	for i := range tickets {
		if err := pgx.BeginFunc(e.ctx, store.Pool(), func(tx pgx.Tx) error {
			_, err := store.Append(e.ctx, tx, projector.Stream("ticket", fmt.Sprintf("t%02d", i)), projector.NoStream,
				testevents.TicketOpened{Title: "t"}, testevents.TicketCommented{Body: "c"})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	d := e.dispatcher(e.counter(1))
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	return e
}

// counter counts each ticket's events, marking its rows with the version.
func (e *rebuildEnv) counter(version int) *projection.Async {
	return e.counterWith(projection.AsyncConfig{Version: version}, nil)
}

// counterWith is counter with cfg (its Version marks the rows; Tables is
// set), whose handler first asks refuse, if not nil, whether to fail.
func (e *rebuildEnv) counterWith(cfg projection.AsyncConfig, refuse func(projector.Event) error) *projection.Async {
	table := e.schema + ".counts"
	cfg.Tables = []string{table}
	version := cfg.Version
	p := projection.NewAsync("counter", cfg)
	h := func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		if refuse != nil {
			if err := refuse(ev); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+projection.Table(ctx, table)+` AS c (stream_id, n, v) VALUES ($1, 1, $2)
			ON CONFLICT (stream_id) DO UPDATE SET n = c.n + 1, v = $2`, ev.Stream.ID, version)
		return err
	}
	if err := projection.OnEvent(p, e.types.Opened, h); err != nil {
		e.t.Fatal(err)
	}
	if err := projection.OnEvent(p, e.types.Commented, h); err != nil {
		e.t.Fatal(err)
	}
	return p
}

func (e *rebuildEnv) dispatcher(ps ...*projection.Async) *projection.Dispatcher {
	e.t.Helper()
	d, err := projection.New(projection.Config{Store: e.store, Projections: ps, PollMax: 20 * time.Millisecond, Recheck: 20 * time.Millisecond})
	if err == nil {
		err = d.Start(e.ctx)
	}
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = d.Stop(ctx)
	})
	return d
}

// versions returns the versions the live rows carry and the events counted.
func (e *rebuildEnv) versions() (vs []int32, counted int64) {
	e.t.Helper()
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT coalesce(array_agg(DISTINCT v ORDER BY v), '{}'), coalesce(sum(n), 0) FROM `+
		pgx.Identifier{e.schema, "counts"}.Sanitize()).Scan(&vs, &counted); err != nil {
		e.t.Fatal(err)
	}
	return vs, counted
}

// cliRun is one invocation of the command tree, in this process, with the
// given projections wired in.
type cliRun struct {
	out, errOut pgtest.SyncBuffer
	done        chan struct{}
	code        int
}

func (e *rebuildEnv) start(ctx context.Context, wired []*projection.Async, args ...string) *cliRun {
	return startCLI(ctx, e.t, e.types.Registry, e.schema, Wiring{Async: wired}, args...)
}

// startCLI runs the command tree with args on schema, in this process, in
// a binary wired with w.
func startCLI(ctx context.Context, t *testing.T, reg *projector.Registry, schema string, w Wiring, args ...string) *cliRun {
	r := &cliRun{done: make(chan struct{})}
	root := New(Config{Registry: reg, Wire: func(string) (Wiring, error) { return w, nil }})
	root.SetArgs(append(args, "--database-url", pgtest.URL(t), "--schema", schema))
	root.SetOut(&r.out)
	root.SetErr(&r.errOut)
	go func() {
		defer close(r.done)
		err := root.ExecuteContext(ctx)
		if err != nil {
			fmt.Fprintln(&r.errOut, "error:", err)
		}
		r.code = ExitCode(err)
	}()
	return r
}

func (e *rebuildEnv) run(wired []*projection.Async, args ...string) *cliRun {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel()
	r := e.start(ctx, wired, args...)
	<-r.done
	return r
}

func (r *cliRun) want(t *testing.T, code int, outs ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, code, r.out.String(), r.errOut.String())
	}
	for _, s := range outs {
		if !strings.Contains(r.out.String()+r.errOut.String(), s) {
			t.Fatalf("output lacks %q\nstdout:\n%s\nstderr:\n%s", s, r.out.String(), r.errOut.String())
		}
	}
}

// waitFor polls the command's output for s, failing if the command ends
// or a minute passes first.
func (r *cliRun) waitFor(t *testing.T, s string) {
	t.Helper()
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !strings.Contains(r.out.String(), s) {
		select {
		case <-r.done:
			t.Fatalf("the command ended (exit %d) before printing %q:\n%s\n%s", r.code, s, r.out.String(), r.errOut.String())
		case <-deadline.C:
			t.Fatalf("no %q within a minute:\n%s\n%s", s, r.out.String(), r.errOut.String())
		case <-tick.C:
		}
	}
}

// rebuild NAME --here, in a binary with version 2 of the projection and no
// dispatcher running anywhere: it requests the rebuild, builds it in this
// process with progress lines, switches, and stops its dispatcher.
func TestRebuildHere(t *testing.T) {
	t.Parallel()
	e := newRebuildEnv(t, 12)
	r := e.run([]*projection.Async{e.counter(2)}, "rebuild", "counter", "--here")
	r.want(t, ExitOK, "running it in this process", "rebuild counter: ", "switched: version 2 is live")
	if vs, n := e.versions(); len(vs) != 1 || vs[0] != 2 || n != 24 {
		t.Fatalf("live model after --here: versions %v, %d events counted; want [2] and 24", vs, n)
	}
	rb, err := rebuild.Current(e.ctx, e.store, "counter")
	if err != nil || rb.Status != rebuild.Switched || rb.Version != 2 {
		t.Fatalf("rebuild record: %+v, %v", rb, err)
	}
	// Its dispatcher stopped: no instance of it is live.
	shards, err := projection.NewAdmin(e.store).List(e.ctx, "counter")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range shards {
		if s.Dispatcher == projection.DispatcherLive {
			t.Fatalf("a dispatcher still runs %s after --here returned", s.ShardID)
		}
	}
	// A second --here of the same version rebuilds again, in place too.
	r = e.run([]*projection.Async{e.counter(2)}, "rebuild", "counter", "--here", "--in-place")
	r.want(t, ExitOK, "done: replayed in place")
	if vs, n := e.versions(); len(vs) != 1 || vs[0] != 2 || n != 24 {
		t.Fatalf("live model after --here --in-place: versions %v, %d counted", vs, n)
	}
}

// rebuild NAME --here after version 1's processes stopped behind the log:
// the shadow stops at the live cursor, and after the switch this process
// handles the later events live through version 2 before it stops, so the
// model it leaves counts every event.
func TestRebuildHereCatchesUpPastAStoppedLiveConsumer(t *testing.T) {
	t.Parallel()
	e := newRebuildEnv(t, 12)
	for i := 12; i < 15; i++ {
		if err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
			_, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", fmt.Sprintf("t%02d", i)), projector.NoStream,
				testevents.TicketOpened{Title: "t"}, testevents.TicketCommented{Body: "c"})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	r := e.run([]*projection.Async{e.counter(2)}, "rebuild", "counter", "--here")
	r.want(t, ExitOK, "switched: version 2 is live")
	if vs, n := e.versions(); len(vs) != 1 || vs[0] != 2 || n != 30 {
		t.Fatalf("live model after --here: versions %v, %d events counted; want [2] and 30", vs, n)
	}
}

// rebuild NAME --here --diff builds the new version here, prints the diff
// when it is ready and keeps running until an operator switches; after a
// Ctrl-C, --here again resumes the same rebuild.
func TestRebuildHereDiffAndResume(t *testing.T) {
	t.Parallel()
	e := newRebuildEnv(t, 5)
	ctx, cancel := context.WithCancel(e.ctx)
	defer cancel()
	r := e.start(ctx, []*projection.Async{e.counter(2)}, "rebuild", "counter", "--here", "--diff", "--limit", "3")
	r.waitFor(t, "the rebuild is held")
	out := r.out.String()
	for _, want := range []string{"LIVE ROWS", e.schema + ".counts", "first 3 differing rows", `changed  stream_id="t00"  v: 1 -> 2`, "rebuild switch counter"} {
		if !strings.Contains(out, want) {
			t.Fatalf("--here --diff output lacks %q:\n%s", want, out)
		}
	}
	// Ctrl-C: the rebuild stays, ready; --here resumes it.
	cancel()
	<-r.done
	r.want(t, ExitError, "resumes from its cursor")
	if rb, err := rebuild.Current(e.ctx, e.store, "counter"); err != nil || rb.Status != rebuild.Ready {
		t.Fatalf("after Ctrl-C: %+v, %v", rb, err)
	}
	ctx2, cancel2 := context.WithTimeout(e.ctx, 2*time.Minute)
	defer cancel2()
	r = e.start(ctx2, []*projection.Async{e.counter(2)}, "rebuild", "counter", "--here", "--diff")
	r.waitFor(t, "the rebuild is held")
	if !strings.Contains(r.out.String(), "resuming rebuild") {
		t.Fatalf("second --here did not resume:\n%s\n%s", r.out.String(), r.errOut.String())
	}
	// The diff through `rebuild diff -o json`, while --here holds it.
	j := e.run(nil, "rebuild", "diff", "counter", "-o", "json")
	j.want(t, ExitOK)
	var d DiffJSON
	if err := json.Unmarshal([]byte(j.out.String()), &d); err != nil {
		t.Fatalf("%v:\n%s", err, j.out.String())
	}
	if d.Same || d.EventsBetween != 0 || len(d.Tables) != 1 || d.Tables[0].Changed != 5 || d.Tables[0].LiveRows != 5 || len(d.Tables[0].Rows) != 5 ||
		d.Tables[0].Rows[0].Columns[0] != "v" || d.Rebuild.Status != "ready" {
		t.Fatalf("rebuild diff -o json: %s", j.out.String())
	}
	e.run(nil, "rebuild", "switch", "counter").want(t, ExitOK)
	<-r.done
	r.want(t, ExitOK, "switched: version 2 is live")
	if vs, n := e.versions(); len(vs) != 1 || vs[0] != 2 || n != 10 {
		t.Fatalf("after the switch: versions %v, %d counted", vs, n)
	}
}

// rebuild NAME --diff without --here: a dispatcher elsewhere (here one in
// the test process) builds it; the command follows it to ready, prints the
// diff and leaves it held.
func TestRebuildDiffFlag(t *testing.T) {
	t.Parallel()
	e := newRebuildEnv(t, 4)
	e.dispatcher(e.counter(2))
	r := e.run(nil, "rebuild", "counter", "--diff")
	r.want(t, ExitOK, "requested", "all 4 differing rows", `v: 1 -> 2`, "rebuild cancel counter")
	rb, err := rebuild.Current(e.ctx, e.store, "counter")
	if err != nil || rb.Status != rebuild.Ready {
		t.Fatalf("after --diff: %+v, %v", rb, err)
	}
	if vs, _ := e.versions(); len(vs) != 1 || vs[0] != 1 {
		t.Fatalf("--diff switched: live versions %v", vs)
	}
	e.run(nil, "rebuild", "diff", "counter", "--limit", "1").want(t, ExitOK, "first 1 differing rows")
	e.run(nil, "rebuild", "cancel", "counter").want(t, ExitOK)
}

// Refusals and bad command lines of diff and --here, each with its exit
// code, and none leaves a trace.
func TestRebuildDiffAndHereRefusals(t *testing.T) {
	t.Parallel()
	e := newRebuildEnv(t, 2)
	fresh := projection.NewAsync("fresh", projection.AsyncConfig{Tables: []string{e.schema + ".counts"}})
	if err := projection.OnEvent(fresh, e.types.Opened, func(context.Context, pgx.Tx, projector.Event) error { return nil }); err != nil {
		t.Fatal(err)
	}
	wired := []*projection.Async{e.counter(2), fresh}
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"rebuild", "nosuch", "--here"}, ExitUsage, "has no async projection nosuch (it has: counter, fresh)"},
		{[]string{"rebuild", "counter", "--here", "--version", "3"}, ExitUsage, "not --version 3"},
		{[]string{"rebuild", "fresh", "--here"}, ExitRefused, "has no consumer yet"},
		{[]string{"rebuild", "counter", "--diff", "--in-place"}, ExitUsage, "in-place rebuild has none"},
		{[]string{"rebuild", "counter", "--diff", "--limit", "0"}, ExitUsage, "--limit 0"},
		{[]string{"rebuild", "diff", "counter", "--limit", "10001"}, ExitUsage, "--limit 10001"},
		{[]string{"rebuild", "diff"}, ExitUsage, "NAME"},
		{[]string{"rebuild", "diff", "counter", "-o", "yaml"}, ExitUsage, "yaml"},
		{[]string{"rebuild", "diff", "counter"}, ExitRefused, "no rebuild of this projection is in progress"},
		{[]string{"rebuild", "diff", "Bad Name"}, ExitUsage, "not a projection name"},
	} {
		r := e.run(wired, c.args...)
		if r.code != c.code || !strings.Contains(r.errOut.String(), c.msg) {
			t.Errorf("%v: exit %d, want %d with %q\nstdout:\n%s\nstderr:\n%s", c.args, r.code, c.code, c.msg, r.out.String(), r.errOut.String())
		}
	}
	var consumers int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+e.store.Table("projector_consumers")+` WHERE name = 'fresh'`).Scan(&consumers); err != nil || consumers != 0 {
		t.Fatalf("a refused --here left %d consumers of fresh (%v)", consumers, err)
	}
	if rs, err := rebuild.List(e.ctx, e.store, ""); err != nil || len(rs) != 0 {
		t.Fatalf("refusals left rebuilds: %+v, %v", rs, err)
	}
	// A rebuild in progress that is not ready: diff refuses with exit 3.
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Hold: true}); err != nil {
		t.Fatal(err)
	}
	e.run(nil, "rebuild", "diff", "counter").want(t, ExitRefused, "still building")
	// --here of another version than the one in progress: refused.
	e.run([]*projection.Async{e.counter(3)}, "rebuild", "counter", "--here").want(t, ExitRefused, "is in progress")
}

// rebuild NAME --diff of a projection whose table has no primary key: the
// rebuild is built and held, the diff is refused with exit 3, and the
// message says the rebuild stays held.
func TestRebuildDiffFlagWithoutPrimaryKey(t *testing.T) {
	t.Parallel()
	e := newRebuildEnv(t, 2)
	table := e.schema + ".nopk"
	if _, err := e.store.Pool().Exec(e.ctx, `CREATE TABLE `+pgx.Identifier{e.schema, "nopk"}.Sanitize()+` (stream_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	p := projection.NewAsync("nopk", projection.AsyncConfig{Tables: []string{table}})
	if err := projection.OnEvent(p, e.types.Opened, func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+projection.Table(ctx, table)+` VALUES ($1)`, ev.Stream.ID)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	e.dispatcher(p)
	e.run(nil, "rebuild", "nopk", "--diff").want(t, ExitRefused, "no primary key", "the rebuild stays held")
	if rb, err := rebuild.Current(e.ctx, e.store, "nopk"); err != nil || rb.Status != rebuild.Ready {
		t.Fatalf("after a refused diff: %+v, %v", rb, err)
	}
}
