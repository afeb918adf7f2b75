package cli

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
)

// `streams archive` and `unarchive` end to end: bad selectors and numbers
// are exit 2 with nothing moved; a dry run moves nothing; archive and
// unarchive move the stream's events and say so.
func TestStreamsArchiveCommand(t *testing.T) {
	t.Parallel()
	types := testevents.New()
	store := pgtest.Store(t, types.Registry)
	ctx := context.Background()
	if err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		_, err := store.Append(ctx, tx, projector.Stream("ticket", "1"), projector.NoStream, testevents.TicketOpened{Title: "x"}, testevents.TicketCommented{Body: "b"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	hot := func() int {
		var n int
		if err := store.Pool().QueryRow(ctx, `SELECT count(*) FROM `+store.Table("projector_events")).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, args := range [][]string{
		{"streams", "archive"},
		{"streams", "archive", "--stream-type", "ticket"},
		{"streams", "archive", "--stream-type", "ticket", "--older-than", "-1h"},
		{"streams", "archive", "--stream-type", "ticket", "--older-than", "99999999d"},
		{"streams", "archive", "--stream", "ticket"},
		{"streams", "archive", "--stream", "ticket/1", "--stream-type", "ticket"},
		{"streams", "archive", "--stream", "ticket/1", "--older-than", "1h"},
		{"streams", "archive", "--stream", "ticket/1", "--batch-size", "0"},
		{"streams", "archive", "--stream", "ticket/1", "--batch-size", "10001"},
		{"streams", "archive", "--stream", "ticket/x\x00y"},
		{"streams", "archive", "--stream-type", "t\xff", "--older-than", "1h"},
		{"streams", "unarchive"},
	} {
		out, code := runIn(t, store.Schema(), types.Registry, args...)
		if code != ExitUsage || strings.Contains(out, "SQLSTATE") {
			t.Errorf("%q: exit %d, want %d\n%s", args, code, ExitUsage, out)
		}
	}
	if n := hot(); n != 2 {
		t.Fatalf("refused commands moved events: %d hot", n)
	}
	out, code := runIn(t, store.Schema(), types.Registry, "streams", "archive", "--stream", "ticket/1", "--dry-run")
	if code != 0 || !strings.Contains(out, "would move 1 stream (2 events)") || hot() != 2 {
		t.Fatalf("dry run: exit %d\n%s", code, out)
	}
	out, code = runIn(t, store.Schema(), types.Registry, "streams", "archive", "--stream", "ticket/1", "--stream", "ticket/1")
	if code != 0 || !strings.Contains(out, "archived 1 stream (2 events)") || strings.Contains(out, "held back") || hot() != 0 {
		t.Fatalf("archive: exit %d\n%s", code, out)
	}
	// An export reads the hot log unless told to read the archive too.
	for flag, want := range map[string]string{"--stream-type=ticket": "exported 0 events", "--include-archived": "exported 2 events"} {
		out, code = runIn(t, store.Schema(), types.Registry, "events", "export", flag)
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("events export %s: exit %d, want %q\n%s", flag, code, want, out)
		}
	}
	// So does events tail.
	for flag, want := range map[string]int{"--type=ticket.opened": 0, "--include-archived": 2} {
		out, code = runIn(t, store.Schema(), types.Registry, "events", "tail", "--from-start", "--no-follow", "-o", "json", flag)
		if n := strings.Count(out, `"stream_id":"1"`); code != 0 || n != want {
			t.Fatalf("events tail %s: exit %d, %d events of ticket/1, want %d\n%s", flag, code, n, want, out)
		}
	}
	if _, err := store.Pool().Exec(ctx, `ANALYZE `+store.Table("projector_events_archive")); err != nil {
		t.Fatal(err)
	}
	out, code = runIn(t, store.Schema(), types.Registry, "status")
	if code != 0 || !strings.Contains(out, "about 2 archived (estimates from table statistics)") {
		t.Fatalf("status: exit %d\n%s", code, out)
	}
	// The hot table was never analyzed: status says what gives the
	// estimate, rather than leaving "unknown" without a next step.
	if want := "ANALYZE " + store.Table("projector_events") + " "; !strings.Contains(out, want) || strings.Contains(out, "ANALYZE "+store.Table("projector_events_archive")) {
		t.Fatalf("status: want the next step %q for the unanalyzed hot log only\n%s", want, out)
	}
	if _, err := store.Pool().Exec(ctx, `ANALYZE `+store.Table("projector_events")); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(newLogSizeCollector(store))
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sizes := map[string]float64{}
	for _, mf := range families {
		for _, m := range mf.GetMetric() {
			sizes[mf.GetName()+"/"+m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
		}
	}
	if sizes["projector_log_events_estimate/archive"] != 2 || sizes["projector_log_events_estimate/hot"] != 0 {
		t.Fatalf("log size metric: %v, want archive 2, hot 0", sizes)
	}
	out, code = runIn(t, store.Schema(), types.Registry, "streams", "unarchive", "--stream-type", "ticket")
	if code != 0 || !strings.Contains(out, "unarchived 1 stream (2 events)") || hot() != 2 {
		t.Fatalf("unarchive: exit %d\n%s", code, out)
	}
	// A stream that is not archived is skipped, and the command says why.
	out, code = runIn(t, store.Schema(), types.Registry, "streams", "unarchive", "--stream", "ticket/1")
	if code != 0 || !strings.Contains(out, "skipped 1 stream: not archived") {
		t.Fatalf("unarchive of a live stream: exit %d\n%s", code, out)
	}
}

// `streams archive` that holds streams back names the slowest shard that is
// not disabled, and what to do about it. It said only "a consumer shard has
// not passed all their events", which left the operator to find the shard: a
// stale per-instance shard of a stopped `run` (its console_tail, or a
// PerInstance projection under a fixed --instance-id) holds archiving back
// until it is removed, and nothing said so.
func TestStreamsArchiveHeldBackNamesTheShard(t *testing.T) {
	t.Parallel()
	types := testevents.New()
	store := pgtest.Store(t, types.Registry)
	ctx := context.Background()
	if err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		_, err := store.Append(ctx, tx, projector.Stream("ticket", "1"), projector.NoStream, testevents.TicketOpened{Title: "x"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// A per-instance shard at the start of the log whose instance is gone,
	// and a disabled one, which holds nothing back.
	if _, err := store.Pool().Exec(ctx, `INSERT INTO `+store.Table("projector_consumers")+` (name, instance_id, status)
		VALUES ('console_tail', 'proc-gone', 'idle'), ('retired', '__shared__', 'disabled')`); err != nil {
		t.Fatal(err)
	}
	for _, dry := range []bool{true, false} {
		args := []string{"streams", "archive", "--stream", "ticket/1"}
		if dry {
			args = append(args, "--dry-run")
		}
		out, code := runIn(t, store.Schema(), types.Registry, args...)
		for _, want := range []string{"held back 1 stream", "console_tail (instance proc-gone", "consumer remove console_tail --instance proc-gone"} {
			if code != 0 || !strings.Contains(out, want) {
				t.Errorf("%q: exit %d, want %q in:\n%s", args, code, want, out)
			}
		}
		if strings.Contains(out, "retired") {
			t.Errorf("%q: names the disabled shard:\n%s", args, out)
		}
		// No dead letter or park is open: the advice does not send the
		// operator to look for one.
		if strings.Contains(out, "dead-letters list") || strings.Contains(out, "parked list") {
			t.Errorf("%q: advises dead letters or parks with none open:\n%s", args, out)
		}
	}
	// With one open dead letter (of any consumer: the guard holds a stream
	// back for any), the line says how many and where.
	if _, err := store.Pool().Exec(ctx, `INSERT INTO `+store.Table("projector_dead_letters")+`
		(consumer, instance_id, event_id, event_tx_id, event_seq, event_type, tenant_id, stream_type, stream_id, version, error, attempts, reason)
		VALUES ('gone', '__shared__', gen_random_uuid(), '1', 1, 'ticket.opened', '__system__', 'ticket', '9', 1, 'boom', 1, 'apply-error')`); err != nil {
		t.Fatal(err)
	}
	out, code := runIn(t, store.Schema(), types.Registry, "streams", "archive", "--stream", "ticket/1")
	if want := "open now: 1 dead letter (`projector dead-letters list`)."; code != 0 || !strings.Contains(out, want) || strings.Contains(out, "parked list") {
		t.Errorf("archive with an open dead letter: exit %d, want %q and no parks line in:\n%s", code, want, out)
	}
}

// The dead-letter/park line of the archive advice counts what is open and
// names only the listing that has some.
func TestArchiveAdviceCountsOpenHolds(t *testing.T) {
	for _, c := range []struct {
		dls, parks int64
		want, not  string
	}{
		{0, 0, "", "held by"},
		{2, 0, "open now: 2 dead letters (`projector dead-letters list`).", "parked list"},
		{0, 1, "open now: 1 park (`projector parked list`).", "dead-letters list"},
		{1, 3, "open now: 1 dead letter (`projector dead-letters list`) and 3 parks (`projector parked list`).", "\x00"},
	} {
		got := archiveAdvice("projector", nil, c.dls, c.parks)
		if !strings.Contains(got, c.want) || strings.Contains(got, c.not) {
			t.Errorf("%d dead letters, %d parks: advice %q; want %q, not %q", c.dls, c.parks, got, c.want, c.not)
		}
	}
}

// The slowest shard is archive advice only when it is behind: with every
// shard caught up and streams held back by an open dead letter and a park,
// the advice said the caught-up shard's live dispatcher was applying it,
// "0 events behind", before the line naming the real reason. With nothing
// behind and nothing open, it says the hold has cleared.
func TestArchiveAdviceNamesLagOnlyWhenBehind(t *testing.T) {
	caughtUp := projection.ShardState{ShardID: projection.ShardID{Consumer: "console_tail", Instance: "web-2"}, Status: projection.StatusIdle,
		Dispatcher: projection.DispatcherLive, Cursor: projector.Position{TxID: 9, Seq: 1}}
	behind := caughtUp
	behind.LagEvents = 3
	// A partition no live dispatcher runs, with no events of its own since
	// its cursor: the guard still stops there.
	unattended := projection.ShardState{ShardID: projection.ShardID{Consumer: "orders", Instance: projection.PartitionInstance(1, 4)},
		Status: projection.StatusIdle, Dispatcher: projection.DispatcherNone, Cursor: projector.Position{TxID: 7, Seq: 2}, Partitions: 4}
	for _, c := range []struct {
		name       string
		shard      projection.ShardState
		dls, parks int64
		want, not  []string
	}{
		{"caught up, held by a dead letter and a park", caughtUp, 1, 1,
			[]string{"open now: 1 dead letter (`projector dead-letters list`) and 1 park"}, []string{"slowest shard", "caught up", "events behind"}},
		{"caught up, nothing open", caughtUp, 0, 0,
			[]string{"No shard is behind and no dead letter or park is open now", "archive again"}, []string{"slowest shard"}},
		{"unattended, none of its own events behind", unattended, 0, 0,
			[]string{"slowest shard: consumer orders (instance __partition__1/4, idle, dispatcher none) at 7/2, none of its own events behind, but the guard stops at its cursor."},
			[]string{"No shard is behind", "archive again"}},
		{"behind", behind, 1, 0,
			[]string{"slowest shard: consumer console_tail (instance web-2, idle, dispatcher live) at 9/1, 3 events behind.",
				"A live dispatcher is applying it", "open now: 1 dead letter"}, []string{"No shard is behind"}},
	} {
		got := archiveAdvice("projector", []projection.ShardState{c.shard}, c.dls, c.parks)
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: advice %q; want %q", c.name, got, w)
			}
		}
		for _, n := range c.not {
			if strings.Contains(got, n) {
				t.Errorf("%s: advice %q; want no %q", c.name, got, n)
			}
		}
	}
}

// The usage lines of `streams archive` and `unarchive` say what each
// accepts: archive by type needs --older-than (shown as optional, though
// refused without it), and unarchive has no --older-than (shown, though
// an unknown flag there).
func TestStreamsArchiveUsageLines(t *testing.T) {
	for _, c := range []struct {
		cmd, want string
	}{
		{"archive", "archive (--stream TYPE/ID ... | --stream-type T --older-than DURATION) [--tenant T] [--dry-run] [--batch-size N]"},
		{"unarchive", "unarchive (--stream TYPE/ID ... | --stream-type T) [--tenant T] [--dry-run] [--batch-size N]"},
	} {
		root := New(Config{})
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs([]string{"streams", c.cmd, "--help"})
		if err := root.Execute(); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "Usage:\n  projector streams "+c.want+" [flags]\n") {
			t.Errorf("streams %s --help: want the usage line %q in:\n%s", c.cmd, c.want, out.String())
		}
		// Each flag the line names is one the command has.
		cmd, _, err := root.Find([]string{"streams", c.cmd})
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range regexp.MustCompile(`--[a-z-]+`).FindAllString(cmd.Use, -1) {
			if cmd.Flags().Lookup(f[2:]) == nil {
				t.Errorf("streams %s: the usage line names %s, which it does not accept", c.cmd, f)
			}
		}
	}
}

// A stream `streams archive` or `unarchive` skips is named with the reason
// that fits it, read after the fact: the command said "already archived, no
// such stream, being appended to, or appended to since chosen" for any
// skip, the last impossible for a named stream, and left the operator to
// find which. A selection of several streams lists only the reasons it can
// have.
func TestStreamsArchiveSkippedSaysWhy(t *testing.T) {
	t.Parallel()
	types := testevents.New()
	store := pgtest.Store(t, types.Registry)
	ctx := context.Background()
	for _, id := range []string{"1", "2"} {
		if err := pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
			_, err := store.Append(ctx, tx, projector.Stream("ticket", id), projector.NoStream, testevents.TicketOpened{Title: "x"})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	run := func(want, not string, args ...string) {
		t.Helper()
		out, code := runIn(t, store.Schema(), types.Registry, args...)
		if code != 0 || !strings.Contains(out, want) || (not != "" && strings.Contains(out, not)) {
			t.Errorf("%q: exit %d, want %q (and not %q) in:\n%s", args, code, want, not, out)
		}
	}
	// The head held as an append holds it.
	holdHead := func(ids ...string) func() {
		t.Helper()
		tx, err := store.Pool().Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `SELECT 1 FROM `+store.Table("projector_streams")+` WHERE stream_type = 'ticket' AND stream_id = ANY($1) FOR UPDATE`, ids); err != nil {
			t.Fatal(err)
		}
		return func() { _ = tx.Rollback(ctx) }
	}
	run("skipped 1 stream: no such stream in tenant __system__ (so at the time of this report); a stream is its tenant's (--tenant)", "", "streams", "archive", "--stream", "ticket/9")
	release := holdHead("1", "2")
	run("skipped 1 stream: being appended to (or moved by another archive) at that moment; it is in the hot log at the time of this report", "", "streams", "archive", "--stream", "ticket/1")
	run("skipped 2 streams: being appended to (or moved by another archive) at that moment, appended to since they were chosen, or archived meanwhile", "no such stream",
		"streams", "archive", "--stream-type", "ticket", "--older-than", "1ns")
	release()
	run("archived 1 stream", "skipped", "streams", "archive", "--stream", "ticket/1")
	run("skipped 1 stream: already archived (so at the time of this report)", "", "streams", "archive", "--stream", "ticket/1", "--dry-run")
	run("skipped 1 stream: not archived (so at the time of this report)", "", "streams", "unarchive", "--stream", "ticket/2")
	run("skipped 1 stream: already archived, no such stream, or being appended to", "appended to since", "streams", "archive", "--stream", "ticket/1", "--stream", "ticket/2")
	release = holdHead("1")
	run("skipped 1 stream: being moved by another archive or unarchive at that moment (it is archived at the time of this report", "", "streams", "unarchive", "--stream", "ticket/1")
	release()
}
