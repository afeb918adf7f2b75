package main_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/examples/helpdesk"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
)

// rebuildEnv is an ops schema where agent_workload version 1 has counted a
// reassigned ticket (T-2: bob, then alice) on both agents, as version 1
// does; version 2 counts it on alice only.
type rebuildEnv struct {
	*opsEnv
	types helpdesk.Types
	app   *helpdesk.App
}

func newRebuildEnv(t *testing.T) *rebuildEnv {
	t.Helper()
	o := newOpsEnv(t)
	t.Cleanup(func() {
		// The rebuilds' shadow and old schemas, which outlive the test's own.
		rows, err := pgtest.Pool(t).Query(context.Background(), `SELECT nspname FROM pg_namespace WHERE starts_with(nspname, $1)`, o.schema+"_rebuild_")
		if err != nil {
			return
		}
		names, _ := pgx.CollectRows(rows, pgx.RowTo[string])
		for _, n := range names {
			_, _ = pgtest.Pool(t).Exec(context.Background(), `DROP SCHEMA `+pgx.Identifier{n}.Sanitize()+` CASCADE`)
		}
	})
	o.append(projector.Stream(helpdesk.TicketStream, "T-2"), helpdesk.TicketOpened{Customer: "ada", Subject: "scanner"},
		helpdesk.TicketAssigned{Agent: "bob"}, helpdesk.TicketAssigned{Agent: "alice"})
	types, err := helpdesk.Define(projector.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	app, err := helpdesk.NewApp(types, o.schema, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	return &rebuildEnv{opsEnv: o, types: types, app: app}
}

// dispatcher starts a dispatcher in the test process over the binary's
// schema, as the application's own process would run it, and stops it when
// the test ends (or earlier, through the returned function).
func (e *rebuildEnv) dispatcher(instance string, ps ...*projection.Async) (*projection.Dispatcher, func()) {
	e.t.Helper()
	d, err := projection.New(projection.Config{Store: e.store, Projections: ps, InstanceID: instance,
		PollMax: 20 * time.Millisecond, Recheck: 20 * time.Millisecond})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = d.Stop(ctx)
	}
	e.t.Cleanup(stop)
	return d, stop
}

func (e *rebuildEnv) catchUp(d *projection.Dispatcher) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		e.t.Fatal(err)
	}
}

func (e *rebuildEnv) v2() *projection.Async {
	e.t.Helper()
	p, err := helpdesk.NewWorkload(e.types, e.schema, 2)
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

// open returns the live workload's open count per agent.
func (e *rebuildEnv) open() map[string]int {
	e.t.Helper()
	rows, err := e.store.Pool().Query(context.Background(), `SELECT agent, open FROM `+pgx.Identifier{e.schema, helpdesk.WorkloadTable}.Sanitize())
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]int{}
	var agent string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&agent, &n}, func() error { out[agent] = n; return nil }); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// wantV1 and wantV2 check the live model: version 1 keeps T-2 open on bob.
func (e *rebuildEnv) wantModel(version int) {
	e.t.Helper()
	want := map[string]int{"alice": 1, "bob": 1} // T-1 closed by alice; T-2 open, v1 counts it on bob too
	if version == 2 {
		want["bob"] = 0
	}
	if got := e.open(); fmt.Sprint(got) != fmt.Sprint(want) {
		e.t.Fatalf("live workload %v, want version %d's %v", got, version, want)
	}
}

// rebuildJSON is one entry of `rebuild list -o json`.
type rebuildJSON struct {
	ID           int64   `json:"id"`
	Name         string  `json:"name"`
	Version      int     `json:"version"`
	Mode         string  `json:"mode"`
	Status       string  `json:"status"`
	Progress     float64 `json:"progress"`
	Done         int64   `json:"events_done"`
	Total        int64   `json:"events_total"`
	ShadowSchema string  `json:"shadow_schema"`
	OldSchema    string  `json:"old_schema"`
	SwitchMS     float64 `json:"switch_ms"`
}

func (e *rebuildEnv) list() []rebuildJSON {
	e.t.Helper()
	r := run(e.t, e.env, "rebuild", "list", "agent_workload", "-o", "json")
	var out []rebuildJSON
	if r.code != 0 {
		e.t.Fatalf("rebuild list -o json: %+v", r)
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		e.t.Fatalf("rebuild list -o json is not JSON: %v\n%s", err, r.stdout)
	}
	return out
}

