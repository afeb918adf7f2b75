package projector

import (
	"bytes"
	"encoding/json"
)

// scanMembers calls fn with the name and the exact value bytes of every
// top-level member of the JSON object data, in order, and the offsets of
// the value, without decoding anything: the hot path of sealing and
// opening, where encoding/json's tokenizer cost more than the cipher. It
// reports false when data is not an object it can follow (the callers then
// fall back to encoding/json, which gives the error). Member names with
// escapes are unescaped with encoding/json.
//
// name is only valid during the call (it may point into data): compare it,
// or copy it.
func scanMembers(data []byte, fn func(name []byte, v []byte, start, end int) bool) bool {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return false
	}
	i = skipSpace(data, i+1)
	if i < len(data) && data[i] == '}' {
		return skipSpace(data, i+1) == len(data)
	}
	for {
		if i >= len(data) || data[i] != '"' {
			return false
		}
		kEnd, escaped := stringEnd(data, i)
		if kEnd < 0 {
			return false
		}
		name := data[i+1 : kEnd-1]
		if escaped {
			var n string
			if json.Unmarshal(data[i:kEnd], &n) != nil {
				return false
			}
			name = []byte(n)
		}
		i = skipSpace(data, kEnd)
		if i >= len(data) || data[i] != ':' {
			return false
		}
		start := skipSpace(data, i+1)
		end := valueEnd(data, start)
		if end < 0 {
			return false
		}
		if !fn(name, data[start:end], start, end) {
			return false
		}
		i = skipSpace(data, end)
		if i >= len(data) {
			return false
		}
		switch data[i] {
		case ',':
			i = skipSpace(data, i+1)
		case '}':
			return skipSpace(data, i+1) == len(data)
		default:
			return false
		}
	}
}

func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the offset just past the string starting at data[i]
// (a '"'), and whether it holds an escape; -1 if it does not end.
func stringEnd(data []byte, i int) (int, bool) {
	escaped := false
	for j := i + 1; j < len(data); j++ {
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

// valueEnd returns the offset just past the JSON value starting at
// data[i], or -1. Nested values are followed by bracket depth outside
// strings; the value's own validity is left to whoever decodes it.
func valueEnd(data []byte, i int) int {
	if i >= len(data) {
		return -1
	}
	switch data[i] {
	case '"':
		end, _ := stringEnd(data, i)
		return end
	case '{', '[':
		depth := 0
		for j := i; j < len(data); j++ {
			switch data[j] {
			case '"':
				end, _ := stringEnd(data, j)
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
