package projector_test

import (
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/projectorhq/projector"
)

// A Position is a JSON string in both directions, and what releases before
// wrote for a Position inside a JSON value ({"TxID":…,"Seq":…}: saga state,
// snapshots, payloads) still decodes.
func TestPositionJSON(t *testing.T) {
	t.Parallel()
	type token struct {
		At    projector.Position  `json:"at"`
		Maybe *projector.Position `json:"maybe,omitempty"`
	}
	in := token{At: projector.Position{TxID: 367141, Seq: 6}}
	b, err := json.Marshal(in)
	if err != nil || string(b) != `{"at":"367141/6"}` {
		t.Fatalf("marshal: %s, %v", b, err)
	}
	var out token
	if err := json.Unmarshal(b, &out); err != nil || out != in {
		t.Fatalf("round trip: %+v, %v", out, err)
	}
	for doc, want := range map[string]projector.Position{
		`{"at":{"TxID":12,"Seq":3}}`: {TxID: 12, Seq: 3},
		`{"at":{"txid":12,"seq":0}}`: {TxID: 12, Seq: 0},
		`{"at":"9/max"}`:             {TxID: 9, Seq: math.MaxInt64},
		`{"at":null}`:                {},
		`{"at":"0/0"}`:               projector.Start,
		`{"at":" 5/1"}`:              {}, // refused below
		`{"at":"18446744073709551615/9223372036854775807"}`: {TxID: math.MaxUint64, Seq: math.MaxInt64},
	} {
		var got token
		err := json.Unmarshal([]byte(doc), &got)
		if strings.Contains(doc, `" 5/1"`) {
			if err == nil {
				t.Errorf("%s: parsed %v", doc, got.At)
			}
			continue
		}
		if err != nil || got.At != want {
			t.Errorf("%s: %v, %v; want %v", doc, got.At, err, want)
		}
	}
	for _, doc := range []string{
		`{"at":12}`, `{"at":true}`, `{"at":[1,2]}`, `{"at":"12"}`, `{"at":"12/-1"}`, `{"at":"a/1"}`,
		`{"at":{"TxID":12}}`, `{"at":{"Seq":1}}`, `{"at":{"TxID":-1,"Seq":1}}`, `{"at":{"TxID":1,"Seq":-1}}`,
		`{"at":"1/1\u001b[31m"}`,
	} {
		var got token
		err := json.Unmarshal([]byte(doc), &got)
		if err == nil {
			t.Errorf("%s: parsed %v", doc, got.At)
			continue
		}
		if strings.ContainsRune(err.Error(), 0x1b) {
			t.Errorf("%s: the error carries the escape raw: %q", doc, err)
		}
	}
	// As a text form (flags, map keys, CSV).
	text, err := projector.Position{TxID: 1, Seq: 2}.MarshalText()
	var p projector.Position
	if err != nil || p.UnmarshalText(text) != nil || p != (projector.Position{TxID: 1, Seq: 2}) {
		t.Fatalf("text round trip: %s %v %v", text, p, err)
	}
	keyed, err := json.Marshal(map[projector.Position]int{{TxID: 4, Seq: 5}: 1})
	if err != nil || string(keyed) != `{"4/5":1}` {
		t.Fatalf("as a map key: %s, %v", keyed, err)
	}
}

// UnmarshalJSON never panics, and what it accepts encodes back to a
// string that decodes to the same position.
func FuzzPositionUnmarshalJSON(f *testing.F) {
	for _, s := range []string{`"1/2"`, `{"TxID":1,"Seq":2}`, `null`, `"9/max"`, `{}`, `"`, `{"TxID":1e30,"Seq":1}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		var p projector.Position
		if err := json.Unmarshal([]byte(doc), &p); err != nil {
			return
		}
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatalf("marshal %v: %v", p, err)
		}
		var q projector.Position
		if err := json.Unmarshal(b, &q); err != nil || q != p {
			t.Fatalf("%s decoded to %v, which encodes to %s and decodes to %v (%v)", doc, p, b, q, err)
		}
	})
}

// EscapeControls changes only the runes a terminal would obey or cannot
// show, where they stand; the CLI's error line and the console's text
// both go through it.
func TestEscapeControls(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"plain text, tab\tand é 名":    "plain text, tab\tand é 名",
		"x@\x1b[31mX":                 `x@\x1b[31mX`,
		"bad \xff, bell \a, nul \x00": `bad \xff, bell \a, nul \x00`,
		"zero\u200bwidth \u202e":      `zero\u200bwidth \u202e`,
		"new\nline\r":                 `new\nline\r`,
		`already \x1b stays`:          `already \x1b stays`,
	} {
		if got := projector.EscapeControls(in); got != want {
			t.Errorf("EscapeControls(%q) = %q, want %q", in, got, want)
		}
	}
}
