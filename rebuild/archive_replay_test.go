package rebuild_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/rebuild"
	"github.com/projectorhq/projector/stores/postgres"
)

// An inline rebuild replays the archive: with one tenant's streams
// archived, the rebuilt model equals the same projection built live from
// the first event.
func TestInlineRebuildReplaysTheArchive(t *testing.T) {
	t.Parallel()
	e := newInlineEnv(t)
	for range 3 {
		for i := range 30 {
			if err := e.append(e.ctx, i, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	e.settle()
	res, err := e.store.Archive(e.ctx, postgres.ArchiveOptions{StreamType: "ticket", Tenant: "t0", OlderThan: time.Nanosecond})
	if err != nil || res.Streams != 10 || res.Events != 30 {
		t.Fatalf("archive tenant t0: %+v, %v", res, err)
	}
	e.exec(`UPDATE ` + e.ident("tickets") + ` SET n = n + 100`)
	if _, err := rebuild.Inline(e.ctx, e.store, e.p, rebuild.InlineOptions{Tables: []string{e.schema + ".tickets"}, BatchSize: 7}); err != nil {
		t.Fatalf("an inline rebuild with archived events: %v", err)
	}
	if n := e.differences(); n != 0 {
		t.Fatalf("%d rows differ between the rebuilt model and the live reference", n)
	}
	if n := e.count(`SELECT count(*) FROM ` + e.ident("tickets") + ` WHERE tenant_id = 't0'`); n != 10 {
		t.Fatalf("the rebuilt model has %d of the archived tenant's 10 tickets", n)
	}
}

// A partial rebuild of a tenant whose streams are archived replays them
// from the archive: its rows equal the reference model built live.
func TestPartialRebuildReplaysTheArchive(t *testing.T) {
	t.Parallel()
	e := newPartialEnv(t)
	for i := range 8 {
		for _, tenant := range []string{"a", "b"} {
			if err := e.ticket(projector.TenantStream(tenant, "ticket", fmt.Sprint(i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	tickets := e.tickets("tickets", "tickets", 1)
	d := e.dispatcher(tickets, e.tickets("tickets_ref", "tickets_ref", 1))
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	// Half of tenant a's streams archived: the scope is read from both
	// tables.
	var half []projector.StreamRef
	for i := 0; i < 8; i += 2 {
		half = append(half, projector.TenantStream("a", "ticket", fmt.Sprint(i)))
	}
	res, err := e.store.Archive(e.ctx, postgres.ArchiveOptions{Streams: half})
	if err != nil || res.Streams != 4 {
		t.Fatalf("archive half of tenant a: %+v, %v", res, err)
	}
	e.exec(`UPDATE ` + e.ident("tickets") + ` SET title = 'corrupt', n = n + 100 WHERE tenant_id = 'a'`)
	e.exec(`DELETE FROM ` + e.ident("tickets") + ` WHERE tenant_id = 'a' AND stream_id IN ('0', '1')`)
	pr, err := rebuild.Partial(e.ctx, e.store, tickets, projection.TenantScope("a"), rebuild.PartialOptions{BatchSize: 3})
	if err != nil {
		t.Fatalf("a partial rebuild of a tenant with archived streams: %v", err)
	}
	if pr.Events != 32 {
		t.Errorf("replayed %d events, want tenant a's 32, archived or not", pr.Events)
	}
	if diff := e.diff("tickets", "tickets_ref", `tenant_id = 'a'`); len(diff) != 0 {
		t.Fatalf("tenant a after the partial rebuild:\n%v", diff)
	}
}
