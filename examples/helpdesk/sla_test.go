package helpdesk_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/examples/helpdesk"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/saga/sagatest"
	"github.com/projectorhq/projector/stores/postgres"
)

func slaSetup(t *testing.T) (helpdesk.Types, *projector.Registry) {
	t.Helper()
	types, err := helpdesk.Define(projector.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := helpdesk.DefineSLA(types.Registry); err != nil {
		t.Fatal(err)
	}
	return types, types.Registry
}

// The SLA saga without a database: a high-priority ticket gets a reminder
// half-way and an escalation at the deadline, each a command on the ticket
// aggregate; assigning it first cancels both; a normal ticket has no SLA.
func TestSLAFixture(t *testing.T) {
	t.Parallel()
	types, reg := slaSetup(t)
	if _, err := helpdesk.NewSLA(types, nil, nil); err == nil {
		t.Fatal("NewSLA accepted a nil ticket repository, to fail only at the first timeout")
	}
	store := pgtest.Store(t, reg) // the repository needs a store; the fixture never uses it
	tickets, err := helpdesk.NewTickets(store, types)
	if err != nil {
		t.Fatal(err)
	}
	sla, err := helpdesk.NewSLA(types, tickets, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := sagatest.New(t, sla, reg)
	f.Given(projector.Stream(helpdesk.TicketStream, "T-1"), helpdesk.TicketOpened{Customer: "ada", Subject: "printer on fire"}).
		ExpectTimeouts("T-1", map[string]time.Time{
			"remind":   sagatest.Start.Add(helpdesk.SLAResponse / 2),
			"escalate": sagatest.Start.Add(helpdesk.SLAResponse),
		})
	f.Given(projector.Stream(helpdesk.TicketStream, "T-2"), helpdesk.TicketOpened{Customer: "ada", Subject: "cannot log in"},
		helpdesk.TicketAssigned{Agent: "alice"}).ExpectStatus("T-2", saga.Completed).ExpectTimeouts("T-2", nil)
	f.Given(projector.Stream(helpdesk.TicketStream, "T-3"), helpdesk.TicketOpened{Customer: "ada", Subject: "invoice is wrong"}).
		ExpectStatus("T-3", saga.Completed).ExpectState("T-3", helpdesk.SLAState{Priority: "normal"})

	f.Advance(helpdesk.SLAResponse/2 - time.Second)
	if cmds := f.Commands(); len(cmds) != 0 {
		t.Fatalf("commands before the reminder was due: %+v", cmds)
	}
	f.Advance(time.Second)
	if cmds := f.Commands(); len(cmds) != 1 || cmds[0].Aggregate != "ticket" || cmds[0].Stream.ID != "T-1" {
		t.Fatalf("at the reminder: %+v, want one command on ticket T-1", cmds)
	}
	f.Advance(helpdesk.SLAResponse / 2)
	if cmds := f.Commands(); len(cmds) != 1 || cmds[0].Stream.ID != "T-1" {
		t.Fatalf("at the deadline: %+v, want the escalation of T-1", cmds)
	}
	f.ExpectStatus("T-1", saga.Completed).ExpectState("T-1", helpdesk.SLAState{Priority: "high", Reminded: true, Escalated: true})
}

// Against a real database, through the ticket aggregate: the unassigned
// ticket gets the reminder comment and the escalation on its stream, the
// one assigned between reminder and deadline only the reminder, the one
// assigned at once nothing; the escalation carries the timeout as cause
// and the ticket's correlation id.
func TestSLAOnTicketStreams(t *testing.T) {
	t.Parallel()
	types, reg := slaSetup(t)
	store := pgtest.Store(t, reg)
	tickets, err := helpdesk.NewTickets(store, types)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	now := sagatest.Start
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	advance := func(d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		now = now.Add(d)
	}
	sla, err := helpdesk.NewSLA(types, tickets, clock)
	if err != nil {
		t.Fatal(err)
	}
	live := sagatest.Run(t, store, sla)
	ctx := context.Background()
	handle := func(id string, cmd func() error) {
		t.Helper()
		if err := cmd(); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
	}
	for _, id := range []string{"T-1", "T-2", "T-3"} {
		handle(id, func() error {
			_, err := tickets.Handle(ctx, projector.Stream(helpdesk.TicketStream, id), helpdesk.OpenTicket("ada", "printer on fire"))
			return err
		})
	}
	handle("T-3", func() error {
		_, err := tickets.Handle(ctx, projector.Stream(helpdesk.TicketStream, "T-3"), helpdesk.AssignTicket("alice"))
		return err
	})
	live.Settle(ctx)
	advance(helpdesk.SLAResponse / 2)
	live.Settle(ctx)
	handle("T-2", func() error {
		_, err := tickets.Handle(ctx, projector.Stream(helpdesk.TicketStream, "T-2"), helpdesk.AssignTicket("bob"))
		return err
	})
	live.Settle(ctx)
	advance(helpdesk.SLAResponse / 2)
	live.Settle(ctx)

	want := map[string][]string{
		"T-1": {"ticket.opened", "ticket.commented", "ticket.escalated"},
		"T-2": {"ticket.opened", "ticket.commented", "ticket.assigned"},
		"T-3": {"ticket.opened", "ticket.assigned"},
	}
	for id, types := range want {
		evs, err := store.ReadStream(ctx, projector.Stream(helpdesk.TicketStream, id), postgres.StreamQuery{})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, ev := range evs {
			got = append(got, ev.Type)
		}
		if len(got) != len(types) {
			t.Fatalf("%s: %v, want %v", id, got, types)
		}
		for i := range got {
			if got[i] != types[i] {
				t.Fatalf("%s: %v, want %v", id, got, types)
			}
		}
		in, err := saga.Show(ctx, store, helpdesk.SLAName, projector.SystemTenant, id)
		if err != nil {
			t.Fatal(err)
		}
		if in.Status != saga.Completed {
			t.Errorf("%s: saga %s, want completed", id, in.Status)
		}
		if id == "T-1" {
			esc := evs[2]
			if esc.Metadata.CausationID != in.Steps[2].CauseID || esc.Metadata.CorrelationID != evs[0].Metadata.CorrelationID {
				t.Errorf("escalation causation %s correlation %s; want the timeout %s and the opening's %s",
					esc.Metadata.CausationID, esc.Metadata.CorrelationID, in.Steps[2].CauseID, evs[0].Metadata.CorrelationID)
			}
		}
	}
}
