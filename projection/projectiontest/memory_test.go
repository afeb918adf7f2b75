package projectiontest_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection/projectiontest"
)

type titles map[string]string

// A fold sees decoded, upcast payloads; a failing event leaves the model as
// it was before it, and the events after it are folded by the next check.
func TestMemory(t *testing.T) {
	t.Parallel()
	k := setup(t) // for its registry (with the ticket.renamed upcaster); the spec uses no database
	fold := func(m titles, ev projector.Event) (titles, error) {
		next := titles{}
		for id, title := range m {
			next[id] = title
		}
		switch e := ev.Payload.(type) {
		case testevents.TicketOpened:
			next[ev.Stream.ID] = e.Title
		case Renamed:
			next[ev.Stream.ID] = e.Title
		case testevents.TicketCommented:
			if e.Body == "boom" {
				return nil, errors.New("comment refused: boom")
			}
		}
		return next, nil
	}
	st := projector.Stream("ticket", "1")
	projectiontest.NewMemory(t, projectiontest.MemoryConfig[titles]{Registry: k.ty.Registry, Initial: titles{}, Fold: fold}).
		Given(st, testevents.TicketOpened{Title: "old"}).
		ThenModel(titles{"1": "old"}).
		GivenEvents(projector.Event{Stream: st, Type: "ticket.renamed", SchemaVersion: 1, Data: json.RawMessage(`{"name":"new"}`)}).
		When(projector.Stream("ticket", "2"), testevents.TicketOpened{Title: "two"}, testevents.TicketCommented{Body: "boom"}, testevents.TicketOpened{Title: "after"}).
		ThenFails("boom").
		ThenModel(titles{"1": "new", "2": "after"})
}
