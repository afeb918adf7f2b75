package postgres_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/stores/postgres"
)

func pruneSetup(t *testing.T) fixture {
	t.Helper()
	types := testevents.New()
	return fixture{ctx: context.Background(), types: types, store: pgtest.Store(t, types.Registry, postgres.Config{Ephemeral: []string{"session"}})}
}

func (f fixture) consumer(t *testing.T, name string, at projector.Position, status string) {
	t.Helper()
	if _, err := f.store.Pool().Exec(f.ctx, `INSERT INTO `+f.store.Table("projector_consumers")+` (name, instance_id, cursor_tx_id, cursor_seq, status)
		VALUES ($1, '__shared__', $2, $3, $4)`, name, at.TxID, at.Seq, status); err != nil {
		t.Fatal(err)
	}
}

func (f fixture) remaining(t *testing.T, streamType string) int {
	t.Helper()
	return countRows(t, f.store.Pool(), `SELECT count(*) FROM `+f.store.Table("projector_events")+` WHERE stream_type = $1`, streamType)
}

const tiny = time.Microsecond

// Promise 9: prune deletes only what every consumer shard that is not
// disabled has passed; disabled shards do not hold it back; aggregate
// streams are untouched unless named; dead-lettered events stay.
func TestPromise9_PruneNeverOutrunsAConsumer(t *testing.T) {
	t.Parallel()
	f := pruneSetup(t)
	var sessions []projector.Event
	for i := range 10 {
		res := f.appendTx(t, projector.Stream("session", "s"+string(rune('a'+i))), projector.NoStream, testevents.TicketOpened{Title: "x"})
		sessions = append(sessions, res.Events...)
	}
	f.appendTx(t, projector.Stream("ticket", "t1"), projector.NoStream, testevents.TicketOpened{Title: "history"})

	// A consumer that has passed the first four session events, and a
	// disabled one that has passed nothing.
	f.consumer(t, "slow", sessions[3].Position, "idle")
	f.consumer(t, "off", projector.Start, "disabled")

	dry, err := f.store.Prune(f.ctx, postgres.PruneOptions{OlderThan: tiny, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if dry.Deleted != 4 || dry.HeldBack != 6 || dry.Blocker == nil || dry.Blocker.Consumer != "slow" {
		t.Fatalf("dry run: %+v (blocker %+v)", dry, dry.Blocker)
	}
	if n := f.remaining(t, "session"); n != 10 {
		t.Fatalf("dry run deleted events: %d left", n)
	}

	res, err := f.store.Prune(f.ctx, postgres.PruneOptions{OlderThan: tiny, BatchSize: 3})
	if err != nil {
		t.Fatal(err)
	}
	if res.Deleted != 4 || res.HeldBack != 6 || res.Blocker == nil || res.Blocker.Consumer != "slow" || res.Blocker.Behind < 7 {
		t.Fatalf("prune: %+v (blocker %+v)", res, res.Blocker)
	}
	// Read the table itself: the log read would wait for the horizon.
	rows, err := f.store.Pool().Query(f.ctx, `SELECT tx_id, seq FROM `+f.store.Table("projector_events")+` WHERE stream_type = 'session'`)
	if err != nil {
		t.Fatal(err)
	}
	var left []projector.Position
	var p projector.Position
	if _, err := pgx.ForEachRow(rows, []any{&p.TxID, &p.Seq}, func() error { left = append(left, p); return nil }); err != nil {
		t.Fatal(err)
	}
	for _, pos := range left {
		if !sessions[3].Position.Less(pos) {
			t.Fatalf("event %v at or before the slow consumer's cursor survived", pos)
		}
	}
	if len(left) != 6 {
		t.Fatalf("%d session events left, want 6", len(left))
	}
	if n := f.remaining(t, "ticket"); n != 1 {
		t.Fatal("an aggregate stream was pruned without being named")
	}
	// What was deleted is recorded by event type, for rebuilds to refuse.
	var pruned int64
	if err := f.store.Pool().QueryRow(f.ctx, `SELECT deleted FROM `+f.store.Table("projector_pruned")+` WHERE event_type = 'ticket.opened'`).Scan(&pruned); err != nil || pruned != 4 {
		t.Fatalf("recorded %d pruned ticket.opened events (%v), want 4", pruned, err)
	}

	// A dead-lettered event is kept even once everyone has passed it.
	if _, err := f.store.Pool().Exec(f.ctx, `INSERT INTO `+f.store.Table("projector_dead_letters")+`
		(consumer, instance_id, event_id, event_tx_id, event_seq, event_type, tenant_id, stream_type, stream_id, version, error, attempts, reason)
		VALUES ('slow', '__shared__', $1, $2, $3, 'ticket.opened', $4, 'session', 'x', 1, 'boom', 1, 'skipped')`,
		sessions[5].ID, sessions[5].Position.TxID, sessions[5].Position.Seq, projector.SystemTenant); err != nil {
		t.Fatal(err)
	}
	if _, err := f.store.Pool().Exec(f.ctx, `UPDATE `+f.store.Table("projector_consumers")+` SET cursor_tx_id = $1, cursor_seq = $2 WHERE name = 'slow'`,
		sessions[9].Position.TxID, sessions[9].Position.Seq); err != nil {
		t.Fatal(err)
	}
	res, err = f.store.Prune(f.ctx, postgres.PruneOptions{OlderThan: tiny})
	if err != nil {
		t.Fatal(err)
	}
	if res.Deleted != 5 || res.HeldBack != 0 || res.Blocker != nil {
		t.Fatalf("second prune: %+v", res)
	}
	if n := f.remaining(t, "session"); n != 1 {
		t.Fatalf("%d session events left, want only the dead-lettered one", n)
	}
	// Named explicitly and included, aggregate streams go too, once no consumer that is
	// not disabled still needs them.
	if _, err := f.store.Pool().Exec(f.ctx, `UPDATE `+f.store.Table("projector_consumers")+` SET status = 'disabled' WHERE name = 'slow'`); err != nil {
		t.Fatal(err)
	}
	if res, err := f.store.Prune(f.ctx, postgres.PruneOptions{OlderThan: tiny, StreamTypes: []string{"ticket"}, IncludeAggregates: true}); err != nil || res.Deleted != 1 {
		t.Fatalf("named prune: %+v %v", res, err)
	}
}

// Promise 9 with a consumer registering while the prune runs: the prune
// waits for the registration to commit, sees the new consumer and deletes
// nothing it needs.
func TestPromise9_ConsumerRegisteringDuringPrune(t *testing.T) {
	t.Parallel()
	f := pruneSetup(t)
	for i := range 5 {
		f.appendTx(t, projector.Stream("session", "s"+string(rune('a'+i))), projector.NoStream, testevents.TicketOpened{Title: "x"})
	}
	reg, err := f.store.Pool().Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reg.Rollback(f.ctx) }()
	if _, err := reg.Exec(f.ctx, `INSERT INTO `+f.store.Table("projector_consumers")+` (name, instance_id) VALUES ('newcomer', '__shared__')`); err != nil {
		t.Fatal(err)
	}

	type result struct {
		res postgres.PruneResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := f.store.Prune(f.ctx, postgres.PruneOptions{OlderThan: tiny})
		done <- result{res, err}
	}()
	// The prune must be waiting on the registration's lock, not done.
	pgtest.WaitForLockOn(t, f.store.Pool(), f.store.Table("projector_consumers"))
	select {
	case r := <-done:
		t.Fatalf("prune finished while a consumer registration was uncommitted: %+v %v", r.res, r.err)
	default:
	}
	if err := reg.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.res.Deleted != 0 || r.res.HeldBack != 5 || r.res.Blocker == nil || r.res.Blocker.Consumer != "newcomer" {
		t.Fatalf("prune after a concurrent registration: %+v", r.res)
	}
	if n := f.remaining(t, "session"); n != 5 {
		t.Fatalf("%d events left; the new consumer needed all 5", n)
	}
}

func TestPruneBadInput(t *testing.T) {
	t.Parallel()
	types := testevents.New()
	store := pgtest.Store(t, types.Registry)
	ctx := context.Background()
	if _, err := store.Prune(ctx, postgres.PruneOptions{OlderThan: time.Hour}); !errors.Is(err, postgres.ErrNoStreamTypes) {
		t.Fatalf("prune with no types and nothing ephemeral: %v", err)
	}
	for _, opts := range []postgres.PruneOptions{
		{StreamTypes: []string{"x"}, IncludeAggregates: true},
		{StreamTypes: []string{"x"}, IncludeAggregates: true, OlderThan: -time.Hour},
		{StreamTypes: []string{"x"}, IncludeAggregates: true, OlderThan: time.Hour, BatchSize: -1},
		{StreamTypes: []string{"x"}, IncludeAggregates: true, OlderThan: time.Hour, BatchSize: postgres.MaxPruneBatchSize + 1},
		{StreamTypes: []string{"a\x00b"}, IncludeAggregates: true, OlderThan: time.Hour},
		{StreamTypes: []string{"bad\xff"}, IncludeAggregates: true, OlderThan: time.Hour},
	} {
		if _, err := store.Prune(ctx, opts); !errors.Is(err, postgres.ErrInvalidPrune) {
			t.Errorf("prune %+v: %v, want ErrInvalidPrune", opts, err)
		}
	}
}

// A stream type that is not declared ephemeral is aggregate history: naming
// it deletes nothing unless IncludeAggregates says so, and a dry run breaks
// what it would delete down by stream type.
func TestPruneKeepsAggregateHistoryUnlessIncluded(t *testing.T) {
	t.Parallel()
	f := pruneSetup(t)
	f.appendTx(t, projector.Stream("ticket", "t1"), projector.NoStream, testevents.TicketOpened{Title: "a"}, testevents.TicketOpened{Title: "b"})
	f.appendTx(t, projector.Stream("ticket", "t2"), projector.NoStream, testevents.TicketOpened{Title: "c"})
	f.appendTx(t, projector.Stream("session", "s1"), projector.NoStream, testevents.TicketOpened{Title: "x"})

	_, err := f.store.Prune(f.ctx, postgres.PruneOptions{OlderThan: tiny, StreamTypes: []string{"session", "ticket"}})
	if !errors.Is(err, postgres.ErrAggregateHistory) || !strings.Contains(err.Error(), "ticket") {
		t.Fatalf("prune naming an aggregate type: %v, want ErrAggregateHistory naming ticket", err)
	}
	if f.remaining(t, "ticket") != 3 || f.remaining(t, "session") != 1 {
		t.Fatal("a refused prune deleted events")
	}
	dry, err := f.store.Prune(f.ctx, postgres.PruneOptions{OlderThan: tiny, StreamTypes: []string{"session", "ticket"}, IncludeAggregates: true, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	want := []postgres.PruneTypeCount{{StreamType: "session", Ephemeral: true, Events: 1, Streams: 1}, {StreamType: "ticket", Events: 3, Streams: 2}}
	if dry.Deleted != 4 || !slices.Equal(dry.Types, want) {
		t.Fatalf("dry run: %+v, types %+v, want %+v", dry, dry.Types, want)
	}
	res, err := f.store.Prune(f.ctx, postgres.PruneOptions{OlderThan: tiny, StreamTypes: []string{"ticket"}, IncludeAggregates: true})
	if err != nil || res.Deleted != 3 || f.remaining(t, "ticket") != 0 {
		t.Fatalf("prune with IncludeAggregates: %+v %v", res, err)
	}
}
