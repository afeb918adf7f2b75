package projection

import (
	"bytes"
	"cmp"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/projectorhq/projector"
)

// MaxErrorBytes bounds the handler error a shard, dead letter or park
// records: past it the text is cut, its length noted. A handler may fail
// with any text (a 500 kB driver message, a document echoed); stored whole,
// it made every console page and state.json carry it, once a second.
const MaxErrorBytes = 8 << 10

// MinPersonalBytes is the length under which a personal value is not
// replaced in a stored error text. A two-letter initial or an age of 42
// would otherwise be replaced wherever those characters stand in the text
// (in an id, a line number, a word), leaving an error no one can read, for
// a value that says little on its own. docs/privacy.md states the rule.
const MinPersonalBytes = 4

// Opened is a payload a handler was given with its personal fields in the
// clear: an event's, or a saga's state. A failure recorded for it is
// stored with those fields' values replaced (see [StoredError]).
type Opened struct {
	// Personal declares the payload's personal fields.
	Personal projector.Personal
	// Data is the payload, a JSON object, as the handler saw it.
	Data json.RawMessage
}

// OpenedEvents returns the payloads of the events whose types reg
// declares personal fields for: what [StoredError] needs to keep their
// values out of the text of a failure in handling them.
func OpenedEvents(reg *projector.Registry, events ...projector.Event) []Opened {
	if reg == nil || !reg.HasPersonal() {
		return nil
	}
	var out []Opened
	for _, ev := range events {
		if ev.Forgotten {
			continue // its personal fields read as null: nothing to replace
		}
		if p, ok := reg.PersonalOf(ev.Type); ok && len(p.Fields) > 0 {
			out = append(out, Opened{Personal: p, Data: ev.Data})
		}
	}
	return out
}

// StoredError is err's text as a shard, a dead letter, a park, a saga or
// the JetStream consumer records it. Every place that records a failure
// goes through it, because the text outlives the failure: the console,
// `parked show` and `dead-letters show` print it, and a forget does not
// reach it.
//
// A handler's error may quote the personal fields of the event it failed
// on (fmt.Errorf("bad note %q", c.Note)); stored as it is, the value stayed
// in the table after the subject was forgotten (promise 19). So each value
// of a personal field of opened that is present — a string, or a number or
// string anywhere inside a structured field — and at least
// MinPersonalBytes long is replaced by "[personal:FIELD]" wherever it
// stands in the text: as it is, and as Go's %q, %+q and JSON would escape
// it (and those escapes applied twice, for an error quoted inside a quoted
// error). A value the handler changed (cut, lower-cased, hashed) is not
// recognised.
//
// The text is then kept whole up to MaxErrorBytes, else cut on a rune
// boundary with its length; the replacement comes first, so the cut never
// leaves a prefix of a value behind.
func StoredError(err error, opened ...Opened) string {
	s := err.Error()
	if len(opened) > 0 {
		s = redact(s, opened)
	}
	if len(s) <= MaxErrorBytes {
		return s
	}
	cut := MaxErrorBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…(" + strconv.Itoa(len(s)) + " bytes)"
}

// redact replaces in s the texts of the personal values of opened.
func redact(s string, opened []Opened) string {
	type needle struct{ text, marker string }
	var needles []needle
	var markers []string
	seen := map[string]bool{}
	for _, o := range opened {
		var fields map[string]json.RawMessage
		if json.Unmarshal(o.Data, &fields) != nil {
			continue
		}
		for _, f := range o.Personal.Fields {
			raw, ok := fields[f]
			if !ok {
				continue
			}
			marker := "[personal:" + f + "]"
			if !slices.Contains(markers, marker) {
				markers = append(markers, marker)
			}
			for _, leaf := range leaves(raw) {
				for _, text := range spellings(leaf) {
					if !seen[text] && strings.Contains(s, text) {
						seen[text] = true
						needles = append(needles, needle{text, marker})
					}
				}
			}
		}
	}
	if len(needles) == 0 {
		return s
	}
	// A Replacer tries its pairs in argument order at each position. The
	// markers first, as themselves: a text redacted before (a saga's step
	// failure, then its dead letter) keeps its markers whole even where a
	// value ("note") is part of one. Then the longest value first: where
	// one holds another ("Anna" in "Anna Smith"), the whole is replaced,
	// not the part.
	slices.SortStableFunc(needles, func(a, b needle) int { return cmp.Compare(len(b.text), len(a.text)) })
	pairs := make([]string, 0, 2*(len(markers)+len(needles)))
	for _, m := range markers {
		pairs = append(pairs, m, m)
	}
	for _, n := range needles {
		pairs = append(pairs, n.text, n.marker)
	}
	return strings.NewReplacer(pairs...).Replace(s)
}

// leaves returns the texts of the strings (unquoted) and numbers (as
// written) in the JSON value raw, at any depth, that are at least
// MinPersonalBytes long. Object keys are left: those of a struct are field
// names, not personal data. A null or a boolean says too little to
// replace.
func leaves(raw json.RawMessage) []string {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return nil
	}
	var out []string
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case string:
			if len(v) >= MinPersonalBytes {
				out = append(out, v)
			}
		case json.Number:
			if len(v) >= MinPersonalBytes {
				out = append(out, v.String())
			}
		case []any:
			for _, e := range v {
				walk(e)
			}
		case map[string]any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(v)
	return out
}

// spellings returns v and the escaped forms an error text may hold it in
// (Go's %q and %+q, JSON with and without HTML escaping), each without its
// quotes so a value inside a longer quoted text is found too, and those
// forms escaped once more. For a plain ASCII value they are all v.
func spellings(v string) []string {
	escapes := []func(string) string{
		func(s string) string { return unquoted(strconv.Quote(s)) },
		func(s string) string { return unquoted(strconv.QuoteToASCII(s)) },
		func(s string) string { return unquoted(jsonString(s, true)) },
		func(s string) string { return unquoted(jsonString(s, false)) },
	}
	out := []string{v}
	for round := 0; round < 2; round++ {
		for _, s := range out {
			for _, esc := range escapes {
				if e := esc(s); !slices.Contains(out, e) {
					out = append(out, e)
				}
			}
		}
	}
	return out
}

// jsonString is s as encoding/json writes it, HTML characters escaped or
// not (json.Marshal escapes them; an Encoder may be told not to).
func jsonString(s string, escapeHTML bool) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(escapeHTML)
	_ = enc.Encode(s) // a string always encodes
	return strings.TrimSuffix(b.String(), "\n")
}

func unquoted(q string) string { return q[1 : len(q)-1] }

// RedactError returns err with the personal values of opened replaced in
// its text as [StoredError] replaces them, for a failure whose text is
// carried further, by code that no longer holds the payloads, before it
// is stored: a saga's step failure (its state's personal fields), a retry's
// failure that is not about its events. errors.Is and errors.As see err.
func RedactError(err error, opened ...Opened) error {
	if err == nil || len(opened) == 0 {
		return err
	}
	text := err.Error()
	if r := redact(text, opened); r != text {
		return &redactedError{err: err, text: r}
	}
	return err
}

// redactedError is an error whose text had personal values replaced.
type redactedError struct {
	err  error
	text string
}

func (e *redactedError) Error() string { return e.text }
func (e *redactedError) Unwrap() error { return e.err }