// until runs `rebuild list` until the latest rebuild has the status.
func (e *rebuildEnv) until(status string) rebuildJSON {
	e.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if l := e.list(); len(l) > 0 && l[0].Status == status {
			return l[0]
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("the rebuild did not reach %s: %+v", status, e.list())
		}
		time.Sleep(50 * time.Millisecond) // polling the binary, not synchronising goroutines
	}
}

func (e *rebuildEnv) events() int64 {
	e.t.Helper()
	var n int64
	if err := e.store.Pool().QueryRow(context.Background(), `SELECT count(*) FROM `+e.store.Table("projector_events")).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// expect runs the binary and checks its exit code and that its output
// (stdout and stderr) contains each of wants.
func (e *rebuildEnv) expect(code int, args []string, wants ...string) result {
	e.t.Helper()
	r := run(e.t, e.env, args...)
	if r.code != code {
		e.t.Fatalf("%v: exit %d, want %d: %+v", args, r.code, code, r)
	}
	for _, w := range wants {
		if !strings.Contains(r.stdout+r.stderr, w) {
			e.t.Errorf("%v: output lacks %q: %+v", args, w, r)
		}
	}
	return r
}

// The refusals, each with its exit code and nothing recorded: a name no
// dispatcher registered (2, listing those that are), a version none runs
// (2), a projection without declared tables (3), nothing to cancel or
// switch (3), and bad command lines (2).
func TestRebuildCLIRefusals(t *testing.T) {
	t.Parallel()
	e := newRebuildEnv(t)
	d, _ := e.dispatcher("v1", e.app.Workload, e.app.History)
	e.catchUp(d)
	cases := []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"rebuild", "nobody"}, 2, "unknown projection: nobody (registered: agent_workload v1, customer_history v1)"},
		{[]string{"rebuild", "agent_workload", "--version", "7"}, 2, "no dispatcher has run version 7 of agent_workload"},
		{[]string{"rebuild", "customer_history"}, 3, "customer_history declares no read-model tables"},
		{[]string{"rebuild", "cancel", "agent_workload"}, 3, "no rebuild of this projection is in progress: agent_workload"},
		{[]string{"rebuild", "switch", "agent_workload"}, 3, "no rebuild of this projection is in progress: agent_workload"},
		{[]string{"rebuild", "agent_workload", "--in-place", "--hold"}, 3, "an in-place rebuild has no switch to hold"},
		{[]string{"rebuild"}, 2, "rebuild needs the projection's NAME"},
		{[]string{"rebuild", "agent_workload", "--version", "-1"}, 2, "--version -1"},
		{[]string{"rebuild", "agent_workload", "--pickup-timeout", "48h"}, 2, "--pickup-timeout 48h0m0s"},
		{[]string{"rebuild", "agent_workload", "--pickup-timeout", "soon"}, 2, "invalid argument"},
		{[]string{"rebuild", "agent_workload", "--bogus"}, 2, "unknown flag"},
		{[]string{"rebuild", "list", "-o", "yaml"}, 2, `--output "yaml"`},
		{[]string{"rebuild", "cancel"}, 2, "missing NAME"},
		{[]string{"rebuild", "switch", "a", "b"}, 2, "accepts 1 arg"},
		{[]string{"rebuild", "drop-old"}, 2, "missing NAME"},
	}
	for _, c := range cases {
		e.expect(c.code, c.args, c.msg)
	}
	if l := e.list(); len(l) != 0 {
		t.Errorf("a refused request recorded rebuilds: %+v", l)
	}
	if r := e.expect(0, []string{"status", "-o", "json"}); strings.Contains(r.stdout, projection.RebuildInstance) {
		t.Errorf("a refused request left a shadow shard: %s", r.stdout)
	}
	e.wantModel(1)
}

