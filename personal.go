package projector

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/projectorhq/projector/internal/jsonscan"
)

// Personal declares which fields of an event type's payload are personal
// data and whose they are, so the store can encrypt them under the data
// subject's key and forget them by destroying that key (crypto-shredding;
// see docs/privacy.md). Fields are named by their top-level JSON names.
// The zero value declares nothing.
type Personal struct {
	// Subject is the JSON name of the top-level string field that holds
	// the data subject's id: whose key the personal fields are sealed
	// with. It stays in the clear, so choose an id that is not itself
	// personal (a customer's UUID rather than their e-mail address).
	Subject string
	// Fields are the JSON names of the top-level fields that are personal.
	// Each is sealed whole (a struct or list field included) and, once
	// the subject is forgotten, decodes as JSON null: the Go zero value.
	Fields []string
	// OneEnvelope seals an event's two or more personal fields in one
	// envelope ("pjx2."): one decrypt per event on reads instead of one
	// per field, and a smaller row. Every reader of this release opens
	// both forms; a binary of an earlier release cannot open the new one.
	// So it is off by default: turn it on once no binary older than this
	// release reads the log (after a rolling deploy has finished). Rows
	// already written keep their form; either form reads the same.
	OneEnvelope bool
	// EnvelopeApart, with OneEnvelope, has the PostgreSQL store keep an
	// event's envelope in a column of its own (projector_events.envelope,
	// migration 29) beside a payload whose sealed fields all hold the
	// placeholder, instead of inside one of them: a sealed read then costs
	// about what a plain one does (docs/performance.md, "Where the
	// envelope lives"). Reads, exports and the relay put the envelope
	// back in the payload, so everything downstream sees the same
	// payload either way. A binary of an earlier release cannot read such
	// rows: turn it on, as OneEnvelope, once no older binary reads the
	// log. Rows already written keep their form.
	EnvelopeApart bool
}

// declared reports whether p declares anything.
func (p Personal) declared() bool { return p.Subject != "" || len(p.Fields) > 0 }

// Check reports whether p fits the Go type t of a JSON object that is not
// an event payload — an aggregate's snapshot state, a saga's state — by the
// rules Define applies to payloads (below); the zero Personal fits any
// type.
func (p Personal) Check(t reflect.Type) error {
	if !p.declared() {
		return nil
	}
	return p.check(t)
}

// check resolves p against the payload type: every name must be a
// top-level JSON field of t, the subject a string, and no field named
// twice or both subject and personal.
func (p Personal) check(t reflect.Type) error {
	if t.Kind() != reflect.Struct {
		return fmt.Errorf("personal fields need a struct payload, %s is a %s", t, t.Kind())
	}
	if p.Subject == "" {
		return errors.New("personal fields need a Subject field naming the data subject")
	}
	if len(p.Fields) == 0 {
		return errors.New("a Personal declaration names no Fields")
	}
	if p.EnvelopeApart && !p.OneEnvelope {
		return errors.New("EnvelopeApart keeps an event envelope apart, and only OneEnvelope seals one: set both, or neither")
	}
	fields := jsonFields(t)
	sub, ok := fields[p.Subject]
	if !ok {
		return fmt.Errorf("subject field %q is not a JSON field of %s", p.Subject, t)
	}
	if sub.Kind() != reflect.String {
		return fmt.Errorf("subject field %q of %s is a %s, want a string", p.Subject, t, sub)
	}
	for i, f := range p.Fields {
		if _, ok := fields[f]; !ok {
			return fmt.Errorf("personal field %q is not a JSON field of %s", f, t)
		}
		if f == p.Subject {
			return fmt.Errorf("field %q is both the subject and personal: the subject id stays in the clear", f)
		}
		if slices.Contains(p.Fields[:i], f) {
			return fmt.Errorf("personal field %q named twice", f)
		}
	}
	return nil
}

// jsonFields returns the top-level JSON names of struct type t with their
// Go types, following encoding/json's rules for tags and embedded structs
// closely enough for declarations: a name that encoding/json would not
// produce is not returned.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for _, f := range reflect.VisibleFields(t) {
		if !f.IsExported() && !f.Anonymous {
			continue
		}
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			continue // its fields are promoted and visited on their own
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		if _, dup := out[name]; !dup {
			out[name] = f.Type
		}
	}
	return out
}

