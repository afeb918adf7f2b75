package projector

import (
	"bytes"
	"encoding/json"
	"testing"
	"unicode/utf8"
)

// FuzzRewriteFields holds the hand-rolled member scanner to what
// encoding/json's tokenizer gives: for any input, rewriting every member
// (and the subject lookup) agrees with the slow path.
func FuzzRewriteFields(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1}`, ` { "a" : "x\"y" , "b":[1,{"c":"]"}] ,"d":null } `, `{"a\u0062":true}`,
		`{"a":1,}`, `{"a"}`, `[1]`, `{"a":"pjx1.x"}`, `{"a":{"b":"}"}}`, `{"a":1}x`, `{"b":"pjx1.x","a":"s"}`, `{"a":"s","b":"pjx1.x","a":"t"}`,
		`{"b":"pjx2.x","a":"s"}`, `{"a":"s","b":"pjx2."}`, `{"b":"pjx2.","c":"pjx2.AAAA","d":"pjx1.x","a":"s"}`, `{"a":"s","b":"pjx2.\u0041"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var seenFast, seenSlow []string
		repl := func(seen *[]string) func([]byte, json.RawMessage) (json.RawMessage, bool, error) {
			return func(name []byte, v json.RawMessage) (json.RawMessage, bool, error) {
				*seen = append(*seen, string(name)+"="+string(v))
				return json.RawMessage(`0`), true, nil
			}
		}
		fast, errFast := rewriteFields(data, repl(&seenFast))
		slow, errSlow := rewriteFieldsSlow(data, repl(&seenSlow))
		if (errFast == nil) != (errSlow == nil) {
			t.Fatalf("%q: fast error %v, slow error %v", data, errFast, errSlow)
		}
		if errFast == nil && errSlow == nil && json.Valid(data) {
			if !bytes.Equal(fast, slow) {
				t.Fatalf("%q: fast %q, slow %q", data, fast, slow)
			}
			if len(seenFast) != len(seenSlow) {
				t.Fatalf("%q: members fast %q, slow %q", data, seenFast, seenSlow)
			}
		}
		p := Personal{Subject: "a", Fields: []string{"b"}}
		sf, ef := p.SubjectOf(data)
		if json.Valid(data) {
			// The one-pass opener agrees with SubjectOf and OpenStored.
			forget := func(string) (*KeyCipher, error) { return nil, nil }
			out, s, gone, err := p.OpenStoredBy(data, forget)
			if (err == nil) != (ef == nil) || s != sf {
				t.Fatalf("%q: OpenStoredBy subject %q (%v), SubjectOf %q (%v)", data, s, err, sf, ef)
			}
			if err == nil {
				want, wantGone, _ := OpenStored(data, sf, nil)
				if !bytes.Equal(out, want) || gone != wantGone {
					t.Fatalf("%q: OpenStoredBy %q (%v), OpenStored %q (%v)", data, out, gone, want, wantGone)
				}
			}
		}
		var m map[string]json.RawMessage
		// Invalid UTF-8 in a subject is refused, where encoding/json
		// would turn it into U+FFFD.
		if utf8.Valid(data) && json.Unmarshal(data, &m) == nil {
			var want string
			_ = json.Unmarshal(m["a"], &want)
			if (ef == nil && sf != want) || (ef != nil && want != "" && ValidText(want) == nil) {
				t.Fatalf("%q: subject %q (%v), want %q", data, sf, ef, want)
			}
		}
	})
}
