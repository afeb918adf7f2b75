package postgres_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

func (f fixture) archived(t *testing.T, streamType string) int {
	t.Helper()
	return countRows(t, f.store.Pool(), `SELECT count(*) FROM `+f.store.Table("projector_events_archive")+` WHERE stream_type = $1`, streamType)
}

func (f fixture) tryAppend(stream projector.StreamRef, payloads ...any) error {
	return pgx.BeginFunc(f.ctx, f.store.Pool(), func(tx pgx.Tx) error {
		_, err := f.store.Append(f.ctx, tx, stream, projector.AnyVersion, payloads...)
		return err
	})
}

// Promise 9 for archiving: only streams every consumer shard that is not
// disabled has wholly passed move; a dry run counts the same; an archived
// stream refuses appends and plain reads, reads exactly with
// IncludeArchived, and unarchive puts every event back at its position.
func TestPromise9_ArchiveNeverOutrunsAConsumer(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var firsts []projector.Event
	for i := range 6 {
		res := f.appendTx(t, projector.Stream("ticket", fmt.Sprint(i)), projector.NoStream,
			testevents.TicketOpened{Title: "x"}, testevents.TicketCommented{Body: "b"})
		firsts = append(firsts, res.Events[1])
	}
	// A consumer that passed the first four streams wholly; a disabled one
	// that passed nothing does not hold archiving back.
	f.consumer(t, "slow", firsts[3].Position, "idle")
	f.consumer(t, "off", projector.Start, "disabled")
	before, err := f.store.ReadStream(f.ctx, projector.Stream("ticket", "0"), postgres.StreamQuery{})
	if err != nil {
		t.Fatal(err)
	}

	opts := postgres.ArchiveOptions{StreamType: "ticket", OlderThan: tiny, BatchSize: 4}
	dry := opts
	dry.DryRun = true
	d, err := f.store.Archive(f.ctx, dry)
	if err != nil {
		t.Fatal(err)
	}
	if d.Streams != 4 || d.Events != 8 || d.HeldBack != 2 {
		t.Fatalf("dry run: %+v, want 4 streams, 8 events, 2 held back", d)
	}
	if n := f.archived(t, "ticket"); n != 0 {
		t.Fatalf("a dry run archived %d events", n)
	}
	res, err := f.store.Archive(f.ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if res.Streams != 4 || res.Events != 8 || res.HeldBack != 2 {
		t.Fatalf("archive: %+v, want 4 streams, 8 events, 2 held back", res)
	}
	if hot, arch := f.remaining(t, "ticket"), f.archived(t, "ticket"); hot != 4 || arch != 8 {
		t.Fatalf("hot %d, archived %d; want 4 and 8", hot, arch)
	}

	closed := projector.Stream("ticket", "0")
	// The error names the command that restores this very stream.
	const restore = "projector streams unarchive --stream ticket/0"
	if err := f.tryAppend(closed, testevents.TicketCommented{Body: "late"}); !errors.Is(err, postgres.ErrStreamArchived) || !strings.Contains(err.Error(), restore) {
		t.Fatalf("append to an archived stream: %v, want ErrStreamArchived naming %q", err, restore)
	}
	if err := pgx.BeginFunc(f.ctx, f.store.Pool(), func(tx pgx.Tx) error {
		_, err := f.store.Append(f.ctx, tx, closed, projector.ExactVersion(2), testevents.TicketCommented{Body: "late"})
		return err
	}); !errors.Is(err, postgres.ErrStreamArchived) {
		t.Fatalf("append at the exact version to an archived stream: %v, want ErrStreamArchived", err)
	}
	if _, err := f.store.ReadStream(f.ctx, closed, postgres.StreamQuery{}); !errors.Is(err, postgres.ErrStreamArchived) || !strings.Contains(err.Error(), restore) {
		t.Fatalf("plain read of an archived stream: %v, want ErrStreamArchived naming %q", err, restore)
	}
	got, err := f.store.ReadStream(f.ctx, closed, postgres.StreamQuery{IncludeArchived: true})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, before) {
		t.Fatalf("archived read differs:\n got %+v\nwant %+v", got, before)
	}
	// The stream the consumer has not passed stays hot and writable.
	f.appendTx(t, projector.Stream("ticket", "5"), projector.AnyVersion, testevents.TicketCommented{Body: "more"})

	un, err := f.store.Unarchive(f.ctx, postgres.ArchiveOptions{StreamType: "ticket"})
	if err != nil {
		t.Fatal(err)
	}
	if un.Streams != 4 || un.Events != 8 {
		t.Fatalf("unarchive: %+v, want 4 streams, 8 events", un)
	}
	again, err := f.store.ReadStream(f.ctx, closed, postgres.StreamQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(again, before) {
		t.Fatalf("unarchived stream differs (positions must be kept):\n got %+v\nwant %+v", again, before)
	}
	f.appendTx(t, closed, projector.ExactVersion(2), testevents.TicketCommented{Body: "reopened"})
}

// Promise 9 with the other actor in the gap between the choice of streams
// and the lock: the consumer that had passed them is rewound (as an
// in-place rebuild does) while the archive waits for the consumers table.
// The guard is read under the lock, so nothing moves.
func TestPromise9_ArchiveConsumerRewoundBetweenChoiceAndLock(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var last projector.Position
	for i := range 3 {
		last = f.appendTx(t, projector.Stream("ticket", fmt.Sprint(i)), projector.NoStream, testevents.TicketOpened{Title: "x"}).Events[0].Position
	}
	f.consumer(t, "live", last, "idle")
	rewind, err := f.store.Pool().Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rewind.Rollback(f.ctx) }()
	if _, err := rewind.Exec(f.ctx, `UPDATE `+f.store.Table("projector_consumers")+` SET cursor_tx_id = '0', cursor_seq = 0 WHERE name = 'live'`); err != nil {
		t.Fatal(err)
	}
	type result struct {
		res postgres.ArchiveResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := f.store.Archive(f.ctx, postgres.ArchiveOptions{StreamType: "ticket", OlderThan: tiny})
		done <- result{res, err}
	}()
	pgtest.WaitForLockOn(t, f.store.Pool(), f.store.Table("projector_consumers"))
	if err := rewind.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.res.Streams != 0 || r.res.HeldBack != 3 {
		t.Fatalf("archive with a consumer rewound in its gap: %+v, want nothing moved, 3 held back", r.res)
	}
	if n := f.remaining(t, "ticket"); n != 3 {
		t.Fatalf("%d events hot; the rewound consumer needs all 3", n)
	}
}

