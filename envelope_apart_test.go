package projector_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/projectorhq/projector"
)

var apartPersonal = projector.Personal{Subject: "customer", Fields: []string{"name", "email"}, OneEnvelope: true, EnvelopeApart: true}

// TestEnvelopeApart holds the envelope kept apart (EnvelopeApart) to the
// event envelope's promises: the payload keeps only placeholders; put back
// (AttachEnvelope) it is the in-payload form every reader opens; opened
// where it is (OpenStoredApart, and in place over an envelope laid just
// before its payload) it gives the same payload; it is bound to its
// subject; and a forgotten subject's fields read as null.
func TestEnvelopeApart(t *testing.T) {
	t.Parallel()
	c, err := projector.NewKeyCipher(bytes.Repeat([]byte{7}, projector.DataKeySize))
	if err != nil {
		t.Fatal(err)
	}
	data := json.RawMessage(`{"name": "Ada", "note": {"x": "pjx2."}, "plan": "pro", "email": "ada@example.com", "customer": "c-1"}`)
	payload, env, forgotten, err := apartPersonal.SealPayloadApart(data, "c-1", c)
	if err != nil || forgotten || env == nil {
		t.Fatalf("seal apart: envelope %x, %v, %v", env, forgotten, err)
	}
	if want := `{"name": "pjx2.", "note": {"x": "pjx2."}, "plan": "pro", "email": "pjx2.", "customer": "c-1"}`; string(payload) != want {
		t.Fatalf("payload %s, want %s", payload, want)
	}
	if bytes.Contains(env, []byte("Ada")) || bytes.Contains(env, []byte("ada@")) {
		t.Fatalf("envelope holds a value in the clear: %q", env)
	}

	// Put back: the first top-level placeholder, not the nested one.
	attached, err := projector.AttachEnvelope(payload, env)
	if err != nil || !strings.HasPrefix(string(attached), `{"name": "pjx2.`) || strings.Count(string(attached), `"pjx2."`) != 2 {
		t.Fatalf("attached %s (%v)", attached, err)
	}
	// And taken out again (an import of an exported line): the same
	// payload and bytes.
	back, got, ok, err := projector.DetachEnvelope(attached)
	if err != nil || !ok || !bytes.Equal(back, payload) || !bytes.Equal(got, env) {
		t.Fatalf("detached %s %x (%v, %v), want %s %x", back, got, ok, err, payload, env)
	}
	if same, none, ok, err := projector.DetachEnvelope(payload); err != nil || ok || none != nil || !bytes.Equal(same, payload) {
		t.Fatalf("detach of a payload of placeholders: %s %x (%v, %v)", same, none, ok, err)
	}
	for _, bad := range []string{
		strings.Replace(string(attached), `"plan": "pro"`, `"plan": "pjx2.AAAA"`, 1), // two envelopes
		`{"name": "pjx2.!!", "email": "pjx2.", "customer": "c-1"}`,                   // not base64url
	} {
		if _, _, _, err := projector.DetachEnvelope(json.RawMessage(bad)); !errors.Is(err, projector.ErrSealed) {
			t.Errorf("DetachEnvelope(%s): %v", bad, err)
		}
	}
	for name, open := range map[string]func() (json.RawMessage, bool, error){
		"attached": func() (json.RawMessage, bool, error) { return projector.OpenStored(attached, "c-1", c) },
		"apart":    func() (json.RawMessage, bool, error) { return projector.OpenStoredApart(payload, env, "c-1", c) },
		"in place, adjacent": func() (json.RawMessage, bool, error) {
			buf := append(bytes.Clone(env), payload...)
			out, _, f, err := apartPersonal.OpenStoredApartByInPlace(buf[len(env):], buf[:len(env)], func(string) (*projector.KeyCipher, error) { return c, nil })
			if err == nil && &out[0] != &buf[0] {
				t.Errorf("in place, adjacent: the result was not written over the envelope and payload")
			}
			return out, f, err
		},
		"in place, apart": func() (json.RawMessage, bool, error) {
			out, _, f, err := apartPersonal.OpenStoredApartByInPlace(bytes.Clone(payload), bytes.Clone(env), func(string) (*projector.KeyCipher, error) { return c, nil })
			return out, f, err
		},
	} {
		got, forgotten, err := open()
		if err != nil || forgotten || !bytes.Equal(got, data) {
			t.Errorf("%s: opened %s (%v, %v), want %s", name, got, forgotten, err, data)
		}
	}

	// Another subject's event does not open it.
	if _, _, err := projector.OpenStoredApart(payload, env, "c-2", c); !errors.Is(err, projector.ErrSealed) {
		t.Errorf("opened under another subject: %v", err)
	}
	// Forgotten: nulls, in place too.
	gone, forgotten, err := projector.OpenStoredApart(payload, env, "c-1", nil)
	if err != nil || !forgotten || string(gone) != `{"name": null, "note": {"x": "pjx2."}, "plan": "pro", "email": null, "customer": "c-1"}` {
		t.Errorf("forgotten: %s (%v, %v)", gone, forgotten, err)
	}
	buf := append(bytes.Clone(env), payload...)
	gone, _, forgotten, err = apartPersonal.OpenStoredApartByInPlace(buf[len(env):], buf[:len(env)], func(string) (*projector.KeyCipher, error) { return nil, nil })
	if err != nil || !forgotten || string(gone) != `{"name": null, "note": {"x": "pjx2."}, "plan": "pro", "email": null, "customer": "c-1"}` {
		t.Errorf("forgotten in place: %s (%v, %v)", gone, forgotten, err)
	}

	// No place for the envelope, or an envelope besides: ErrSealed.
	for _, bad := range []string{`{"name": "Ada", "customer": "c-1"}`, `{"note": {"x": "pjx2."}, "customer": "c-1"}`, `[1]`} {
		if _, err := projector.AttachEnvelope(json.RawMessage(bad), env); !errors.Is(err, projector.ErrSealed) {
			t.Errorf("AttachEnvelope to %s: %v", bad, err)
		}
		if _, _, err := projector.OpenStoredApart(json.RawMessage(bad), env, "c-1", c); !errors.Is(err, projector.ErrSealed) {
			t.Errorf("OpenStoredApart of %s: %v", bad, err)
		}
	}
	if _, _, err := projector.OpenStoredApart(attached, env, "c-1", c); !errors.Is(err, projector.ErrSealed) {
		t.Errorf("an envelope apart beside one in the payload opened: %v", err)
	}

	// One field present: an envelope of its own in the payload, none apart.
	one, env, _, err := apartPersonal.SealPayloadApart(json.RawMessage(`{"name": "Ada", "email": null, "customer": "c-1"}`), "c-1", c)
	if err != nil || env != nil || !strings.Contains(string(one), `"pjx1.`) {
		t.Errorf("one field sealed apart: %s, envelope %x, %v", one, env, err)
	}
}

