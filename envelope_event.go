package projector

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"

	"github.com/projectorhq/projector/internal/jsonscan"
)

// An event with two or more sealed fields keeps them in one envelope (the
// "event envelope"): one nonce, one tag,
// one decryption and one base64 decode per event instead of one of each
// per field, which is what made sealed reads cost ~0.8× a plain read. The
// envelope sits in one of the fields, the others hold a placeholder:
//
//	"name":  "pjx2." + base64url(nonce ‖ AES-256-GCM(values) ‖ tag)
//	"email": "pjx2."
//
// The plaintext is each sealed field's JSON value, uvarint length first,
// in the byte order of the fields' names (jsonb reorders members, names
// do not move). The additional data binds the format, the subject and the
// names in that order, so an envelope copied into another subject's
// event, or into an event whose sealed fields are named differently, does
// not open. Fields sealed one by one ("pjx1.", [SealValue]) still open:
// rows are never rewritten, and a payload may hold both forms.
const (
	eventPrefix = "pjx2."
	// eventPlaceholder is a sealed field's value kept in the envelope
	// another field holds: the prefix alone.
	eventPlaceholder = `"` + eventPrefix + `"`
)

// The kinds of sealed member sealedKind tells apart.
const (
	notSealed byte = iota
	fieldEnvelope
	eventEnvelope
	eventPart
)

// sealedKind returns what a top-level JSON value is: a field's own
// envelope (returned, as sealedBytes does), the event envelope (returned)
// or a part of it, or nothing sealed.
func sealedKind(v []byte) ([]byte, byte) {
	if string(v) == eventPlaceholder {
		return nil, eventPart
	}
	if len(v) > len(eventPlaceholder) && v[0] == '"' && string(v[1:1+len(eventPrefix)]) == eventPrefix {
		inner := v[1 : len(v)-1]
		if v[len(v)-1] == '"' && bytes.IndexByte(inner, '\\') < 0 && bytes.IndexByte(inner, '"') < 0 {
			return inner, eventEnvelope
		}
		// Base64url needs no escapes: what has them is not an envelope
		// we wrote, and opens as a malformed one.
		return []byte(eventPrefix + "!"), eventEnvelope
	}
	if env, ok := sealedBytes(v); ok {
		return env, fieldEnvelope
	}
	return nil, notSealed
}

// startsSealed reports whether a top-level value starts like either form,
// which a field that is not personal may not.
func startsSealed(v []byte) bool {
	if _, ok := sealedBytes(v); ok {
		return true
	}
	v = bytes.TrimSpace(v)
	return len(v) > len(eventPrefix) && v[0] == '"' && bytes.HasPrefix(v[1:], []byte(eventPrefix))
}

// member is a top-level member of a payload: its name, value or envelope,
// and where it sits in the payload.
type member struct {
	name, v    []byte
	start, end int
	kind       byte
}

// sortByName sorts idx, indexes into ms, by the members' names: insertion
// sort, there are a few.
func sortByName(idx []int, ms []member) {
	for i := 1; i < len(idx); i++ {
		for j := i; j > 0 && bytes.Compare(ms[idx[j]].name, ms[idx[j-1]].name) < 0; j-- {
			idx[j], idx[j-1] = idx[j-1], idx[j]
		}
	}
}

func appendEventAdditional(b []byte, subject string, ms []member, idx []int) []byte {
	b = append(b, eventPrefix...)
	b = append(b, 0)
	b = append(b, subject...)
	for _, i := range idx {
		b = append(b, 0)
		b = append(b, ms[i].name...)
	}
	return b
}