// SubjectForgotten is the payload of the system event [Store.Forget]
// appends when a data subject's key is destroyed: projections and search
// projections handle it to delete or blank what they hold of the subject
// (see projection.OnForgotten and search.OnForgotten).
//
// [Store.Forget]: https://pkg.go.dev/github.com/projectorhq/projector/stores/postgres#Store.Forget
type SubjectForgotten struct {
	// Subject is the forgotten data subject's id.
	Subject string `json:"subject"`
}

// SubjectForgottenType is the event type of [SubjectForgotten]. A registry
// defines it by itself the first time a type with personal fields is
// defined.
var SubjectForgottenType = EventType[SubjectForgotten]{name: "subject.forgotten", version: 1}

// SubjectStreamType is the stream type of the streams the forgotten events
// go to: one stream per subject, in the subject's tenant, its id the
// subject's id.
const SubjectStreamType = "projector.subject"

// PersonalOf returns the personal-data declaration of the type name, and
// whether it has one.
func (r *Registry) PersonalOf(name string) (Personal, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e, ok := r.byName[name]
	if !ok || !e.Personal.declared() {
		return Personal{}, false
	}
	return e.Personal, true
}

// HasPersonal reports whether any defined type declares personal fields:
// readers that find none skip looking for sealed fields altogether.
func (r *Registry) HasPersonal() bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.personal
}

// PersonalSubjects returns the types with personal fields and, at the same
// index, the JSON name of each one's subject field: what a store needs to
// find the subjects' keys in the statement that reads the events. The
// slices are shared: do not modify them.
func (r *Registry) PersonalSubjects() (types, subjects []string) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.personalTypes, r.personalSubjects
}

// HoldsClearValue reports whether data, a JSON object, holds in one of
// p's fields a value that is neither null nor sealed: one a reader of it
// is given in the clear. An import asks it of a file's line (a clear value
// needs the subject's key to seal it); a partitioned consumer's pass and
// retries ask it of the events they opened (only a subject whose fields a
// handler was given in the clear needs guarding against a forget). Not an
// object: false.
func (p Personal) HoldsClearValue(data json.RawMessage) bool {
	clear := func(name string, v []byte) bool {
		return slices.Contains(p.Fields, name) && !bytes.Equal(bytes.TrimSpace(v), []byte("null")) && !IsSealed(v)
	}
	found := false
	if jsonscan.MembersBytes(data, func(name, v []byte, _, _ int) bool {
		found = clear(string(name), v)
		return !found
	}) || found {
		return found
	}
	// Not an object the scanner follows: encoding/json decides.
	var members map[string]json.RawMessage
	if json.Unmarshal(data, &members) != nil {
		return false
	}
	for name, v := range members {
		if clear(name, v) {
			return true
		}
	}
	return false
}

// SubjectOf returns the data subject's id in an encoded payload of a type
// with personal fields: the value of its Subject field, which must be a
// non-empty JSON string.
func (p Personal) SubjectOf(data json.RawMessage) (string, error) {
	var raw json.RawMessage
	if !jsonscan.MembersBytes(data, func(name []byte, v []byte, _, _ int) bool {
		if string(name) == p.Subject {
			raw = v
		}
		return true
	}) {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(data, &fields); err != nil {
			return "", fmt.Errorf("%w: personal payload: %w", ErrInvalidPayload, err)
		}
		raw = fields[p.Subject]
	}
	return p.subjectValue(raw)
}

// subjectValue checks and unquotes raw, the subject field's value (nil
// when there is none).
func (p Personal) subjectValue(raw []byte) (string, error) {
	subject := ""
	if len(raw) > 1 && raw[0] == '"' && bytes.IndexByte(raw[1:len(raw)-1], '\\') < 0 && bytes.IndexByte(raw[1:len(raw)-1], '"') < 0 {
		subject = string(raw[1 : len(raw)-1])
	} else if raw != nil {
		var s string // on the heap: only an id with escapes pays for it
		_ = json.Unmarshal(raw, &s)
		subject = s
	}
	if subject == "" {
		return "", fmt.Errorf("%w: the subject field %q is empty: personal data needs its subject", ErrInvalidPayload, p.Subject)
	}
	if err := ValidText(subject); err != nil {
		return "", fmt.Errorf("%w: the subject field %q %w", ErrInvalidPayload, p.Subject, err)
	}
	return subject, nil
}

