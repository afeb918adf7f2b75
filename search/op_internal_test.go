package search

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/projectorhq/projector"
)

// Op.Raw, the encoding a backend may store as is instead of encoding Doc
// again, always holds exactly Doc's attributes: for whole documents, for
// patches with and without the primary key (spliced in), for an empty
// patch; and Compact drops it where it merged ops, so a merged document is
// never written from one op's stale encoding.
func TestOpRawMatchesDoc(t *testing.T) {
	type doc struct {
		ID    string `json:"id"`
		Title string `json:"title"`
		N     int    `json:"n,omitempty"`
	}
	w := &Writer{idx: Index{Name: "docs"}.withDefaults(), tenant: "acme"}
	steps := []func() error{
		func() error { return w.Upsert(doc{ID: "a", Title: "printer \"on\" fire", N: 2}) },
		func() error { return w.Upsert(map[string]any{"id": 7, "tags": []string{"x", "y"}}) },
		func() error { return w.Patch("a", map[string]string{"title": "fixed"}) },
		func() error { return w.Patch("a", map[string]any{"id": "a", "n": 3}) },
		func() error { return w.Patch("b", map[string]any{}) },
		func() error { return w.Patch("c", json.RawMessage(` { "x" : [1, {"y": null}] } `)) },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	for i, op := range w.ops {
		if op.Raw == nil {
			t.Fatalf("op %d (%v %s): no Raw", i, op.Kind, op.ID)
		}
		var got map[string]json.RawMessage
		if err := json.Unmarshal(op.Raw, &got); err != nil {
			t.Fatalf("op %d: Raw %s is not a JSON object: %v", i, op.Raw, err)
		}
		if !maps.EqualFunc(got, op.Doc, func(a, b json.RawMessage) bool { return string(a) == string(b) }) {
			t.Errorf("op %d: Raw %s, Doc %v", i, op.Raw, op.Doc)
		}
		if _, ok := got["id"]; !ok {
			t.Errorf("op %d: Raw %s lacks the primary key", i, op.Raw)
		}
	}
	for _, op := range Compact(w.ops) {
		if op.ID == "a" {
			if op.Raw != nil {
				t.Errorf("Compact merged a's upsert and patches but kept a Raw: %s", op.Raw)
			}
			if string(op.Doc["title"]) != `"fixed"` || string(op.Doc["n"]) != `3` {
				t.Errorf("Compact's merged a: %v", op.Doc)
			}
		}
	}
}

// A document id no backend can key a document by (a NUL, invalid UTF-8,
// over a name's length) is refused by the handler's call with
// ErrInvalidDocument, and no op is queued: it reached PostgreSQL at the
// index write, failed the batch and, retried, killed the shard (an API
// audit).
func TestWriterRefusesUnstorableIDs(t *testing.T) {
	w := &Writer{idx: Index{Name: "docs"}.withDefaults(), tenant: "acme"}
	for _, id := range []string{"a\x00", "a\xffb", strings.Repeat("i", projector.MaxNameLength+1)} {
		for name, call := range map[string]func() error{
			// (Upsert's document goes through encoding/json, which makes
			// invalid UTF-8 U+FFFD before the id is read: not refused.)
			"upsert": func() error {
				if !utf8.ValidString(id) {
					return fmt.Errorf("%w: skipped", ErrInvalidDocument)
				}
				return w.Upsert(map[string]string{"id": id})
			},
			"patch":  func() error { return w.Patch(id, map[string]string{"t": "x"}) },
			"delete": func() error { return w.Delete(id) },
		} {
			if err := call(); !errors.Is(err, ErrInvalidDocument) || strings.ContainsRune(err.Error(), 0) {
				t.Errorf("%s %.20q: %v; want ErrInvalidDocument", name, id, err)
			}
		}
	}
	if len(w.ops) != 0 {
		t.Fatalf("%d ops queued by refused calls", len(w.ops))
	}
	if err := w.Upsert(map[string]string{"id": strings.Repeat("i", projector.MaxNameLength)}); err != nil {
		t.Fatalf("an id of a name's length: %v", err)
	}
}
