package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/tracing"
)

// Header names of a relayed message. The body is the payload JSON; the
// envelope travels in these headers so a consumer in any language can route
// and deduplicate without parsing the body. Text values (tenant, stream
// type and id, actor) are percent-escaped like subject tokens where they hold
// '%' or control characters, which NATS headers cannot carry; everything
// else is plain.
const (
	HeaderMsgID         = "Nats-Msg-Id" // the event id: JetStream's duplicate window key
	HeaderEventID       = "Projector-Event-Id"
	HeaderEventType     = "Projector-Event-Type"
	HeaderSchemaVersion = "Projector-Schema-Version"
	HeaderTenant        = "Projector-Tenant"
	HeaderStreamType    = "Projector-Stream-Type"
	HeaderStreamID      = "Projector-Stream-Id"
	HeaderVersion       = "Projector-Version"
	HeaderPosition      = "Projector-Position"
	HeaderCorrelationID = "Projector-Correlation-Id"
	HeaderCausationID   = "Projector-Causation-Id"
	HeaderActor         = "Projector-Actor"
	HeaderRecordedAt    = "Projector-Recorded-At" // RFC 3339 with nanoseconds, UTC
	HeaderMetadata      = "Projector-Headers"     // Metadata.Headers as a JSON object
	// HeaderPersonalRedacted is "true" on an event whose type declares
	// personal fields: the relay sent them as null (docs/privacy.md).
	HeaderPersonalRedacted = "Projector-Personal-Redacted"
	// The W3C Trace Context of the append that recorded the event, as the
	// standard message headers any OpenTelemetry NATS instrumentation
	// reads; set only when the event's metadata holds a valid one.
	HeaderTraceParent = tracing.HeaderTraceParent
	HeaderTraceState  = tracing.HeaderTraceState
)

// ErrInvalidMessage: a message is not a relayed Projector event (a header
// missing or malformed). Decode also returns the registry's
// projector.ErrUnknownEventType and projector.ErrInvalidPayload.
var ErrInvalidMessage = errors.New("jetstream: invalid message")

// NewMsg builds the message the relay publishes for ev.
func NewMsg(prefix string, ev projector.Event) (*nats.Msg, error) {
	h := nats.Header{}
	id := ev.ID.String()
	h.Set(HeaderMsgID, id)
	h.Set(HeaderEventID, id)
	h.Set(HeaderEventType, escapeValue(ev.Type))
	h.Set(HeaderSchemaVersion, strconv.Itoa(ev.SchemaVersion))
	h.Set(HeaderTenant, escapeValue(ev.Stream.Tenant))
	h.Set(HeaderStreamType, escapeValue(ev.Stream.Type))
	h.Set(HeaderStreamID, escapeValue(ev.Stream.ID))
	h.Set(HeaderVersion, strconv.FormatInt(ev.Version, 10))
	h.Set(HeaderPosition, ev.Position.String())
	h.Set(HeaderCorrelationID, ev.Metadata.CorrelationID.String())
	h.Set(HeaderCausationID, ev.Metadata.CausationID.String())
	if ev.Metadata.Actor != "" {
		h.Set(HeaderActor, escapeValue(ev.Metadata.Actor))
	}
	h.Set(HeaderRecordedAt, ev.RecordedAt.UTC().Format(time.RFC3339Nano))
	if len(ev.Metadata.Headers) > 0 {
		b, err := json.Marshal(ev.Metadata.Headers)
		if err != nil {
			return nil, fmt.Errorf("event %s: encode metadata headers: %w", ev.ID, err)
		}
		h.Set(HeaderMetadata, string(b))
		setTraceContext(h, ev.Metadata.Headers)
	}
	data := ev.Data
	if data == nil {
		data = json.RawMessage("null")
	}
	return &nats.Msg{Subject: Subject(prefix, ev), Header: h, Data: data}, nil
}

// setTraceContext copies the trace context stored in an event's metadata
// headers to the message's standard headers, written anew from the parsed
// context: a malformed stored value is left out rather than passed on.
func setTraceContext(h nats.Header, md map[string]string) {
	sc := tracing.Extract(md)
	if !sc.IsValid() {
		return
	}
	for k, v := range tracing.Inject(trace.ContextWithRemoteSpanContext(context.Background(), sc), nil) {
		h.Set(k, v)
	}
}

