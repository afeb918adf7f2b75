package postgres_test

import (
	"strings"
	"testing"

	"github.com/projectorhq/projector/stores/postgres"
)

// An import into a fresh log analyzes the events and stream heads tables
// once its first batch committed, so the later batches' lookups are
// planned with statistics even where autovacuum is off or late (off here,
// so only the import can have analyzed them); once only, and not at all
// when the statistics already count more rows than a batch writes.
func TestHistory_ImportAnalyzesFreshLog(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for _, table := range []string{"projector_events", "projector_streams"} {
		if _, err := f.store.Pool().Exec(f.ctx, `ALTER TABLE `+f.store.Table(table)+` SET (autovacuum_enabled = false)`); err != nil {
			t.Fatal(err)
		}
	}
	stats := func(table string) (rows float64) {
		t.Helper()
		if err := f.store.Pool().QueryRow(f.ctx, `SELECT reltuples FROM pg_class WHERE oid = $1::regclass`,
			f.store.Table(table)).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		return rows
	}
	history := func(stream string, n int) string {
		lines := make([]string, n)
		for i := range lines {
			lines[i] = eventLine(stream, int64(i+1), "ticket.commented", `{"body":"b"}`)
		}
		return historyFile(lines...)
	}
	if _, err := f.store.Import(f.ctx, strings.NewReader(history("a", 30)), postgres.ImportOptions{BatchSize: 10}); err != nil {
		t.Fatal(err)
	}
	// Analyzed after the first batch of 10 events (and its one stream
	// head), not after the later ones.
	if events, streams := stats("projector_events"), stats("projector_streams"); events != 10 || streams != 1 {
		t.Fatalf("statistics count %v events and %v stream heads; want those of the first batch, 10 and 1", events, streams)
	}
	// A log whose statistics count more rows than a batch writes is left
	// to autovacuum.
	if _, err := f.store.Import(f.ctx, strings.NewReader(history("b", 10)), postgres.ImportOptions{BatchSize: 5}); err != nil {
		t.Fatal(err)
	}
	if events := stats("projector_events"); events != 10 {
		t.Fatalf("statistics count %v events after a second import; want the first import's 10 still", events)
	}
}
