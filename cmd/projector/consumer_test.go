package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// status shows whether a live dispatcher holds each shard; prune's advice
// follows from it; `consumer remove` unregisters a consumer only when no
// dispatcher runs it; an unknown consumer is a usage error that lists the
// registered ones.
func TestStatusDispatcherPruneAdviceAndRemove(t *testing.T) {
	t.Parallel()
	o := newOpsEnv(t)
	ctx := context.Background()
	exec := func(sql string) {
		t.Helper()
		if _, err := o.store.Pool().Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	consumers, instances := o.store.Table("projector_consumers"), o.store.Table("projector_instances")
	exec(`INSERT INTO ` + consumers + ` (name, instance_id, status) VALUES ('agent_workload', '__shared__', 'idle'),
		('welcome_mail', '__shared__', 'disabled'), ('live_counter', 'pod-gone', 'idle')`)
	exec(`INSERT INTO ` + instances + ` (instance_id, consumers) VALUES ('pod-1', '{agent_workload}')`)
	exec(`INSERT INTO ` + instances + ` (instance_id, consumers, last_seen_at) VALUES ('pod-gone', '{live_counter}', now() - interval '3 days')`)

	r := run(t, o.env, "status")
	if r.code != 0 {
		t.Fatalf("status: %+v", r)
	}
	for line := range strings.Lines(r.stdout) {
		if strings.HasSuffix(strings.TrimSuffix(line, "\n"), " ") {
			t.Errorf("status line ends in blanks: %q", line)
		}
	}
	rows := map[string]string{}
	for line := range strings.Lines(r.stdout) {
		if f := strings.Fields(line); len(f) > 3 {
			rows[f[0]] = strings.Join(f[3:], " ")
		}
	}
	if !strings.Contains(r.stdout, "DISPATCHER") || !strings.HasPrefix(rows["agent_workload"], "live") ||
		!strings.HasPrefix(rows["welcome_mail"], "none") || !strings.HasPrefix(rows["live_counter"], "stale (seen 3d ago)") {
		t.Fatalf("status dispatcher column:\n%s", r.stdout)
	}
	r = run(t, o.env, "status", "-o", "json")
	var shards []struct {
		Consumer, Dispatcher string
	}
	if err := unmarshalStatusShards(r.stdout, &shards); err != nil || len(shards) != 3 {
		t.Fatalf("status -o json: %v\n%s", err, r.stdout)
	}
	for _, s := range shards {
		if s.Consumer == "live_counter" && s.Dispatcher != "stale" {
			t.Errorf("json dispatcher of the expired shard: %q", s.Dispatcher)
		}
	}

	// Held back by a shard a live dispatcher runs: wait. By one nobody
	// runs: start a dispatcher or remove it. The stale shard holds nothing.
	r = run(t, o.env, "events", "prune", "--older-than", "1ms", "--dry-run")
	if !strings.Contains(r.stdout, "consumer agent_workload (instance __shared__, idle, dispatcher live)") || !strings.Contains(r.stdout, "A live dispatcher is applying it") {
		t.Errorf("advice for a live consumer: %+v", r)
	}
	r = run(t, o.env, "consumer", "remove", "agent_workload")
	if r.code != 3 || !strings.Contains(r.stderr, "agent_workload has a live dispatcher") {
		t.Errorf("remove while a dispatcher runs it: %+v", r)
	}
	exec(`UPDATE ` + instances + ` SET stopped_at = now() WHERE instance_id = 'pod-1'`)
	r = run(t, o.env, "events", "prune", "--older-than", "1ms", "--dry-run")
	if !strings.Contains(r.stdout, "dispatcher none") || !strings.Contains(r.stdout, "No live dispatcher runs it") ||
		!strings.Contains(r.stdout, "consumer remove agent_workload") {
		t.Errorf("advice for an unattended consumer: %+v", r)
	}
	r = run(t, o.env, "consumer", "remove", "agent_workload")
	if r.code != 0 || !strings.Contains(r.stdout, "removed consumer agent_workload: 1 shards") {
		t.Fatalf("remove: %+v", r)
	}

	// Unknown names anywhere under `consumer` exit 2 and list what exists.
	for _, args := range [][]string{
		{"consumer", "remove", "agent_workload"},
		{"consumer", "restart", "nobody"},
		{"consumer", "status", "nobody"},
		{"consumer", "disable", "nobody"},
	} {
		r := run(t, o.env, args...)
		if r.code != 2 || !strings.Contains(r.stderr, "not found; registered consumers: live_counter, welcome_mail") {
			t.Errorf("%v: %+v", args, r)
		}
	}
	r = run(t, o.env, "consumer", "status", "live_counter")
	if r.code != 2 || !strings.Contains(r.stderr, "has shards for instances: pod-gone") {
		t.Errorf("wrong instance: %+v", r)
	}
}

// `status --watch` refreshes until interrupted, and refuses an interval out
// of range; so does `run --instance-expiry`.
func TestStatusWatch(t *testing.T) {
	t.Parallel()
	o := newOpsEnv(t)
	for _, bad := range []string{"10ms", "2h", "-1s", "soon"} {
		if r := run(t, o.env, "status", "--watch", bad); r.code != 2 {
			t.Errorf("--watch %s: exit %d, want 2 (%s)", bad, r.code, r.stderr)
		}
	}
	for _, bad := range []string{"1s", "-24h", "400d"} {
		if r := run(t, o.env, "run", "--instance-expiry", bad); r.code != 2 || !strings.Contains(r.stderr, "--instance-expiry") {
			t.Errorf("run --instance-expiry %s: exit %d, want 2 (%s)", bad, r.code, r.stderr)
		}
	}
	cmd := exec.Command(binary, "status", "--watch", "500ms")
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, o.env...)
	var out syncBuf
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for strings.Count(out.String(), "Ctrl-C stops") < 2 {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatalf("no second refresh: %q", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("status --watch after Ctrl-C: %v", err)
	}
}

// syncBuf is a bytes.Buffer safe to read while a process writes it.
type syncBuf struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// unmarshalStatusShards decodes the "shards" of `status -o json` (an
// object since the horizon joined the shards) into shards.
func unmarshalStatusShards(out string, shards any) error {
	var status struct {
		Shards json.RawMessage `json:"shards"`
	}
	if err := json.Unmarshal([]byte(out), &status); err != nil {
		return err
	}
	if status.Shards == nil {
		return errors.New(`status -o json has no "shards"`)
	}
	return json.Unmarshal(status.Shards, shards)
}