// Seal returns data with each of p's fields that is present and not null
// replaced by its envelope under key (see [SealValue]). A top-level string
// of another field that starts like an envelope is refused
// ([ErrInvalidPayload]): reads would take it for one. A nil key seals
// nothing and writes the fields as null instead: the subject was
// forgotten before the event was written.
func (p Personal) Seal(data json.RawMessage, subject string, key []byte) (json.RawMessage, error) {
	c, err := cipherOf(key)
	if err != nil {
		return nil, err
	}
	return p.SealWith(data, subject, c)
}

// SealWith is [Personal.Seal] under a key's cipher; a nil c writes the
// fields as null.
//
// Each envelope is written into a pooled buffer and copied into the result,
// sized up front for the fields' growth: sealing a payload allocates the
// result alone (TestSealAllocs).
func (p Personal) SealWith(data json.RawMessage, subject string, c *KeyCipher) (json.RawMessage, error) {
	out, _, _, err := p.sealWith(data, subject, c, jsonNull, false)
	return out, err
}

// SealPayload is [Personal.SealWith] for an event's payload on its way to
// the log. Under a nil c (the subject was forgotten) each personal field
// that holds a value is written as the envelope that never opens,
// "pjx1." alone, rather than as null: every read then takes the field
// for one sealed under the destroyed key, returns it as null and marks the
// event Forgotten, as it does for the events written before the forget.
// A field with no value (absent, or null) is left as it is. forgotten
// reports that such a field was written: exactly when a read marks the
// event Forgotten. Opening the result with a nil cipher ([OpenWith])
// gives the payload every read returns.
func (p Personal) SealPayload(data json.RawMessage, subject string, c *KeyCipher) (out json.RawMessage, forgotten bool, err error) {
	out, _, forgotten, err = p.sealWith(data, subject, c, forgottenEnvelope, false)
	return out, forgotten, err
}

// SealPayloadApart is [Personal.SealPayload] for a store that keeps an
// event envelope beside the payload rather than in it, for a type whose
// declaration sets EnvelopeApart: when the fields are sealed in one
// envelope, each holds the placeholder "pjx2." and the envelope's bytes
// (nonce, ciphertext and tag, not base64) are returned apart, to be
// stored in a column of their own (a read then carries them as bytes,
// not as a JSON string the server writes out a character at a time).
// Otherwise envelope is nil and out is what SealPayload returns.
// [AttachEnvelope] puts the envelope back: a reader opens the result.
func (p Personal) SealPayloadApart(data json.RawMessage, subject string, c *KeyCipher) (out json.RawMessage, envelope []byte, forgotten bool, err error) {
	return p.sealWith(data, subject, c, forgottenEnvelope, p.EnvelopeApart)
}

// forgottenEnvelope is what [Personal.SealPayload] writes for a forgotten
// subject's field: the field-envelope prefix alone, which reads of every
// release take for an envelope (null, Forgotten, without a key) and which
// no key opens.
var forgottenEnvelope = json.RawMessage(`"` + sealedPrefix + `"`)

// sealWith is SealWith, writing forgotten in place of each field's value
// under a nil c; nulled reports that it did. With apart, an event envelope
// is returned beside the payload (SealPayloadApart).
func (p Personal) sealWith(data json.RawMessage, subject string, c *KeyCipher, forgotten json.RawMessage, apart bool) (_ json.RawMessage, envelope []byte, nulled bool, _ error) {
	if c != nil && p.OneEnvelope {
		if out, env, ok, err := p.sealEvent(data, subject, c, apart); err != nil || ok {
			return out, env, false, err
		}
	}
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)
	// A value of n bytes becomes at most n/3 + 46 bytes longer: quotes,
	// prefix, and base64 of nonce and tag around its ciphertext.
	size := len(data) + len(data)/3 + 46*len(p.Fields)
	out, err := rewriteMembers(data, func(name []byte, v json.RawMessage) (json.RawMessage, bool, error) {
		if !hasName(p.Fields, name) {
			if startsSealed(v) {
				// Reads open any top-level envelope, so a field that is
				// not personal may not look like one.
				return nil, false, fmt.Errorf("%w: field %q starts with %q or %q, which mark a sealed personal field", ErrInvalidPayload, name, sealedPrefix, eventPrefix)
			}
			return nil, false, nil
		}
		if isNull(v) {
			return nil, false, nil
		}
		if c == nil {
			nulled = true
			return forgotten, true, nil
		}
		var err error
		sc.text, sc.crypto, err = c.appendSealed(sc.text[:0], subject, name, v, sc.crypto)
		if err != nil {
			return nil, false, err
		}
		return sc.text, true, nil
	}, false, size)
	if err != nil {
		return nil, nil, false, err
	}
	return out, nil, nulled, nil
}

