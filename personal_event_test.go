package projector_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/projectorhq/projector"
)

// TestEventEnvelope holds an event's sealed fields to one envelope (one
// nonce, one tag, one decryption per event: what sealed reads cost), which
// opens back to the payload, and holds the rows written before it — an
// envelope per field — to opening as they did, alone or beside it.
func TestEventEnvelope(t *testing.T) {
	t.Parallel()
	p := projector.Personal{Subject: "customer", Fields: []string{"name", "email", "phone"}, OneEnvelope: true}
	c, err := projector.NewKeyCipher(bytes.Repeat([]byte{7}, projector.DataKeySize))
	if err != nil {
		t.Fatal(err)
	}
	data := json.RawMessage(`{"name": "Ada", "plan": "pro", "email": "ada@example.com", "customer": "c-1"}`)
	sealed, err := p.SealWith(data, "c-1", c)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(sealed), `"pjx`); n != 2 || strings.Count(string(sealed), `"pjx2.`) != 2 || strings.Count(string(sealed), `"pjx2."`) != 1 {
		t.Fatalf("sealed %s: want one event envelope and one field kept in it", sealed)
	}
	opened, forgotten, err := projector.OpenWith(sealed, "c-1", c)
	if err != nil || forgotten || !bytes.Equal(opened, data) {
		t.Fatalf("opened %s (%v, %v), want %s", opened, forgotten, err, data)
	}

	// The form of every row written before: an envelope per field.
	name, _ := c.SealValue("c-1", "name", []byte(`"Ada"`))
	email, _ := c.SealValue("c-1", "email", []byte(`"ada@example.com"`))
	old := json.RawMessage(`{"name": "` + name + `", "plan": "pro", "email": "` + email + `", "customer": "c-1"}`)
	if len(sealed) >= len(old) {
		t.Errorf("an event envelope (%d bytes) is no smaller than an envelope per field (%d)", len(sealed), len(old))
	}
	// Both forms in one payload: a field sealed alone beside two kept in
	// the event's envelope.
	two, err := projector.Personal{Subject: "customer", Fields: []string{"name", "email"}, OneEnvelope: true}.SealWith(data, "c-1", c)
	if err != nil {
		t.Fatal(err)
	}
	phone, _ := c.SealValue("c-1", "phone", []byte(`"+44 1"`))
	mixed := json.RawMessage(strings.Replace(string(two), `"plan"`, `"phone": "`+phone+`", "plan"`, 1))
	wantMixed := strings.Replace(string(data), `"plan"`, `"phone": "+44 1", "plan"`, 1)
	byID := func(string) (*projector.KeyCipher, error) { return c, nil }
	for _, in := range []struct {
		data json.RawMessage
		want string
	}{{old, string(data)}, {mixed, wantMixed}, {sealed, string(data)}} {
		got, _, err := projector.OpenStored(in.data, "c-1", c)
		if err != nil || string(got) != in.want {
			t.Errorf("OpenStored %s = %s (%v), want %s", in.data, got, err, in.want)
		}
		got, subject, _, err := p.OpenStoredBy(in.data, byID)
		if err != nil || subject != "c-1" || string(got) != in.want {
			t.Errorf("OpenStoredBy %s = %s %q (%v), want %s", in.data, got, subject, err, in.want)
		}
		// Forgotten: every sealed field of either form reads as null.
		gone, forgotten, err := projector.OpenStored(in.data, "c-1", nil)
		if err != nil || !forgotten || projector.IsSealed(gone) || strings.Contains(string(gone), "Ada") || !strings.Contains(string(gone), `"name": null`) {
			t.Errorf("forgotten %s = %s (%v, %v)", in.data, gone, forgotten, err)
		}
	}
}

