package postgres

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/jsonscan"
)

// prescanHistoryLine reads the stream and version at the head of a line
// as Export writes it, {"stream":{"tenant":…,"type":…,"id":…},"version":N,
// with plain strings, without reading the rest: the import needs every
// line's stream and version before the first row of a batch is sent, and
// decodes the lines themselves while the batch is being copied. It
// returns the stream's member as written (its key among the batch's
// streams: no string is made for a stream seen before; prescanStream reads
// it) and reports false for any other line. A line it reads may still be
// one the full decoding refuses, or reads otherwise (a member given
// twice); the import compares the two.
func prescanHistoryLine(line []byte) (stream []byte, version int64, ok bool) {
	rest, ok := bytes.CutPrefix(line, []byte(`{"stream":`))
	if !ok {
		return nil, 0, false
	}
	at := len(line) - len(rest)
	for _, name := range [...]string{`{"tenant":`, `,"type":`, `,"id":`} {
		if rest, ok = bytes.CutPrefix(rest, []byte(name)); !ok {
			return nil, 0, false
		}
		if rest, ok = cutPlainString(rest); !ok {
			return nil, 0, false
		}
	}
	if rest, ok = bytes.CutPrefix(rest, []byte(`},"version":`)); !ok {
		return nil, 0, false
	}
	stream = line[at : len(line)-len(rest)-len(`,"version":`)]
	end := bytes.IndexByte(rest, ',')
	if end < 0 {
		return nil, 0, false
	}
	version, ok = jsonInt(rest[:end])
	return stream, version, ok
}

// prescanStream returns the stream of a member prescanHistoryLine read.
func prescanStream(stream []byte) projector.StreamRef {
	var parts [3]string
	rest := stream
	for i := range parts {
		rest = rest[bytes.IndexByte(rest, ':')+1:]
		end := bytes.IndexByte(rest[1:], '"') + 1
		parts[i], rest = string(rest[1:end]), rest[end+1:]
	}
	return projector.StreamRef{Tenant: parts[0], Type: parts[1], ID: parts[2]}
}

// cutPlainString cuts a JSON string without escapes from the head of b.
func cutPlainString(b []byte) ([]byte, bool) {
	if len(b) == 0 || b[0] != '"' {
		return b, false
	}
	end := bytes.IndexByte(b[1:], '"')
	if end < 0 || !isJSONString(b[:end+2]) {
		return b, false
	}
	return b[end+2:], true
}

// decodeHistoryLine decodes one history line into h, as json.Unmarshal
// would, without encoding/json's reflection: the import decodes every
// line of a file, and that decoding was most of its client CPU. It handles
// the lines Export writes (every member a known one, once, no nulls, plain
// numbers) and reports false for anything else, leaving the caller to run
// json.Unmarshal, which decodes the unusual line or names its error. So it
// never accepts a line json.Unmarshal refuses, and where it accepts one it
// fills h as json.Unmarshal would (FuzzHistoryLine checks both).
func decodeHistoryLine(line []byte, h *HistoryEvent) bool { return decodeHistoryLineWith(line, h, nil) }

// lineCache carries what one goroutine decoding line after line can reuse:
// the strings of the line before (lines of a file mostly repeat their
// tenant, stream and type, and a string equal to the last one is not
// allocated again), and whether the payload may stay in the line's bytes
// (the import keeps a batch's lines while its events live) instead of
// being copied, and whether the payload's JSON is left to the caller to
// check (the import's registry decoding parses it anyway: see
// importBatch.decodeChunk).
type lineCache struct {
	last             [cachedFields]string
	alias, unchecked bool
}

// The strings a lineCache keeps, one of each.
const (
	cachedTenant = iota
	cachedStreamType
	cachedStreamID
	cachedEventType
	cachedActor
	cachedFields
)

// str decodes a JSON string, field f of a line, reusing the last one's
// value when it is the same plain string.
func (c *lineCache) str(f int, v []byte) (string, bool) {
	if c == nil {
		return jsonString(v)
	}
	last := &c.last[f]
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' && *last != "" && string(v[1:len(v)-1]) == *last {
		return *last, true // *last is a plain string's value, so v is that plain string
	}
	if isJSONString(v) {
		*last = string(v[1 : len(v)-1])
		return *last, true
	}
	return jsonString(v)
}