// cipherOf returns key's cipher, nil for a nil key (forgotten).
func cipherOf(key []byte) (*KeyCipher, error) {
	if key == nil {
		return nil, nil
	}
	return NewKeyCipher(key)
}

// Open returns data with every sealed field opened with key, or set to
// null when key is nil (the subject was forgotten). It opens whatever
// top-level field holds an envelope, not only the fields declared now, so
// a field an upcaster renames later still opens; forgotten reports that
// some field was set to null for want of a key. A field whose envelope
// does not open under key is an error, never garbage.
func Open(data json.RawMessage, subject string, key []byte) (out json.RawMessage, forgotten bool, err error) {
	c, err := cipherOf(key)
	if err != nil {
		return nil, false, err
	}
	return OpenWith(data, subject, c)
}

// OpenWith is [Open] under a key's cipher; a nil c sets the sealed fields
// to null.
func OpenWith(data json.RawMessage, subject string, c *KeyCipher) (out json.RawMessage, forgotten bool, err error) {
	return openWith(data, subject, c, false, nil)
}

// OpenStored is [OpenWith] for data read from a PostgreSQL jsonb column,
// which is valid JSON by construction: it does not validate data again
// (what it does with invalid JSON is unspecified, but it never panics).
func OpenStored(data json.RawMessage, subject string, c *KeyCipher) (out json.RawMessage, forgotten bool, err error) {
	return openWith(data, subject, c, true, nil)
}

// OpenStoredApart is [OpenStored] for a payload stored with its event
// envelope apart ([Personal.SealPayloadApart]): envelope is the envelope's
// bytes, opened as they are, which spares putting them back in the payload
// as base64 ([AttachEnvelope]) only to decode them again. A nil envelope
// is OpenStored. A payload with no field holding the placeholder, or with
// an envelope of its own besides, is an error (ErrSealed).
func OpenStoredApart(data json.RawMessage, envelope []byte, subject string, c *KeyCipher) (out json.RawMessage, forgotten bool, err error) {
	return openWith(data, subject, c, true, envelope)
}

// openWith opens data's envelopes in a pooled buffer, one for every field
// and every call (rewrite copies each result at once), into a result of
// data's size: an opened value is always shorter than its envelope, so
// opening a payload allocates the result alone (TestOpenStoredAllocs).
func openWith(data json.RawMessage, subject string, c *KeyCipher, valid bool, apart []byte) (out json.RawMessage, forgotten bool, err error) {
	if apart != nil || bytes.Contains(data, []byte(`"`+eventPrefix)) && (valid || json.Valid(data)) {
		// An event envelope opens before any of its fields is written.
		var few [4]member
		ms, ok := sealedMembers(data, few[:])
		if !ok {
			return nil, false, fmt.Errorf("%w: an event envelope in a payload the scanner does not follow", ErrSealed)
		}
		return openMembers(data, subject, c, ms, false, apart)
	}
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)
	out, err = rewriteMembers(data, func(name []byte, v json.RawMessage) (json.RawMessage, bool, error) {
		env, ok := sealedBytes(v)
		if !ok {
			return nil, false, nil
		}
		if c == nil {
			forgotten = true
			return jsonNull, true, nil
		}
		var plain []byte
		var err error
		plain, sc.crypto, err = c.open(subject, name, env, sc.crypto)
		if err != nil {
			return nil, false, fmt.Errorf("field %q: %w", name, err)
		}
		return plain, true, nil
	}, valid, len(data)+len(jsonNull))
	return out, forgotten, err
}

