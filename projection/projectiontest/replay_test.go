package projectiontest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/projection/projectiontest"
	"github.com/projectorhq/projector/stores/postgres"
)

// ticketModel is a projection of tickets, one row per ticket: events,
// comments and status. Version 2 says "merged" of a ticket closed as a
// duplicate, where version 1 says "closed".
func ticketModel(t *testing.T, ty testevents.Types, table string, version int) *projection.Async {
	p := projection.NewAsync(fmt.Sprintf("replay_tickets_v%d", version), projection.AsyncConfig{})
	must(t, projection.OnBatch(p, func(ctx context.Context, tx pgx.Tx, b projection.Batch) error {
		var tenants, ids, statuses []string
		var events, comments []int64
		for _, s := range b.Streams {
			status := ""
			var n int64
			for _, ev := range s.Events {
				switch e := ev.Payload.(type) {
				case testevents.TicketCommented:
					n++
				case testevents.TicketClosed:
					status = "closed"
					if version >= 2 && e.Reason == "duplicate" {
						status = "merged"
					}
				}
			}
			tenants, ids, statuses = append(tenants, s.Stream.Tenant), append(ids, s.Stream.ID), append(statuses, status)
			events, comments = append(events, int64(len(s.Events))), append(comments, n)
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` AS c (tenant, id, events, comments, status)
			SELECT te, id, ev, co, CASE WHEN st = '' THEN 'open' ELSE st END
			FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::text[]) AS u(te, id, ev, co, st)
			ON CONFLICT (tenant, id) DO UPDATE SET events = c.events + excluded.events, comments = c.comments + excluded.comments,
				status = CASE WHEN excluded.status = 'open' THEN c.status ELSE excluded.status END`,
			tenants, ids, events, comments, statuses)
		return err
	}, ty.Opened, ty.Commented, ty.Closed))
	return p
}

// writeHistory writes a history file of streams tickets of perStream
// events each (opened, comments, closed); the tickets in duplicates are
// closed as duplicates.
func writeHistory(t *testing.T, path string, streams, perStream int, duplicates map[int]bool) {
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	enc := postgres.NewHistoryEncoder(f)
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for s := range streams {
		for v := 1; v <= perStream; v++ {
			var typ string
			var payload any
			switch v {
			case 1:
				typ, payload = "ticket.opened", testevents.TicketOpened{Title: fmt.Sprintf("ticket %d", s)}
			case perStream:
				reason := ""
				if duplicates[s] {
					reason = "duplicate"
				}
				typ, payload = "ticket.closed", testevents.TicketClosed{Reason: reason}
			default:
				typ, payload = "ticket.commented", testevents.TicketCommented{Body: "more toner", N: v}
			}
			data, err := json.Marshal(payload)
			if err != nil {
				t.Fatal(err)
			}
			must(t, enc.Encode(postgres.HistoryEvent{
				Stream:  postgres.HistoryStream{Tenant: []string{"acme", "globex"}[s%2], Type: "ticket", ID: fmt.Sprintf("t-%04d", s)},
				Version: int64(v), Type: typ, SchemaVersion: 1, ID: uuid.New(), RecordedAt: at.Add(time.Duration(s*perStream+v) * time.Second),
				Payload: data,
			}))
		}
	}
	must(t, enc.Flush())
}