// Decode turns a relayed message back into the event that was appended,
// through reg: the payload is upcast to the type's current schema version
// and decoded into its Go type, exactly as the dispatcher does, so a Go
// service on the other side uses the same registry and typed payloads.
// Position is the event's place in the source log. A message that is not a
// relayed event fails with [ErrInvalidMessage]; an undefined type or a
// payload that cannot be upcast or decoded with the registry's errors.
func Decode(reg *projector.Registry, header nats.Header, data []byte) (projector.Event, error) {
	var ev projector.Event
	var err error
	field := func(name string) string {
		if err != nil {
			return ""
		}
		v := header.Get(name)
		if v == "" {
			err = fmt.Errorf("%w: header %s missing", ErrInvalidMessage, name)
		}
		return v
	}
	text := func(name string) string {
		v := field(name)
		if err != nil {
			return ""
		}
		s, uerr := unescapeValue(v)
		if uerr != nil {
			err = fmt.Errorf("%w: header %s: %w", ErrInvalidMessage, name, uerr)
		}
		return s
	}
	id := func(name string) uuid.UUID {
		v := field(name)
		if err != nil {
			return uuid.Nil
		}
		u, perr := uuid.Parse(v)
		if perr != nil || len(v) != 36 {
			err = fmt.Errorf("%w: header %s: not a UUID", ErrInvalidMessage, name)
		}
		return u
	}
	number := func(name string) int64 {
		v := field(name)
		if err != nil {
			return 0
		}
		n, perr := strconv.ParseInt(v, 10, 64)
		if perr != nil || n < 1 {
			err = fmt.Errorf("%w: header %s: %s is not a positive integer", ErrInvalidMessage, name, projector.Quoted(v))
		}
		return n
	}
	ev.ID = id(HeaderEventID)
	ev.Type = text(HeaderEventType)
	schema := number(HeaderSchemaVersion)
	ev.Stream.Tenant = text(HeaderTenant)
	ev.Stream.Type = text(HeaderStreamType)
	ev.Stream.ID = text(HeaderStreamID)
	ev.Version = number(HeaderVersion)
	pos := field(HeaderPosition)
	ev.Metadata.CorrelationID = id(HeaderCorrelationID)
	ev.Metadata.CausationID = id(HeaderCausationID)
	recorded := field(HeaderRecordedAt)
	if err != nil {
		return projector.Event{}, err
	}
	if schema > 1<<31-1 {
		return projector.Event{}, fmt.Errorf("%w: header %s out of range", ErrInvalidMessage, HeaderSchemaVersion)
	}
	if ev.Position, err = projector.ParsePosition(pos); err != nil {
		return projector.Event{}, fmt.Errorf("%w: header %s: %w", ErrInvalidMessage, HeaderPosition, err)
	}
	if ev.RecordedAt, err = time.Parse(time.RFC3339Nano, recorded); err != nil {
		return projector.Event{}, fmt.Errorf("%w: header %s: %w", ErrInvalidMessage, HeaderRecordedAt, err)
	}
	if a := header.Get(HeaderActor); a != "" {
		if ev.Metadata.Actor, err = unescapeValue(a); err != nil {
			return projector.Event{}, fmt.Errorf("%w: header %s: %w", ErrInvalidMessage, HeaderActor, err)
		}
	}
	if m := header.Get(HeaderMetadata); m != "" {
		if err := json.Unmarshal([]byte(m), &ev.Metadata.Headers); err != nil {
			return projector.Event{}, fmt.Errorf("%w: header %s: %w", ErrInvalidMessage, HeaderMetadata, err)
		}
	}
	if err := ev.Stream.Validate(); err != nil {
		return projector.Event{}, fmt.Errorf("%w: %w", ErrInvalidMessage, err)
	}
	// An actor or header PostgreSQL cannot store (a NUL) failed the
	// handler's insert, blamed on the handler and retried to MaxDeliver:
	// the message's fault, said here so it is dead-lettered at once.
	if err := ev.Metadata.Validate(); err != nil {
		return projector.Event{}, fmt.Errorf("%w: %w", ErrInvalidMessage, err)
	}
	payload, upcast, err := reg.Decode(ev.Type, int(schema), json.RawMessage(data))
	if err != nil {
		return projector.Event{}, fmt.Errorf("event %s: %w", ev.ID, err)
	}
	ev.Payload = payload
	ev.Data = upcast
	info, _ := reg.Lookup(ev.Type)
	ev.SchemaVersion = info.SchemaVersion
	return ev, nil
}

// escapeValue percent-escapes '%' and control bytes, which a NATS header
// value cannot hold (a CR or LF would end the header); the rest stays
// readable.
func escapeValue(s string) string {
	if !strings.ContainsFunc(s, func(r rune) bool { return r == '%' || r < 0x20 || r == 0x7f }) {
		return s
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '%' || c < 0x20 || c == 0x7f {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

func unescapeValue(v string) (string, error) {
	if !strings.Contains(v, "%") {
		if !utf8.ValidString(v) {
			return "", errors.New("not valid UTF-8")
		}
		return v, nil
	}
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		if i+2 >= len(v) || unhex(v[i+1]) < 0 || unhex(v[i+2]) < 0 {
			return "", fmt.Errorf("bad escape at byte %d", i)
		}
		b.WriteByte(byte(unhex(v[i+1])<<4 | unhex(v[i+2])))
		i += 2
	}
	s := b.String()
	if !utf8.ValidString(s) {
		return "", errors.New("not valid UTF-8")
	}
	return s, nil
}
