package projector

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

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
	// Forgotten reports that the event's personal fields belong to a data
	// subject who was forgotten: they read as JSON null in Data and as the
	// Go zero value in Payload (see [Personal] and docs/privacy.md).
	Forgotten bool
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

// MaxNameLength is the longest tenant, stream type, stream id or event type
// name, in bytes. A stream's three names are the key of the stream and event
// indexes, and a PostgreSQL b-tree entry cannot exceed about 2.7 kB; 255
// bytes each keeps every key storable with room to spare, and is more than
// any real name needs. Appends and reads refuse longer names before sending
// anything.
const MaxNameLength = 255

// Validate reports whether the reference names a stream PostgreSQL can
// store. Every part must be non-empty, so an application cannot write into an
// unnamed tenant by forgetting to set one; valid UTF-8 without NUL bytes,
// which PostgreSQL text cannot hold (a raw driver error would abort the
// caller's transaction); and at most [MaxNameLength] bytes. The error matches
// [ErrInvalidStream] and never carries the raw bytes.
func (s StreamRef) Validate() error {
	switch {
	case s.Tenant == "":
		return fmt.Errorf("%w: stream %s has no tenant (use projector.SystemTenant for streams that belong to no tenant)", ErrInvalidStream, s)
	case s.Type == "":
		return fmt.Errorf("%w: stream %s has no type", ErrInvalidStream, s)
	case s.ID == "":
		return fmt.Errorf("%w: stream %s has no id", ErrInvalidStream, s)
	}
	for _, part := range [...]struct{ what, v string }{{"tenant", s.Tenant}, {"type", s.Type}, {"id", s.ID}} {
		if problem := storable(part.v, MaxNameLength); problem != "" {
			return fmt.Errorf("%w: stream %s: the %s %s", ErrInvalidStream, s, part.what, problem)
		}
	}
	return nil
}

// String renders the reference as tenant/type/id for logs and errors. A part
// that is not a plain, printable name of at most [MaxNameLength] bytes is
// shown quoted with Go escapes and cut short, so a log line or an error never
// carries raw control or invalid bytes, or a megabyte of id.
func (s StreamRef) String() string {
	return Printable(s.Tenant) + "/" + Printable(s.Type) + "/" + Printable(s.ID)
}

// MaxMetadataBytes is the most bytes an event's metadata may hold: its
// actor and every header name and value together. Metadata is copied onto
// every event of an append and into the headers of every message the relay
// publishes, where NATS counts it against the message's size (1 MB by
// default), so a large value belongs in the payload. An append over it is
// refused before anything is sent.
const MaxMetadataBytes = 64 << 10

// Validate reports whether PostgreSQL can store the metadata exactly as
// given: the actor and every header name and value must be valid UTF-8
// without NUL bytes, and together at most [MaxMetadataBytes]. encoding/json would silently turn invalid UTF-8 into
// U+FFFD, and PostgreSQL refuses NUL in text and jsonb with an error that
// aborts the caller's transaction; appends call Validate before sending
// anything instead. The error matches [ErrInvalidPayload] and never carries
// the raw bytes.
func (m Metadata) Validate() error {
	n := len(m.Actor)
	for k, v := range m.Headers {
		n += len(k) + len(v)
	}
	if n > MaxMetadataBytes {
		return fmt.Errorf("%w: metadata: the actor and headers are %d bytes, over the limit of %d (projector.MaxMetadataBytes): keep large values in the payload",
			ErrInvalidPayload, n, MaxMetadataBytes)
	}
	if problem := storable(m.Actor, 0); problem != "" {
		return fmt.Errorf("%w: metadata: the actor %s %s", ErrInvalidPayload, Printable(m.Actor), problem)
	}
	for k, v := range m.Headers {
		if problem := storable(k, 0); problem != "" {
			return fmt.Errorf("%w: metadata: the header name %s %s", ErrInvalidPayload, Printable(k), problem)
		}
		if problem := storable(v, 0); problem != "" {
			return fmt.Errorf("%w: metadata: the value of header %s %s", ErrInvalidPayload, Printable(k), problem)
		}
	}
	return nil
}

// ValidText reports whether PostgreSQL text can hold s exactly: nil, or an
// error saying why not (it is not valid UTF-8, or holds a NUL byte) that
// never carries s itself. Every string from outside that reaches a query —
// a name, a filter value, a key — is checked with it at the API boundary
// and the error wrapped in that package's sentinel: sent as it is, the
// driver's "invalid byte sequence" would abort the caller's transaction
// and tell the caller nothing it can test with errors.Is.
func ValidText(s string) error {
	if problem := storable(s, 0); problem != "" {
		return errors.New(problem)
	}
	return nil
}

// storable says why PostgreSQL text cannot hold s exactly, or would refuse
// it as a name longer than limit bytes (0: no limit); "" when it can.
func storable(s string, limit int) string {
	switch {
	case limit > 0 && len(s) > limit:
		return fmt.Sprintf("is %d bytes long, over the limit of %d", len(s), limit)
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	case strings.IndexByte(s, 0) >= 0:
		return "contains a NUL byte, which PostgreSQL cannot store"
	}
	return ""
}

// printableCut is how much of an unprintable or oversized value an error
// message shows.
const printableCut = 64

