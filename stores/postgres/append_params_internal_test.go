package postgres

import (
	"bytes"
	"testing"

	"github.com/google/uuid"
)

// TestNewIDs: the ids of one append are version-7 UUIDs, unique and in
// increasing order, also when the 12-bit counter carries into the
// millisecond (4,096 ids and more).
func TestNewIDs(t *testing.T) {
	for _, n := range []int{1, 2, 100, 5000} {
		ids := make([][16]byte, n)
		newIDs(ids)
		seen := make(map[[16]byte]bool, n)
		for i, id := range ids {
			u := uuid.UUID(id)
			if u.Version() != 7 || u.Variant() != uuid.RFC4122 {
				t.Fatalf("n=%d: id %d is %s: version %d, variant %s", n, i, u, u.Version(), u.Variant())
			}
			if seen[id] {
				t.Fatalf("n=%d: id %d (%s) repeats", n, i, u)
			}
			seen[id] = true
			if i > 0 && bytes.Compare(ids[i-1][:8], id[:8]) >= 0 {
				t.Fatalf("n=%d: id %d (%s) does not sort after id %d (%s)", n, i, u, i-1, uuid.UUID(ids[i-1]))
			}
		}
		// The batch starts where a single id would: within a second of now.
		if got, want := uuid.UUID(ids[0]).Time(), uuid.UUID(newID()).Time(); got > want || want-got > 1e7 {
			t.Fatalf("n=%d: first id's time %d, a new id's %d", n, got, want)
		}
	}
}

// TestArrayLiteral: the text form the exec and simple-protocol modes send
// for a text[] quotes every element and escapes its quotes and
// backslashes, so an element holding a comma, a brace, a quote or nothing
// stays one element.
func TestArrayLiteral(t *testing.T) {
	got := arrayLiteral([]string{`a"b`, `c\d`, "", "x,y", "{z}"})
	want := `{"a\"b","c\\d","","x,y","{z}"}`
	if got != want {
		t.Fatalf("arrayLiteral = %s, want %s", got, want)
	}
	if got := arrayLiteral(nil); got != "{}" {
		t.Fatalf("arrayLiteral(nil) = %s, want {}", got)
	}
}
