package postgres

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/projectorhq/projector"
)

// History files: the log as JSON Lines, written by [Store.Export] and read by
// [Store.Import] (`projector events export` and `events import`). The first
// line is a [HistoryHeader] naming the format and its version; every later
// line is one [HistoryEvent]. docs/history.md describes the format field by
// field; it is stable: readers ignore fields they do not know (optional
// fields may be added within a version), a change that an older reader
// could misread gets a new version number, and readers refuse versions
// they do not know.
const (
	// HistoryFormat is the header's format name.
	HistoryFormat = "projector.history"
	// HistoryVersion is the version of the format this package writes and
	// reads.
	HistoryVersion = 1
	// MaxHistoryLine is the longest line a history decoder accepts, in
	// bytes: one event's payload and metadata with room to spare, and a
	// bound on what a corrupt file (no newline for gigabytes) costs.
	MaxHistoryLine = 64 << 20
)

// ErrInvalidHistory means a history file cannot be read: a missing or
// unknown header, a line that is not an event, or an event that breaks the
// format's rules. Errors about one line are a [*HistoryLineError].
var ErrInvalidHistory = errors.New("projector: invalid history file")

// HistoryLineError is a problem with one line of a history file.
type HistoryLineError struct {
	// Line is the 1-based line number; the header is line 1.
	Line int
	Err  error
}

func (e *HistoryLineError) Error() string { return fmt.Sprintf("line %d: %v", e.Line, e.Err) }

// Unwrap returns the cause.
func (e *HistoryLineError) Unwrap() error { return e.Err }

// HistoryHeader is the first line of a history file.
type HistoryHeader struct {
	Format  string `json:"format"`
	Version int    `json:"version"`
	// ExportedAt is informational: when the export began.
	ExportedAt time.Time `json:"exported_at,omitzero"`
}

// HistoryEvent is one line of a history file: an event as stored, with
// everything needed to write it again except its log position, which a
// log assigns when the event is written (positions are not portable
// between databases; the order of the lines is the order of the log).
type HistoryEvent struct {
	Stream        HistoryStream `json:"stream"`
	Version       int64         `json:"version"`
	Type          string        `json:"type"`
	SchemaVersion int           `json:"schema_version"`
	ID            uuid.UUID     `json:"id"`
	RecordedAt    time.Time     `json:"recorded_at"`
	// Payload is the event's data as stored, at SchemaVersion (not upcast).
	Payload  json.RawMessage `json:"payload"`
	Metadata HistoryMetadata `json:"metadata"`
}

// HistoryStream names an event's stream.
type HistoryStream struct {
	Tenant string `json:"tenant"`
	Type   string `json:"type"`
	ID     string `json:"id"`
}

// HistoryMetadata is an event's metadata. A zero correlation id, allowed
// for history written by other tools, is imported as the event's own id.
type HistoryMetadata struct {
	CorrelationID uuid.UUID         `json:"correlation_id,omitzero"`
	CausationID   uuid.UUID         `json:"causation_id,omitzero"`
	Actor         string            `json:"actor,omitempty"`
	Headers       map[string]string `json:"headers,omitempty"`
}

// Ref returns the stream as a [projector.StreamRef].
func (s HistoryStream) Ref() projector.StreamRef {
	return projector.StreamRef{Tenant: s.Tenant, Type: s.Type, ID: s.ID}
}

// HistoryEventOf returns ev as a history line.
func HistoryEventOf(ev projector.Event) HistoryEvent {
	return HistoryEvent{
		Stream:  HistoryStream{Tenant: ev.Stream.Tenant, Type: ev.Stream.Type, ID: ev.Stream.ID},
		Version: ev.Version, Type: ev.Type, SchemaVersion: ev.SchemaVersion, ID: ev.ID,
		RecordedAt: ev.RecordedAt, Payload: ev.Data,
		Metadata: HistoryMetadata{CorrelationID: ev.Metadata.CorrelationID, CausationID: ev.Metadata.CausationID,
			Actor: ev.Metadata.Actor, Headers: ev.Metadata.Headers},
	}
}

// Event returns the line as an event as it was stored: Data set, Payload
// and Position not.
func (h HistoryEvent) Event() projector.Event {
	return projector.Event{
		ID: h.ID, Stream: h.Stream.Ref(), Version: h.Version, Type: h.Type, SchemaVersion: h.SchemaVersion,
		Data: h.Payload, RecordedAt: h.RecordedAt,
		Metadata: projector.Metadata{CorrelationID: h.Metadata.CorrelationID, CausationID: h.Metadata.CausationID,
			Actor: h.Metadata.Actor, Headers: h.Metadata.Headers},
	}
}

