package postgres_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/stores/postgres"
)

// parallelFile is a history file of n ticket.opened events, one per
// stream, with bad[i] in place of event i's line, and the events' ids.
func parallelFile(n int, bad map[int]string) (string, []uuid.UUID) {
	lines, ids := make([]string, n), make([]uuid.UUID, n)
	for i := range lines {
		ids[i] = uuid.New()
		lines[i] = eventLineID(ids[i].String(), fmt.Sprintf("s-%d", i), 1, "ticket.opened", `{"title":"x"}`)
		if b, ok := bad[i]; ok {
			lines[i] = b
		}
	}
	return historyFile(lines...), ids
}

// TestHistory_ImportFirstBadLineAcrossWorkers: with a batch decoded by four
// workers, the error is the first bad line's in the file, whichever worker
// found it and whether it is a line's own fault (decoded by its worker) or
// one between lines (checked afterwards in file order); nothing of the
// batch is written, and Lines counts the events before it.
func TestHistory_ImportFirstBadLineAcrossWorkers(t *testing.T) {
	t.Parallel()
	const n = 2000 // four workers of 500 lines
	dup := uuid.NewString()
	dupAt := func(i int) string {
		return eventLineID(dup, fmt.Sprintf("d-%d", i), 1, "ticket.opened", `{"title":"x"}`)
	}
	tests := []struct {
		name  string
		bad   map[int]string
		first int // the index of the event whose line the error names
		want  string
	}{
		{"a repeated id in the second worker's share before a bad line in the fourth's",
			map[int]string{100: dupAt(100), 900: dupAt(900), 1700: "{nope"}, 900, "repeats line 102"},
		{"a bad line in the second worker's share before a repeated id in the fourth's",
			map[int]string{600: eventLine("x", 1, "ticket.exploded", `{}`), 1400: dupAt(1400), 1500: dupAt(1500)}, 600, "never defined"},
		{"bad lines in two shares, the later worker's first",
			map[int]string{1200: "{nope", 300: eventLine("y", 1, "ticket.opened", `{"title":""}`)}, 300, "title is required"},
		{"a bad last line", map[int]string{n - 1: "{nope"}, n - 1, "invalid character"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			file, _ := parallelFile(n, tt.bad)
			res, err := f.store.ImportWorkers(f.ctx, strings.NewReader(file), postgres.ImportOptions{}, 4)
			var le *postgres.HistoryLineError
			if !errors.As(err, &le) || le.Line != tt.first+2 || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v: want line %d saying %q", err, tt.first+2, tt.want)
			}
			if res.Lines != int64(tt.first) || res.Imported != 0 {
				t.Errorf("result %+v: want %d lines read before the bad one, nothing imported", res, tt.first)
			}
			if got := countEvents(t, f); got != 0 {
				t.Errorf("%d events written from the failing batch", got)
			}
		})
	}
}

// TestHistory_ImportWorkersKeepFileOrder: decoded by four workers in
// batches that do not divide the file, the log holds the file's events in
// the file's order.
func TestHistory_ImportWorkersKeepFileOrder(t *testing.T) {
	t.Parallel()
	f := setup(t)
	file, ids := parallelFile(3000, nil)
	res, err := f.store.ImportWorkers(f.ctx, strings.NewReader(file), postgres.ImportOptions{BatchSize: 1100}, 4)
	if err != nil || res.Imported != 3000 || res.Batches != 3 {
		t.Fatalf("import: %+v, %v", res, err)
	}
	rows, err := f.store.Pool().Query(f.ctx, `SELECT id FROM `+f.store.Table("projector_events")+` ORDER BY tx_id, seq`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		t.Fatal(err)
	}
	for i := range ids {
		if i >= len(got) || got[i] != ids[i] {
			t.Fatalf("log event %d is not the file's event %d (%d events in the log)", i, i, len(got))
		}
	}
}

// TestHistory_ImportSignalsWatches: each committed batch tells the Store's
// append watches its transaction, as an append does, so a dispatcher in
// the process looks at the log at once; the id is the one the batch's
// rows carry.
func TestHistory_ImportSignalsWatches(t *testing.T) {
	t.Parallel()
	f := setup(t)
	w := f.store.WatchAppends()
	defer w.Close()
	file, _ := parallelFile(10, nil)
	if _, err := f.store.Import(f.ctx, strings.NewReader(file), postgres.ImportOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.C():
	default:
		t.Fatal("the import signalled no watch")
	}
	var want uint64
	if err := f.store.Pool().QueryRow(f.ctx, `SELECT max(tx_id::text::bigint) FROM `+f.store.Table("projector_events")).Scan(&want); err != nil {
		t.Fatal(err)
	}
	if got := w.Take(); got != want {
		t.Fatalf("watch got transaction %d, the imported rows carry %d", got, want)
	}
}

// TestHistory_ImportLineReadTwoWays: a line giving its stream twice, which
// encoding/json reads as the last one, is imported into that stream, with
// its head: the import plans a batch's versions and heads from each line's
// stream and version prescanned at its head, and a line the prescan reads
// otherwise than the decoder makes it write the batch again from the
// decoded events rather than fail or write the heads of the wrong stream.
func TestHistory_ImportLineReadTwoWays(t *testing.T) {
	t.Parallel()
	f := setup(t)
	twice := strings.TrimSuffix(eventLine("first", 1, "ticket.opened", `{"title":"x"}`), "}") +
		`,"stream":{"tenant":"acme","type":"ticket","id":"last"}}`
	file := historyFile(eventLine("other", 1, "ticket.opened", `{"title":"x"}`), twice,
		eventLine("last", 2, "ticket.opened", `{"title":"y"}`))
	res, err := f.store.Import(f.ctx, strings.NewReader(file), postgres.ImportOptions{})
	if err != nil || res.Imported != 3 || res.Lines != 3 || res.Batches != 1 {
		t.Fatalf("import: %+v, %v", res, err)
	}
	rows, err := f.store.Pool().Query(f.ctx, `SELECT stream_id || ' ' || version FROM `+f.store.Table("projector_events")+` ORDER BY tx_id, seq`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"other 1", "last 1", "last 2"}; !slices.Equal(got, want) {
		t.Fatalf("log %q, want %q", got, want)
	}
	rows, err = f.store.Pool().Query(f.ctx, `SELECT stream_id || ' ' || version FROM `+f.store.Table("projector_streams")+` ORDER BY stream_id`)
	if err != nil {
		t.Fatal(err)
	}
	if got, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if want := []string{"last 2", "other 1"}; !slices.Equal(got, want) {
		t.Fatalf("stream heads %q, want %q", got, want)
	}
}
