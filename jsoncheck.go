package projector

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"unicode/utf8"
)

// MaxPayloadBytes is the largest encoded payload an append accepts: the
// longest string PostgreSQL's jsonb holds (2^28 − 1 bytes), so no payload
// under it fails for its size there. A larger one is refused before
// anything is sent (it took a 300 MB payload 15 s to fail in PostgreSQL,
// with an error no sentinel matched); a blob that size belongs outside the
// log, referenced by an event.
const MaxPayloadBytes = 1<<28 - 1

// checkSize refuses an encoded payload of n bytes over MaxPayloadBytes.
func checkSize(n int) error {
	if n > MaxPayloadBytes {
		return fmt.Errorf("the encoded payload is %d bytes, over the limit of %d (projector.MaxPayloadBytes, the longest string jsonb holds): keep large blobs outside the log and reference them", n, MaxPayloadBytes)
	}
	return nil
}

// checkEncoded reports why data, the JSON encoding of v, is not v stored
// exactly, or could not be stored in jsonb at all.
//
// encoding/json writes every invalid UTF-8 byte of a Go string as the escape
// \ufffd (a genuine U+FFFD it writes as the character itself), a NUL as
// \u0000, and passes a custom marshaller's or a json.RawMessage's bytes
// through unchecked. PostgreSQL's jsonb refuses \u0000 and unpaired
// surrogate escapes, and any invalid UTF-8, with an error that aborts the
// caller's transaction. So: invalid UTF-8 anywhere is refused; \u0000 and
// unpaired surrogates are refused; and a \ufffd escape is refused when v
// holds a string that is not valid UTF-8, the one case where the escape
// means encoding/json changed the data (JSON from elsewhere, in a
// RawMessage, may spell U+FFFD as an escape legitimately).
func checkEncoded(data []byte, v reflect.Value) error {
	if err := checkSize(len(data)); err != nil {
		return err
	}
	if !utf8.Valid(data) {
		return errors.New("the encoded JSON is not valid UTF-8 (from a custom MarshalJSON or a json.RawMessage)")
	}
	if bytes.IndexByte(data, '\\') < 0 {
		return nil // no escapes at all: the common case
	}
	replaced := false
	for i := 0; i < len(data); i++ {
		if data[i] != '\\' {
			continue
		}
		i++ // the escaped character; a backslash outside a string is not valid JSON
		if i >= len(data) || data[i] != 'u' {
			continue
		}
		r, ok := hex4(data[i+1:])
		if !ok {
			return errors.New("the encoded JSON has a malformed \\u escape")
		}
		i += 4
		switch {
		case r == 0:
			return errors.New("a string contains a NUL character (\\u0000), which PostgreSQL cannot store")
		case r == utf8.RuneError:
			replaced = true
		case r >= 0xDC00 && r <= 0xDFFF:
			return errors.New("the encoded JSON has an unpaired low surrogate escape")
		case r >= 0xD800 && r <= 0xDBFF:
			if i+2 >= len(data) || data[i+1] != '\\' || data[i+2] != 'u' {
				return errors.New("the encoded JSON has an unpaired high surrogate escape")
			}
			lo, ok := hex4(data[i+3:])
			if !ok || lo < 0xDC00 || lo > 0xDFFF {
				return errors.New("the encoded JSON has an unpaired high surrogate escape")
			}
			i += 6
		}
	}
	if replaced && hasInvalidUTF8(v, 0) {
		return errors.New("a string is not valid UTF-8 (encoding it would silently replace bytes with U+FFFD)")
	}
	return nil
}

// hex4 parses the four hex digits of a \u escape.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		r <<= 4
		switch {
		case '0' <= c && c <= '9':
			r |= rune(c - '0')
		case 'a' <= c && c <= 'f':
			r |= rune(c - 'a' + 10)
		case 'A' <= c && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	return r, true
}

var (
	jsonMarshalerType = reflect.TypeFor[json.Marshaler]()
	textMarshalerType = reflect.TypeFor[encoding.TextMarshaler]()
)

// maxWalkDepth bounds hasInvalidUTF8 on deeply nested values; encoding/json
// has already encoded v, so v has no cycles, only possibly a deep shape.
const maxWalkDepth = 1000

// hasInvalidUTF8 reports whether encoding/json, encoding v, met a string
// (or a TextMarshaler's text) that is not valid UTF-8. It follows what
// encoding/json encodes: exported fields not tagged "-", map keys and values,
// elements, pointers and interfaces; a json.Marshaler's output is checked
// as bytes by the caller instead.
func hasInvalidUTF8(v reflect.Value, depth int) bool {
	if depth > maxWalkDepth || !v.IsValid() {
		return false
	}
	if v.Kind() != reflect.Pointer && v.Kind() != reflect.Interface {
		if v.Type().Implements(jsonMarshalerType) || (v.CanAddr() && v.Addr().Type().Implements(jsonMarshalerType)) {
			return false
		}
		if t, ok := textMarshaler(v); ok {
			text, err := t.MarshalText()
			return err == nil && !utf8.Valid(text)
		}
	}
	switch v.Kind() {
	case reflect.String:
		return !utf8.ValidString(v.String())
	case reflect.Pointer, reflect.Interface:
		return !v.IsNil() && hasInvalidUTF8(v.Elem(), depth+1)
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() && !f.Anonymous {
				continue
			}
			if f.Tag.Get("json") == "-" {
				continue
			}
			if hasInvalidUTF8(v.Field(i), depth+1) {
				return true
			}
		}
	case reflect.Map:
		iter := v.MapRange()
		for iter.Next() {
			if hasInvalidUTF8(iter.Key(), depth+1) || hasInvalidUTF8(iter.Value(), depth+1) {
				return true
			}
		}
	case reflect.Slice, reflect.Array:
		if v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.Uint8 {
			return false // []byte is base64
		}
		for i := range v.Len() {
			if hasInvalidUTF8(v.Index(i), depth+1) {
				return true
			}
		}
	}
	return false
}

// textMarshaler returns v as an encoding.TextMarshaler when encoding/json
// would use it as one.
func textMarshaler(v reflect.Value) (encoding.TextMarshaler, bool) {
	if v.Type().Implements(textMarshalerType) && v.CanInterface() {
		t, ok := v.Interface().(encoding.TextMarshaler)
		return t, ok
	}
	if v.CanAddr() && v.Addr().Type().Implements(textMarshalerType) && v.Addr().CanInterface() {
		t, ok := v.Addr().Interface().(encoding.TextMarshaler)
		return t, ok
	}
	return nil, false
}
