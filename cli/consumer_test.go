package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

func TestHumanDurations(t *testing.T) {
	cases := []struct {
		in   time.Duration
		want string
	}{
		{1234567 * time.Microsecond, "1s"},
		{350 * time.Millisecond, "350ms"},
		{10*time.Minute + 54*time.Second + 321*time.Millisecond, "10m54s"},
		{10 * time.Minute, "10m"},
		{2*time.Hour + 5*time.Minute + 7*time.Second, "2h5m"},
		{2 * time.Hour, "2h"},
		{50*time.Hour + 20*time.Minute, "2d2h"},
		{72 * time.Hour, "3d"},
	}
	for _, c := range cases {
		if got := human(c.in); got != c.want {
			t.Errorf("human(%v) = %q, want %q", c.in, got, c.want)
		}
	}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		at   time.Time
		want string
	}{
		{now.Add(-2*time.Hour - 10*time.Minute), "2h ago"},
		{now.Add(-90 * time.Second), "1m ago"},
		{now.Add(-49 * time.Hour), "2d ago"},
		{now.Add(5 * time.Second), "in 5s"},
		{now, "just now"},
	} {
		if got := ago(c.at, now); got != c.want {
			t.Errorf("ago(%v) = %q, want %q", now.Sub(c.at), got, c.want)
		}
	}
	if got := timestamp(now.Add(-2*time.Hour), now); !strings.Contains(got, "(2h ago)") || !strings.ContainsAny(got[len("2026-11-30T10:00:00"):], "Z+-") {
		t.Errorf("timestamp without zone or age: %q", got)
	}
}

// Tables end their lines where their text ends, show whether a dispatcher
// runs each shard, and print cursors one way.
func TestStatusTable(t *testing.T) {
	now := time.Now()
	shards := []projection.ShardState{
		{ShardID: projection.ShardID{Consumer: "a", Instance: projection.SharedInstance}, Status: projection.StatusIdle,
			Cursor: projector.Horizon(10), Dispatcher: projection.DispatcherLive, LastSeen: now},
		{ShardID: projection.ShardID{Consumer: "b", Instance: "pod-1"}, Status: projection.StatusDead, Cursor: projector.Position{TxID: 7, Seq: 3},
			Dispatcher: projection.DispatcherStale, LastSeen: now.Add(-50 * time.Hour), LagSeconds: 654.3, LagEvents: 3, Attempts: 2, LastError: "boom"},
	}
	var buf bytes.Buffer
	if err := WriteStatus(&buf, shards, false); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for line := range strings.Lines(out) {
		if strings.HasSuffix(strings.TrimSuffix(line, "\n"), " ") {
			t.Errorf("trailing blanks: %q", line)
		}
	}
	for _, want := range []string{"DISPATCHER", "live", "stale (seen 2d ago)", "9/max", "7/3", "10m54s"} {
		if !strings.Contains(out, want) {
			t.Errorf("status table lacks %q:\n%s", want, out)
		}
	}
	buf.Reset()
	if err := WriteStatus(&buf, shards, true); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"cursor": "9/max"`, `"dispatcher": "stale"`, `"last_seen_at"`} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("status JSON lacks %s:\n%s", want, buf.String())
		}
	}
}

// Prune's advice names the fix that fits: wait for a live dispatcher,
// start or remove an unattended consumer, act on a dead one.
func TestPruneAdvice(t *testing.T) {
	res := func(status, disp string) postgres.PruneResult {
		return postgres.PruneResult{HeldBack: 5, Blocker: &postgres.PruneBlocker{Consumer: "mailer", Instance: projection.SharedInstance,
			Status: status, Dispatcher: disp, Cursor: projector.Horizon(4), Behind: 9}}
	}
	cases := []struct {
		res       postgres.PruneResult
		want, not string
	}{
		{res("idle", "live"), "A live dispatcher is applying it", "consumer remove"},
		{res("processing", "none"), "No live dispatcher runs it: start one", "skip"},
		{res("idle", "none"), "`projector consumer remove mailer`", "live dispatcher is"},
		{res("dead", "live"), "`projector consumer restart mailer`", "consumer remove"},
	}
	for _, c := range cases {
		got := PruneAdvice("projector", c.res)
		if !strings.Contains(got, c.want) || strings.Contains(got, c.not) || !strings.Contains(got, "3/max") {
			t.Errorf("%s/%s: advice %q; want %q, not %q", c.res.Blocker.Status, c.res.Blocker.Dispatcher, got, c.want, c.not)
		}
	}
	if got := PruneAdvice("projector", postgres.PruneResult{}); got != "" {
		t.Errorf("advice with nothing held back: %q", got)
	}
}

// A partition holding retention or archiving back is named the way the
// consumer commands take it (--partition P/N), and the advice for one no
// dispatcher runs is to start a dispatcher of its consumer or remove the
// whole consumer: never `consumer remove NAME --instance __partition__…`,
// which would cut one partition's streams out of the consumer (the newcomer
// pass was told exactly that by `streams archive` with its dispatchers
// stopped).
func TestAdviceNamesAPartitionByPartition(t *testing.T) {
	inst := projection.PartitionInstance(3, 4)
	prune := PruneAdvice("projector", postgres.PruneResult{HeldBack: 5, Blocker: &postgres.PruneBlocker{Consumer: "orders", Instance: inst,
		Status: "idle", Dispatcher: "none", Cursor: projector.Horizon(4), Behind: 9}})
	archive := archiveAdvice("projector", []projection.ShardState{{ShardID: projection.ShardID{Consumer: "orders", Instance: inst},
		Status: projection.StatusIdle, Dispatcher: projection.DispatcherNone, Cursor: projector.Horizon(4), LagEvents: 9, Partition: 3, Partitions: 4}}, 0, 0)
	for what, got := range map[string]string{"prune": prune, "archive": archive} {
		for _, want := range []string{"`projector consumer remove orders`", "`projector consumer disable orders --partition 3/4`"} {
			if !strings.Contains(got, want) {
				t.Errorf("%s advice %q: want %q", what, got, want)
			}
		}
		if strings.Contains(got, "--instance") {
			t.Errorf("%s advice %q: names the partition with --instance", what, got)
		}
	}
	dead := archiveAdvice("projector", []projection.ShardState{{ShardID: projection.ShardID{Consumer: "orders", Instance: inst},
		Status: projection.StatusDead, Dispatcher: projection.DispatcherLive, Partition: 3, Partitions: 4}}, 0, 0)
	if !strings.Contains(dead, "`projector consumer restart orders --partition 3/4`") {
		t.Errorf("archive advice for a dead partition %q: want restart --partition 3/4", dead)
	}
}