// An append racing an archive of the same stream: exactly one outcome,
// nothing lost. An append in flight (its head locked) makes the archive
// skip the stream; an append that comes while the archive holds the head
// waits for it and is refused with ErrStreamArchived.
func TestArchiveRacesAppend(t *testing.T) {
	t.Parallel()
	f := setup(t)
	stream := projector.Stream("ticket", "race")
	f.appendTx(t, stream, projector.NoStream, testevents.TicketOpened{Title: "x"})

	// 1. The append first: its transaction holds the head.
	tx, err := f.store.Pool().Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Append(f.ctx, tx, stream, projector.AnyVersion, testevents.TicketCommented{Body: "in flight"}); err != nil {
		t.Fatal(err)
	}
	res, err := f.store.Archive(f.ctx, postgres.ArchiveOptions{Streams: []projector.StreamRef{stream}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Streams != 0 || res.Skipped != 1 {
		t.Fatalf("archive of a stream being appended to: %+v, want it skipped", res)
	}
	if err := tx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	if n := f.remaining(t, "ticket"); n != 2 {
		t.Fatalf("%d events hot, want 2", n)
	}

	// 2. The archive first: it holds the head while it moves the events
	// (held here by a lock on the archive table), and the append waits.
	hold, err := f.store.Pool().Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hold.Rollback(f.ctx) }()
	if _, err := hold.Exec(f.ctx, `LOCK TABLE `+f.store.Table("projector_events_archive")+` IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	archived := make(chan error, 1)
	go func() {
		res, err := f.store.Archive(f.ctx, postgres.ArchiveOptions{Streams: []projector.StreamRef{stream}})
		if err == nil && (res.Streams != 1 || res.Events != 2) {
			err = fmt.Errorf("archive: %+v, want 1 stream, 2 events", res)
		}
		archived <- err
	}()
	pgtest.WaitForLockOn(t, f.store.Pool(), f.store.Table("projector_events_archive"))
	conn, err := f.store.Pool().Acquire(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	appended := make(chan error, 1)
	go func() {
		appended <- pgx.BeginFunc(f.ctx, conn, func(tx pgx.Tx) error {
			_, err := f.store.Append(f.ctx, tx, stream, projector.AnyVersion, testevents.TicketCommented{Body: "late"})
			return err
		})
	}()
	pgtest.WaitUntilBlocked(t, f.store.Pool(), conn.Conn().PgConn().PID())
	if err := hold.Rollback(f.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-archived; err != nil {
		t.Fatal(err)
	}
	if err := <-appended; !errors.Is(err, postgres.ErrStreamArchived) {
		t.Fatalf("append that waited for the archive: %v, want ErrStreamArchived", err)
	}
	if hot, arch := f.remaining(t, "ticket"), f.archived(t, "ticket"); hot != 0 || arch != 2 {
		t.Fatalf("hot %d, archived %d; want 0 and 2", hot, arch)
	}
}

// Bad options are refused before anything is read.
func TestArchiveRefusesBadOptions(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for _, o := range []postgres.ArchiveOptions{
		{},
		{StreamType: "ticket"},
		{StreamType: "ticket", OlderThan: -tiny},
		{StreamType: "ticket", OlderThan: tiny, BatchSize: postgres.MaxArchiveBatchSize + 1},
		{StreamType: "bad\x00type", OlderThan: tiny},
		{Streams: []projector.StreamRef{projector.Stream("ticket", "1")}, StreamType: "ticket"},
	} {
		if _, err := f.store.Archive(f.ctx, o); !errors.Is(err, postgres.ErrInvalidArchive) {
			t.Errorf("archive %+v: %v, want ErrInvalidArchive", o, err)
		}
	}
}

// A repair renumbers archived positions too: after a forced repair, the
// archived events sit at the repair's transaction id with negative seqs
// (before every renumbered event, in their old order), and unarchiving
// puts them back into a log that reads in the same order as before.
func TestRepairRenumbersArchivedEvents(t *testing.T) {
	t.Parallel()
	f := setup(t)
	old := projector.Stream("ticket", "old")
	f.appendTx(t, old, projector.NoStream, testevents.TicketOpened{Title: "a"}, testevents.TicketCommented{Body: "b"})
	f.appendTx(t, projector.Stream("ticket", "live"), projector.NoStream, testevents.TicketOpened{Title: "c"})
	// The log reads only below the horizon, which other tests' open
	// transactions hold back: poll for all three events, with a deadline.
	readAll := func() []uuid.UUID {
		t.Helper()
		return eventIDs(readLogN(t, f.ctx, f.store, postgres.LogQuery{}, 3))
	}
	before := readAll()
	if res, err := f.store.Archive(f.ctx, postgres.ArchiveOptions{Streams: []projector.StreamRef{old}}); err != nil || res.Events != 2 {
		t.Fatalf("archive: %+v, %v", res, err)
	}
	if _, err := f.repair(t, postgres.RepairOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, f.store.Pool(), `SELECT count(*) FROM `+f.store.Table("projector_events_archive")+` WHERE tx_id = $1::xid8 AND seq < 0`,
		postgres.RepairTxID); n != 2 {
		t.Fatalf("%d archived events renumbered, want 2", n)
	}
	if _, err := f.store.Unarchive(f.ctx, postgres.ArchiveOptions{Streams: []projector.StreamRef{old}}); err != nil {
		t.Fatal(err)
	}
	if got, want := readAll(), before; !reflect.DeepEqual(got, want) {
		t.Fatalf("log after repair and unarchive: %v, want %v", got, want)
	}
}

// TestEmptyStreamReadOneStatement: a read from version 1 that finds no
// events learns in the same statement whether the stream was archived — an
// archived stream fails with ErrStreamArchived, a stream that does not exist
// reads as empty — without a second look at the stream's head.
func TestEmptyStreamReadOneStatement(t *testing.T) {
	t.Parallel()
	cfg := pgtest.PoolConfig(t)
	var count statementCounter
	cfg.ConnConfig.Tracer = &count
	f := setup(t)
	store, err := postgres.New(f.ctx, pgtest.PoolFromConfig(t, cfg), postgres.Config{Schema: f.store.Schema(), Registry: f.types.Registry})
	if err != nil {
		t.Fatal(err)
	}
	old := projector.Stream("ticket", "old")
	f.appendTx(t, old, projector.NoStream, testevents.TicketOpened{Title: "a"})
	if res, err := f.store.Archive(f.ctx, postgres.ArchiveOptions{Streams: []projector.StreamRef{old}}); err != nil || res.Events != 1 {
		t.Fatalf("archive: %+v, %v", res, err)
	}
	conn, err := store.Pool().Acquire(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, c := range []struct {
		stream projector.StreamRef
		want   error
	}{{projector.Stream("ticket", "none"), nil}, {old, postgres.ErrStreamArchived}} {
		start := count.n.Load()
		evs, err := store.ReadStreamTx(f.ctx, conn, c.stream, postgres.StreamQuery{})
		if !errors.Is(err, c.want) || len(evs) != 0 {
			t.Fatalf("read %s: %d events, %v; want %v", c.stream, len(evs), err, c.want)
		}
		if n := count.n.Load() - start; n != 1 {
			t.Errorf("an empty read of %s sent %d statements, want 1", c.stream, n)
		}
	}
	evs, err := store.ReadStreamTx(f.ctx, conn, old, postgres.StreamQuery{IncludeArchived: true})
	if err != nil || len(evs) != 1 {
		t.Fatalf("read with the archive: %d events, %v", len(evs), err)
	}
}

// TestExportIncludesArchive: an export reads the hot log only, unless
// IncludeArchived: then archived streams' events are in the file too, each
// at its place in log order, filters applied alike.
func TestExportIncludesArchive(t *testing.T) {
	t.Parallel()
	f := setup(t)
	old, live := projector.Stream("ticket", "old"), projector.Stream("ticket", "live")
	f.appendTx(t, old, projector.NoStream, testevents.TicketOpened{Title: "a"})
	f.appendTx(t, live, projector.NoStream, testevents.TicketOpened{Title: "b"})
	f.appendTx(t, old, projector.ExactVersion(1), testevents.TicketCommented{Body: "c"})
	f.appendTx(t, projector.Stream("user", "u"), projector.NoStream, testevents.TicketClosed{})
	want := eventIDs(readLogN(t, f.ctx, f.store, postgres.LogQuery{}, 4))
	if res, err := f.store.Archive(f.ctx, postgres.ArchiveOptions{Streams: []projector.StreamRef{old}}); err != nil || res.Events != 2 {
		t.Fatalf("archive: %+v, %v", res, err)
	}
	export := func(o postgres.ExportOptions) []uuid.UUID {
		t.Helper()
		var out bytes.Buffer
		if _, err := f.store.Export(f.ctx, &out, o); err != nil {
			t.Fatal(err)
		}
		var ids []uuid.UUID
		for _, h := range decodeHistory(t, &out) {
			ids = append(ids, h.ID)
		}
		return ids
	}
	if got := export(postgres.ExportOptions{}); !reflect.DeepEqual(got, []uuid.UUID{want[1], want[3]}) {
		t.Fatalf("export of the hot log: %v, want %v", got, []uuid.UUID{want[1], want[3]})
	}
	if got := export(postgres.ExportOptions{IncludeArchived: true}); !reflect.DeepEqual(got, want) {
		t.Fatalf("export with the archive: %v, want %v", got, want)
	}
	if got := export(postgres.ExportOptions{IncludeArchived: true, StreamTypes: []string{"ticket"}, PageSize: 1}); !reflect.DeepEqual(got, want[:3]) {
		t.Fatalf("export of tickets with the archive, a page per event: %v, want %v", got, want[:3])
	}
}

// TestExportWaitsForTheArchivesHorizon: with every stream archived the hot
// table is empty, and an export with the archive still waits until the
// horizon has passed the archived events before it reads. A transaction
// older than them, open elsewhere, holds the export back (here until its
// deadline, an error) instead of letting it write a file without them and
// report success; once that transaction ends, the export has every event.
func TestExportWaitsForTheArchivesHorizon(t *testing.T) {
	t.Parallel()
	f := setup(t)
	older, err := f.store.Pool().Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer older.Rollback(f.ctx)
	if _, err := older.Exec(f.ctx, `SELECT pg_current_xact_id()`); err != nil {
		t.Fatal(err)
	}
	s := projector.Stream("ticket", "closed")
	f.appendTx(t, s, projector.NoStream, testevents.TicketOpened{Title: "a"}, testevents.TicketClosed{})
	if res, err := f.store.Archive(f.ctx, postgres.ArchiveOptions{Streams: []projector.StreamRef{s}}); err != nil || res.Events != 2 {
		t.Fatalf("archive: %+v, %v", res, err)
	}
	ctx, cancel := context.WithTimeout(f.ctx, 300*time.Millisecond)
	defer cancel()
	var file bytes.Buffer
	res, err := f.store.Export(ctx, &file, postgres.ExportOptions{IncludeArchived: true})
	if err == nil {
		t.Fatalf("export with the archive reported success with %d of 2 events while a transaction older than them was open", res.Events)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("export while an older transaction is open: %v, want it to wait until its deadline", err)
	}
	if err := older.Rollback(f.ctx); err != nil {
		t.Fatal(err)
	}
	file.Reset()
	if res, err := f.store.Export(f.ctx, &file, postgres.ExportOptions{IncludeArchived: true}); err != nil || res.Events != 2 {
		t.Fatalf("export once the older transaction ended: %+v, %v, want 2 events", res, err)
	}
}

// TestImportSeesTheArchive: an import checks its events against the
// archive as against the hot log. A file exported with the archive and
// imported back into the same schema is skipped whole (no archived event
// copied into the hot log, where unarchiving would then collide); an event
// whose id an archived event holds, in another stream, is refused at its
// line.
func TestImportSeesTheArchive(t *testing.T) {
	t.Parallel()
	f := setup(t)
	old := projector.Stream("ticket", "old")
	f.appendTx(t, old, projector.NoStream, testevents.TicketOpened{Title: "a"}, testevents.TicketCommented{Body: "c"})
	f.appendTx(t, projector.Stream("ticket", "live"), projector.NoStream, testevents.TicketOpened{Title: "b"})
	readLogN(t, f.ctx, f.store, postgres.LogQuery{}, 3)
	if res, err := f.store.Archive(f.ctx, postgres.ArchiveOptions{Streams: []projector.StreamRef{old}}); err != nil || res.Events != 2 {
		t.Fatalf("archive: %+v, %v", res, err)
	}
	var file bytes.Buffer
	if res, err := f.store.Export(f.ctx, &file, postgres.ExportOptions{IncludeArchived: true}); err != nil || res.Events != 3 {
		t.Fatalf("export: %+v, %v", res, err)
	}
	exported := file.String()
	res, err := f.store.Import(f.ctx, strings.NewReader(exported), postgres.ImportOptions{})
	if err != nil || res.Imported != 0 || res.Skipped != 3 {
		t.Fatalf("import of the schema's own export: %+v, %v", res, err)
	}
	if n := countRows(t, f.store.Pool(), `SELECT count(*) FROM `+f.store.Table("projector_events")); n != 1 {
		t.Fatalf("%d hot events after the import, want 1", n)
	}
	if _, err := f.store.Unarchive(f.ctx, postgres.ArchiveOptions{Streams: []projector.StreamRef{old}}); err != nil {
		t.Fatalf("unarchive after the import: %v", err)
	}
	if _, err := f.store.Archive(f.ctx, postgres.ArchiveOptions{Streams: []projector.StreamRef{old}}); err != nil {
		t.Fatal(err)
	}
	// The archived opening event's id, moved to a stream of its own.
	line := strings.Split(strings.TrimSpace(exported), "\n")[1]
	moved := strings.Replace(line, `"old"`, `"elsewhere"`, 1)
	if moved == line {
		t.Fatalf("no stream id to replace in %s", line)
	}
	header := strings.Split(exported, "\n")[0]
	_, err = f.store.Import(f.ctx, strings.NewReader(header+"\n"+moved+"\n"), postgres.ImportOptions{})
	var lineErr *postgres.HistoryLineError
	if !errors.As(err, &lineErr) || lineErr.Line != 2 || !errors.Is(err, postgres.ErrInvalidHistory) {
		t.Fatalf("import of an archived event's id in another stream: %v", err)
	}
}

// TestUnarchiveIDConflict: an event id both in the archive and in the hot
// log (written around Projector: its appends and imports check the
// archive) makes unarchive fail with ErrUnarchiveConflict naming the id,
// and move nothing.
func TestUnarchiveIDConflict(t *testing.T) {
	t.Parallel()
	f := setup(t)
	old := projector.Stream("ticket", "old")
	res := f.appendTx(t, old, projector.NoStream, testevents.TicketOpened{Title: "a"})
	if r, err := f.store.Archive(f.ctx, postgres.ArchiveOptions{Streams: []projector.StreamRef{old}}); err != nil || r.Events != 1 {
		t.Fatalf("archive: %+v, %v", r, err)
	}
	// A copy of the archived event in another stream of the hot log.
	if _, err := f.store.Pool().Exec(f.ctx, `INSERT INTO `+f.store.Table("projector_events")+`
		(id, tenant_id, stream_type, stream_id, version, type, schema_version, data, correlation_id)
		SELECT id, tenant_id, stream_type, 'copy', version, type, schema_version, data, correlation_id
		FROM `+f.store.Table("projector_events_archive")); err != nil {
		t.Fatal(err)
	}
	_, err := f.store.Unarchive(f.ctx, postgres.ArchiveOptions{Streams: []projector.StreamRef{old}})
	if !errors.Is(err, postgres.ErrUnarchiveConflict) || !strings.Contains(err.Error(), res.Events[0].ID.String()) {
		t.Fatalf("unarchive with an id in both tables: %v", err)
	}
	if n := f.archived(t, "ticket"); n != 1 {
		t.Fatalf("%d events left in the archive, want 1", n)
	}
}