// TestEnvelopeApartNeedsOneEnvelope: EnvelopeApart keeps the one envelope
// OneEnvelope makes; declared alone it is a definition error.
func TestEnvelopeApartNeedsOneEnvelope(t *testing.T) {
	t.Parallel()
	type customer struct {
		Customer string `json:"customer"`
		Name     string `json:"name"`
	}
	_, err := projector.Define[customer](projector.NewRegistry(), "customer.apart", projector.TypeConfig{
		Personal: projector.Personal{Subject: "customer", Fields: []string{"name"}, EnvelopeApart: true},
	})
	if err == nil || !strings.Contains(err.Error(), "OneEnvelope") {
		t.Fatalf("EnvelopeApart without OneEnvelope: %v", err)
	}
}

// FuzzAttachEnvelope holds putting an envelope back, taking it out again,
// and opening one kept apart, to never panicking and to agreeing with each
// other: whatever
// payload and envelope bytes, either both fail (ErrSealed or
// ErrInvalidPayload) or the attached payload opens to what the envelope
// opens to where it is, in place or not.
func FuzzAttachEnvelope(f *testing.F) {
	c, err := projector.NewKeyCipher(bytes.Repeat([]byte{1}, projector.DataKeySize))
	if err != nil {
		f.Fatal(err)
	}
	payload, env, _, err := apartPersonal.SealPayloadApart(json.RawMessage(`{"customer":"s","name":"secret-a","email":"secret-b"}`), "s", c)
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte(payload), env)
	f.Add([]byte(`{"customer":"s","name":"pjx2."}`), env)
	f.Add([]byte(`{"customer":"s","name":"pjx2.","email":"pjx2.AAAA"}`), env)
	f.Add([]byte(`{"customer":"s","x":{"y":"pjx2."}}`), []byte{1, 2, 3})
	f.Add([]byte(`{"customer":"s","name" : "pjx2." }`), []byte{})
	byID := func(string) (*projector.KeyCipher, error) { return c, nil }
	f.Fuzz(func(t *testing.T, data, env []byte) {
		attached, aerr := projector.AttachEnvelope(data, env)
		if aerr != nil && !errors.Is(aerr, projector.ErrSealed) {
			t.Fatalf("AttachEnvelope(%q, %x): %v is not ErrSealed", data, env, aerr)
		}
		if !json.Valid(data) {
			return
		}
		if aerr == nil && !json.Valid(attached) {
			t.Fatalf("AttachEnvelope(%q, %x) = invalid JSON %q", data, env, attached)
		}
		if len(env) == 0 {
			return // nil: not apart at all
		}
		if aerr == nil {
			// Taken out again: the same payload and bytes, unless data
			// held an envelope of its own (two: refused).
			back, got, ok, derr := projector.DetachEnvelope(attached)
			if derr != nil && !errors.Is(derr, projector.ErrSealed) {
				t.Fatalf("DetachEnvelope(%q): %v", attached, derr)
			}
			if derr == nil && (!ok || !bytes.Equal(back, data) || !bytes.Equal(got, env)) {
				t.Fatalf("DetachEnvelope(AttachEnvelope(%q, %x)) = %q %x %v", data, env, back, got, ok)
			}
		}
		apart, _, err := projector.OpenStoredApart(data, env, "s", c)
		if err != nil && !errors.Is(err, projector.ErrSealed) && !errors.Is(err, projector.ErrInvalidPayload) {
			t.Fatalf("OpenStoredApart(%q, %x): %v", data, env, err)
		}
		buf := append(bytes.Clone(env), data...)
		in, _, _, ierr := apartPersonal.OpenStoredApartByInPlace(buf[len(env):], buf[:len(env)], byID)
		if err == nil {
			// What opened apart opens the same attached and in place.
			via, _, verr := projector.OpenStored(attached, "s", c)
			if aerr != nil || verr != nil || !bytes.Equal(via, apart) {
				t.Fatalf("%q %x: apart %q, attached %q (%v, %v)", data, env, apart, via, aerr, verr)
			}
			if ierr == nil && !bytes.Equal(in, apart) {
				t.Fatalf("%q %x: apart %q, in place %q", data, env, apart, in)
			}
		}
	})
}

