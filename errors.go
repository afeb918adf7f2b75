package projector

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every error Projector returns for one of these conditions
// matches the sentinel with [errors.Is], however much context it was wrapped
// in.
var (
	// ErrUnknownEventType: a payload's Go type, or a stored type name, was
	// never defined in the registry.
	ErrUnknownEventType = errors.New("projector: unknown event type")
	// ErrDuplicateEventType: a type name or Go type was defined twice.
	ErrDuplicateEventType = errors.New("projector: event type defined twice")
	// ErrInvalidEventType: a definition breaks the naming or versioning
	// rules, or an event type name given to a read cannot be a name at all.
	ErrInvalidEventType = errors.New("projector: invalid event type definition")
	// ErrInvalidPayload: a payload failed its own validation, could not be
	// encoded or decoded, or holds what PostgreSQL cannot store exactly
	// (invalid UTF-8, NUL); also metadata (actor, headers) that cannot be
	// stored exactly.
	ErrInvalidPayload = errors.New("projector: invalid payload")
	// ErrInvalidStream: a stream reference is incomplete or cannot be
	// stored (see [StreamRef.Validate]).
	ErrInvalidStream = errors.New("projector: invalid stream reference")
	// ErrConcurrency: another writer changed the stream first. It is
	// retryable: load the stream again, decide again, append again.
	ErrConcurrency = errors.New("projector: concurrent modification")
	// ErrNotFound: the stream, consumer or record does not exist.
	ErrNotFound = errors.New("projector: not found")
	// ErrInvalidTransition: an operation is not allowed in the current state
	// (restarting a consumer that is not dead, for instance). Nothing changed.
	ErrInvalidTransition = errors.New("projector: invalid state transition")
)

// ConcurrencyError reports an append that lost a race. It matches
// [ErrConcurrency] with [errors.Is].
type ConcurrencyError struct {
	Stream   StreamRef
	Expected ExpectedVersion
	// Actual is the stream's version when the append was refused (0 if it
	// does not exist), or -1 where it could not be read.
	Actual int64
	// Reason says why when the versions alone do not, as when an older
	// transaction tries to append after a younger one.
	Reason string
}

// Error implements error.
func (e *ConcurrencyError) Error() string {
	msg := fmt.Sprintf("projector: concurrent modification of stream %s: expected version %s, actual %d", e.Stream, e.Expected, e.Actual)
	if e.Reason != "" {
		msg += ": " + e.Reason
	}
	return msg
}

// Is makes errors.Is(err, ErrConcurrency) true.
func (e *ConcurrencyError) Is(target error) bool { return target == ErrConcurrency }