// TestReplay_CatchesChangedRows replays 100k events of history (20k under
// the race detector: 1,000 tickets either way) through a projection, records the model as golden, then replays the same history
// through a changed version of it: exactly the three tickets the change
// touches are named, with the column that differs.
func TestReplay_CatchesChangedRows(t *testing.T) {
	t.Parallel()
	ty := testevents.New()
	store := pgtest.Store(t, ty.Registry)
	table := pgx.Identifier{store.Schema(), "replay_tickets"}.Sanitize()
	if _, err := store.Pool().Exec(context.Background(), `CREATE TABLE `+table+` (tenant text, id text, events bigint NOT NULL,
		comments bigint NOT NULL, status text NOT NULL, PRIMARY KEY (tenant, id))`); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	history, golden := filepath.Join(dir, "history.jsonl"), filepath.Join(dir, "testdata", "tickets.golden.jsonl")
	perStream := 100
	if raceEnabled {
		perStream = 20
	}
	writeHistory(t, history, 1000, perStream, map[int]bool{7: true, 420: true, 999: true})
	cfg := projectiontest.ReplayConfig{Store: store, Tables: []string{table}, Golden: golden}

	// The version in production records the model it builds.
	update := cfg
	update.Update = true
	res := projectiontest.ReplayTest(t, history, ticketModel(t, ty, table, 1), update)
	if res.Events != 1000*perStream || res.Rows != 1000 {
		t.Fatalf("recorded %d rows from %d events, want 1000 from %d", res.Rows, res.Events, 1000*perStream)
	}
	// The changed version is caught, with exactly the three rows it alters
	// (and so none of the 997 it leaves alone: the replay itself adds no
	// difference).
	var changed projectiontest.ReplayResult
	msg := run(t, func(ft testing.TB) {
		changed = projectiontest.ReplayTest(ft, history, ticketModel(t, ty, table, 2), cfg)
	})
	var keys []string
	for _, d := range changed.Differences {
		keys = append(keys, d.Key)
		if d.Kind != "changed" || len(d.Columns) != 1 || d.Columns[0] != "status" || d.Golden["status"] != "closed" || d.Replay["status"] != "merged" {
			t.Errorf("difference %s: want status closed → merged", d)
		}
	}
	if want := `["acme","t-0420"] ["globex","t-0007"] ["globex","t-0999"]`; strings.Join(keys, " ") != want {
		t.Fatalf("differing rows %v, want %s\n%s", keys, want, msg)
	}
	for _, want := range []string{
		"replay_tickets\": 3 rows differ",
		`"replay_tickets" ["acme","t-0420"] changed: status "closed" → "merged"`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("failure message lacks %q:\n%s", want, msg)
		}
	}
	if strings.Count(msg, "changed:") != 3 {
		t.Errorf("failure message names %d rows, want 3:\n%s", strings.Count(msg, "changed:"), msg)
	}
}

// A golden file holding a table ReplayConfig.Tables does not name (recorded
// under another schema, or another spelling of the name) fails the test,
// naming both: the replay compared that table with nothing, and passed
// when the table it was given is empty, or failed with every row "extra
// in the replay" and no word of why.
func TestReplay_GoldenOfOtherTables(t *testing.T) {
	t.Parallel()
	ty := testevents.New()
	store := pgtest.Store(t, ty.Registry)
	table := pgx.Identifier{store.Schema(), "replay_tickets"}.Sanitize()
	other := pgx.Identifier{store.Schema(), "replay_other"}.Sanitize()
	for _, tb := range []string{table, other} {
		if _, err := store.Pool().Exec(context.Background(), `CREATE TABLE `+tb+` (tenant text, id text, events bigint NOT NULL,
			comments bigint NOT NULL, status text NOT NULL, PRIMARY KEY (tenant, id))`); err != nil {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	history, golden := filepath.Join(dir, "history.jsonl"), filepath.Join(dir, "tickets.golden.jsonl")
	writeHistory(t, history, 4, 3, nil)
	projectiontest.ReplayTest(t, history, ticketModel(t, ty, table, 1), projectiontest.ReplayConfig{Store: store, Tables: []string{table}, Golden: golden, Update: true})

	// Compared as another table: the replay fills it (every row extra), or
	// leaves it empty (nothing differs, yet nothing was compared).
	for _, into := range []string{other, table} {
		msg := run(t, func(ft testing.TB) {
			projectiontest.ReplayTest(ft, history, ticketModel(t, ty, into, 1), projectiontest.ReplayConfig{Store: store, Tables: []string{other}, Golden: golden})
		})
		for _, want := range []string{golden + " holds the rows of " + table + ", which ReplayConfig.Tables (" + other + ") does not name",
			"record the golden file again with ReplayConfig.Update"} {
			if !strings.Contains(msg, want) {
				t.Errorf("replayed into %s: failure message lacks %q:\n%s", into, want, msg)
			}
		}
	}
}