// TestEventEnvelopeBinds holds the event envelope to its subject and to
// the names of the fields kept in it: moved to another subject's event,
// with a field renamed, dropped or added, or beside a second envelope, it
// does not open (ErrSealed), never yielding another field's value. A
// field that is not personal may not look like either form.
func TestEventEnvelopeBinds(t *testing.T) {
	t.Parallel()
	p := projector.Personal{Subject: "customer", Fields: []string{"name", "email"}, OneEnvelope: true}
	c, err := projector.NewKeyCipher(bytes.Repeat([]byte{7}, projector.DataKeySize))
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := p.SealWith(json.RawMessage(`{"customer":"c-1","name":"Ada","email":"ada@example.com"}`), "c-1", c)
	if err != nil {
		t.Fatal(err)
	}
	s := string(sealed)
	env := s[strings.Index(s, `"pjx2.`)+1 : strings.Index(s, `","email"`)]
	for what, data := range map[string]string{
		"renamed":        strings.Replace(s, `"email"`, `"mail"`, 1),
		"part dropped":   strings.Replace(s, `,"email":"pjx2."`, ``, 1),
		"part added":     strings.Replace(s, `}`, `,"phone":"pjx2."}`, 1),
		"two envelopes":  strings.Replace(s, `"email":"pjx2."`, `"email":"`+env+`"`, 1),
		"no envelope":    `{"customer":"c-1","name":"pjx2.","email":"pjx2."}`,
		"tampered":       strings.Replace(s, env, env[:len(env)-2]+"AA", 1),
		"not base64":     strings.Replace(s, env, "pjx2.!!!!", 1),
		"too short":      strings.Replace(s, env, "pjx2.AAAA", 1),
		"escaped":        strings.Replace(s, env, `pjx2.\u0041`, 1),
		"other envelope": strings.Replace(s, env, "pjx1."+env[len("pjx2."):], 1),
	} {
		if out, _, err := projector.OpenStored(json.RawMessage(data), "c-1", c); !errors.Is(err, projector.ErrSealed) {
			t.Errorf("%s: %s opened as %s (%v), want ErrSealed", what, data, out, err)
		}
	}
	if out, _, err := projector.OpenStored(sealed, "c-2", c); !errors.Is(err, projector.ErrSealed) {
		t.Errorf("another subject: opened as %s (%v), want ErrSealed", out, err)
	}
	for _, v := range []string{`"pjx2."`, `"pjx2.abc"`, `"pjx1.abc"`} {
		if _, err := p.SealWith(json.RawMessage(`{"customer":"c-1","name":"Ada","email":"a@b","plan":`+v+`}`), "c-1", c); !errors.Is(err, projector.ErrInvalidPayload) {
			t.Errorf("a plain field holding %s: %v, want ErrInvalidPayload", v, err)
		}
	}
}

// FuzzOpenEvent holds the openers to never panicking on any payload,
// to errors that say what went wrong (ErrSealed, ErrInvalidPayload), and
// to opening nothing that was not sealed with the key: whatever opens
// holds no sealed value and, but for the seed's own envelope, no value the
// fuzzer did not write.
func FuzzOpenEvent(f *testing.F) {
	p := projector.Personal{Subject: "c", Fields: []string{"a", "b"}, OneEnvelope: true}
	c, err := projector.NewKeyCipher(bytes.Repeat([]byte{1}, projector.DataKeySize))
	if err != nil {
		f.Fatal(err)
	}
	good, err := p.SealWith(json.RawMessage(`{"c":"s","a":"secret-a","b":"secret-b"}`), "s", c)
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{string(good), `{"c":"s","a":"pjx2.","b":"pjx2."}`, `{"c":"s","a":"pjx2.AAAA"}`,
		`{"c":"s","a":"pjx1.AAAA","b":"pjx2.AAAA","d":"pjx2."}`, `{"a":"pjx2.","c":"s"}`, `{"c":"s","a":"pjx2.\u0041"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		out, _, err := projector.OpenWith(data, "s", c)
		if err != nil && !errors.Is(err, projector.ErrSealed) && !errors.Is(err, projector.ErrInvalidPayload) {
			t.Fatalf("%q: error %v is neither ErrSealed nor ErrInvalidPayload", data, err)
		}
		if err == nil && json.Valid(data) {
			if !json.Valid(out) {
				t.Fatalf("%q opened as invalid JSON %q", data, out)
			}
			// Every top-level envelope opened or was refused.
			var m map[string]json.RawMessage
			if json.Unmarshal(out, &m) == nil {
				for k, v := range m {
					if bytes.HasPrefix(v, []byte(`"pjx1.`)) || bytes.HasPrefix(v, []byte(`"pjx2.`)) {
						t.Fatalf("%q opened as %q: %s still sealed", data, out, k)
					}
				}
			}
			// The only values ever sealed under the key are the seed's
			// (each fuzz process seals them afresh): a value that was not
			// in data came out of such an envelope, whole and in place.
			if bytes.Contains(out, []byte("secret-")) && !bytes.Contains(data, []byte("secret-")) &&
				(string(m["a"]) != `"secret-a"` || string(m["b"]) != `"secret-b"`) {
				t.Fatalf("%q opened as %q: a value that was not in it", data, out)
			}
		}
		if json.Valid(data) {
			byID := func(string) (*projector.KeyCipher, error) { return c, nil }
			got, subject, _, err := p.OpenStoredBy(data, byID)
			if err == nil {
				want, _, werr := projector.OpenStored(data, subject, c)
				if werr != nil || !bytes.Equal(got, want) {
					t.Fatalf("%q: OpenStoredBy %q, OpenStored %q (%v)", data, got, want, werr)
				}
			}
			// In place: the same result, and data as it was on an error.
			own := bytes.Clone(data)
			in, _, _, ierr := p.OpenStoredByInPlace(own, byID)
			if (ierr == nil) != (err == nil) || err == nil && !bytes.Equal(in, got) || err != nil && !bytes.Equal(own, data) {
				t.Fatalf("%q: OpenStoredByInPlace %q (%v), left %q; OpenStoredBy %q (%v)", data, in, ierr, own, got, err)
			}
		}
	})
}

// TestIsSealed holds the one-scan check to both forms' prefixes and
// nothing else.
func TestIsSealed(t *testing.T) {
	t.Parallel()
	for data, want := range map[string]bool{
		`{"a":"pjx1.x"}`: true, `{"a":"pjx2."}`: true, `{"a":"pjx3.x","b":"pjx2.y"}`: true,
		`{"a":"pjx3.x"}`: false, `{"a":"pjx1"}`: false, `{"a":"pjx"}`: false, `{"a":"xpjx1.y"}`: false, `{}`: false, `"pjx`: false,
	} {
		if got := projector.IsSealed(json.RawMessage(data)); got != want {
			t.Errorf("IsSealed(%s) = %v, want %v", data, got, want)
		}
	}
}