// OpenStoredBy is [OpenStored] for a payload of p's type, read from a
// jsonb column, whose subject the caller does not know yet: one pass over
// data finds both the subject (checked as [Personal.SubjectOf] checks it)
// and the sealed fields, where SubjectOf then OpenStored make two. cipher
// is asked for the subject's key cipher (nil: forgotten) only when a field
// is sealed; an error from it is returned as it is. The subject is
// returned whenever it was found, with cipher's error too, so a caller
// whose cipher had no key at hand can fetch it and call OpenStored.
func (p Personal) OpenStoredBy(data json.RawMessage, cipher func(subject string) (*KeyCipher, error)) (out json.RawMessage, subject string, forgotten bool, err error) {
	return p.openStoredBy(data, cipher, false, nil)
}

// OpenStoredByInPlace is [Personal.OpenStoredBy] for data the caller owns
// and gives up: when the opened payload fits, it is written over data,
// which saves the result's allocation (a read's events are opened so).
// After a call that returns no error, use out, never data; on an error
// data is left as it was.
func (p Personal) OpenStoredByInPlace(data json.RawMessage, cipher func(subject string) (*KeyCipher, error)) (out json.RawMessage, subject string, forgotten bool, err error) {
	return p.openStoredBy(data, cipher, true, nil)
}

// OpenStoredApartByInPlace is [Personal.OpenStoredByInPlace] for a payload
// stored with its event envelope apart, as [OpenStoredApart] is for
// [OpenStored]; a nil envelope is OpenStoredByInPlace. The caller gives up
// both data and envelope. The opened values are longer than the
// placeholders they replace, so the result fits over data only when
// envelope lies just before it in one array (envelope's capacity running
// on into data, as a store's read lays a row out): it is then written
// from envelope's start, and the open allocates nothing.
func (p Personal) OpenStoredApartByInPlace(data json.RawMessage, envelope []byte, cipher func(subject string) (*KeyCipher, error)) (out json.RawMessage, subject string, forgotten bool, err error) {
	return p.openStoredBy(data, cipher, true, envelope)
}

func (p Personal) openStoredBy(data json.RawMessage, cipher func(subject string) (*KeyCipher, error), inPlace bool, apart []byte) (out json.RawMessage, subject string, forgotten bool, err error) {
	var few [4]member // on the stack while the event has at most four
	ms := few[:0]
	var raw []byte
	ok := jsonscan.MembersBytes(data, func(name, v []byte, start, end int) bool {
		if string(name) == p.Subject {
			raw = v
		}
		if env, k := sealedKind(v); k != notSealed {
			// name and env stay valid: they are data's bytes, or a copy
			// made for a name or value with escapes.
			ms = append(ms, member{name: name, v: env, start: start, end: end, kind: k})
		}
		return true
	})
	if !ok {
		// What the scanner does not follow: the two passes, and their
		// errors.
		if subject, err = p.SubjectOf(data); err != nil {
			return nil, "", false, err
		}
		c, err := cipher(subject)
		if err != nil {
			return nil, subject, false, err
		}
		out, forgotten, err = OpenStoredApart(data, apart, subject, c)
		return out, subject, forgotten, err
	}
	if subject, err = p.subjectValue(raw); err != nil {
		return nil, "", false, err
	}
	if len(ms) == 0 && apart == nil {
		return data, subject, false, nil
	}
	c, err := cipher(subject)
	if err != nil {
		return nil, subject, false, err
	}
	out, forgotten, err = openMembers(data, subject, c, ms, inPlace, apart)
	return out, subject, forgotten, err
}

// IsSealed reports whether data, a JSON object, holds a sealed field, in
// either form (an envelope per field, or one per event).
func IsSealed(data json.RawMessage) bool {
	// One scan for both prefixes ("pjx1." and "pjx2."), where two
	// bytes.Contains would read an event-envelope payload twice.
	for {
		i := bytes.Index(data, []byte(`"pjx`))
		if i < 0 {
			return false
		}
		if rest := data[i+4:]; len(rest) > 1 && (rest[0] == '1' || rest[0] == '2') && rest[1] == '.' {
			return true
		}
		data = data[i+4:]
	}
}

