package postgres_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

// TestHistory_ReimportRefusesAnEditedLine: an import run again skips the
// events the log already holds only when each is the line's event — its
// type, schema version (not shown here: this registry knows one) and payload (as JSON: key order and spacing do not
// matter), not only its id, stream and version. A line edited since it was
// imported is refused at its line, nothing of its batch written, where it
// was counted as skipped and reported success.
func TestHistory_ReimportRefusesAnEditedLine(t *testing.T) {
	t.Parallel()
	src := setup(t)
	stream := projector.Stream("ticket", "t-1")
	src.appendTx(t, stream, projector.NoStream, testevents.TicketOpened{Title: "printer"},
		testevents.TicketCommented{Body: "on fire"})
	var file bytes.Buffer
	if _, err := src.store.Export(src.ctx, &file, postgres.ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(file.String(), "\n") // the header, two events, ""
	dst := pgtest.Store(t, src.types.Registry)
	importFile := func(text string) (postgres.ImportResult, error) {
		return dst.Import(src.ctx, strings.NewReader(text), postgres.ImportOptions{})
	}
	if res, err := importFile(file.String()); err != nil || res.Imported != 2 {
		t.Fatalf("first import: %+v, %v", res, err)
	}
	// Again, unchanged, and with the payload's keys respaced: skipped.
	var h postgres.HistoryEvent
	if err := json.Unmarshal([]byte(lines[2]), &h); err != nil {
		t.Fatal(err)
	}
	h.Payload = json.RawMessage(" {  \"body\" :  \"on fire\" } ")
	respaced, _ := json.Marshal(h)
	for name, text := range map[string]string{"unchanged": file.String(), "respaced": lines[0] + lines[1] + string(respaced) + "\n"} {
		if res, err := importFile(text); err != nil || res.Imported != 0 || res.Skipped != int64(strings.Count(text, "\n")-1) {
			t.Fatalf("%s again: %+v, %v", name, res, err)
		}
	}
	// Edited: refused at its line.
	for name, edit := range map[string]func(h *postgres.HistoryEvent){
		"payload": func(h *postgres.HistoryEvent) { h.Payload = json.RawMessage(`{"body":"on ice"}`) },
		"type": func(h *postgres.HistoryEvent) {
			h.Type = src.types.Opened.Name()
			h.Payload = json.RawMessage(`{"title":"x"}`)
		},
	} {
		var e postgres.HistoryEvent
		if err := json.Unmarshal([]byte(lines[2]), &e); err != nil {
			t.Fatal(err)
		}
		edit(&e)
		edited, _ := json.Marshal(e)
		res, err := importFile(lines[0] + lines[1] + string(edited) + "\n")
		var lineErr *postgres.HistoryLineError
		if !errors.As(err, &lineErr) || lineErr.Line != 3 || !errors.Is(err, postgres.ErrInvalidHistory) || res.Imported != 0 {
			t.Fatalf("edited %s: %+v, %v; want line 3 refused", name, res, err)
		}
	}
	if evs, err := dst.ReadStream(src.ctx, stream, postgres.StreamQuery{}); err != nil || len(evs) != 2 ||
		evs[1].Payload != (testevents.TicketCommented{Body: "on fire"}) {
		t.Fatalf("the log after the refused imports: %+v, %v", evs, err)
	}
}
