package projector_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/projectorhq/projector"
)

type personalPayload struct {
	Customer string            `json:"customer"`
	Name     string            `json:"name"`
	Address  map[string]string `json:"address,omitempty"`
	Plan     string            `json:"plan"`
	Count    int               `json:"count"`
	Hidden   string            `json:"-"`
}

func TestDefinePersonalChecksFields(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		p    projector.Personal
		ok   bool
	}{
		{"good", projector.Personal{Subject: "customer", Fields: []string{"name", "address"}}, true},
		{"no subject", projector.Personal{Fields: []string{"name"}}, false},
		{"no fields", projector.Personal{Subject: "customer"}, false},
		{"unknown field", projector.Personal{Subject: "customer", Fields: []string{"nmae"}}, false},
		{"go name, not json name", projector.Personal{Subject: "customer", Fields: []string{"Name"}}, false},
		{"skipped field", projector.Personal{Subject: "customer", Fields: []string{"Hidden"}}, false},
		{"unknown subject", projector.Personal{Subject: "client", Fields: []string{"name"}}, false},
		{"subject not a string", projector.Personal{Subject: "count", Fields: []string{"name"}}, false},
		{"subject personal too", projector.Personal{Subject: "customer", Fields: []string{"customer"}}, false},
		{"field twice", projector.Personal{Subject: "customer", Fields: []string{"name", "name"}}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := projector.NewRegistry()
			_, err := projector.Define[personalPayload](r, "customer.registered", projector.TypeConfig{Personal: c.p})
			if c.ok != (err == nil) {
				t.Fatalf("Define: %v, want ok=%v", err, c.ok)
			}
			if !c.ok {
				if !errors.Is(err, projector.ErrInvalidEventType) {
					t.Fatalf("error %v does not match ErrInvalidEventType", err)
				}
				if r.HasPersonal() || len(r.Names()) != 0 {
					t.Fatalf("a refused definition left %v behind", r.Names())
				}
				return
			}
			if _, ok := r.Lookup(projector.SubjectForgottenType.Name()); !ok || !r.HasPersonal() {
				t.Fatal("subject.forgotten was not defined with the first personal type")
			}
		})
	}
	t.Run("non-struct", func(t *testing.T) {
		_, err := projector.Define[string](projector.NewRegistry(), "customer.named", projector.TypeConfig{Personal: projector.Personal{Subject: "x", Fields: []string{"y"}}})
		if !errors.Is(err, projector.ErrInvalidEventType) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("subject.forgotten taken", func(t *testing.T) {
		r := projector.NewRegistry()
		projector.MustDefine[opened](r, "subject.forgotten")
		_, err := projector.Define[personalPayload](r, "customer.registered", projector.TypeConfig{Personal: projector.Personal{Subject: "customer", Fields: []string{"name"}}})
		if !errors.Is(err, projector.ErrDuplicateEventType) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("no personal types, no subject.forgotten", func(t *testing.T) {
		r := projector.NewRegistry()
		projector.MustDefine[opened](r, "ticket.opened")
		if r.HasPersonal() || len(r.Names()) != 1 {
			t.Fatalf("names %v", r.Names())
		}
	})
}

func TestSealAndOpen(t *testing.T) {
	t.Parallel()
	p := projector.Personal{Subject: "customer", Fields: []string{"name", "address"}}
	key := bytes.Repeat([]byte{7}, projector.DataKeySize)
	data := json.RawMessage(`{ "customer" : "c-1", "name":  "Ada Lovelace" ,"address":{"city":"London"},"plan":"pro","count":3, "empty": null}`)
	sealed, err := p.Seal(data, "c-1", key)
	if err != nil {
		t.Fatal(err)
	}
	for _, clear := range []string{"Ada", "London"} {
		if strings.Contains(string(sealed), clear) {
			t.Fatalf("sealed payload holds %q in the clear: %s", clear, sealed)
		}
	}
	if !json.Valid(sealed) || !projector.IsSealed(sealed) || !strings.Contains(string(sealed), `"plan":"pro"`) {
		t.Fatalf("sealed payload: %s", sealed)
	}
	again, _ := p.Seal(data, "c-1", key)
	if bytes.Equal(again, sealed) {
		t.Fatal("two seals of one payload are equal: nonces are not random")
	}

	opened, forgotten, err := projector.Open(sealed, "c-1", key)
	if err != nil || forgotten {
		t.Fatalf("open: %v, forgotten %v", err, forgotten)
	}
	var want, got map[string]any
	_ = json.Unmarshal(data, &want)
	_ = json.Unmarshal(opened, &got)
	if !jsonEqual(want, got) {
		t.Fatalf("opened %s, want %s", opened, data)
	}

	gone, forgotten, err := projector.Open(sealed, "c-1", nil)
	if err != nil || !forgotten {
		t.Fatalf("open without key: %v, forgotten %v", err, forgotten)
	}
	var g personalPayload
	if err := json.Unmarshal(gone, &g); err != nil || g.Name != "" || g.Address != nil || g.Plan != "pro" || g.Customer != "c-1" {
		t.Fatalf("forgotten payload %s decodes as %+v (%v)", gone, g, err)
	}

	other := bytes.Repeat([]byte{8}, projector.DataKeySize)
	if _, _, err := projector.Open(sealed, "c-1", other); !errors.Is(err, projector.ErrSealed) {
		t.Fatalf("wrong key: %v", err)
	}
	if _, _, err := projector.Open(sealed, "c-2", key); !errors.Is(err, projector.ErrSealed) {
		t.Fatalf("another subject: %v", err)
	}
	// An envelope moved to another field does not open there.
	var fields map[string]json.RawMessage
	_ = json.Unmarshal(sealed, &fields)
	fields["plan"] = fields["name"]
	moved, _ := json.Marshal(fields)
	if _, _, err := projector.Open(moved, "c-1", key); !errors.Is(err, projector.ErrSealed) {
		t.Fatalf("moved envelope: %v", err)
	}

	// Decoding through the registry without opening never yields ciphertext.
	r := projector.NewRegistry()
	projector.MustDefine[personalPayload](r, "customer.registered", projector.TypeConfig{Personal: p})
	v, _, err := r.Decode("customer.registered", 1, sealed)
	if err != nil {
		t.Fatal(err)
	}
	if pp := v.(personalPayload); pp.Name != "" || pp.Plan != "pro" {
		t.Fatalf("decoded sealed payload as %+v", pp)
	}
	if _, err := p.Seal(json.RawMessage(`{"customer":"c-1","plan":"pjx1.abc"}`), "c-1", key); !errors.Is(err, projector.ErrInvalidPayload) {
		t.Fatalf("a plain field that looks sealed: %v", err)
	}
	red, err := p.Redact(data)
	if err != nil || strings.Contains(string(red), "Ada") || strings.Contains(string(red), "London") || !strings.Contains(string(red), "pro") {
		t.Fatalf("redacted %s (%v)", red, err)
	}
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

func TestPersonalSubjectOf(t *testing.T) {
	t.Parallel()
	p := projector.Personal{Subject: "customer", Fields: []string{"name"}}
	for _, data := range []string{`{"name":"x"}`, `{"customer":""}`, `{"customer":5}`, `[1]`} {
		if _, err := p.SubjectOf(json.RawMessage(data)); !errors.Is(err, projector.ErrInvalidPayload) {
			t.Errorf("%s: %v", data, err)
		}
	}
}

// HoldsClearValue: a personal field's value a reader gets in the clear
// (not null, not sealed, not another field's), however the payload spells
// its member names.
func TestPersonalHoldsClearValue(t *testing.T) {
	t.Parallel()
	p := projector.Personal{Subject: "customer", Fields: []string{"name", "email"}}
	key := bytes.Repeat([]byte{1}, projector.DataKeySize)
	sealed, err := p.Seal(json.RawMessage(`{"customer":"c-1","name":"Ada","email":"a@x"}`), "c-1", key)
	if err != nil {
		t.Fatal(err)
	}
	for data, want := range map[string]bool{
		`{"customer":"c-1","name":"Ada"}`:               true,
		`{"customer":"c-1","name":null,"email":"a@x"}`:  true,
		`{"customer":"c-1","email":{"home":"a@x"}}`:     true,
		"{\"customer\":\"c-1\",\"na\\u006de\":\"Ada\"}": true, // an escaped member name
		`{"customer":"c-1","name":null,"email":null}`:   false,
		`{"customer":"c-1","plan":"pro"}`:               false,
		`{"customer":"Ada"}`:                            false, // the subject is not personal
		string(sealed):                                  false,
		`["Ada"]`:                                       false,
		`{"name":`:                                      false,
	} {
		if got := p.HoldsClearValue(json.RawMessage(data)); got != want {
			t.Errorf("HoldsClearValue(%s) = %v, want %v", data, got, want)
		}
	}
}

// FuzzOpenValue holds the envelope decoder to never panicking and never
// returning bytes for an envelope that was not sealed with the key, for
// that subject and field.
func FuzzOpenValue(f *testing.F) {
	key := bytes.Repeat([]byte{1}, projector.DataKeySize)
	good, _ := projector.SealValue(key, "s", "f", []byte(`"v"`))
	for _, s := range []string{good, "pjx1.", "pjx1.AAAA", "pjx1.!!", "", "x", good[:len(good)-1], good + "A"} {
		f.Add(s, "s", "f")
	}
	f.Fuzz(func(t *testing.T, env, subject, field string) {
		plain, err := projector.OpenValue(key, subject, field, env)
		// Nonces are random per process, so a fuzz worker's seal differs
		// from the seed's: what opens must have been sealed for s/f, and
		// strict base64 gives an envelope one spelling only.
		if err == nil && (subject != "s" || field != "f" || string(plain) != `"v"` || !strings.HasPrefix(env, "pjx1.")) {
			t.Fatalf("opened %q for %q/%q as %q", env, subject, field, plain)
		}
		if err != nil && !errors.Is(err, projector.ErrSealed) {
			t.Fatalf("error %v does not match ErrSealed", err)
		}
		// Open over arbitrary payloads never panics either.
		_, _, _ = projector.Open(json.RawMessage(env), subject, key)
		_, _, _ = projector.Open(json.RawMessage(`{"a":`+env+`}`), subject, nil)
	})
}

// TestOpenStoredBy holds the one-pass opener to what SubjectOf and then
// OpenStored give, wherever the subject sits among the fields.
func TestOpenStoredBy(t *testing.T) {
	t.Parallel()
	p := projector.Personal{Subject: "customer", Fields: []string{"name", "email"}}
	key := bytes.Repeat([]byte{7}, projector.DataKeySize)
	c, err := projector.NewKeyCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	errNoKey := errors.New("no key at hand")
	for _, data := range []string{
		`{"name": "Ada", "plan": "pro", "email": "ada@example.com", "customer": "c-1"}`, // jsonb's order
		`{"customer":"c-1","name":"Ada","email":"a\"da@example.com","plan":"pro"}`,
		`{"customer":"c\u002d1","name":{"first":"Ada"},"email":null}`,
		` { "name" : "Ada" , "customer" : "c-1" } `,
	} {
		sealed, err := p.SealWith(json.RawMessage(data), "c-1", c)
		if err != nil {
			t.Fatalf("%s: %v", data, err)
		}
		want, _, err := projector.OpenStored(sealed, "c-1", c)
		if err != nil {
			t.Fatal(err)
		}
		asked := ""
		got, subject, forgotten, err := p.OpenStoredBy(sealed, func(s string) (*projector.KeyCipher, error) { asked = s; return c, nil })
		if err != nil || forgotten || subject != "c-1" || asked != "c-1" || !bytes.Equal(got, want) {
			t.Fatalf("%s: opened %s of %q (asked for %q, forgotten %v, %v), want %s", data, got, subject, asked, forgotten, err, want)
		}
		gone, _, _ := projector.OpenStored(sealed, "c-1", nil)
		got, _, forgotten, err = p.OpenStoredBy(sealed, func(string) (*projector.KeyCipher, error) { return nil, nil })
		if err != nil || !forgotten || !bytes.Equal(got, gone) {
			t.Fatalf("%s: forgotten opens as %s (%v, %v), want %s", data, got, forgotten, err, gone)
		}
		if _, subject, _, err := p.OpenStoredBy(sealed, func(string) (*projector.KeyCipher, error) { return nil, errNoKey }); !errors.Is(err, errNoKey) || subject != "c-1" {
			t.Fatalf("%s: a cipher's error: %v of %q", data, err, subject)
		}
		other, _ := projector.NewKeyCipher(bytes.Repeat([]byte{8}, projector.DataKeySize))
		if _, _, _, err := p.OpenStoredBy(sealed, func(string) (*projector.KeyCipher, error) { return other, nil }); !errors.Is(err, projector.ErrSealed) {
			t.Fatalf("%s: another key: %v", data, err)
		}
	}
	// A row sealed before envelopes were written in place (SealValue's
	// string, quoted by encoding/json) opens the same, and an envelope
	// written in place opens with OpenValue: one format.
	env, err := projector.SealValue(key, "c-1", "name", []byte(`"Ada"`))
	if err != nil {
		t.Fatal(err)
	}
	quoted, _ := json.Marshal(env)
	old := json.RawMessage(`{"name": ` + string(quoted) + `, "customer": "c-1"}`)
	if got, _, _, err := p.OpenStoredBy(old, func(string) (*projector.KeyCipher, error) { return c, nil }); err != nil || string(got) != `{"name": "Ada", "customer": "c-1"}` {
		t.Fatalf("an envelope of SealValue opens as %s (%v)", got, err)
	}
	var fields map[string]string
	now, _ := p.SealWith(json.RawMessage(`{"customer":"c-1","name":"Ada"}`), "c-1", c)
	if err := json.Unmarshal(now, &fields); err != nil {
		t.Fatal(err)
	}
	if plain, err := projector.OpenValue(key, "c-1", "name", fields["name"]); err != nil || string(plain) != `"Ada"` {
		t.Fatalf("an envelope written in place opens with OpenValue as %s (%v)", plain, err)
	}

	// More sealed fields than the opener keeps on the stack.
	six := projector.Personal{Subject: "customer", Fields: []string{"a", "b", "c", "d", "e", "f"}}
	many := json.RawMessage(`{"a":"1","b":[2],"c":{"x":3},"customer":"c-1","d":4,"e":"5","f":true}`)
	sealed, err := six.SealWith(many, "c-1", c)
	if err != nil {
		t.Fatal(err)
	}
	if got, _, _, err := six.OpenStoredBy(sealed, func(string) (*projector.KeyCipher, error) { return c, nil }); err != nil || !bytes.Equal(got, many) {
		t.Fatalf("six fields open as %s (%v), want %s", got, err, many)
	}
	plain := json.RawMessage(`{"customer":"c-1","plan":"pro"}`)
	if got, subject, _, err := p.OpenStoredBy(plain, func(string) (*projector.KeyCipher, error) { return nil, errNoKey }); err != nil || subject != "c-1" || !bytes.Equal(got, plain) {
		t.Fatalf("nothing sealed: %s of %q (%v): the cipher is asked only for a sealed field", got, subject, err)
	}
	for _, data := range []string{`{"name":"pjx1.AAAA"}`, `{"customer":"","name":"pjx1.AAAA"}`, `{"customer":1}`, `[1]`} {
		if _, _, _, err := p.OpenStoredBy(json.RawMessage(data), func(string) (*projector.KeyCipher, error) { return c, nil }); !errors.Is(err, projector.ErrInvalidPayload) {
			t.Errorf("%s: %v", data, err)
		}
	}
}

// TestSealPayloadForgotten: under no key, SealPayload writes each personal
// field holding a value as the envelope no key opens and says so; opening
// the result without a key gives null and forgotten, which is what reads
// do. A payload with no value in any personal field comes back as it is,
// not forgotten.
func TestSealPayloadForgotten(t *testing.T) {
	t.Parallel()
	p := projector.Personal{Subject: "customer", Fields: []string{"name", "address"}}
	for _, c := range []struct {
		in, stored, opened string
		forgotten          bool
	}{
		{`{"customer":"c-1","name":"Ada","plan":"pro"}`, `{"customer":"c-1","name":"pjx1.","plan":"pro"}`, `{"customer":"c-1","name":null,"plan":"pro"}`, true},
		{`{"customer":"c-1","name":null,"address":{"city":"x"}}`, `{"customer":"c-1","name":null,"address":"pjx1."}`, `{"customer":"c-1","name":null,"address":null}`, true},
		{`{"customer":"c-1","name":null,"plan":"pro"}`, `{"customer":"c-1","name":null,"plan":"pro"}`, `{"customer":"c-1","name":null,"plan":"pro"}`, false},
		{`{"customer":"c-1","plan":"pro"}`, `{"customer":"c-1","plan":"pro"}`, `{"customer":"c-1","plan":"pro"}`, false},
	} {
		stored, forgotten, err := p.SealPayload(json.RawMessage(c.in), "c-1", nil)
		if err != nil || string(stored) != c.stored || forgotten != c.forgotten {
			t.Fatalf("SealPayload(%s) = %s, %v, %v; want %s, %v", c.in, stored, forgotten, err, c.stored, c.forgotten)
		}
		opened, forgotten, err := projector.OpenWith(stored, "c-1", nil)
		if err != nil || string(opened) != c.opened || forgotten != c.forgotten {
			t.Fatalf("OpenWith(%s) = %s, %v, %v; want %s, %v", stored, opened, forgotten, err, c.opened, c.forgotten)
		}
		key, err := projector.NewDataKey()
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := projector.Open(stored, "c-1", key); c.forgotten && !errors.Is(err, projector.ErrSealed) {
			t.Fatalf("a key opened the forgotten field of %s: %v", stored, err)
		}
		if sealed, err := p.SealWith(json.RawMessage(c.in), "c-1", nil); err != nil || strings.Contains(string(sealed), "pjx") {
			t.Fatalf("SealWith without a key wrote %s, %v; want the fields null", sealed, err)
		}
	}
}
