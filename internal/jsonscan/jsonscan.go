// Package jsonscan follows JSON text without decoding it: the hot paths
// that only need to find members and values, where encoding/json's
// tokenizer costs more than the work around it.
package jsonscan

import (
	"bytes"
	"encoding/json"
)

// Members calls fn with the name and the exact value bytes of every
// top-level member of the JSON object data, in order, and the offsets of
// the value, without decoding anything: the hot path of sealing and
// opening, where encoding/json's tokenizer cost more than the cipher. It
// reports false when data is not an object it can follow (the callers then
// fall back to encoding/json, which gives the error). Member names with
// escapes are unescaped with encoding/json.
func Members(data []byte, fn func(name string, v []byte, start, end int) bool) bool {
	return walk(data, func(raw []byte, escaped bool, v []byte, start, end int) bool {
		var name string
		if escaped {
			if json.Unmarshal(raw, &name) != nil {
				return false
			}
		} else {
			name = string(raw[1 : len(raw)-1])
		}
		return fn(name, v, start, end)
	})
}

// MembersBytes is Members with each name as bytes, valid only during the
// call: the bytes between the quotes, or the unescaped name when it holds an
// escape. For callers that compare names: it allocates nothing for a name
// without escapes, where Members allocates a string per member.
func MembersBytes(data []byte, fn func(name, v []byte, start, end int) bool) bool {
	return walk(data, func(raw []byte, escaped bool, v []byte, start, end int) bool {
		name := raw[1 : len(raw)-1]
		if escaped {
			var s string
			if json.Unmarshal(raw, &s) != nil {
				return false
			}
			name = []byte(s)
		}
		return fn(name, v, start, end)
	})
}

// RawMembers is Members for callers that compare names and keep few: fn
// gets each name's bytes between the quotes, allocating nothing, and a
// name with an escape stops the walk (false), as for an object it cannot
// follow. The name's bytes are not checked to be valid JSON text.
func RawMembers(data []byte, fn func(name, v []byte) bool) bool {
	return walk(data, func(raw []byte, escaped bool, v []byte, _, _ int) bool {
		return !escaped && fn(raw[1:len(raw)-1], v)
	})
}

// walk calls fn with every top-level member's name as written (quotes
// included), whether it holds an escape, and its value.
func walk(data []byte, fn func(rawName []byte, escaped bool, v []byte, start, end int) bool) bool {
	i := SkipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return false
	}
	i = SkipSpace(data, i+1)
	if i < len(data) && data[i] == '}' {
		return SkipSpace(data, i+1) == len(data)
	}
	for {
		if i >= len(data) || data[i] != '"' {
			return false
		}
		kEnd, escaped := StringEnd(data, i)
		if kEnd < 0 {
			return false
		}
		raw := data[i:kEnd]
		for _, c := range raw {
			if c < 0x20 {
				return false // not JSON: a control character in a name
			}
		}
		i = SkipSpace(data, kEnd)
		if i >= len(data) || data[i] != ':' {
			return false
		}
		start := SkipSpace(data, i+1)
		end := ValueEnd(data, start)
		if end < 0 {
			return false
		}
		if !fn(raw, escaped, data[start:end], start, end) {
			return false
		}
		i = SkipSpace(data, end)
		if i >= len(data) {
			return false
		}
		switch data[i] {
		case ',':
			i = SkipSpace(data, i+1)
		case '}':
			return SkipSpace(data, i+1) == len(data)
		default:
			return false
		}
	}
}

// SkipSpace returns the offset of the first byte at or after i that is not
// JSON whitespace.
func SkipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// StringEnd returns the offset just past the string starting at data[i]
// (a '"'), and whether it holds an escape; -1 if it does not end.
//
// The closing quote is found with bytes.IndexByte, which reads many bytes
// an instruction, and the string's bytes are searched for a backslash the
// same way: a sealed field's envelope is a hundred or more base64 bytes
// without escapes, and reading them one at a time was a third of the
// scan's cost in a sealed read's opening (docs/performance.md). Only a
// string with an escape is followed byte by byte, from its first one.
func StringEnd(data []byte, i int) (int, bool) {
	if i+1 > len(data) {
		return -1, false
	}
	q := bytes.IndexByte(data[i+1:], '"')
	if q < 0 {
		return -1, false
	}
	q += i + 1
	b := bytes.IndexByte(data[i+1:q], '\\')
	if b < 0 {
		return q + 1, false
	}
	return stringEndEscaped(data, i+1+b)
}

// stringEndEscaped is StringEnd from j, a backslash inside the string:
// byte by byte, as an escaped quote may follow.
func stringEndEscaped(data []byte, j int) (int, bool) {
	escaped := false
	for ; j < len(data); j++ {
		switch data[j] {
		case '\\':
			escaped = true
			j++
		case '"':
			return j + 1, escaped
		}
	}
	return -1, false
}

// ValueEnd returns the offset just past the JSON value starting at
// data[i], or -1. Nested values are followed by bracket depth outside
// strings; the value's own validity is left to whoever decodes it.
func ValueEnd(data []byte, i int) int {
	if i >= len(data) {
		return -1
	}
	switch data[i] {
	case '"':
		end, _ := StringEnd(data, i)
		return end
	case '{', '[':
		depth := 0
		for j := i; j < len(data); j++ {
			switch data[j] {
			case '"':
				end, _ := StringEnd(data, j)
				if end < 0 {
					return -1
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	default:
		j := i
		for j < len(data) && !bytes.ContainsRune([]byte(",}] \t\n\r"), rune(data[j])) {
			j++
		}
		if j == i {
			return -1
		}
		return j
	}
}