// decodeHistoryLineWith is decodeHistoryLine reusing what c holds (nil: nothing).
func decodeHistoryLineWith(line []byte, h *HistoryEvent, c *lineCache) bool {
	var seen uint16
	return jsonscan.RawMembers(line, func(name, v []byte) bool {
		var bit uint16
		ok := false
		switch string(name) {
		case "stream":
			bit, ok = 1<<0, decodeHistoryStream(v, &h.Stream, c)
		case "version":
			bit = 1 << 1
			h.Version, ok = jsonInt(v)
		case "type":
			bit = 1 << 2
			h.Type, ok = c.str(cachedEventType, v)
		case "schema_version":
			bit = 1 << 3
			var n int64
			n, ok = jsonInt(v)
			h.SchemaVersion = int(n)
			ok = ok && int64(h.SchemaVersion) == n
		case "id":
			bit, ok = 1<<4, jsonText(v, h.ID.UnmarshalText)
		case "recorded_at":
			bit, ok = 1<<5, isJSONString(v) && h.RecordedAt.UnmarshalJSON(v) == nil
		case "payload":
			bit = 1 << 6
			if ok = len(v) > 0 && v[0] != 'n' && ((c != nil && c.unchecked) || json.Valid(v)); ok {
				h.Payload = v
				if c == nil || !c.alias {
					h.Payload = bytes.Clone(v)
				}
			}
		case "metadata":
			bit, ok = 1<<7, decodeHistoryMetadata(v, &h.Metadata, c)
		}
		if !ok || seen&bit != 0 {
			return false // unknown, repeated or unusual: encoding/json's turn
		}
		seen |= bit
		return true
	})
}

func decodeHistoryStream(v []byte, s *HistoryStream, c *lineCache) bool {
	var seen uint8
	return jsonscan.RawMembers(v, func(name, v []byte) bool {
		var bit uint8
		ok := false
		switch string(name) {
		case "tenant":
			bit = 1 << 0
			s.Tenant, ok = c.str(cachedTenant, v)
		case "type":
			bit = 1 << 1
			s.Type, ok = c.str(cachedStreamType, v)
		case "id":
			bit = 1 << 2
			s.ID, ok = c.str(cachedStreamID, v)
		}
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
		return true
	})
}

func decodeHistoryMetadata(v []byte, m *HistoryMetadata, c *lineCache) bool {
	var seen uint8
	return jsonscan.RawMembers(v, func(name, v []byte) bool {
		var bit uint8
		ok := false
		switch string(name) {
		case "correlation_id":
			bit, ok = 1<<0, jsonText(v, m.CorrelationID.UnmarshalText)
		case "causation_id":
			bit, ok = 1<<1, jsonText(v, m.CausationID.UnmarshalText)
		case "actor":
			bit = 1 << 2
			m.Actor, ok = c.str(cachedActor, v)
		case "headers":
			bit = 1 << 3
			headers := map[string]string{}
			ok = jsonscan.Members(v, func(name string, v []byte, start, end int) bool {
				if _, dup := headers[name]; dup || !utf8.ValidString(name) {
					return false // repeated, or not as encoding/json reads it
				}
				s, ok := jsonString(v)
				headers[name] = s
				return ok
			})
			m.Headers = headers
		}
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
		return true
	})
}

// isJSONString reports whether v is a JSON string without escapes, control
// characters or invalid UTF-8: one whose bytes between the quotes are its
// value, as encoding/json would decode it.
func isJSONString(v []byte) bool {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return false
	}
	for _, c := range v[1 : len(v)-1] {
		if c < 0x20 || c == '\\' || c == '"' {
			return false
		}
	}
	return utf8.Valid(v)
}

// jsonString decodes a JSON string: the plain ones directly, the others
// (escapes) with encoding/json.
func jsonString(v []byte) (string, bool) {
	if isJSONString(v) {
		return string(v[1 : len(v)-1]), true
	}
	if len(v) == 0 || v[0] != '"' {
		return "", false
	}
	var s string
	return s, json.Unmarshal(v, &s) == nil
}

// jsonText decodes a plain JSON string with a TextUnmarshaler's method, as
// encoding/json does for such a type.
func jsonText(v []byte, unmarshal func([]byte) error) bool {
	return isJSONString(v) && unmarshal(v[1:len(v)-1]) == nil
}

// jsonInt decodes a JSON integer written plainly (no fraction, exponent or
// leading zero), as encoding/json decodes one into an int64.
func jsonInt(v []byte) (int64, bool) {
	digits := v
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || (digits[0] == '0' && len(digits) > 1) {
		return 0, false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	return n, err == nil
}