// sealEvent seals the present, non-null personal fields of data, valid
// JSON, into one envelope. It returns ok false, and nothing, when fewer
// than two fields are sealed (one envelope per field costs the same then,
// and keeps the format every earlier row has) or when the scanner does
// not follow data (SealWith's path gives the precise error). With apart,
// every sealed field holds the placeholder and the envelope's bytes are
// returned beside the payload instead (SealPayloadApart).
func (p Personal) sealEvent(data json.RawMessage, subject string, c *KeyCipher, apart bool) (_ json.RawMessage, envelope []byte, ok bool, _ error) {
	var few [4]member // on the stack while the event has at most four
	ms := few[:0]
	var bad []byte
	followed := jsonscan.MembersBytes(data, func(name, v []byte, start, end int) bool {
		if !hasName(p.Fields, name) {
			if startsSealed(v) {
				bad = name
				return false
			}
			return true
		}
		if !isNull(v) {
			ms = append(ms, member{name: name, v: v, start: start, end: end})
		}
		return true
	})
	if bad != nil {
		return nil, nil, false, fmt.Errorf("%w: field %q starts with %q or %q, which mark a sealed personal field", ErrInvalidPayload, bad, sealedPrefix, eventPrefix)
	}
	if !followed || len(ms) < 2 || !json.Valid(data) {
		return nil, nil, false, nil
	}
	var idxa [4]int
	idx := idxa[:0]
	plainLen := 0
	for i := range ms {
		idx = append(idx, i)
		plainLen += len(ms[i].v) + binary.MaxVarintLen32
	}
	sortByName(idx, ms)
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)
	ns := gcmNonceSize
	sealedEnd := ns + plainLen + gcmTagSize
	need := sealedEnd + len(eventPrefix) + len(subject) + 1
	for _, m := range ms {
		need += len(m.name) + 1
	}
	if cap(sc.crypto) < need {
		sc.crypto = make([]byte, need+64)
	}
	buf := sc.crypto[:cap(sc.crypto)]
	nonce := buf[:ns:ns]
	if _, err := rand.Read(nonce); err != nil {
		return nil, nil, false, fmt.Errorf("seal: nonce: %w", err)
	}
	plain := buf[ns:ns]
	for _, i := range idx {
		plain = binary.AppendUvarint(plain, uint64(len(ms[i].v)))
		plain = append(plain, ms[i].v...)
	}
	// The additional data goes after the most the sealed bytes can take.
	ad := appendEventAdditional(buf[sealedEnd:sealedEnd], subject, ms, idx)
	raw := c.aead.Seal(buf[:ns:sealedEnd], nonce, plain, ad)
	if apart {
		envelope = append([]byte(nil), raw...) // raw is the pool's
	}
	out := make([]byte, 0, len(data)+base64.RawURLEncoding.EncodedLen(len(raw))+len(eventPlaceholder)*len(ms))
	last := 0
	for k, m := range ms {
		out = append(out, data[last:m.start]...)
		if k == 0 && !apart {
			out = append(out, '"')
			out = append(out, eventPrefix...)
			out = base64.RawURLEncoding.AppendEncode(out, raw)
			out = append(out, '"')
		} else {
			out = append(out, eventPlaceholder...)
		}
		last = m.end
	}
	return append(out, data[last:]...), envelope, true, nil
}

// DetachEnvelope is [AttachEnvelope]'s inverse, for a writer that keeps
// an event envelope apart (an import of payloads exported with the
// envelope inside): when a top-level field of payload holds an event
// envelope, it returns payload with that field holding the placeholder
// and the envelope's bytes, ok true; otherwise payload as it is and ok
// false. An envelope that is not base64url, or two of them, is an error
// (ErrSealed), as it is to a read.
func DetachEnvelope(payload json.RawMessage) (out json.RawMessage, envelope []byte, ok bool, err error) {
	var few [4]member
	ms, followed := sealedMembers(payload, few[:0])
	if !followed {
		return payload, nil, false, nil
	}
	at := -1
	for i := range ms {
		if ms[i].kind != eventEnvelope {
			continue
		}
		if at >= 0 {
			return nil, nil, false, fmt.Errorf("%w: two event envelopes in one payload", ErrSealed)
		}
		at = i
	}
	if at < 0 {
		return payload, nil, false, nil
	}
	m := ms[at]
	enc := m.v[len(eventPrefix):]
	envelope = make([]byte, base64.RawURLEncoding.DecodedLen(len(enc)))
	n, err := strictBase64.Decode(envelope, enc)
	if err != nil {
		return nil, nil, false, fmt.Errorf("%w: event envelope encoding: %w", ErrSealed, err)
	}
	out = make([]byte, 0, len(payload)-(m.end-m.start)+len(eventPlaceholder))
	out = append(out, payload[:m.start]...)
	out = append(out, eventPlaceholder...)
	return append(out, payload[m.end:]...), envelope[:n], true, nil
}