// `rebuild NAME --wait` with version 2 running beside version 1: progress
// as plain lines (stdout is not a terminal), the switch and its lock time;
// the live model is version 2's; `rebuild list` (table and JSON) records
// it; `drop-old` drops the old tables once; an in-place rebuild waits to
// done; a second request while one runs is refused with exit 3.
func TestRebuildCLIWaitListDropOld(t *testing.T) {
	t.Parallel()
	e := newRebuildEnv(t)
	d1, _ := e.dispatcher("v1", e.app.Workload)
	e.catchUp(d1)
	e.wantModel(1)
	e.dispatcher("v2", e.v2())
	total := e.events()

	r := e.expect(0, []string{"rebuild", "agent_workload", "--wait"},
		fmt.Sprintf("rebuild 1 of agent_workload v2 requested (blue-green, %d events in the log)", total),
		"rebuild 1 of agent_workload switched: version 2 is live (switch held the tables",
		"old tables kept in schema "+e.schema+"_rebuild_1_old until `rebuild drop-old agent_workload`")
	if strings.Contains(r.stdout, "\r") {
		t.Errorf("--wait drew a progress bar on a pipe: %q", r.stdout)
	}
	progress := regexp.MustCompile(`(?m)^rebuild agent_workload: (building|switched), (\d+)/(\d+) events \((\d+)%\)$`).FindAllStringSubmatch(r.stdout, -1)
	if len(progress) == 0 || progress[len(progress)-1][2] != fmt.Sprint(total) || progress[len(progress)-1][4] != "100" {
		t.Errorf("--wait printed no plain progress ending at %d/%d events (100%%): %q", total, total, r.stdout)
	}
	e.wantModel(2)

	l := e.list()
	if len(l) != 1 || l[0].Status != "switched" || l[0].Version != 2 || l[0].Mode != "blue-green" || l[0].Progress != 1 ||
		l[0].Total != total || l[0].Done != total || l[0].OldSchema != e.schema+"_rebuild_1_old" || l[0].SwitchMS <= 0 {
		t.Errorf("rebuild list -o json: %+v", l)
	}
	e.expect(0, []string{"rebuild", "list"}, "PROGRESS", "agent_workload", "v2", "blue-green", "switched",
		fmt.Sprintf("100%% (%d/%d)", total, total), e.schema+"_rebuild_1_old")

	e.expect(0, []string{"rebuild", "drop-old", "agent_workload"}, "dropped "+e.schema+"_rebuild_1_old")
	if pgtest.SchemaExists(t, e.schema+"_rebuild_1_old") {
		t.Errorf("drop-old left the old schema")
	}
	e.expect(0, []string{"rebuild", "drop-old", "agent_workload"}, "no old tables of agent_workload to drop")
	if l := e.list(); l[0].OldSchema != "" {
		t.Errorf("after drop-old the rebuild still names old tables: %+v", l[0])
	}
	e.wantModel(2)

	// In place, with version 2 live: cleared, replayed, done.
	e.expect(0, []string{"rebuild", "agent_workload", "--in-place", "--wait"},
		"rebuild 2 of agent_workload v2 requested (in-place", "rebuild 2 of agent_workload done: replayed in place")
	e.wantModel(2)
	if l := e.list(); len(l) != 2 || l[0].Status != "done" || l[0].Mode != "in-place" {
		t.Errorf("after the in-place rebuild: %+v", l)
	}
}

// A rebuild nobody runs yet shows in `status` at 0% on its shadow shard; a
// second request is refused (3); cancel drops it (and a second cancel is
// refused, 3). A held one builds, waits at ready (100%) with version 1
// still live, and switches on `rebuild switch`.
func TestRebuildCLIStatusHoldSwitchCancel(t *testing.T) {
	t.Parallel()
	e := newRebuildEnv(t)
	d1, stop1 := e.dispatcher("v1", e.app.Workload)
	e.catchUp(d1)
	stop1() // nobody runs agent_workload now
	total := e.events()

	e.expect(0, []string{"rebuild", "agent_workload", "--hold"}, "rebuild 1 of agent_workload v1 requested (blue-green", "rebuild list agent_workload")
	r := e.expect(0, []string{"status"}, "__rebuild__ (rebuild 1: v1 shadow)", "__rebuild__ is a blue/green rebuild's shadow shard",
		"REBUILDS IN PROGRESS", fmt.Sprintf("0%% (0/%d events)", total))
	if !regexp.MustCompile(`(?m)^1\s+agent_workload\s+v1\s+blue-green\s+building\s+0% `).MatchString(r.stdout) {
		t.Errorf("status lacks the rebuild's row:\n%s", r.stdout)
	}
	shards := e.statusJSON()
	if s := shards["agent_workload@__rebuild__"]; s.Role != "rebuild-shadow" || s.Rebuild == nil || s.Rebuild.Status != "building" ||
		s.Rebuild.Done != 0 || s.Rebuild.Total != total || s.Rebuild.Progress != 0 {
		t.Errorf("status -o json, shadow shard: %+v", s)
	}
	if s := shards["agent_workload@__shared__"]; s.Role != "shared" || s.Rebuild != nil {
		t.Errorf("status -o json, live shard: %+v", s)
	}

	e.expect(0, []string{"consumer", "status", "agent_workload", "--instance", projection.RebuildInstance}, "shadow shard of a blue/green rebuild")
	e.expect(3, []string{"rebuild", "agent_workload"}, "a rebuild of this projection is in progress: agent_workload")
	e.expect(0, []string{"rebuild", "cancel", "agent_workload"}, "rebuild of agent_workload: cancel done")
	if pgtest.SchemaExists(t, e.schema+"_rebuild_1") {
		t.Errorf("cancel left the shadow schema")
	}
	if l := e.list(); len(l) != 1 || l[0].Status != "cancelled" {
		t.Errorf("after cancel: %+v", l)
	}
	if r := e.expect(0, []string{"status"}); strings.Contains(r.stdout, "__rebuild__") || strings.Contains(r.stdout, "REBUILDS") {
		t.Errorf("status after cancel still shows the rebuild:\n%s", r.stdout)
	}
	e.expect(3, []string{"rebuild", "cancel", "agent_workload"}, "no rebuild of this projection is in progress")
	e.wantModel(1)

	// Version 1 serves again, version 2 deploys; a held rebuild waits.
	e.dispatcher("v1-again", e.app.Workload)
	e.dispatcher("v2", e.v2())
	e.expect(0, []string{"rebuild", "agent_workload", "--hold"}, "of agent_workload v2 requested") // ids: the refused request used one
	ready := e.until("ready")
	if ready.Progress != 1 || ready.Done != total {
		t.Errorf("ready: %+v", ready)
	}
	e.expect(0, []string{"status"}, "ready (held: rebuild switch agent_workload)", fmt.Sprintf("100%% (%d/%d events)", total, total))
	e.wantModel(1)
	e.expect(0, []string{"rebuild", "switch", "agent_workload"}, "rebuild of agent_workload: switch released; the dispatcher building it switches once it has caught up")
	e.until("switched")
	e.wantModel(2)
	e.expect(3, []string{"rebuild", "switch", "agent_workload"}, "no rebuild of this projection is in progress")
}

