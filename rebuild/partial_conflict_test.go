package rebuild_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
)

// A partial rebuild whose handler loses a conflict with another transaction
// (here a real deadlock's victim) is rolled back and run again, not
// recorded as the event's failure: in continuous mode the healthy event
// used to be dead-lettered and the rebuild reported done without it.
//
// The deadlock: the test holds the handler's side table in SHARE mode, so
// the rebuild, holding the consumer's shard lock, waits at the handler's
// INSERT; the test then asks for the shard lock with a far longer
// deadlock_timeout, so the rebuild's backend is the victim. Its next try
// waits for the shard lock the test now holds, and goes through once the
// test lets go.
func TestPartialRebuildOutlivesADeadlock(t *testing.T) {
	t.Parallel()
	e := newPartialEnv(t)
	side := e.ident("side")
	e.exec(`CREATE TABLE ` + side + ` (event_id uuid NOT NULL)`)
	var block atomic.Bool
	p := e.sided(side, &block)
	var events int
	for i := range 3 {
		s := projector.TenantStream("a", "ticket", string(rune('x'+i)))
		if err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
			_, err := e.store.Append(e.ctx, tx, s, projector.NoStream, testevents.TicketOpened{Title: "t"}, testevents.TicketCommented{}, testevents.TicketClosed{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		events += 3
	}
	d := e.dispatcher(p)
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	block.Store(true)

	tx, holder := pgtest.HoldForDeadlock(t, e.store.Pool(), side)
	type result struct {
		res rebuild.PartialResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := rebuild.Partial(e.ctx, e.store, p, projection.TenantScope("a"), rebuild.PartialOptions{})
		done <- result{res, err}
	}()
	pgtest.WaitForLockOn(t, e.store.Pool(), side) // the rebuild holds the shard lock and waits at the INSERT
	if err := projection.LockShard(e.ctx, tx, e.store, projection.ShardID{Consumer: "tickets"}); err != nil {
		t.Fatalf("the test's side of the deadlock: %v; want the rebuild aborted", err)
	}
	// An aborted try recorded nothing; the next one waits for the shard
	// lock the test now holds. (The old code dead-lettered the event,
	// committed and returned.)
	pgtest.WaitTriedAgain(t, e.store.Pool(), holder, func() string {
		select {
		case r := <-done:
			return fmt.Sprintf("(%+v, %v)", r.res, r.err)
		default:
			return ""
		}
	})
	if n := e.count(`SELECT count(*) FROM ` + e.store.Table("projector_dead_letters")); n != 0 {
		t.Fatalf("%d dead letters after the aborted try, want none", n)
	}
	if err := tx.Rollback(e.ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.res.DeadLettered != 0 || r.res.Events != events {
		t.Fatalf("partial rebuild: %+v, %v; want %d events, none dead-lettered", r.res, r.err, events)
	}
	if n := e.count(`SELECT count(*) FROM ` + side); n != 3 {
		t.Fatalf("the side table holds %d rows, want one per closed ticket (3)", n)
	}
}

// sided is a projection of tickets into tickets (n counting each stream's
// events), whose handler of ticket.closed also writes to side once block
// is set: a table its partial rebuild's clear does not touch.
func (e *penv) sided(side string, block *atomic.Bool) *projection.Async {
	qualified := e.schema + ".tickets"
	p := projection.NewAsync("tickets", projection.AsyncConfig{ErrorMode: projection.SkipApplyErrors, Tables: []string{qualified},
		ScopeColumns: projection.ScopeColumns{Tenant: "tenant_id", StreamType: "stream_type", StreamID: "stream_id"}})
	count := func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+projection.Table(ctx, qualified)+` AS t VALUES ($1, $2, $3, '', 1, $4)
			ON CONFLICT (tenant_id, stream_type, stream_id) DO UPDATE SET n = t.n + 1, last_version = $4`,
			ev.Stream.Tenant, ev.Stream.Type, ev.Stream.ID, ev.Version)
		return err
	}
	must(projection.OnEvent(p, e.types.Opened, count))
	must(projection.OnEvent(p, e.types.Commented, count))
	must(projection.OnEvent(p, e.types.Closed, func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		if block.Load() {
			if _, err := tx.Exec(ctx, `INSERT INTO `+side+` VALUES ($1)`, ev.ID); err != nil {
				return err
			}
		}
		return count(ctx, tx, ev)
	}))
	return p
}