// Validate checks what the format requires of a line, before any database
// sees it: every field present, names PostgreSQL can store, a payload that
// is a JSON value jsonb accepts.
func (h *HistoryEvent) Validate() error { return h.validate(true) }

// validate is Validate; checkJSON false skips checking that the payload is
// JSON, for a line just decoded (the decoder checked it).
func (h *HistoryEvent) validate(checkJSON bool) error {
	ref := h.Stream.Ref()
	switch {
	case h.Stream.Tenant == "" || h.Stream.Type == "" || h.Stream.ID == "":
		return fmt.Errorf("stream needs tenant, type and id (the system tenant is %q)", projector.SystemTenant)
	case h.Version == 0:
		return errors.New("version 0, or no version: want the event's version in its stream, 1 or more")
	case h.Version < 1:
		return fmt.Errorf("version %d: want 1 or more", h.Version)
	case h.Type == "":
		return errors.New("no event type")
	case h.SchemaVersion < 1 || h.SchemaVersion > 1<<31-1:
		return fmt.Errorf("schema_version %d: want 1 or more", h.SchemaVersion)
	case h.ID == uuid.Nil:
		return errors.New("no event id")
	case h.RecordedAt.IsZero():
		return errors.New("no recorded_at")
	case len(h.Payload) == 0 || string(h.Payload) == "null":
		return errors.New("no payload")
	}
	if err := ref.Validate(); err != nil {
		return err
	}
	if err := projector.ValidText(h.Type); err != nil || len(h.Type) > projector.MaxNameLength {
		return fmt.Errorf("event type %s: not storable", projector.Printable(h.Type))
	}
	md := projector.Metadata{Actor: h.Metadata.Actor, Headers: h.Metadata.Headers}
	if err := md.Validate(); err != nil {
		return err
	}
	// jsonb refuses the NUL character, escaped or not.
	if bytes.Contains(h.Payload, []byte(`\u0000`)) || bytes.IndexByte(h.Payload, 0) >= 0 {
		return errors.New("payload holds a NUL character, which PostgreSQL's jsonb cannot store")
	}
	if checkJSON && !json.Valid(h.Payload) {
		return errors.New("payload is not valid JSON")
	}
	return nil
}

// HistoryEncoder writes a history file: the header, then one event a line.
type HistoryEncoder struct {
	w      *bufio.Writer
	header bool
	at     time.Time
	buf    bytes.Buffer
	enc    *json.Encoder
}

// NewHistoryEncoder returns an encoder writing to w. Call Flush at the end.
func NewHistoryEncoder(w io.Writer) *HistoryEncoder {
	e := &HistoryEncoder{w: bufio.NewWriterSize(w, 64<<10), at: time.Now().UTC()}
	e.enc = json.NewEncoder(&e.buf)
	e.enc.SetEscapeHTML(false) // payloads stay as stored, "<" and all
	return e
}

// Encode writes one event, after the header if it is the first.
func (e *HistoryEncoder) Encode(h HistoryEvent) error {
	if err := e.writeHeader(); err != nil {
		return err
	}
	return e.line(h)
}

func (e *HistoryEncoder) writeHeader() error {
	if e.header {
		return nil
	}
	e.header = true
	return e.line(HistoryHeader{Format: HistoryFormat, Version: HistoryVersion, ExportedAt: e.at})
}

// line encodes v into one line (json.Encoder ends it with a newline).
func (e *HistoryEncoder) line(v any) error {
	e.buf.Reset()
	if err := e.enc.Encode(v); err != nil {
		return fmt.Errorf("encode history line: %w", err)
	}
	_, err := e.w.Write(e.buf.Bytes())
	return err
}

// Flush writes the header if nothing else was written (an empty export is
// still a valid file) and flushes the buffer.
func (e *HistoryEncoder) Flush() error {
	if err := e.writeHeader(); err != nil {
		return err
	}
	return e.w.Flush()
}

// HistoryDecoder reads a history file line by line, in constant memory.
type HistoryDecoder struct {
	r      *bufio.Reader
	line   int
	header *HistoryHeader
	err    error
}

// NewHistoryDecoder returns a decoder reading r.
func NewHistoryDecoder(r io.Reader) *HistoryDecoder {
	return &HistoryDecoder{r: bufio.NewReaderSize(r, 256<<10)}
}

// Line returns the number of the line last read.
func (d *HistoryDecoder) Line() int { return d.line }