// statusJSON returns `status -o json` by consumer@instance.
func (e *rebuildEnv) statusJSON() map[string]statusShard {
	e.t.Helper()
	r := e.expect(0, []string{"status", "-o", "json"})
	var status struct {
		Shards []statusShard `json:"shards"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &status); err != nil {
		e.t.Fatalf("status -o json: %v\n%s", err, r.stdout)
	}
	out := map[string]statusShard{}
	for _, s := range status.Shards {
		out[s.Consumer+"@"+s.Instance] = s
	}
	return out
}

type statusShard struct {
	Consumer string `json:"consumer"`
	Instance string `json:"instance_id"`
	Role     string `json:"role"`
	Rebuild  *struct {
		ID       int64   `json:"id"`
		Version  int     `json:"version"`
		Status   string  `json:"status"`
		Progress float64 `json:"progress"`
		Done     int64   `json:"events_done"`
		Total    int64   `json:"events_total"`
	} `json:"rebuild"`
}

// `--wait` on a request no dispatcher picks up says so on standard error
// after --pickup-timeout, with what to do, and keeps following: once a
// dispatcher of the version starts, the rebuild runs and the command ends
// with the switch.
func TestRebuildCLIWaitWarnsWhenNobodyPicksUp(t *testing.T) {
	t.Parallel()
	e := newRebuildEnv(t)
	d1, stop1 := e.dispatcher("v1", e.app.Workload)
	e.catchUp(d1)
	stop1()

	cmd := exec.Command(binary, "rebuild", "agent_workload", "--wait", "--pickup-timeout", "1s")
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, e.env...)
	var stdout strings.Builder
	cmd.Stdout = &stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	pgtest.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	warned := make(chan string, 1)
	var rest strings.Builder
	go func() {
		lines := bufio.NewScanner(stderr)
		for lines.Scan() {
			if strings.Contains(lines.Text(), "no dispatcher has started rebuild") {
				warned <- lines.Text()
			} else {
				fmt.Fprintln(&rest, lines.Text())
			}
		}
		close(warned)
	}()
	select {
	case w, ok := <-warned:
		if !ok {
			t.Fatalf("--wait ended without warning: %s %s", stdout.String(), rest.String())
		}
		for _, want := range []string{"within 1s", "is a dispatcher with that version running", "rebuild cancel agent_workload"} {
			if !strings.Contains(w, want) {
				t.Errorf("warning %q lacks %q", w, want)
			}
		}
	case <-time.After(time.Minute):
		t.Fatal("no warning within a minute of a 1s pickup timeout")
	}
	e.dispatcher("v1-again", e.app.Workload)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil || !strings.Contains(stdout.String(), "rebuild 1 of agent_workload switched: version 1 is live") {
			t.Fatalf("--wait after a dispatcher came: %v\n%s", err, stdout.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("--wait did not end after a dispatcher came: %s", stdout.String())
	}
	e.wantModel(1)
}