// TestDecodeOpened holds Registry.DecodeOpened to Decode's result on an
// opened payload, with the type's current schema version, and to Decode's
// refusals: an unknown type, a schema version the type does not have.
func TestDecodeOpened(t *testing.T) {
	t.Parallel()
	type customer struct {
		Customer string `json:"customer"`
		Name     string `json:"name"`
		Email    string `json:"email"`
	}
	r := projector.NewRegistry()
	projector.MustDefine[customer](r, "customer.opened", projector.TypeConfig{Personal: apartPersonal})
	data := json.RawMessage(`{"customer":"c-1","name":"Ada","email":"ada@example.com"}`)
	want, _, err := r.Decode("customer.opened", 1, data)
	if err != nil {
		t.Fatal(err)
	}
	got, out, version, err := r.DecodeOpened("customer.opened", 1, data)
	if err != nil || got != want || version != 1 || !bytes.Equal(out, data) {
		t.Fatalf("DecodeOpened = %+v %s v%d (%v), want %+v", got, out, version, err, want)
	}
	if _, _, _, err := r.DecodeOpened("customer.unknown", 1, data); !errors.Is(err, projector.ErrUnknownEventType) {
		t.Errorf("unknown type: %v", err)
	}
	for _, v := range []int{0, 2, -1} {
		if _, _, _, err := r.DecodeOpened("customer.opened", v, data); !errors.Is(err, projector.ErrInvalidPayload) {
			t.Errorf("schema version %d: %v", v, err)
		}
	}
}
