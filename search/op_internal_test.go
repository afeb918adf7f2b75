package search

import (
	"encoding/json"
	"maps"
	"testing"
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
