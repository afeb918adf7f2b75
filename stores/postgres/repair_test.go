package postgres_test

import (
	"context"
	"errors"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// shard is a consumer row as a test writes it before the "dump".
type shard struct {
	name, instance, status string
	cursor                 projector.Position
	failing                *projector.Event // the event the shard is failing on
}

func (f fixture) insertShard(t *testing.T, s shard) {
	t.Helper()
	var failedTx *uint64
	var failedSeq *int64
	var failedID *uuid.UUID
	attempts, lastError := 0, ""
	if s.failing != nil {
		failedTx, failedSeq, failedID = &s.failing.Position.TxID, &s.failing.Position.Seq, &s.failing.ID
		attempts, lastError = 2, "boom"
	}
	if _, err := f.store.Pool().Exec(f.ctx, `INSERT INTO `+f.store.Table("projector_consumers")+`
		(name, instance_id, cursor_tx_id, cursor_seq, status, attempts, last_error, failed_tx_id, failed_seq, failed_event_id)
		VALUES ($1, $2, $3, $4, $5, $6, NULLIF($7, ''), $8, $9, $10)`,
		s.name, s.instance, s.cursor.TxID, s.cursor.Seq, s.status, attempts, lastError, failedTx, failedSeq, failedID); err != nil {
		t.Fatal(err)
	}
}

// idsAfter lists the ids of the events after pos in log order, straight
// from the table (the gap-safe read would wait for other tests' horizons).
func (f fixture) idsAfter(t *testing.T, pos projector.Position) []uuid.UUID {
	t.Helper()
	rows, err := f.store.Pool().Query(f.ctx, `SELECT id FROM `+f.store.Table("projector_events")+`
		WHERE (tx_id, seq) > ($1::xid8, $2::bigint) ORDER BY tx_id, seq`, pos.TxID, pos.Seq)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// eventAt returns the id of the event at pos, or uuid.Nil.
func (f fixture) eventAt(t *testing.T, pos projector.Position) uuid.UUID {
	t.Helper()
	var id uuid.UUID
	err := f.store.Pool().QueryRow(f.ctx, `SELECT id FROM `+f.store.Table("projector_events")+` WHERE tx_id = $1::xid8 AND seq = $2`,
		pos.TxID, pos.Seq).Scan(&id)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
	return id
}

// positions renders every stored position of the schema, and the seq
// column's identity mode, so a test can see that nothing changed.
func (f fixture) positions(t *testing.T) string {
	t.Helper()
	var out string
	err := f.store.Pool().QueryRow(f.ctx, `SELECT concat_ws(E'\n',
		(SELECT string_agg(format('%s/%s %s', tx_id, seq, id), ',' ORDER BY id) FROM `+f.store.Table("projector_events")+`),
		(SELECT string_agg(format('%s %s', stream_id, last_tx_id), ',' ORDER BY stream_id) FROM `+f.store.Table("projector_streams")+`),
		(SELECT string_agg(format('%s@%s %s/%s %s/%s', name, instance_id, cursor_tx_id, cursor_seq, failed_tx_id, failed_seq), ',' ORDER BY name, instance_id)
			FROM `+f.store.Table("projector_consumers")+`),
		(SELECT string_agg(format('%s %s/%s', event_id, event_tx_id, event_seq), ',' ORDER BY id) FROM `+f.store.Table("projector_dead_letters")+`),
		(SELECT attidentity FROM pg_attribute WHERE attrelid = $1::regclass AND attname = 'seq'))`,
		f.store.Table("projector_events")).Scan(&out)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// restoreIntoYoungerCluster does to a schema what a pg_dump restored into
// a younger cluster does: every stored transaction id is now far ahead of
// the server's, in the same order. Start (0/0) stays Start.
func (f fixture) restoreIntoYoungerCluster(t *testing.T) {
	t.Helper()
	const shift = `(%s::text::bigint + 2000000000)::text::xid8`
	add := func(col string) string { return strings.ReplaceAll(shift, "%s", col) }
	for _, sql := range []string{
		`UPDATE ` + f.store.Table("projector_events") + ` SET tx_id = ` + add("tx_id"),
		`UPDATE ` + f.store.Table("projector_streams") + ` SET last_tx_id = ` + add("last_tx_id"),
		`UPDATE ` + f.store.Table("projector_consumers") + ` SET failed_tx_id = ` + add("failed_tx_id") + `,
			cursor_tx_id = CASE WHEN cursor_tx_id = '0' THEN cursor_tx_id ELSE ` + add("cursor_tx_id") + ` END,
			hold_tx_id = CASE WHEN hold_tx_id = '0' THEN hold_tx_id ELSE ` + add("hold_tx_id") + ` END`,
		`UPDATE ` + f.store.Table("projector_dead_letters") + ` SET event_tx_id = ` + add("event_tx_id"),
	} {
		if _, err := f.store.Pool().Exec(f.ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
}

func (f fixture) newStore(t *testing.T) (*postgres.Store, error) {
	t.Helper()
	return postgres.New(f.ctx, f.store.Pool(), postgres.Config{Schema: f.store.Schema(), Registry: f.types.Registry})
}

func (f fixture) repair(t *testing.T, opts postgres.RepairOptions) (postgres.RepairReport, error) {
	t.Helper()
	return postgres.RepairRestoredCluster(f.ctx, f.store.Pool(), f.store.Schema(), opts)
}

func eventIDs(evs []projector.Event) []uuid.UUID {
	ids := make([]uuid.UUID, len(evs))
	for i, ev := range evs {
		ids[i] = ev.ID
	}
	return ids
}

// The restore a repair exists for: events of several streams from several
// transactions, consumer shards at every kind of cursor, a failing shard and
// a dead letter, all carried into a cluster whose transaction ids are far
// behind. After the repair the store starts, the log reads in its old order,
// every cursor selects exactly the events it had not seen (the dispatcher's
// own read), and new appends sort after everything old.
func TestRepairRestoredCluster(t *testing.T) {
	t.Parallel()
	f := setup(t)
	a, b, c := projector.Stream("ticket", "a"), projector.TenantStream("acme", "ticket", "b"), projector.Stream("ticket", "c")
	opened, comment, closed := testevents.TicketOpened{Title: "t"}, testevents.TicketCommented{Body: "c"}, testevents.TicketClosed{}
	tx1 := f.appendTx(t, a, projector.NoStream, opened, comment).Events
	tx2 := f.appendTx(t, b, projector.NoStream, opened).Events
	session := f.appendTx(t, projector.Stream("session", "s"), projector.NoStream, opened).Events[0]
	tx4 := f.appendTx(t, a, projector.ExactVersion(2), comment).Events
	tx5 := f.appendTx(t, c, projector.NoStream, opened, comment, closed).Events
	last := f.appendTx(t, b, projector.ExactVersion(1), closed).Events[0]

	shards := []shard{
		{name: "start", status: "idle", cursor: projector.Start},
		{name: "mid", status: "idle", cursor: tx4[0].Position},
		{name: "mid", instance: "i-1", status: "idle", cursor: tx1[0].Position},
		{name: "mid-tx", status: "processing", cursor: tx5[0].Position},
		{name: "horizon-mid", status: "idle", cursor: projector.Position{TxID: tx2[0].Position.TxID, Seq: math.MaxInt64}},
		{name: "between", status: "idle", cursor: projector.Position{TxID: tx4[0].Position.TxID, Seq: 0}},
		{name: "end", status: "idle", cursor: projector.Position{TxID: last.Position.TxID + 3, Seq: math.MaxInt64}},
		{name: "gone", status: "idle", cursor: session.Position},
		{name: "failing", status: "processing", cursor: tx4[0].Position, failing: &tx5[1]},
		{name: "off", status: "disabled", cursor: tx1[1].Position},
	}
	for i := range shards {
		if shards[i].instance == "" {
			shards[i].instance = "__shared__"
		}
		f.insertShard(t, shards[i])
	}
	if _, err := f.store.Pool().Exec(f.ctx, `INSERT INTO `+f.store.Table("projector_dead_letters")+`
		(consumer, instance_id, event_id, event_tx_id, event_seq, event_type, tenant_id, stream_type, stream_id, version, error, attempts, reason)
		VALUES ('failing', '__shared__', $1, $2, $3, 'ticket.opened', 'acme', 'ticket', 'b', 1, 'bad', 1, 'skipped')`,
		tx2[0].ID, tx2[0].Position.TxID, tx2[0].Position.Seq); err != nil {
		t.Fatal(err)
	}
	// A pruned event: the "gone" shard's cursor now points at nothing.
	if _, err := f.store.Pool().Exec(f.ctx, `DELETE FROM `+f.store.Table("projector_events")+` WHERE id = $1`, session.ID); err != nil {
		t.Fatal(err)
	}
	// Every shard held at its cursor, as the halves of a merge under way
	// stand: the repair must keep them standing there.
	if _, err := f.store.Pool().Exec(f.ctx, `UPDATE `+f.store.Table("projector_consumers")+` SET hold_tx_id = cursor_tx_id, hold_seq = cursor_seq`); err != nil {
		t.Fatal(err)
	}
	oldLog := f.idsAfter(t, projector.Start)
	want := map[string][]uuid.UUID{}
	for _, s := range shards {
		want[s.name+"@"+s.instance] = f.idsAfter(t, s.cursor)
	}

	f.restoreIntoYoungerCluster(t)
	if _, err := f.newStore(t); !errors.Is(err, postgres.ErrRestoredDatabase) {
		t.Fatalf("New before the repair: %v, want ErrRestoredDatabase", err)
	}

	before := f.positions(t)
	dry, err := f.repair(t, postgres.RepairOptions{DryRun: true})
	if err != nil {
		t.Fatalf("dry run: %v", err)
	}
	if after := f.positions(t); after != before {
		t.Fatalf("dry run changed the schema:\nbefore %s\nafter  %s", before, after)
	}

	rep, err := f.repair(t, postgres.RepairOptions{})
	if err != nil {
		t.Fatalf("repair: %v", err)
	}
	// The same report, but for the flag and the server's next id, which
	// the dry run's own transaction advanced.
	dry.DryRun, dry.NextTxID = false, rep.NextTxID
	if !reflect.DeepEqual(dry, rep) {
		t.Fatalf("dry run reported\n%+v\nthe repair did\n%+v", dry, rep)
	}
	if !rep.Restored || rep.NewestIn != "projector_consumers.cursor_tx_id" || rep.Events != int64(len(oldLog)) ||
		rep.Streams != 4 || rep.DeadLetters != 1 || len(rep.Consumers) != len(shards) {
		t.Fatalf("report: %+v", rep)
	}

	store, err := f.newStore(t)
	if err != nil {
		t.Fatalf("New after the repair: %v", err)
	}
	// The log reads in its old order, through the gap-safe read at once
	// (RepairTxID is below every horizon), with per-stream versions rising.
	all, err := store.ReadLog(f.ctx, postgres.LogQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if got := eventIDs(all.Events); !slices.Equal(got, oldLog) {
		t.Fatalf("log after the repair:\n%v\nwant the old order\n%v", got, oldLog)
	}
	versions := map[projector.StreamRef]int64{}
	for i, ev := range all.Events {
		if ev.Position != (projector.Position{TxID: postgres.RepairTxID, Seq: int64(i + 1)}) {
			t.Fatalf("event %d at %s, want %d/%d", i, ev.Position, postgres.RepairTxID, i+1)
		}
		if ev.Version <= versions[ev.Stream] {
			t.Fatalf("stream %s: version %d after %d", ev.Stream, ev.Version, versions[ev.Stream])
		}
		versions[ev.Stream] = ev.Version
	}

	// Every shard sees exactly what it had not seen: no skip, no replay.
	cursors := map[string]projector.Position{}
	for _, cr := range rep.Consumers {
		key := cr.Consumer + "@" + cr.Instance
		cursors[key] = cr.NewCursor
		batch, err := store.ReadLog(f.ctx, postgres.LogQuery{After: cr.NewCursor})
		if err != nil {
			t.Fatal(err)
		}
		if got := eventIDs(batch.Events); !slices.Equal(got, want[key]) {
			t.Errorf("%s: %s → %s reads %v, want %v", key, cr.OldCursor, cr.NewCursor, got, want[key])
		}
		if cr.SeesAgain != 0 || cr.Behind != int64(len(want[key])) {
			t.Errorf("%s: sees again %d, behind %d; want 0 and %d", key, cr.SeesAgain, cr.Behind, len(want[key]))
		}
		var stored, hold projector.Position
		if err := store.Pool().QueryRow(f.ctx, `SELECT cursor_tx_id, cursor_seq, hold_tx_id, hold_seq FROM `+store.Table("projector_consumers")+
			` WHERE name = $1 AND instance_id = $2`, cr.Consumer, cr.Instance).Scan(&stored.TxID, &stored.Seq, &hold.TxID, &hold.Seq); err != nil {
			t.Fatal(err)
		}
		if stored != cr.NewCursor {
			t.Errorf("%s: stored cursor %s, reported %s", key, stored, cr.NewCursor)
		}
		if hold != stored {
			t.Errorf("%s: held at its cursor %s before the repair, at %s after it (cursor %s)", key, cr.OldCursor, hold, stored)
		}
		if key == "failing@__shared__" {
			if id := f.eventAt(t, cr.NewFailedAt); id != tx5[1].ID {
				t.Errorf("failing position %s → %s holds %v, want the failing event %v", cr.OldFailedAt, cr.NewFailedAt, id, tx5[1].ID)
			}
		} else if cr.NewFailedAt != (projector.Position{}) {
			t.Errorf("%s: failed position %s appeared", key, cr.NewFailedAt)
		}
	}
	if cursors["start@__shared__"] != projector.Start {
		t.Errorf("Start moved to %s", cursors["start@__shared__"])
	}
	var dl projector.Position
	var dlID uuid.UUID
	if err := store.Pool().QueryRow(f.ctx, `SELECT event_id, event_tx_id, event_seq FROM `+store.Table("projector_dead_letters")).Scan(&dlID, &dl.TxID, &dl.Seq); err != nil {
		t.Fatal(err)
	}
	if id := f.eventAt(t, dl); id != dlID {
		t.Errorf("dead letter at %s holds %v, want %v", dl, id, dlID)
	}

	// New appends: the stream heads kept their versions and let a new
	// transaction in (promise 4's check), and the events sort after every
	// old one, so the shard at the old end reads exactly them.
	err = pgx.BeginFunc(f.ctx, store.Pool(), func(tx pgx.Tx) error {
		_, err := store.Append(f.ctx, tx, a, projector.ExactVersion(2), comment)
		return err
	})
	if !errors.Is(err, projector.ErrConcurrency) {
		t.Fatalf("append with a stale version after the repair: %v, want ErrConcurrency", err)
	}
	fresh := f.appendTx(t, a, projector.ExactVersion(3), comment).Events[0]
	brandNew := f.appendTx(t, projector.Stream("ticket", "new"), projector.NoStream, opened).Events[0]
	for _, ev := range []projector.Event{fresh, brandNew} {
		if ev.Position.TxID <= postgres.RepairTxID || ev.Position.Seq <= rep.Events {
			t.Fatalf("new event at %s: want a transaction after %d and a seq above %d", ev.Position, postgres.RepairTxID, rep.Events)
		}
	}
	wantNew := []uuid.UUID{fresh.ID, brandNew.ID}
	deadline := time.Now().Add(15 * time.Second)
	for {
		batch, err := store.ReadLog(f.ctx, postgres.LogQuery{After: cursors["end@__shared__"]})
		if err != nil {
			t.Fatal(err)
		}
		if got := eventIDs(batch.Events); slices.Equal(got, wantNew) {
			break
		} else if len(got) >= len(wantNew) || time.Now().After(deadline) {
			t.Fatalf("the shard at the old end reads %v, want %v", got, wantNew)
		}
		time.Sleep(20 * time.Millisecond) // waiting for other tests' transactions to end
	}

	// Once repaired, the check refuses a second run and nothing changes.
	before = f.positions(t)
	_, err = f.repair(t, postgres.RepairOptions{})
	if !errors.Is(err, postgres.ErrNotRestored) || !errors.Is(err, projector.ErrInvalidTransition) {
		t.Fatalf("second repair: %v, want ErrNotRestored", err)
	}
	if after := f.positions(t); after != before {
		t.Fatalf("refused repair changed the schema:\nbefore %s\nafter  %s", before, after)
	}

	// Forced on the repaired log after its first event was pruned, every
	// rank shifts down onto a position another row still holds: the two-pass
	// renumbering. It keeps the order, and every cursor still selects what
	// it selected.
	if _, err := f.store.Pool().Exec(f.ctx, `DELETE FROM `+f.store.Table("projector_events")+` WHERE id = $1`, oldLog[0]); err != nil {
		t.Fatal(err)
	}
	// A row version written later is scanned later: the update then meets
	// the rows after it while it still holds the position they move to.
	if _, err := f.store.Pool().Exec(f.ctx, `UPDATE `+f.store.Table("projector_events")+` SET actor = 'moved' WHERE id = $1`, oldLog[1]); err != nil {
		t.Fatal(err)
	}
	wantForced := map[string][]uuid.UUID{}
	for key, cur := range cursors {
		wantForced[key] = f.idsAfter(t, cur)
	}
	forced, err := f.repair(t, postgres.RepairOptions{Force: true})
	if err != nil {
		t.Fatalf("forced repair: %v", err)
	}
	if forced.Restored || forced.Events != rep.Events+1 {
		t.Fatalf("forced report: %+v", forced)
	}
	for _, cr := range forced.Consumers {
		key := cr.Consumer + "@" + cr.Instance
		batch, err := store.ReadLog(f.ctx, postgres.LogQuery{After: cr.NewCursor})
		if err != nil {
			t.Fatal(err)
		}
		if got := eventIDs(batch.Events); !slices.Equal(got, wantForced[key]) {
			t.Errorf("after the forced repair %s: %s → %s reads %v, want %v", key, cr.OldCursor, cr.NewCursor, got, wantForced[key])
		}
	}
	all, err = store.ReadLog(f.ctx, postgres.LogQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if got := eventIDs(all.Events); !slices.Equal(got, append(oldLog[1:], wantNew...)) {
		t.Fatalf("log after the forced repair: %v", got)
	}
}

// On a database that was never restored the repair refuses, names its
// check, and changes nothing; Force makes it run anyway.
func TestRepairRefusesHealthyDatabase(t *testing.T) {
	t.Parallel()
	f := setup(t)
	if _, err := f.repair(t, postgres.RepairOptions{}); !errors.Is(err, postgres.ErrNotRestored) || !strings.Contains(err.Error(), "stores no transaction ids") {
		t.Fatalf("repair of an empty schema: %v, want ErrNotRestored", err)
	}
	ev := f.appendTx(t, projector.Stream("ticket", "h"), projector.NoStream, testevents.TicketOpened{Title: "h"}).Events[0]
	f.insertShard(t, shard{name: "p", instance: "__shared__", status: "idle", cursor: ev.Position})
	before := f.positions(t)
	_, err := f.repair(t, postgres.RepairOptions{})
	if !errors.Is(err, postgres.ErrNotRestored) || !errors.Is(err, projector.ErrInvalidTransition) ||
		!strings.Contains(err.Error(), "pg_snapshot_xmax") || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("repair of a healthy schema: %v, want ErrNotRestored naming the check", err)
	}
	if after := f.positions(t); after != before {
		t.Fatalf("refused repair changed the schema:\nbefore %s\nafter  %s", before, after)
	}
	rep, err := f.repair(t, postgres.RepairOptions{Force: true, DryRun: true})
	if err != nil || rep.Restored || rep.Events != 1 || len(rep.Consumers) != 1 ||
		rep.Consumers[0].NewCursor != (projector.Position{TxID: postgres.RepairTxID, Seq: 1}) {
		t.Fatalf("forced dry run: %+v, %v", rep, err)
	}
	if after := f.positions(t); after != before {
		t.Fatalf("forced dry run changed the schema:\nbefore %s\nafter  %s", before, after)
	}
}

// The start-up check looks at consumer positions as well as events: an idle
// cursor rests at a horizon past the newest event, and a cluster whose next
// transaction id falls in between would deliver new events behind it.
func TestRestoredGuardSeesConsumerCursors(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ev := f.appendTx(t, projector.Stream("ticket", "g"), projector.NoStream, testevents.TicketOpened{Title: "g"}).Events[0]
	var xmax uint64
	if err := f.store.Pool().QueryRow(f.ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())`).Scan(&xmax); err != nil {
		t.Fatal(err)
	}
	f.insertShard(t, shard{name: "ahead", instance: "__shared__", status: "idle", cursor: projector.Position{TxID: xmax + 1_000_000, Seq: math.MaxInt64}})
	if _, err := f.newStore(t); !errors.Is(err, postgres.ErrRestoredDatabase) {
		t.Fatalf("New with a cursor from the future: %v, want ErrRestoredDatabase", err)
	}
	rep, err := f.repair(t, postgres.RepairOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Restored || rep.NewestIn != "projector_consumers.cursor_tx_id" || len(rep.Consumers) != 1 ||
		rep.Consumers[0].NewCursor != (projector.Position{TxID: postgres.RepairTxID, Seq: 1}) {
		t.Fatalf("report: %+v", rep)
	}
	if id := f.eventAt(t, projector.Position{TxID: postgres.RepairTxID, Seq: 1}); id != ev.ID {
		t.Fatalf("event at %d/1 is %v, want %v", postgres.RepairTxID, id, ev.ID)
	}
	if _, err := f.newStore(t); err != nil {
		t.Fatalf("New after the repair: %v", err)
	}
}

// The start-up check looks at the archive too: with every stream archived
// the hot table is empty, and a cluster whose next transaction id falls
// below the archived events' would put new events before them in log
// order (a rebuild or an export with the archive reads both).
func TestRestoredGuardSeesTheArchive(t *testing.T) {
	t.Parallel()
	f := setup(t)
	s := projector.Stream("ticket", "archived")
	f.appendTx(t, s, projector.NoStream, testevents.TicketOpened{Title: "a"})
	if res, err := f.store.Archive(f.ctx, postgres.ArchiveOptions{Streams: []projector.StreamRef{s}}); err != nil || res.Events != 1 {
		t.Fatalf("archive: %+v, %v", res, err)
	}
	if _, err := f.store.Pool().Exec(f.ctx, `UPDATE `+f.store.Table("projector_events_archive")+
		` SET tx_id = (pg_snapshot_xmax(pg_current_snapshot())::text::bigint + 1000000)::text::xid8`); err != nil {
		t.Fatal(err)
	}
	if _, err := f.newStore(t); !errors.Is(err, postgres.ErrRestoredDatabase) {
		t.Fatalf("New with an archived event from the future: %v, want ErrRestoredDatabase", err)
	}
}

// A session still using the tables (a dispatcher mid-batch, say) makes the
// repair give up after its lock timeout with ErrRepairBusy, changing
// nothing, rather than hang or interleave.
func TestRepairGivesUpOnBusyTables(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.appendTx(t, projector.Stream("ticket", "b"), projector.NoStream, testevents.TicketOpened{Title: "b"})
	f.restoreIntoYoungerCluster(t)
	before := f.positions(t)
	busy, err := f.store.Pool().Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = busy.Rollback(context.WithoutCancel(f.ctx)) }()
	if _, err := busy.Exec(f.ctx, `SELECT * FROM `+f.store.Table("projector_consumers")+` FOR UPDATE SKIP LOCKED`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = f.repair(t, postgres.RepairOptions{LockTimeout: 100 * time.Millisecond})
	if !errors.Is(err, postgres.ErrRepairBusy) || !strings.Contains(err.Error(), "stop every dispatcher") {
		t.Fatalf("repair with the consumers table in use: %v, want ErrRepairBusy", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("gave up after %v", d)
	}
	if err := busy.Rollback(f.ctx); err != nil {
		t.Fatal(err)
	}
	if after := f.positions(t); after != before {
		t.Fatalf("busy repair changed the schema:\nbefore %s\nafter  %s", before, after)
	}
	if _, err := f.repair(t, postgres.RepairOptions{}); err != nil {
		t.Fatalf("repair once the tables are free: %v", err)
	}
}

// Every transaction id the schema stores is one the repair knows about, so
// a migration adding a position column cannot leave it behind (the
// snapshots table, keyed by stream version, stores none).
func TestRepairCoversEveryStoredTransactionID(t *testing.T) {
	t.Parallel()
	f := setup(t)
	rows, err := f.store.Pool().Query(f.ctx, `SELECT c.relname || '.' || a.attname
		FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind = 'r' AND a.atttypid = 'xid8'::regtype AND NOT a.attisdropped
		ORDER BY 1`, f.store.Schema())
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	known := slices.Sorted(slices.Values(postgres.PositionColumns))
	if !slices.Equal(got, known) {
		t.Fatalf("xid8 columns in the schema: %v; the repair handles %v", got, known)
	}
}
