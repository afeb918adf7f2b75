package cli

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// registeredPartitions returns a store on which a dispatcher (instance id
// instance) registered the consumers named, each handling ticket.opened
// with nothing: the first with cfg, the others unpartitioned.
func registeredPartitions(t *testing.T, instance string, cfg projection.AsyncConfig, names ...string) (testevents.Types, *postgres.Store) {
	t.Helper()
	types := testevents.New()
	store := pgtest.Store(t, types.Registry)
	ctx := context.Background()
	if err := store.CreatePartitionIndex(ctx); err != nil {
		t.Fatal(err)
	}
	var projections []*projection.Async
	for i, name := range names {
		c := projection.AsyncConfig{}
		if i == 0 {
			c = cfg
		}
		p := projection.NewAsync(name, c)
		if err := projection.OnEvent(p, types.Opened, func(context.Context, pgx.Tx, projector.Event) error { return nil }); err != nil {
			t.Fatal(err)
		}
		projections = append(projections, p)
	}
	d, err := projection.New(projection.Config{Store: store, Projections: projections, InstanceID: instance})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	return types, store
}

// Partitions show under their consumer (cursor, lag, owner); consumer
// commands take a range-checked --partition (exit 2 outside it); restart
// without it acts on the dead partitions only; the fence row refuses
// transitions.
func TestConsumerPartitions(t *testing.T) {
	t.Parallel()
	types, store := registeredPartitions(t, "cli-test", projection.AsyncConfig{Partitions: 4}, "parts")
	ctx := context.Background()
	if _, err := store.Pool().Exec(ctx, `UPDATE `+store.Table("projector_consumers")+` SET status = 'dead', attempts = 3 WHERE name = 'parts' AND instance_id = $1`,
		projection.PartitionInstance(2, 4)); err != nil {
		t.Fatal(err)
	}
	run := func(want int, args ...string) string {
		t.Helper()
		out, code := runIn(t, store.Schema(), types.Registry, args...)
		if code != want {
			t.Fatalf("%v: exit %d, want %d:\n%s", args, code, want, out)
		}
		return out
	}
	out := run(0, "status")
	for _, want := range []string{"partition 0/4", "partition 3/4", "(partitioned: fence)"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	if i0, i3 := strings.Index(out, "partition 0/4"), strings.Index(out, "partition 3/4"); i0 > i3 {
		t.Errorf("partitions out of order:\n%s", out)
	}
	checkFenceShown(t, run, out)
	run(2, "consumer", "status", "parts", "--partition", "4")
	run(2, "consumer", "status", "parts", "--partition", "-1")
	run(2, "consumer", "status", "parts", "--partition", "x")
	run(2, "consumer", "status", "parts", "--partition", "1", "--instance", "a")
	if out := run(0, "consumer", "status", "parts", "--partition", "1"); !strings.Contains(out, "1 of 4") {
		t.Errorf("consumer status --partition 1:\n%s", out)
	}
	if out := run(0, "consumer", "status", "parts", "--partition", "1", "-o", "json"); !strings.Contains(out, `"partition": 1`) {
		t.Errorf("consumer status -o json:\n%s", out)
	}
	if out := run(0, "consumer", "restart", "parts"); !strings.Contains(out, "partition 2/4") || strings.Contains(out, "partition 1/4") {
		t.Errorf("restart without --partition restarted:\n%s", out)
	}
	run(3, "consumer", "restart", "parts")
	run(3, "consumer", "enable", "parts")
	run(3, "consumer", "restart", "parts", "--partition", "0")
	run(0, "consumer", "disable", "parts", "--partition", "0")
	run(0, "consumer", "enable", "parts", "--partition", "0")
}

// `consumer split` and `merge`: live layout changes from the command line,
// with --partition as P/N once sizes are mixed, range-checked numbers
// (exit 2), and a refusal (exit 3) for what cannot change.
func TestConsumerSplitMerge(t *testing.T) {
	t.Parallel()
	types, store := registeredPartitions(t, "cli-split", projection.AsyncConfig{Partitions: 2}, "parts", "plain")
	ctx := context.Background()
	run := func(want int, args ...string) string {
		t.Helper()
		out, code := runIn(t, store.Schema(), types.Registry, args...)
		if code != want {
			t.Fatalf("%v: exit %d, want %d:\n%s", args, code, want, out)
		}
		return out
	}
	if out := run(0, "consumer", "split", "parts", "--partition", "1"); !strings.Contains(out, "1/2 -> 2/4 3/4") {
		t.Errorf("split --partition 1:\n%s", out)
	}
	run(2, "consumer", "split", "parts", "--partition", "0")   // sizes are mixed now: P/N
	run(2, "consumer", "split", "parts", "--partition", "1/2") // split already
	run(2, "consumer", "split", "parts", "--partition", "0/3")
	run(2, "consumer", "split", "parts", "--partition", "0/128")
	run(2, "consumer", "split", "parts", "--partition", "9/4")
	run(2, "consumer", "split", "parts", "--instance", "a")
	run(2, "consumer", "split", "plain")
	run(2, "consumer", "split", "nosuch")
	run(2, "consumer", "merge", "parts", "--wait", "0s")
	run(2, "consumer", "merge", "parts", "--wait", "2h")
	out := run(0, "status")
	for _, want := range []string{"partition 0/2", "partition 2/4", "partition 3/4"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	if out := run(0, "consumer", "status", "parts", "--partition", "3/4"); !strings.Contains(out, "3 of 4") {
		t.Errorf("consumer status --partition 3/4:\n%s", out)
	}
	run(0, "consumer", "disable", "parts", "--partition", "0/2")
	run(3, "consumer", "merge", "parts", "--partition", "0/2") // no sibling 1/2
	run(0, "consumer", "enable", "parts", "--partition", "0/2")
	// A merge killed after it set its holds: status shows them, a split of
	// a held partition is refused, and merging again finishes it.
	if _, err := store.Pool().Exec(ctx, `UPDATE `+store.Table("projector_consumers")+` SET hold_tx_id = cursor_tx_id, hold_seq = cursor_seq
		WHERE name = 'parts' AND instance_id = ANY($1)`, []string{projection.PartitionInstance(2, 4), projection.PartitionInstance(3, 4)}); err != nil {
		t.Fatal(err)
	}
	if out := run(0, "status"); !strings.Contains(out, "partition 2/4 (owner none, held at") {
		t.Errorf("status does not show the hold:\n%s", out)
	}
	if out := run(0, "consumer", "status", "parts", "--partition", "3/4", "-o", "json"); !strings.Contains(out, `"hold":`) {
		t.Errorf("consumer status -o json does not show the hold:\n%s", out)
	}
	run(3, "consumer", "split", "parts", "--partition", "2/4")
	if out := run(0, "consumer", "merge", "parts"); !strings.Contains(out, "2/4 3/4 -> 1/2") {
		t.Errorf("merge:\n%s", out)
	}
	if out := run(0, "consumer", "split", "parts"); !strings.Contains(out, "0/2 -> 0/4 1/4") || !strings.Contains(out, "1/2 -> 2/4 3/4") {
		t.Errorf("split of every partition:\n%s", out)
	}
}

// A hot partition (one stream far busier than the rest) shows as skew: its
// rate and its share of the recent events over an even share, marked HOT
// in `status` and `consumer status`, and in -o json; the others are not.
func TestStatusShowsHotPartition(t *testing.T) {
	t.Parallel()
	types, store := registeredPartitions(t, "skew-test", projection.AsyncConfig{Partitions: 4}, "skewed")
	ctx := context.Background()
	hot := make([]any, 300)
	for i := range hot {
		hot[i] = testevents.TicketCommented{Body: "busy"}
	}
	if err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		if _, err := store.Append(ctx, tx, projector.Stream("ticket", "hot"), projector.NoStream, hot...); err != nil {
			return err
		}
		for i := range 40 {
			if _, err := store.Append(ctx, tx, projector.Stream("ticket", "calm-"+strconv.Itoa(i)), projector.NoStream,
				testevents.TicketOpened{Title: "t"}, testevents.TicketCommented{Body: "c"}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var bucket int
	if err := store.Pool().QueryRow(ctx, `SELECT `+store.Schema()+`.projector_stream_bucket(tenant_id, stream_type, stream_id) FROM `+
		store.Table("projector_events")+` WHERE stream_id = 'hot' LIMIT 1`).Scan(&bucket); err != nil {
		t.Fatal(err)
	}
	hotPart := bucket / 16

	shards, err := projection.NewAdmin(store).List(ctx, "skewed")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range shards {
		switch {
		case s.Partitions == 0:
		case s.Partition == hotPart && (s.Skew < projection.HotSkew || s.InRate <= 0 || !s.Hot()):
			t.Errorf("hot partition %d: in %.1f/s, skew %.2f, hot %v; want skew ≥ %v", s.Partition, s.InRate, s.Skew, s.Hot(), projection.HotSkew)
		case s.Partition != hotPart && (s.Skew >= 1 || s.Hot()):
			t.Errorf("calm partition %d: skew %.2f, hot %v", s.Partition, s.Skew, s.Hot())
		}
	}

	run := func(args ...string) string {
		t.Helper()
		out, code := runIn(t, store.Schema(), types.Registry, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d:\n%s", args, code, out)
		}
		return out
	}
	label := "partition " + strconv.Itoa(hotPart) + "/4"
	for line := range strings.Lines(run("status")) {
		if strings.Contains(line, "partition ") && strings.Contains(line, "HOT") != strings.Contains(line, label) {
			t.Errorf("status line %q: HOT on the hot partition (%s) only", line, label)
		}
	}
	if out := run("consumer", "status", "skewed", "--partition", strconv.Itoa(hotPart)); !strings.Contains(out, "HOT") || !strings.Contains(out, "/s") {
		t.Errorf("consumer status of the hot partition:\n%s", out)
	}
	if out := run("status", "-o", "json"); !strings.Contains(out, `"skew"`) || !strings.Contains(out, `"hot": true`) || !strings.Contains(out, `"in_per_second"`) {
		t.Errorf("status -o json lacks rate, skew and hot:\n%s", out)
	}
}

// checkFenceShown checks that the fence row of consumer "parts" (4
// partitions, 2/4 dead) shows as the partitioned consumer it stands for,
// never as the "disabled" it is stored as: in `status`, `consumer status`
// and both -o json.
func checkFenceShown(t *testing.T, run func(int, ...string) string, status string) {
	t.Helper()
	for line := range strings.Lines(status) {
		if strings.Contains(line, "(partitioned: fence)") {
			if strings.Contains(line, "disabled") || !strings.Contains(line, "partitioned (4: 1 dead)") || strings.Contains(line, "partitioned into") {
				t.Errorf("status shows the fence as %q; want partitioned (4: 1 dead), without the fence's note", line)
			}
		}
	}
	out := run(0, "consumer", "status", "parts")
	if strings.Contains(out, "disabled\n") || !strings.Contains(out, "partitioned (4: 1 dead)") {
		t.Errorf("consumer status of the partitioned consumer:\n%s", out)
	}
	var shard ShardJSON
	if err := json.Unmarshal([]byte(run(0, "consumer", "status", "parts", "-o", "json")), &shard); err != nil {
		t.Fatal(err)
	}
	if shard.Status != StatusPartitioned || shard.Partitioned == nil || shard.Partitioned.Count != 4 ||
		shard.Partitioned.Statuses["dead"] != 1 || shard.Partitioned.Statuses["idle"] != 3 || shard.Partitioned.StoredStatus != "disabled" ||
		shard.Role != RolePartitionFence || shard.LastError != "" {
		t.Errorf("consumer status -o json: %+v (partitioned %+v)", shard, shard.Partitioned)
	}
	var all StatusJSON
	if err := json.Unmarshal([]byte(run(0, "status", "-o", "json")), &all); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, s := range all.Shards {
		if s.Role == RolePartitionFence && s.Consumer == "parts" {
			found = true
			if s.Status != StatusPartitioned || s.Partitioned == nil || s.Partitioned.Count != 4 || s.Partitioned.Statuses["dead"] != 1 {
				t.Errorf("status -o json shows the fence as %+v (partitioned %+v)", s, s.Partitioned)
			}
		}
	}
	if !found {
		t.Errorf("status -o json has no fence row for parts: %+v", all.Shards)
	}
}

// splitBeforeFirstRestart is an Admin whose first Restart splits the
// partition it is asked to restart first: the command listed the
// partitions, and a `consumer split` ran before it acted on them.
type splitBeforeFirstRestart struct {
	*projection.Admin
	t     *testing.T
	split []projection.PartitionChange
}

func (s *splitBeforeFirstRestart) Restart(ctx context.Context, id projection.ShardID) error {
	if s.split == nil {
		p, n, ok := projection.ParsePartition(id.Instance)
		if !ok {
			s.t.Fatalf("restart of %s: not a partition", id)
		}
		seg, err := postgres.SegmentOf(p, n)
		if err != nil {
			s.t.Fatal(err)
		}
		if s.split, err = s.Admin.Split(ctx, id.Consumer, seg); err != nil {
			s.t.Fatalf("split %s between the listing and the restart: %v", seg, err)
		}
	}
	return s.Admin.Restart(ctx, id)
}

// `consumer restart NAME` lists the partitions, then restarts the dead
// ones; a dead partition split in between (its row gone, its failure
// carried by the child whose streams hold the failing event) failed the
// whole command with "not found". It must restart that child instead,
// name it, and leave the other child, which started clean, as it was.
func TestRestartDeadPartitionSplitMeanwhile(t *testing.T) {
	t.Parallel()
	_, store := registeredPartitions(t, "cli-restart-split", projection.AsyncConfig{Partitions: 4}, "parts")
	ctx := context.Background()
	if err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		for i := range 40 {
			if _, err := store.Append(ctx, tx, projector.Stream("ticket", "t-"+strconv.Itoa(i)), projector.NoStream, testevents.TicketOpened{Title: "t"}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Partition 2/4 dead on an event of its streams.
	dead := projection.PartitionInstance(2, 4)
	if _, err := store.Pool().Exec(ctx, `UPDATE `+store.Table("projector_consumers")+` c SET status = 'dead', attempts = 3, last_error = 'boom', last_error_at = now(),
			failed_tx_id = e.tx_id, failed_seq = e.seq, failed_event_id = e.id
		FROM (SELECT tx_id, seq, id FROM `+store.Table("projector_events")+`
			WHERE `+store.Schema()+`.projector_stream_bucket(tenant_id, stream_type, stream_id) / 16 = 2 ORDER BY tx_id, seq LIMIT 1) e
		WHERE c.name = 'parts' AND c.instance_id = $1`, dead); err != nil {
		t.Fatal(err)
	}
	admin := &splitBeforeFirstRestart{Admin: projection.NewAdmin(store), t: t}
	listed, err := admin.List(ctx, "parts")
	if err != nil {
		t.Fatal(err)
	}
	var parts []projection.ShardState
	for _, s := range listed {
		if s.Partitions > 0 {
			parts = append(parts, s)
		}
	}
	var out strings.Builder
	a := &App{out: &out}
	if err := a.restartDeadPartitions(ctx, admin, "parts", parts); err != nil {
		t.Fatalf("restart with partition 2/4 split after the listing: %v\n%s", err, out.String())
	}
	if len(admin.split) != 1 {
		t.Fatalf("split %v, want 2/4's", admin.split)
	}
	after, err := admin.List(ctx, "parts")
	if err != nil {
		t.Fatal(err)
	}
	restarted := 0
	for _, s := range after {
		if s.Partitions == 0 {
			continue
		}
		if s.Status == projection.StatusDead {
			t.Errorf("partition %d/%d still dead after the restart:\n%s", s.Partition, s.Partitions, out.String())
		}
		if s.Partitions == 8 && s.Attempts == 0 && strings.Contains(out.String(), "partition "+strconv.Itoa(s.Partition)+"/8") {
			restarted++
		}
	}
	if restarted != 1 || strings.Contains(out.String(), "partition 2/4") {
		t.Errorf("restart named %d of 2/4's children (want the one that carried its failure) or the vanished 2/4:\n%s", restarted, out.String())
	}
}