// Without OneEnvelope (the default) every field keeps its own envelope
// ("pjx1."), the form every earlier release opens: a rolling deploy's
// older binaries can still read what the newer ones write.
func TestOneEnvelopeIsOptIn(t *testing.T) {
	c, err := projector.NewKeyCipher(make([]byte, 32))
	if err != nil {
		t.Fatal(err)
	}
	data := json.RawMessage(`{"customer": "c-1", "name": "Ada", "email": "ada@example.com"}`)
	sealed, err := projector.Personal{Subject: "customer", Fields: []string{"name", "email"}}.SealWith(data, "c-1", c)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(sealed), "pjx2.") || strings.Count(string(sealed), `"pjx1.`) != 2 {
		t.Fatalf("sealed by default: %s, want one pjx1 envelope per field", sealed)
	}
}

// TestOpenStoredByInPlace: opening over the payload itself gives what
// opening into a new one gives — in the order jsonb keeps (the envelope
// first), in one where a kept field's long value comes before the envelope
// (it does not fit: a new payload), forgotten, and in the form of a field
// per envelope — and it writes over the payload only when it fits.
func TestOpenStoredByInPlace(t *testing.T) {
	t.Parallel()
	p := projector.Personal{Subject: "customer", Fields: []string{"name", "email"}, OneEnvelope: true}
	c, err := projector.NewKeyCipher(bytes.Repeat([]byte{7}, projector.DataKeySize))
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("Ada Lovelace ", 4)
	envFirst, err := p.SealWith(json.RawMessage(`{"name": "`+long+`", "plan": "pro", "email": "a@x", "customer": "c-1"}`), "c-1", c)
	if err != nil {
		t.Fatal(err)
	}
	// The envelope in email, the name kept in it, and the name first.
	sealed, err := p.SealWith(json.RawMessage(`{"email": "a@x", "name": "`+long+`", "customer": "c-1"}`), "c-1", c)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]string
	if err := json.Unmarshal(sealed, &m); err != nil || m["name"] != "pjx2." {
		t.Fatalf("sealed %s: want the name kept in the email's envelope", sealed)
	}
	placeholderFirst := json.RawMessage(`{"name": "pjx2.", "email": "` + m["email"] + `", "customer": "c-1"}`)
	perField, err := projector.Personal{Subject: "customer", Fields: []string{"name", "email"}}.SealWith(json.RawMessage(`{"name": "Ada", "email": "a@x", "customer": "c-1"}`), "c-1", c)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		data    json.RawMessage
		key     *projector.KeyCipher
		inPlace bool
	}{
		{envFirst, c, true},
		{placeholderFirst, c, false},
		{placeholderFirst, nil, true},
		{perField, c, false},
		{perField, nil, true},
	} {
		byID := func(string) (*projector.KeyCipher, error) { return tc.key, nil }
		want, _, wantGone, err := p.OpenStoredBy(tc.data, byID)
		if err != nil {
			t.Fatal(err)
		}
		own := bytes.Clone(tc.data)
		got, subject, gone, err := p.OpenStoredByInPlace(own, byID)
		if err != nil || subject != "c-1" || gone != wantGone || !bytes.Equal(got, want) {
			t.Fatalf("%s in place: %s %q %v (%v), want %s %v", tc.data, got, subject, gone, err, want, wantGone)
		}
		if over := &got[:1][0] == &own[0]; over != tc.inPlace {
			t.Errorf("%s (key %v): written over the payload %v, want %v", tc.data, tc.key != nil, over, tc.inPlace)
		}
	}
}
