package projection

import (
	"errors"
	"fmt"

	"github.com/projectorhq/projector"
)

// EventError is a batch handler's failure that names the event it failed
// on. A [BatchFunc] that returns one (see [EventFailed]) spares the
// dispatcher the bisection it otherwise runs to find the failing event of
// a batch, which re-applies about twice the batch under savepoints: the
// dispatcher rolls the batch back, applies the events before the named one
// again, and treats the named one as the failure its error mode says (the
// cursor stops before it, or it is dead-lettered, or its stream is parked
// and the rest of the batch applied). The name is trusted only as far as
// it goes: if the events before it fail when applied again, the failure is
// looked for among them, and an error naming an event not in the batch is
// treated like any other error.
type EventError struct {
	// Event is the event of the batch the handler failed on.
	Event projector.Event
	// Err is the failure.
	Err error
}

// EventFailed returns err as the failure of ev, an event of the batch a
// [BatchFunc] was given (matched by its ID), or nil when err is nil. Name
// the event whose effect could not be applied; a batch handler that works
// stream by stream names the first failing event of the stream it was on.
//
//	for _, s := range b.Streams {
//		for _, ev := range s.Events {
//			if err := check(ev); err != nil {
//				return projection.EventFailed(ev, err)
//			}
//		}
//	}
func EventFailed(ev projector.Event, err error) error {
	if err == nil {
		return nil
	}
	return &EventError{Event: ev, Err: err}
}

func (e *EventError) Error() string {
	return fmt.Sprintf("%s v%d of %s: %v", e.Event.Type, e.Event.Version, e.Event.Stream, e.Err)
}

func (e *EventError) Unwrap() error { return e.Err }

// namedIn returns the index in events of the event err names (an
// [EventError]), or -1.
func namedIn(events []projector.Event, err error) int {
	var ee *EventError
	if !errors.As(err, &ee) {
		return -1
	}
	for i := range events {
		if events[i].ID == ee.Event.ID {
			return i
		}
	}
	return -1
}
