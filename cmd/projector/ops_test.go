package main_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/examples/helpdesk"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/stores/postgres"
)

// opsEnv is a migrated schema with some helpdesk events, and the
// environment that points the binary at it.
type opsEnv struct {
	t      *testing.T
	schema string
	env    []string
	store  *postgres.Store
}

func newOpsEnv(t *testing.T) *opsEnv {
	t.Helper()
	types, err := helpdesk.Define(projector.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	// The binary wires the helpdesk's inline projection and records it in
	// the schema, so the store standing in for the application runs it too:
	// a store without it would be refused the ticket events it covers.
	ctx, schema := context.Background(), pgtest.Schema(t)
	app, err := helpdesk.NewApp(types, schema, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := app.Migrate(ctx, pgtest.Pool(t)); err != nil {
		t.Fatal(err)
	}
	store, err := postgres.New(ctx, pgtest.Pool(t), postgres.Config{Schema: schema, Registry: types.Registry,
		Inline: app.Inline(), Ephemeral: helpdesk.Ephemeral})
	if err != nil {
		t.Fatal(err)
	}
	o := &opsEnv{t: t, schema: store.Schema(), store: store,
		env: []string{"PROJECTOR_DATABASE_URL=" + pgtest.URL(t), "PROJECTOR_SCHEMA=" + store.Schema(), "PROJECTOR_EXAMPLE=1"}}
	o.append(projector.Stream(helpdesk.CustomerStream, "ada"), helpdesk.CustomerRegistered{Name: "ada", Email: "ada@example.com"})
	o.append(projector.Stream(helpdesk.TicketStream, "T-1"), helpdesk.TicketOpened{Customer: "ada", Subject: "printer"},
		helpdesk.TicketAssigned{Agent: "alice"}, helpdesk.TicketClosed{Resolution: "fixed"})
	o.append(projector.Stream(helpdesk.SessionStream, "alice"), helpdesk.AgentPinged{Agent: "alice"}, helpdesk.AgentPinged{Agent: "alice"})
	return o
}

func (o *opsEnv) append(stream projector.StreamRef, payloads ...any) {
	o.t.Helper()
	ctx := context.Background()
	if err := pgx.BeginFunc(ctx, o.store.Pool(), func(tx pgx.Tx) error {
		_, err := o.store.Append(ctx, tx, stream, projector.AnyVersion, payloads...)
		return err
	}); err != nil {
		o.t.Fatal(err)
	}
}

// startRun starts `projector run` (with extra flags) and returns the
// process and the address it serves HTTP on.
func (o *opsEnv) startRun(extra ...string) (*exec.Cmd, string, *strings.Builder) {
	o.t.Helper()
	cmd := exec.Command(binary, append([]string{"run", "--http-addr", "127.0.0.1:0", "--instance-id", "test-1"}, extra...)...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, o.env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		o.t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	pgtest.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		o.t.Fatal(err)
	}
	o.t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	lines := bufio.NewScanner(stdout)
	addrRe := regexp.MustCompile(`metrics on http://([^/]+)/metrics`)
	out := &strings.Builder{}
	for lines.Scan() {
		fmt.Fprintln(out, lines.Text())
		if m := addrRe.FindStringSubmatch(lines.Text()); m != nil {
			go func() { // keep draining: welcome mails go to stdout
				for lines.Scan() {
					fmt.Fprintln(out, lines.Text())
				}
			}()
			return cmd, m[1], out
		}
	}
	o.t.Fatalf("run exited before serving: %s\n%s", out, stderr.String())
	return nil, "", nil
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// `run` dispatches the binary's projections, serves metrics and health, and
// stops cleanly on SIGTERM; `status` shows the shards it registered.
func TestRunStatusAndGracefulStop(t *testing.T) {
	t.Parallel()
	o := newOpsEnv(t)
	r := run(t, o.env, "status")
	if r.code != 0 || !strings.Contains(r.stdout, "no consumers registered yet") {
		t.Fatalf("status before run: %+v", r)
	}
	cmd, addr, _ := o.startRun()
	if code, body := get(t, "http://"+addr+"/healthz"); code != 200 || !strings.Contains(body, "ok") {
		t.Fatalf("healthz: %d %q", code, body)
	}
	if code, _ := get(t, "http://"+addr+"/readyz"); code != 200 {
		t.Fatalf("readyz: %d", code)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		r = run(t, o.env, "status", "-o", "json")
		var shards []struct {
			Consumer  string `json:"consumer"`
			Status    string `json:"status"`
			LagEvents int64  `json:"lag_events"`
			Processed int64  `json:"processed"`
		}
		if r.code != 0 {
			t.Fatalf("status -o json: %+v", r)
		}
		if err := unmarshalStatusShards(r.stdout, &shards); err != nil {
			t.Fatalf("status -o json is not JSON: %v\n%s", err, r.stdout)
		}
		// agent_workload, customer_history, welcome_mail, live_counter, ticket_search, the SLA saga
		// ticket_sla, and console_tail, the console's live tail
		caught := len(shards) == 7
		for _, s := range shards {
			caught = caught && s.LagEvents == 0 && s.Status == "idle"
		}
		if caught {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumers did not catch up: %s", r.stdout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	_, metrics := get(t, "http://"+addr+"/metrics")
	for _, want := range []string{`projector_events_processed_total{consumer="agent_workload",instance_id="__shared__"} 2`, "projector_horizon_age_seconds", "go_goroutines"} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	// The console is served next to the metrics, read-only without a
	// token, with the sagas the binary runs; / leads to it.
	if code, page := get(t, "http://"+addr+"/console/"); code != 200 || !strings.Contains(page, "read-only") ||
		!strings.Contains(page, `data-consumer="agent_workload"`) || !strings.Contains(page, "ticket_sla") || strings.Contains(page, `class="act"`) || !strings.Contains(page, `id="tail-panel"`) {
		t.Errorf("console: %d, want the read-only dashboard with the consumers, the saga and the live tail", code)
	}
	if code, _ := get(t, "http://"+addr+"/"); code != 200 {
		t.Errorf("/ does not lead to the console: %d", code)
	}
	// Its live tail is an SSE stream of the live feed.
	tailCtx, cancelTail := context.WithTimeout(context.Background(), 10*time.Second)
	req, _ := http.NewRequestWithContext(tailCtx, http.MethodGet, "http://"+addr+"/console/tail", nil)
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Errorf("console tail: %v", err)
	} else {
		first, _ := bufio.NewReader(resp.Body).ReadString('\n')
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" || !strings.HasPrefix(first, ": projector live feed") {
			t.Errorf("console tail: %d %s %q, want an SSE stream", resp.StatusCode, resp.Header.Get("Content-Type"), first)
		}
		resp.Body.Close()
	}
	cancelTail()
	r = run(t, o.env, "status")
	for _, want := range []string{"CONSUMER", "agent_workload", "live_counter", "test-1", "idle"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status table lacks %q:\n%s", want, r.stdout)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("run after SIGTERM: %v", err)
	}
}

// Every guarded transition refuses with exit code 3 and a message that says
// the current state and what would be allowed; allowed ones succeed.
func TestConsumerTransitions(t *testing.T) {
	t.Parallel()
	o := newOpsEnv(t)
	if _, err := o.store.Pool().Exec(context.Background(), `INSERT INTO `+o.store.Table("projector_consumers")+` (name, instance_id) VALUES ('agent_workload', '__shared__')`); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"consumer", "restart", "agent_workload"}, 3, "it is idle; restart is allowed only from dead"},
		{[]string{"consumer", "skip", "agent_workload"}, 3, "it is idle; skip is allowed only from dead or processing"},
		{[]string{"consumer", "enable", "agent_workload"}, 3, "it is idle; enable is allowed only from disabled"},
		{[]string{"consumer", "disable", "agent_workload"}, 0, "now disabled"},
		{[]string{"consumer", "disable", "agent_workload"}, 3, "it is disabled; disable is allowed only from idle or processing or dead"},
		{[]string{"consumer", "enable", "agent_workload"}, 0, "now idle"},
		{[]string{"consumer", "status", "agent_workload"}, 0, "status"},
		{[]string{"consumer", "restart", "nobody"}, 2, "not found; registered consumers: agent_workload"},
		{[]string{"consumer", "restart"}, 2, "missing NAME"},
		{[]string{"consumer", "status", "agent_workload", "--instance", "elsewhere"}, 2, "has shards for instances: __shared__"},
	}
	for _, s := range steps {
		r := run(t, o.env, s.args...)
		out := r.stdout + r.stderr
		if r.code != s.code || !strings.Contains(out, s.msg) {
			t.Errorf("%v: exit %d, want %d; output %q lacks %q", s.args, r.code, s.code, out, s.msg)
		}
	}
}

