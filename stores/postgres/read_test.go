package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
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

func TestReadLogFiltersAndHorizon(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.appendTx(t, projector.Stream("ticket", "a"), projector.NoStream, testevents.TicketOpened{Title: "a"}, testevents.TicketCommented{Body: "1"})
	f.appendTx(t, projector.Stream("invoice", "b"), projector.NoStream, testevents.TicketCommented{Body: "2"})
	last := f.appendTx(t, projector.Stream("ticket", "c"), projector.NoStream, testevents.TicketOpened{Title: "c"}, testevents.TicketClosed{})

	read := func(q postgres.LogQuery) postgres.LogBatch {
		t.Helper()
		// Poll: a transaction elsewhere in the cluster can hold the horizon
		// for a moment.
		deadline := time.Now().Add(20 * time.Second)
		for {
			b, err := f.store.ReadLog(f.ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			if b.Horizon > last.Events[1].Position.TxID || time.Now().After(deadline) {
				return b
			}
		}
	}
	types := func(b postgres.LogBatch) string {
		var s []string
		for _, ev := range b.Events {
			s = append(s, ev.Type)
		}
		return strings.Join(s, ",")
	}
	if got := types(read(postgres.LogQuery{})); got != "ticket.opened,ticket.commented,ticket.commented,ticket.opened,ticket.closed" {
		t.Errorf("all: %s", got)
	}
	if got := types(read(postgres.LogQuery{EventTypes: []string{"ticket.opened"}})); got != "ticket.opened,ticket.opened" {
		t.Errorf("by event type: %s", got)
	}
	if got := types(read(postgres.LogQuery{StreamTypes: []string{"invoice"}})); got != "ticket.commented" {
		t.Errorf("by stream type: %s", got)
	}

	// A filter that matches nothing still moves the cursor past everything.
	b := read(postgres.LogQuery{EventTypes: []string{"nothing.happened"}})
	if len(b.Events) != 0 || b.Full {
		t.Fatalf("empty filter: %d events, full=%v", len(b.Events), b.Full)
	}
	next := b.Next(projector.Start)
	if !last.Events[1].Position.Less(next) {
		t.Fatalf("cursor after an empty filtered read is %v, not past the last event %v", next, last.Events[1].Position)
	}
	if b2, _ := f.store.ReadLog(f.ctx, postgres.LogQuery{After: next}); len(b2.Events) != 0 {
		t.Fatalf("reading after the horizon returned %d old events", len(b2.Events))
	}

	// A full batch stops at its last event, not at the horizon.
	b = read(postgres.LogQuery{Limit: 2})
	if !b.Full || b.Next(projector.Start) != b.Events[1].Position {
		t.Fatalf("full batch: full=%v next=%v last=%v", b.Full, b.Next(projector.Start), b.Events[1].Position)
	}
}

// Dispatchers read inside their own transaction; events that transaction
// appends must not be passed by the horizon it reports.
func TestReadLogInsideWritingTransaction(t *testing.T) {
	t.Parallel()
	f := setup(t)
	err := pgx.BeginFunc(f.ctx, f.store.Pool(), func(tx pgx.Tx) error {
		res, err := f.store.Append(f.ctx, tx, projector.Stream("ticket", "own"), projector.NoStream, testevents.TicketOpened{Title: "own"})
		if err != nil {
			return err
		}
		b, err := f.store.ReadLogTx(f.ctx, tx, postgres.LogQuery{})
		if err != nil {
			return err
		}
		if next := b.Next(projector.Start); !next.Less(res.Events[0].Position) {
			t.Errorf("cursor %v would pass this transaction's own event at %v", next, res.Events[0].Position)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

type ticketOpenedV2 struct {
	Title    string `json:"title"`
	Priority string `json:"priority"`
}

// An event stored at schema version 1 reads back as version 2 through the
// upcaster, in stream reads and log reads alike.
func TestUpcastOnRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.Schema(t)
	v1 := projector.NewRegistry()
	projector.MustDefine[testevents.TicketOpened](v1, "ticket.opened")
	old, err := postgres.New(ctx, pgtest.Pool(t), postgres.Config{Schema: schema, Registry: v1})
	if err != nil {
		t.Fatal(err)
	}
	s := projector.Stream("ticket", "up")
	if err := pgx.BeginFunc(ctx, old.Pool(), func(tx pgx.Tx) error {
		_, err := old.Append(ctx, tx, s, projector.NoStream, testevents.TicketOpened{Title: "legacy"})
		return err
	}); err != nil {
		t.Fatal(err)
	}

	v2 := projector.NewRegistry()
	projector.MustDefine[ticketOpenedV2](v2, "ticket.opened", projector.TypeConfig{
		SchemaVersion: 2,
		Upcasters: []projector.Upcaster{{From: 1, Func: func(old json.RawMessage) (json.RawMessage, error) {
			var m map[string]any
			if err := json.Unmarshal(old, &m); err != nil {
				return nil, err
			}
			m["priority"] = "normal"
			return json.Marshal(m)
		}}},
	})
	cur, err := postgres.New(ctx, pgtest.Pool(t), postgres.Config{Schema: schema, Registry: v2})
	if err != nil {
		t.Fatal(err)
	}
	evs, err := cur.ReadStream(ctx, s, postgres.StreamQuery{})
	if err != nil {
		t.Fatal(err)
	}
	want := ticketOpenedV2{Title: "legacy", Priority: "normal"}
	if len(evs) != 1 || evs[0].Payload != want || evs[0].SchemaVersion != 2 {
		t.Fatalf("stream read: %+v", evs)
	}
	var b postgres.LogBatch
	for deadline := time.Now().Add(20 * time.Second); len(b.Events) == 0 && time.Now().Before(deadline); {
		if b, err = cur.ReadLog(ctx, postgres.LogQuery{}); err != nil {
			t.Fatal(err)
		}
	}
	if len(b.Events) != 1 || b.Events[0].Payload != want {
		t.Fatalf("log read: %+v", b.Events)
	}
	// The old binary cannot read what the new one writes, and says so.
	if err := pgx.BeginFunc(ctx, cur.Pool(), func(tx pgx.Tx) error {
		_, err := cur.Append(ctx, tx, s, projector.ExactVersion(1), ticketOpenedV2{Title: "new", Priority: "high"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := old.ReadStream(ctx, s, postgres.StreamQuery{}); !errors.Is(err, projector.ErrInvalidPayload) {
		t.Fatalf("old reader on a newer schema version: %v, want ErrInvalidPayload", err)
	}
}

// A database restored into another cluster carries transaction ids from
// that cluster's future; the store must refuse to start rather than hide
// new events behind them.
func TestRestoredDatabaseGuard(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.appendTx(t, projector.Stream("ticket", "r"), projector.NoStream, testevents.TicketOpened{Title: "r"})
	if _, err := f.store.Pool().Exec(f.ctx, `UPDATE `+f.store.Table("projector_events")+` SET tx_id = (pg_snapshot_xmax(pg_current_snapshot())::text::bigint + 1000000)::text::xid8`); err != nil {
		t.Fatal(err)
	}
	_, err := postgres.New(f.ctx, f.store.Pool(), postgres.Config{Schema: f.store.Schema(), Registry: f.types.Registry})
	if !errors.Is(err, postgres.ErrRestoredDatabase) || !strings.Contains(err.Error(), "repair restored-cluster") {
		t.Fatalf("New on a restored database: %v", err)
	}
}

func TestNewRefusesUnmigratedSchema(t *testing.T) {
	t.Parallel()
	_, err := postgres.New(context.Background(), pgtest.Pool(t), postgres.Config{Schema: "pt_never_migrated", Registry: projector.NewRegistry()})
	if !errors.Is(err, postgres.ErrSchemaOutdated) {
		t.Fatalf("New on an empty schema: %v, want ErrSchemaOutdated", err)
	}
	if _, err := postgres.New(context.Background(), pgtest.Pool(t), postgres.Config{Schema: "Bad-Name", Registry: projector.NewRegistry()}); err == nil {
		t.Fatal("New accepted schema name Bad-Name")
	}
}

func TestReadStreamUntil(t *testing.T) {
	t.Parallel()
	f := setup(t)
	s := projector.Stream("ticket", "time")
	first := f.appendTx(t, s, projector.NoStream, testevents.TicketOpened{Title: "t"})
	f.appendTx(t, s, projector.ExactVersion(1), testevents.TicketCommented{Body: "later"})
	evs, err := f.store.ReadStream(f.ctx, s, postgres.StreamQuery{Until: first.Events[0].RecordedAt})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || evs[0].ID != first.Events[0].ID {
		t.Fatalf("read until first event's time: %d events", len(evs))
	}
	if evs[0].Metadata.CausationID != uuid.Nil {
		t.Fatalf("causation id set on a direct append: %v", evs[0].Metadata.CausationID)
	}
}

// StreamQuery.Raw reads a stream whose types the registry does not know
// (a tool without the application's types), Data set and Payload nil, as
// LogQuery.Raw does; without it the read fails naming the type, and its
// message tells the stream version from the schema version.
func TestReadStreamRaw(t *testing.T) {
	t.Parallel()
	f := setup(t)
	res := f.appendTx(t, projector.Stream("ticket", "a"), projector.NoStream, testevents.TicketOpened{Title: "a"}, testevents.TicketCommented{Body: "1"})
	stock, err := postgres.New(f.ctx, f.store.Pool(), postgres.Config{Schema: f.store.Schema(), Registry: projector.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	_, err = stock.ReadStream(f.ctx, projector.Stream("ticket", "a"), postgres.StreamQuery{FromVersion: 2})
	if !errors.Is(err, projector.ErrUnknownEventType) || !strings.Contains(err.Error(), "v2 of __system__/ticket/a, schema version 1") {
		t.Fatalf("typed read without the types: %v", err)
	}
	evs, err := stock.ReadStream(f.ctx, projector.Stream("ticket", "a"), postgres.StreamQuery{Raw: true})
	if err != nil || len(evs) != 2 {
		t.Fatalf("raw read: %d events, %v", len(evs), err)
	}
	for i, ev := range evs {
		if ev.Payload != nil || ev.ID != res.Events[i].ID || ev.Type != res.Events[i].Type || !json.Valid(ev.Data) || len(ev.Data) == 0 {
			t.Fatalf("raw event %d: %+v", i, ev)
		}
	}
}
