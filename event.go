package projector

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// SystemTenant is the tenant of streams that belong to no tenant in
// particular (reference data, cross-tenant processes, single-tenant
// applications). Handlers run unscoped for system-tenant events, so row-level
// security policies keyed on the tenant do not apply to them.
const SystemTenant = "__system__"

// Event is one stored event: the envelope the store writes and every reader
// receives.
type Event struct {
	// ID is the event's stable identity, assigned at append. Effects outside
	// PostgreSQL use it to stay idempotent.
	ID uuid.UUID
	// Stream is the stream the event belongs to.
	Stream StreamRef
	// Version is the event's 1-based position within its stream.
	Version int64
	// Position is the event's place in the global log.
	Position Position
	// Type is the registered event type name, such as "ticket.opened".
	Type string
	// SchemaVersion is the payload's schema version after upcasting; it equals
	// the type's current version whenever the type is registered.
	SchemaVersion int
	// Data is the JSON payload, already upcast to SchemaVersion.
	Data json.RawMessage
	// Payload is Data decoded into the registered Go type (a value, not a
	// pointer), or nil when the reader was asked for raw events or does not
	// know the type.
	Payload any
	// Metadata carries correlation, causation, actor and headers.
	Metadata Metadata
	// RecordedAt is the database clock when the event was inserted.
	RecordedAt time.Time
}

// Metadata is the context an event was written in.
type Metadata struct {
	// CorrelationID groups every event caused, directly or not, by one
	// original request or command.
	CorrelationID uuid.UUID
	// CausationID is the id of the event whose handling produced this one;
	// uuid.Nil for events appended directly by an application.
	CausationID uuid.UUID
	// Actor names who or what caused the event (a user id, a service name).
	Actor string
	// Headers holds free-form string pairs (trace ids, client versions).
	Headers map[string]string
}

// StreamRef names a stream: its tenant, its type (what kind of aggregate it
// holds, such as "ticket") and its id within that type and tenant.
type StreamRef struct {
	Tenant string
	Type   string
	ID     string
}

// Stream returns a reference to a system-tenant stream.
func Stream(streamType, id string) StreamRef {
	return StreamRef{Tenant: SystemTenant, Type: streamType, ID: id}
}

// TenantStream returns a reference to a stream owned by tenant.
func TenantStream(tenant, streamType, id string) StreamRef {
	return StreamRef{Tenant: tenant, Type: streamType, ID: id}
}

// Validate reports whether the reference names a stream: every part must be
// non-empty, so an application cannot write into an unnamed tenant by
// forgetting to set one.
func (s StreamRef) Validate() error {
	switch {
	case s.Tenant == "":
		return fmt.Errorf("%w: stream %s has no tenant (use projector.SystemTenant for streams that belong to no tenant)", ErrInvalidStream, s)
	case s.Type == "":
		return fmt.Errorf("%w: stream %s has no type", ErrInvalidStream, s)
	case s.ID == "":
		return fmt.Errorf("%w: stream %s has no id", ErrInvalidStream, s)
	}
	return nil
}

// String renders the reference as tenant/type/id for logs and errors.
func (s StreamRef) String() string {
	return s.Tenant + "/" + s.Type + "/" + s.ID
}

// ExpectedVersion is what an append asserts about a stream's current version
// before it writes: [AnyVersion], [NoStream] or an exact version from
// [ExactVersion].
type ExpectedVersion int64

const (
	// AnyVersion appends whatever the stream's current version is.
	AnyVersion ExpectedVersion = -1
	// NoStream appends only if the stream does not exist yet.
	NoStream ExpectedVersion = 0
)

// ExactVersion asserts that the stream is at version v. ExactVersion(0) is
// the same as [NoStream].
func ExactVersion(v int64) ExpectedVersion { return ExpectedVersion(v) }

// String renders the expectation for errors and logs.
func (e ExpectedVersion) String() string {
	switch {
	case e == AnyVersion:
		return "any"
	case e == NoStream:
		return "no stream"
	case e < AnyVersion:
		return "invalid(" + strconv.FormatInt(int64(e), 10) + ")"
	default:
		return strconv.FormatInt(int64(e), 10)
	}
}

// Position is a place in the global log: the id of the transaction that
// wrote an event and the event's sequence number. Readers order the log by
// (TxID, Seq) and only ever read events whose transaction finished, which is
// what keeps a cursor from passing an event a running transaction will still
// commit (see the stores/postgres package).
type Position struct {
	TxID uint64
	Seq  int64
}

// Start is the position before the first event of any log.
var Start = Position{}

// Less reports whether p comes before q in log order.
func (p Position) Less(q Position) bool {
	if p.TxID != q.TxID {
		return p.TxID < q.TxID
	}
	return p.Seq < q.Seq
}

// Horizon returns the highest position that sorts before every event of
// transaction id xmin and later: the position a cursor may move to once it
// has read everything finished below xmin.
func Horizon(xmin uint64) Position {
	if xmin == 0 {
		return Start
	}
	return Position{TxID: xmin - 1, Seq: math.MaxInt64}
}

// Before returns the highest position that sorts before p: a cursor there
// has passed every event before p and not p itself.
func (p Position) Before() Position {
	if p.Seq == 0 {
		if p.TxID == 0 {
			return Start
		}
		return Position{TxID: p.TxID - 1, Seq: math.MaxInt64}
	}
	return Position{TxID: p.TxID, Seq: p.Seq - 1}
}

// String renders the position as "txid/seq".
func (p Position) String() string {
	return strconv.FormatUint(p.TxID, 10) + "/" + strconv.FormatInt(p.Seq, 10)
}

// ParsePosition parses the form String produces.
func ParsePosition(s string) (Position, error) {
	tx, seq, ok := strings.Cut(s, "/")
	if !ok {
		return Position{}, fmt.Errorf("parse position %q: want txid/seq", s)
	}
	t, err := strconv.ParseUint(tx, 10, 64)
	if err != nil {
		return Position{}, fmt.Errorf("parse position %q: transaction id: %w", s, err)
	}
	q, err := strconv.ParseInt(seq, 10, 64)
	if err != nil || q < 0 {
		return Position{}, fmt.Errorf("parse position %q: sequence must be a non-negative integer", s)
	}
	return Position{TxID: t, Seq: q}, nil
}
