package projectiontest

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
)

// cells prints a row's values the one way both sides of a comparison are
// printed. Checks compare cells by this printed form, so it must be one to
// one for values that differ: a text 'NULL' must not print as SQL NULL,
// nor the text '[a b]' as the array {"a b"}, nor {"a b"} as {"a","b"}.
func cells(values []any) []string {
	out := make([]string, len(values))
	for i, v := range values {
		out[i] = cell(v, false)
	}
	return out
}

// cell prints v: NULL for SQL NULL (nil, or a nil pointer or slice, as
// pgx encodes them); an array (a Go slice or array other than bytes) as
// [e1, e2], each element printed as a cell; a time in RFC 3339 in UTC; a
// UUID in its canonical form; anything else as its text (fmt.Sprint),
// quoted where it could be mistaken for one of the other forms.
func cell(v any, inArray bool) string {
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Invalid:
		return "NULL"
	case reflect.Pointer, reflect.Slice:
		if rv.IsNil() {
			return "NULL"
		}
	}
	switch x := v.(type) {
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano)
	case string:
		return text(x, inArray)
	case []byte:
		return text(string(x), inArray)
	case [16]byte:
		return uuid.UUID(x).String()
	case fmt.Stringer:
		return text(x.String(), inArray)
	}
	switch rv.Kind() {
	case reflect.Pointer:
		return cell(rv.Elem().Interface(), inArray)
	case reflect.Slice, reflect.Array:
		elems := make([]string, rv.Len())
		for i := range elems {
			elems[i] = cell(rv.Index(i).Interface(), true)
		}
		return "[" + strings.Join(elems, ", ") + "]"
	}
	return text(fmt.Sprint(v), inArray)
}

// text prints s as it is where it cannot be mistaken for another cell, and
// quoted (Go syntax) where it could: "NULL", text starting with [ (an
// array) or " (quoted text), and, as an array's element, text that is
// empty, has a comma or ] in it, or starts or ends with a space.
func text(s string, inArray bool) string {
	if s == "NULL" || strings.HasPrefix(s, "[") || strings.HasPrefix(s, `"`) ||
		inArray && (s == "" || strings.ContainsAny(s, ",]") || strings.TrimSpace(s) != s) {
		return strconv.Quote(s)
	}
	return printable([]byte(s))
}

// printable makes text safe to print in a test log: text with control
// characters or invalid UTF-8 is quoted, whole (two cells that differ must
// not print alike).
func printable(b []byte) string {
	s := string(b)
	if !utf8.ValidString(s) || strings.IndexFunc(s, unicode.IsControl) >= 0 {
		return strconv.Quote(s)
	}
	return s
}