// AttachEnvelope returns payload, stored with its event envelope apart
// (Personal.SealPayloadApart: every sealed field holds the placeholder
// "pjx2."), with envelope, its bytes, back in the first top-level field
// holding the placeholder: the payload as it would be stored with the
// envelope inside it, which every reader, export and relay consumer opens.
// It fails with ErrSealed, and returns nothing, when payload has no such
// field (an envelope beside a payload that has no place for it is a
// damaged row, not one to read as if nothing were sealed).
func AttachEnvelope(payload json.RawMessage, envelope []byte) (json.RawMessage, error) {
	at, end := -1, -1
	jsonscan.RawMembers(payload, func(_, v []byte) bool {
		if string(v) != eventPlaceholder {
			return true
		}
		// v is payload's own bytes: its offset is where the field's value starts.
		at = cap(payload) - cap(v)
		end = at + len(v)
		return false
	})
	if at < 0 {
		return nil, fmt.Errorf("%w: an event envelope is stored beside a payload with no field holding %q", ErrSealed, eventPlaceholder)
	}
	n := base64.RawURLEncoding.EncodedLen(len(envelope))
	out := make([]byte, 0, len(payload)+n)
	out = append(out, payload[:at+1+len(eventPrefix)]...) // up to `"pjx2.`
	out = base64.RawURLEncoding.AppendEncode(out, envelope)
	return append(out, payload[end-1:]...), nil // from the closing quote
}

// openEvent opens the event envelope env of the members ms[idx] (sorted
// by name) in buf, grown as needed and returned, and sets each member's v
// to its JSON value, valid until buf is used again. env is the envelope as
// a payload holds it ("pjx2." and base64), or, with apart, its bytes as
// kept beside the payload (migration 29's column).
func (c *KeyCipher) openEvent(subject string, ms []member, idx []int, env []byte, apart bool, buf []byte) ([]byte, error) {
	var enc []byte
	size := len(env)
	if !apart {
		enc = env[len(eventPrefix):]
		size = base64.RawURLEncoding.DecodedLen(len(enc))
	}
	need := size + len(eventPrefix) + len(subject) + 1
	for _, i := range idx {
		need += len(ms[i].name) + 1
	}
	if cap(buf) < need {
		buf = make([]byte, need+64)
	}
	buf = buf[:cap(buf)]
	raw := buf[:size]
	if apart {
		copy(raw, env) // opened in place: env is the caller's
	} else {
		n, err := strictBase64.Decode(raw, enc)
		if err != nil {
			return buf, fmt.Errorf("%w: event envelope encoding: %w", ErrSealed, err)
		}
		raw = raw[:n]
	}
	if len(raw) < gcmNonceSize+gcmTagSize {
		return buf, fmt.Errorf("%w: event envelope of %d bytes is too short", ErrSealed, len(raw))
	}
	ad := appendEventAdditional(buf[size:size], subject, ms, idx)
	nonce, ct := raw[:gcmNonceSize], raw[gcmNonceSize:]
	plain, err := c.aead.Open(ct[:0], nonce, ct, ad)
	if err != nil {
		return buf, fmt.Errorf("%w: the key does not open the event envelope (a changed key or a tampered row)", ErrSealed)
	}
	// Authenticated: what follows only guards against our own mistakes.
	for _, i := range idx {
		l, k := binary.Uvarint(plain)
		if k <= 0 || uint64(len(plain)-k) < l {
			return buf, fmt.Errorf("%w: the event envelope holds fewer values than its fields", ErrSealed)
		}
		ms[i].v = plain[k : k+int(l)]
		plain = plain[k+int(l):]
	}
	if len(plain) != 0 {
		return buf, fmt.Errorf("%w: the event envelope holds more values than its fields", ErrSealed)
	}
	return buf, nil
}