var jsonNull = json.RawMessage("null")

func isNull(v json.RawMessage) bool { return string(bytes.TrimSpace(v)) == "null" }

// sealedBytes returns the envelope a JSON value holds, if it is a string
// that starts like one: v's own bytes when the string has no escapes.
func sealedBytes(v json.RawMessage) ([]byte, bool) {
	v = bytes.TrimSpace(v)
	if len(v) < len(sealedPrefix)+2 || v[0] != '"' || !bytes.HasPrefix(v[1:], []byte(sealedPrefix)) {
		return nil, false
	}
	if inner := v[1 : len(v)-1]; v[len(v)-1] == '"' && bytes.IndexByte(inner, '\\') < 0 && bytes.IndexByte(inner, '"') < 0 {
		return inner, true // no escapes: the bytes are the string
	}
	var s string
	if json.Unmarshal(v, &s) != nil {
		return nil, false
	}
	return []byte(s), true
}

// hasName reports whether names holds name, without allocating.
func hasName(names []string, name []byte) bool {
	for _, n := range names {
		if n == string(name) {
			return true
		}
	}
	return false
}

// rewriteFields calls fn on every top-level member of the JSON object data
// and replaces the values fn asks to, keeping the members' order; it
// returns data itself when nothing changed.
func rewriteFields(data json.RawMessage, fn func(name []byte, v json.RawMessage) (json.RawMessage, bool, error)) (json.RawMessage, error) {
	return rewriteMembers(data, fn, false, len(data)+64)
}

// rewriteMembers is rewriteFields, for data known to be valid JSON when
// valid is set (it is not checked again), into a result made with size
// bytes of capacity: enough for what fn writes saves growing it.
func rewriteMembers(data json.RawMessage, fn func(name []byte, v json.RawMessage) (json.RawMessage, bool, error), valid bool, size int) (json.RawMessage, error) {
	var out []byte
	last := 0
	var ferr error
	ok := jsonscan.MembersBytes(data, func(name []byte, v []byte, start, end int) bool {
		repl, changed, err := fn(name, v)
		if err != nil {
			ferr = err
			return false
		}
		if changed {
			if out == nil {
				out = make([]byte, 0, size)
			}
			out = append(out, data[last:start]...)
			out = append(out, repl...)
			last = end
		}
		return true
	})
	if ferr != nil {
		return nil, ferr
	}
	if ok && (valid || json.Valid(data)) {
		if out == nil {
			return data, nil
		}
		return append(out, data[last:]...), nil
	}
	return rewriteFieldsSlow(data, fn)
}

// rewriteFieldsSlow is rewriteFields through encoding/json's tokenizer,
// for what the scanner does not follow; it gives the precise error.
func rewriteFieldsSlow(data json.RawMessage, fn func(name []byte, v json.RawMessage) (json.RawMessage, bool, error)) (json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("%w: payload: %w", ErrInvalidPayload, err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("%w: payload is not a JSON object", ErrInvalidPayload)
	}
	var out []byte
	last := 0 // bytes of data copied to out so far
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("%w: payload: %w", ErrInvalidPayload, err)
		}
		name, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("%w: payload: %w", ErrInvalidPayload, err)
		}
		end := int(dec.InputOffset())
		repl, ok, err := fn([]byte(name), v)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		start := end - len(v) // RawMessage holds the value's exact bytes
		if out == nil {
			out = make([]byte, 0, len(data)+64)
		}
		out = append(out, data[last:start]...)
		out = append(out, repl...)
		last = end
	}
	if out == nil {
		return data, nil
	}
	return append(out, data[last:]...), nil
}

// Redact returns data with p's personal fields set to null: what leaves
// Projector for a system that holds no keys (the JetStream relay sends
// nothing of a personal field, clear or sealed).
func (p Personal) Redact(data json.RawMessage) (json.RawMessage, error) {
	return rewriteFields(data, func(name []byte, v json.RawMessage) (json.RawMessage, bool, error) {
		if !hasName(p.Fields, name) || isNull(v) {
			return nil, false, nil
		}
		return jsonNull, true, nil
	})
}
