package rebuild_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
)

// A blue/green rebuild replays parked events like any other: the new
// model, which no longer fails on them, applies them, and the switch
// resolves the live shard's parks in the same transaction, so no retry
// applies them a second time and the stream is live again.
func TestBlueGreenSwitchResolvesParks(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := projection.AsyncConfig{ErrorMode: projection.ParkStream, MaxAttempts: 1}
	v1 := projection.NewAsync("counter", projection.AsyncConfig{ErrorMode: projection.ParkStream, MaxAttempts: 1, Version: 1, Tables: []string{e.table}})
	h := func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		if ev.Stream.ID == "p" {
			return errors.New("version 1 cannot handle p")
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+projection.Table(ctx, e.table)+` AS c (stream_id, n, v) VALUES ($1, 1, 1)
			ON CONFLICT (stream_id) DO UPDATE SET n = c.n + 1`, ev.Stream.ID)
		return err
	}
	must(projection.OnEvent(v1, e.types.Opened, h))
	must(projection.OnEvent(v1, e.types.Commented, h))
	appendTo := func(id string, payloads ...any) {
		t.Helper()
		if err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
			_, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", id), projector.AnyVersion, payloads...)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	appendTo("p", testevents.TicketOpened{Title: "p"}, testevents.TicketCommented{Body: "1"})
	appendTo("ok", testevents.TicketOpened{Title: "ok"})
	d1 := e.dispatcher(v1)
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d1.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	parks, err := projection.ListParks(e.ctx, e.store, projection.ParkFilter{Status: projection.ParkOpen})
	if err != nil || len(parks) != 1 || parks[0].Events != 2 {
		t.Fatalf("parks before the rebuild: %+v, %v", parks, err)
	}

	v2 := e.counter(2, cfg)
	e.dispatcher(v2)
	rb, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the rebuild to switch", func() bool {
		r, err := rebuild.Current(e.ctx, e.store, "counter")
		return err == nil && r.Status == rebuild.Switched
	})
	pk, _, err := projection.GetPark(e.ctx, e.store, parks[0].ID)
	if err != nil || pk.Status != projection.ParkResolved || pk.ResolvedBy != fmt.Sprintf("rebuild %d (replayed by the switch)", rb.ID) || pk.Events != 2 {
		t.Fatalf("park after the switch: %+v, %v", pk, err)
	}
	if _, err := projection.RetryPark(e.ctx, e.store, v2, pk.ID, "tester", nil); !errors.Is(err, projector.ErrInvalidTransition) {
		t.Fatalf("retry after the switch: %v; want a refusal", err)
	}
	appendTo("p", testevents.TicketCommented{Body: "2"})
	count := func(id string) (n int) {
		_ = e.store.Pool().QueryRow(e.ctx, `SELECT n FROM `+pgx.Identifier{e.schema, "counts"}.Sanitize()+` WHERE stream_id = $1`, id).Scan(&n)
		return n
	}
	eventually(t, time.Minute, "p's next event applied live", func() bool { return count("p") == 3 })
	if count("ok") != 1 {
		t.Fatalf("ok counted %d times, want 1", count("ok"))
	}
}

// A partial rebuild of a parked stream replays the events before the park
// and leaves the parked ones to it: the retry applies them once, after.
func TestPartialRebuildLeavesParkedEventsToThePark(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var failing atomic.Bool
	failing.Store(true)
	counts := pgx.Identifier{e.schema, "counts"}.Sanitize()
	p := projection.NewAsync("counter", projection.AsyncConfig{ErrorMode: projection.ParkStream, MaxAttempts: 1, Tables: []string{e.table},
		ResetScope: func(ctx context.Context, tx pgx.Tx, s projection.Scope) error {
			_, err := tx.Exec(ctx, `DELETE FROM `+counts+` WHERE stream_id = $1`, s.StreamID)
			return err
		}})
	h := func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		if failing.Load() && ev.Version >= 2 {
			return errors.New("cannot handle it yet")
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+counts+` AS c (stream_id, n, v) VALUES ($1, 1, 1) ON CONFLICT (stream_id) DO UPDATE SET n = c.n + 1`, ev.Stream.ID)
		return err
	}
	must(projection.OnEvent(p, e.types.Opened, h))
	must(projection.OnEvent(p, e.types.Commented, h))
	if err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		_, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", "p"), projector.NoStream,
			testevents.TicketOpened{Title: "p"}, testevents.TicketCommented{Body: "1"}, testevents.TicketCommented{Body: "2"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	d := e.dispatcher(p)
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	parks, err := projection.ListParks(e.ctx, e.store, projection.ParkFilter{Status: projection.ParkOpen})
	if err != nil || len(parks) != 1 || parks[0].Events != 2 {
		t.Fatalf("parks: %+v, %v", parks, err)
	}
	count := func() (n int) {
		_ = e.store.Pool().QueryRow(e.ctx, `SELECT n FROM `+counts+` WHERE stream_id = 'p'`).Scan(&n)
		return n
	}
	failing.Store(false) // the fixed handler: a replay must still leave the parked events alone
	if _, err := rebuild.Partial(e.ctx, e.store, p, projection.StreamScope(projector.Stream("ticket", "p")), rebuild.PartialOptions{}); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 1 {
		t.Fatalf("after the partial rebuild p counts %d, want 1 (its parked events left to the park)", n)
	}
	if res, err := projection.RetryPark(e.ctx, e.store, p, parks[0].ID, "tester", nil); err != nil || !res.Resolved {
		t.Fatalf("retry: %+v, %v", res, err)
	}
	if n := count(); n != 3 {
		t.Fatalf("after the retry p counts %d, want 3", n)
	}
}