// openMembers returns data with its sealed members ms (in the payload's
// order, v holding each envelope) opened under c, or set to null when c is
// nil (forgotten), into a result of data's size plus room for nulls; with
// inPlace, over data itself when every opened value is at hand before the
// first byte is written and no write passes what is still to be read
// (fitsInPlace). apart is the event envelope kept beside data, whose
// fields then all hold the placeholder, or nil. data is left as it was on
// an error.
func openMembers(data []byte, subject string, c *KeyCipher, ms []member, inPlace bool, apart []byte) (out []byte, forgotten bool, err error) {
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)
	if c != nil {
		env := apart
		var idxa [4]int
		idx := idxa[:0]
		envs := 0
		for i := range ms {
			switch ms[i].kind {
			case eventEnvelope:
				env = ms[i].v
				envs++
				idx = append(idx, i)
			case eventPart:
				idx = append(idx, i)
			}
		}
		if apart != nil {
			if envs != 0 || len(idx) == 0 {
				return nil, false, fmt.Errorf("%w: an event envelope kept apart from a payload with %d envelopes and %d placeholders", ErrSealed, envs, len(idx)-envs)
			}
			envs = 1
		}
		if len(idx) > 0 {
			if envs != 1 {
				return nil, false, fmt.Errorf("%w: %d event envelopes for %d fields sealed in one", ErrSealed, envs, len(idx))
			}
			sortByName(idx, ms)
			if sc.text, err = c.openEvent(subject, ms, idx, env, apart != nil, sc.text); err != nil {
				return nil, false, err
			}
		}
	}
	// With inPlace, the result goes over data, or, when an envelope kept
	// apart lies just before data in the same array (a store's read lays
	// them out so, adjacent), over both from the envelope's start: the
	// envelope was copied out by openEvent, and its length is the room the
	// opened values need.
	head := 0
	if inPlace && adjacent(apart, data) {
		head = len(apart)
	}
	if inPlace && fitsInPlace(ms, c, head) {
		out = data[:0]
		if head > 0 {
			out = apart[: 0 : head+len(data)]
		}
	} else {
		// An opened value is shorter than its envelope; a placeholder (7
		// bytes) may be shorter than null (4) plus nothing: room for nulls.
		// An envelope kept apart opens into values longer than their
		// placeholders, by less than the envelope's length.
		out = make([]byte, 0, len(data)+len(jsonNull)+len(apart))
	}
	last := 0
	for i := range ms {
		m := &ms[i]
		out = append(out, data[last:m.start]...)
		last = m.end
		switch {
		case c == nil:
			forgotten = true
			out = append(out, jsonNull...)
		case m.kind == fieldEnvelope:
			var plain []byte
			if plain, sc.crypto, err = c.open(subject, m.name, m.v, sc.crypto); err != nil {
				return nil, false, fmt.Errorf("field %q: %w", m.name, err)
			}
			out = append(out, plain...)
		default:
			out = append(out, m.v...)
		}
	}
	return append(out, data[last:]...), forgotten, nil
}

// fitsInPlace reports whether ms, opened (their v the opened values) or
// set to null (c nil), can be written over the payload they were read
// from, front to back, starting head bytes before the payload: no field
// envelope is left to open while writing (it would be decrypted from
// bytes already overwritten), and after each member the result ends at or
// before the member's end in the payload, so what is still to be read is
// never overwritten.
func fitsInPlace(ms []member, c *KeyCipher, head int) bool {
	// How far the result's end is ahead of the payload's: head bytes to
	// spare when the result starts that far before data.
	shrunk := head
	for i := range ms {
		m := &ms[i]
		n := len(jsonNull)
		if c != nil {
			if m.kind == fieldEnvelope {
				return false
			}
			n = len(m.v)
		}
		shrunk += (m.end - m.start) - n
		if shrunk < 0 {
			return false
		}
	}
	return true
}

// adjacent reports whether env, not empty, ends where data starts, in one
// array: data's bytes are then env's capacity past its length.
func adjacent(env, data []byte) bool {
	if len(env) == 0 || len(data) == 0 || cap(env) < len(env)+len(data) {
		return false
	}
	return &env[:len(env)+1][len(env)] == &data[0]
}

// sealedMembers returns data's sealed members, in order, in few when they
// fit; ok is false when the scanner does not follow data.
func sealedMembers(data []byte, few []member) (ms []member, ok bool) {
	ms = few[:0]
	ok = jsonscan.MembersBytes(data, func(name, v []byte, start, end int) bool {
		if env, k := sealedKind(v); k != notSealed {
			ms = append(ms, member{name: name, v: env, start: start, end: end, kind: k})
		}
		return true
	})
	return ms, ok
}