func TestEventsPruneAndTail(t *testing.T) {
	t.Parallel()
	o := newOpsEnv(t)
	r := run(t, o.env, "events", "prune", "--older-than", "1ms", "--dry-run")
	if r.code != 0 || !strings.Contains(r.stdout, "would delete 2 events of stream types session") {
		t.Fatalf("dry run: %+v", r)
	}
	// A consumer that has passed nothing holds everything back, and prune
	// says so and what to do.
	if _, err := o.store.Pool().Exec(context.Background(), `INSERT INTO `+o.store.Table("projector_consumers")+` (name, instance_id) VALUES ('agent_workload', '__shared__')`); err != nil {
		t.Fatal(err)
	}
	r = run(t, o.env, "events", "prune", "--older-than", "1ms")
	if r.code != 0 || !strings.Contains(r.stdout, "deleted 0 events") || !strings.Contains(r.stdout, "held back 2 events: consumer agent_workload") ||
		!strings.Contains(r.stdout, "consumer disable agent_workload") {
		t.Fatalf("held-back prune: %+v", r)
	}
	if r := run(t, o.env, "consumer", "disable", "agent_workload"); r.code != 0 {
		t.Fatalf("disable: %+v", r)
	}
	r = run(t, o.env, "events", "prune", "--older-than", "1ms")
	if r.code != 0 || !strings.Contains(r.stdout, "deleted 2 events of stream types session") {
		t.Fatalf("prune: %+v", r)
	}
	for _, bad := range [][]string{{"events", "prune"}, {"events", "prune", "--older-than", "soon"}, {"events", "prune", "--older-than", "-5d"}} {
		if r := run(t, o.env, bad...); r.code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", bad, r.code, r.stderr)
		}
	}

	r = run(t, o.env, "events", "tail", "--from-start", "--type", "ticket.opened", "--type", "ticket.closed", "--limit", "2")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 2 || !strings.Contains(lines[0], "ticket.opened") || !strings.Contains(lines[1], "ticket.closed") ||
		!strings.Contains(lines[0], "__system__/ticket/T-1 v1") || !strings.Contains(lines[0], `"subject": "printer"`) {
		t.Fatalf("tail: %+v", r)
	}

	// Following: events appended after tail started arrive.
	cmd := exec.Command(binary, "events", "tail", "--limit", "1", "--type", "ticket.commented")
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, o.env...)
	var out strings.Builder
	cmd.Stdout = &out
	pgtest.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.After(time.Minute)
	for {
		// Keep appending until the running tail has seen one: it may not
		// have read its starting horizon when the first lands.
		o.append(projector.Stream(helpdesk.TicketStream, "T-1"), helpdesk.TicketCommented{Author: "ada", Body: "still broken"})
		select {
		case err := <-done:
			if err != nil || !strings.Contains(out.String(), "still broken") {
				t.Fatalf("tail follow: %v %q", err, out.String())
			}
			return
		case <-deadline:
			_ = cmd.Process.Kill()
			t.Fatal("tail never printed the appended event")
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// The demo, pointed at the test database, runs end to end and prints every
// read model.
func TestDemoCommand(t *testing.T) {
	t.Parallel()
	schema := fmt.Sprintf("pt_%d_demo%d", time.Now().Unix(), time.Now().UnixNano()%1e9) // new: the demo creates it
	t.Cleanup(func() {
		_, _ = pgtest.Pool(t).Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
	})
	r := run(t, []string{"PROJECTOR_DATABASE_URL=" + pgtest.URL(t)}, "demo", "--demo-schema", schema, "--users", "4", "--actions", "50")
	if r.code != 0 {
		t.Fatalf("demo: %+v", r)
	}
	for _, want := range []string{"using the database from", "consumers caught up", "== Tickets", "== Agent workload", "== Customer history",
		"== Live counter", "== Time travel", "== Welcome mails", "== Consumers", "== Retention", "== Rebuild", "switched: version 2 is live"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
}