// Header reads and checks the header, if not read yet, and returns it.
func (d *HistoryDecoder) Header() (HistoryHeader, error) {
	if d.header != nil {
		return *d.header, nil
	}
	if d.err != nil {
		return HistoryHeader{}, d.err
	}
	b, err := d.next()
	if errors.Is(err, io.EOF) {
		return HistoryHeader{}, d.fail(fmt.Errorf("%w: empty file, no header line", ErrInvalidHistory))
	}
	if err != nil {
		return HistoryHeader{}, d.fail(err)
	}
	var h HistoryHeader
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&h); err != nil || h.Format != HistoryFormat {
		return HistoryHeader{}, d.fail(&HistoryLineError{Line: d.line,
			Err: fmt.Errorf("%w: not a history header (want {\"format\":%q,\"version\":%d})", ErrInvalidHistory, HistoryFormat, HistoryVersion)})
	}
	if h.Version != HistoryVersion {
		return HistoryHeader{}, d.fail(&HistoryLineError{Line: d.line,
			Err: fmt.Errorf("%w: format version %d; this program reads version %d", ErrInvalidHistory, h.Version, HistoryVersion)})
	}
	d.header = &h
	return h, nil
}

// Next reads the next event into h. It returns io.EOF at the end of the
// file, and a [*HistoryLineError] wrapping [ErrInvalidHistory] for a line
// that is not a valid event; the decoder stops at the first error.
func (d *HistoryDecoder) Next(h *HistoryEvent) error {
	if _, err := d.Header(); err != nil {
		return err
	}
	if d.err != nil {
		return d.err
	}
	b, err := d.next()
	if err != nil {
		return d.fail(err)
	}
	if err := decodeHistoryEvent(b, h); err != nil {
		return d.fail(&HistoryLineError{Line: d.line, Err: err})
	}
	return nil
}

// decodeHistoryEvent decodes and checks one event line into h; an error
// wraps ErrInvalidHistory.
func decodeHistoryEvent(b []byte, h *HistoryEvent) error { return decodeHistoryEventWith(b, h, nil) }

// decodeHistoryEventWith is decodeHistoryEvent reusing what c holds.
func decodeHistoryEventWith(b []byte, h *HistoryEvent, c *lineCache) error {
	*h = HistoryEvent{}
	if !utf8.Valid(b) {
		// JSON text is UTF-8. encoding/json would turn the bytes of a
		// string into U+FFFD, so an actor or a header would be imported
		// other than written, and PostgreSQL refuses them in a payload.
		return fmt.Errorf("%w: the line is not valid UTF-8", ErrInvalidHistory)
	}
	if !decodeHistoryLineWith(b, h, c) {
		// An unusual line: encoding/json decodes it or says what is wrong
		// (Unmarshal, not a Decoder, refuses a second value after the
		// first).
		*h = HistoryEvent{}
		if err := json.Unmarshal(b, h); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidHistory, err)
		}
	}
	if err := h.validate(false); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidHistory, err)
	}
	return nil
}

// nextLine returns the next event line, unparsed and valid until the next
// read, and its number: the import decodes lines in parallel, elsewhere.
func (d *HistoryDecoder) nextLine() ([]byte, int, error) {
	if _, err := d.Header(); err != nil {
		return nil, 0, err
	}
	if d.err != nil {
		return nil, 0, d.err
	}
	b, err := d.next()
	if err != nil {
		return nil, 0, d.fail(err)
	}
	return b, d.line, nil
}

func (d *HistoryDecoder) fail(err error) error {
	d.err = err
	return err
}

// next returns the next non-empty line, without its newline.
func (d *HistoryDecoder) next() ([]byte, error) {
	for {
		b, err := d.readLine()
		if err != nil {
			return nil, err
		}
		d.line++
		b = bytes.TrimSpace(b)
		if len(b) > 0 {
			return b, nil
		}
	}
}

// readLine reads one line of at most MaxHistoryLine bytes; the last line
// may lack its newline.
func (d *HistoryDecoder) readLine() ([]byte, error) {
	var long []byte
	for {
		frag, err := d.r.ReadSlice('\n')
		if err == nil || (errors.Is(err, io.EOF) && len(frag)+len(long) > 0) {
			if long == nil {
				return frag, nil
			}
			return append(long, frag...), nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			if errors.Is(err, io.EOF) {
				return nil, io.EOF
			}
			return nil, fmt.Errorf("read history: %w", err)
		}
		long = append(long, frag...)
		if len(long) > MaxHistoryLine {
			return nil, &HistoryLineError{Line: d.line + 1, Err: fmt.Errorf("%w: line longer than %d bytes", ErrInvalidHistory, MaxHistoryLine)}
		}
	}
}