// Printable renders a user-supplied name for a log line or an error
// message: as it is when it is valid UTF-8, printable and at most
// [MaxNameLength] bytes; otherwise quoted with Go escapes (so NUL, control
// characters and invalid bytes show as \x00, \n, \xff) and, past 64 bytes,
// cut short with its length noted.
func Printable(s string) string { return printable(s, MaxNameLength, printableCut) }

// Quoted is [Printable] in quotes whatever the value, for a value named
// inside a sentence, where an empty or spaced one must stand out. Use it
// rather than %q over Printable, which quotes an unprintable value twice
// ("\"\\x00\"" for a NUL): here it is quoted and escaped once.
func Quoted(s string) string {
	if p := Printable(s); p != s {
		return p // quoted and escaped already
	}
	return strconv.Quote(s)
}

// PrintableText is [Printable] for stored free text an operator reads —
// an error message, a document, a saga's state — that may be longer than
// a name: as it is when it is valid UTF-8, printable and at most limit
// bytes; otherwise quoted with Go escapes and, past limit bytes, cut short
// with its length noted. Whatever was stored, the result holds no escape
// sequence a terminal would obey (ESC shows as \x1b) and no more than
// limit bytes of s.
func PrintableText(s string, limit int) string { return printable(s, limit, limit) }

// printable returns s as it is when it is printable and at most pass
// bytes, else quoted and cut to cut bytes.
func printable(s string, pass, cut int) string {
	if len(s) <= pass && isPrintable(s) {
		return s
	}
	if len(s) <= cut {
		return strconv.Quote(s)
	}
	cut = max(cut, 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + "…(" + strconv.Itoa(len(s)) + " bytes)"
}

// EscapeControls writes every rune of s a terminal would obey or cannot
// show — ESC and the other control characters but tab, invisible format
// runes, bytes that are not UTF-8 — as its Go escape where it stands,
// leaving the rest of s as it reads. Unlike [PrintableText] it neither
// quotes nor cuts: it is for a message that quotes values of its own (an
// error line, a page's text) where only the offending runes should change.
func EscapeControls(s string) string {
	if !strings.ContainsFunc(s, func(r rune) bool { return r == utf8.RuneError || (r != ' ' && r != '\t' && !unicode.IsPrint(r)) }) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b.WriteString(`\x`)
			b.WriteString(strconv.FormatUint(uint64(s[i])|0x100, 16)[1:])
		case r == ' ' || r == '\t' || unicode.IsPrint(r):
			b.WriteString(s[i : i+size])
		default:
			q := strconv.QuoteRuneToASCII(r)
			b.WriteString(q[1 : len(q)-1])
		}
		i += size
	}
	return b.String()
}

func isPrintable(s string) bool {
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			// RuneError is also what an invalid byte decodes to: quote
			// both, the genuine U+FFFD is rare in a name.
			return false
		}
	}
	return true
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

// MarshalText renders the position as String does, so a Position is a
// JSON string ("367141/6") wherever it is encoded: a read-your-writes token
// in an API response, a cursor in the console's state.json.
func (p Position) MarshalText() ([]byte, error) {
	return []byte(p.String()), nil
}

// UnmarshalText parses what MarshalText writes, as [ParsePosition] does.
func (p *Position) UnmarshalText(text []byte) error {
	q, err := ParsePosition(string(text))
	if err != nil {
		return err
	}
	*p = q
	return nil
}

// UnmarshalJSON reads the string MarshalText writes, and also the object
// {"TxID":…,"Seq":…} that releases before it wrote for a Position inside a
// value encoded with encoding/json (saga state, a snapshot, a payload), so
// what they stored still decodes. null leaves p unchanged, as encoding/json
// does for other types.
func (p *Position) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	switch {
	case string(data) == "null":
		return nil
	case len(data) > 0 && data[0] == '"':
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return fmt.Errorf("parse position: %w", err)
		}
		return p.UnmarshalText([]byte(s))
	case len(data) > 0 && data[0] == '{':
		var legacy struct {
			TxID *uint64
			Seq  *int64
		}
		if err := json.Unmarshal(data, &legacy); err != nil {
			return fmt.Errorf("parse position: %w", err)
		}
		if legacy.TxID == nil || legacy.Seq == nil || *legacy.Seq < 0 {
			return errors.New(`parse position: want "txid/seq", or an object with TxID and a non-negative Seq`)
		}
		*p = Position{TxID: *legacy.TxID, Seq: *legacy.Seq}
		return nil
	}
	return errors.New(`parse position: want a string "txid/seq"`)
}

// ParsePosition parses the form String produces, and "txid/max", the form
// the ops CLI prints for a cursor at a horizon (every event of txid and
// before passed).
func ParsePosition(s string) (Position, error) {
	tx, seq, ok := strings.Cut(s, "/")
	if !ok {
		return Position{}, fmt.Errorf("parse position %q: want txid/seq", s)
	}
	t, err := strconv.ParseUint(tx, 10, 64)
	if err != nil {
		return Position{}, fmt.Errorf("parse position %q: transaction id: %w", s, err)
	}
	if seq == "max" {
		return Position{TxID: t, Seq: math.MaxInt64}, nil
	}
	q, err := strconv.ParseInt(seq, 10, 64)
	if err != nil || q < 0 {
		return Position{}, fmt.Errorf("parse position %q: sequence must be a non-negative integer", s)
	}
	return Position{TxID: t, Seq: q}, nil
}
