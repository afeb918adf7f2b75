package postgres_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// TestImportRefusesArchivedStream: an import that continues an archived
// stream (events after the archive's last version) is refused with
// ErrStreamArchived, as an append is, and writes nothing: its events would
// otherwise land in the hot log of a stream whose head says archived, read
// by a plain read as the stream's whole history from the middle. Lines the
// archive already holds are skipped as before.
func TestImportRefusesArchivedStream(t *testing.T) {
	t.Parallel()
	src := setup(t)
	old := projector.Stream("ticket", "old")
	src.appendTx(t, old, projector.NoStream, testevents.TicketOpened{Title: "a"}, testevents.TicketCommented{Body: "b"})
	src.appendTx(t, old, projector.AnyVersion, testevents.TicketCommented{Body: "c"})
	var file bytes.Buffer
	if res, err := src.store.Export(src.ctx, &file, postgres.ExportOptions{}); err != nil || res.Events != 3 {
		t.Fatalf("export: %+v, %v", res, err)
	}
	lines := strings.Split(strings.TrimSpace(file.String()), "\n")
	f := setup(t)
	if res, err := f.store.Import(f.ctx, strings.NewReader(strings.Join(lines[:3], "\n")+"\n"), postgres.ImportOptions{}); err != nil || res.Imported != 2 {
		t.Fatalf("import of the first two events: %+v, %v", res, err)
	}
	if res, err := f.store.Archive(f.ctx, postgres.ArchiveOptions{Streams: []projector.StreamRef{old}}); err != nil || res.Events != 2 {
		t.Fatalf("archive: %+v, %v", res, err)
	}
	res, err := f.store.Import(f.ctx, strings.NewReader(file.String()), postgres.ImportOptions{})
	if !errors.Is(err, postgres.ErrStreamArchived) {
		t.Fatalf("import continuing an archived stream: %+v, %v; want ErrStreamArchived", res, err)
	}
	if n := countRows(t, f.store.Pool(), `SELECT count(*) FROM `+f.store.Table("projector_events")); n != 0 {
		t.Fatalf("%d hot events after the refused import, want 0", n)
	}
	// The archive's own lines alone are skipped, as before.
	if res, err := f.store.Import(f.ctx, strings.NewReader(strings.Join(lines[:3], "\n")+"\n"), postgres.ImportOptions{}); err != nil || res.Skipped != 2 {
		t.Fatalf("import of the archived events again: %+v, %v", res, err)
	}
}

// TestImportRefusesAnArchivedEventsID: a line bringing, for another stream,
// the id of an event the archive holds is refused at its line, naming where
// the archive holds it, and nothing of its batch is written (the events
// table's unique id index does not see the archive; unarchiving would
// collide).
func TestImportRefusesAnArchivedEventsID(t *testing.T) {
	t.Parallel()
	f := setup(t)
	old := projector.TenantStream("acme", "ticket", "old")
	res := f.appendTx(t, old, projector.NoStream, testevents.TicketOpened{Title: "a"}, testevents.TicketCommented{Body: "b"})
	if ar, err := f.store.Archive(f.ctx, postgres.ArchiveOptions{Streams: []projector.StreamRef{old}}); err != nil || ar.Events != 2 {
		t.Fatalf("archive: %+v, %v", ar, err)
	}
	file := historyFile(
		eventLine("new", 1, "ticket.opened", `{"title":"x"}`),
		eventLineID(res.Events[1].ID.String(), "new", 2, "ticket.commented", `{"body":"y"}`),
	)
	_, err := f.store.Import(f.ctx, strings.NewReader(file), postgres.ImportOptions{})
	var le *postgres.HistoryLineError
	if !errors.As(err, &le) || le.Line != 3 || !errors.Is(err, postgres.ErrInvalidHistory) ||
		!strings.Contains(err.Error(), "already in the log's archive, at acme/ticket/old version 2") {
		t.Fatalf("err %v: want line 3, id already in the log's archive at acme/ticket/old version 2", err)
	}
	if n := countRows(t, f.store.Pool(), `SELECT count(*) FROM `+f.store.Table("projector_events")); n != 0 {
		t.Fatalf("%d hot events after the refused import, want 0", n)
	}
}