// An in-place rebuild keeps a stream's park: its replay, over cleared
// tables, holds the stream's events before the one that parked it in the
// park too. A retry then applies the whole stream once, in order, and
// gives the events the model had applied before the rebuild to the
// handlers as replays, so an Emit appends each event's effects once.
func TestInPlaceRebuildKeepsParksAndRetryEmitsOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var failing atomic.Bool
	failing.Store(true)
	counts := pgx.Identifier{e.schema, "counts"}.Sanitize()
	p := projection.NewAsync("counter", projection.AsyncConfig{ErrorMode: projection.ParkStream, MaxAttempts: 1, Tables: []string{e.table}})
	h := func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		if ev.Stream.ID != "p" {
			return nil
		}
		if failing.Load() && ev.Version >= 2 {
			return errors.New("cannot handle it yet")
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+counts+` AS c (stream_id, n, v) VALUES ($1, 1, $2)
			ON CONFLICT (stream_id) DO UPDATE SET n = c.n + 1, v = $2 WHERE c.v = $2 - 1`, ev.Stream.ID, ev.Version); err != nil {
			return err
		}
		_, err := projection.Emit(ctx, tx, projector.Stream("echo", fmt.Sprintf("p-%d", ev.Version)), projector.AnyVersion,
			testevents.TicketCommented{Body: "echo"})
		return err
	}
	must(projection.OnEvent(p, e.types.Opened, h))
	must(projection.OnEvent(p, e.types.Commented, h))
	if err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		_, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", "p"), projector.NoStream,
			testevents.TicketOpened{Title: "p"}, testevents.TicketCommented{Body: "1"}, testevents.TicketCommented{Body: "2"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	d := e.dispatcher(p)
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	parks, err := projection.ListParks(e.ctx, e.store, projection.ParkFilter{Status: projection.ParkOpen})
	if err != nil || len(parks) != 1 || parks[0].Events != 2 {
		t.Fatalf("parks before the rebuild: %+v, %v", parks, err)
	}
	if _, err := rebuild.Request(e.ctx, e.store, "counter", rebuild.Options{Mode: rebuild.InPlace}); err != nil {
		t.Fatal(err)
	}
	if final, err := rebuild.Wait(ctx, e.store, "counter", 10*time.Millisecond, nil); err != nil || final.Status != rebuild.Done {
		t.Fatalf("in-place rebuild: %+v, %v", final, err)
	}
	pk, _, err := projection.GetPark(e.ctx, e.store, parks[0].ID)
	if err != nil || pk.Status != projection.ParkOpen || pk.Events != 3 {
		t.Fatalf("park after the in-place rebuild: %+v, %v; want open, the whole stream held", pk, err)
	}
	failing.Store(false)
	if res, err := projection.RetryPark(e.ctx, e.store, p, pk.ID, "tester", nil); err != nil || !res.Resolved || res.Events != 3 {
		t.Fatalf("retry: %+v, %v", res, err)
	}
	var n, v, echoes int
	if err := e.store.Pool().QueryRow(e.ctx, `SELECT n, v, (SELECT count(*) FROM `+e.store.Table("projector_events")+` WHERE stream_type = 'echo')
		FROM `+counts+` WHERE stream_id = 'p'`).Scan(&n, &v, &echoes); err != nil {
		t.Fatal(err)
	}
	if n != 3 || v != 3 || echoes != 3 {
		t.Fatalf("after the retry p counts %d up to v%d with %d emitted events; want 3, v3 and 3 (each event's Emit once)", n, v, echoes)
	}
}
