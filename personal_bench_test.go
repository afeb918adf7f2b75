package projector_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/projectorhq/projector"
)

// BenchmarkOpenSealedEvent is the client's share of a sealed read, per
// event, on the payload of BenchmarkPersonalFields as jsonb returns it:
// the subject found and both fields opened in one pass (OpenStoredBy; a
// read with trusted cached keys opens in place, OpenStoredByInPlace), in two (SubjectOf, then
// OpenStored: the path before it), and, as the yardstick, decoding the
// same payload in the clear with json.Unmarshal, which every read does
// after opening.
func BenchmarkOpenSealedEvent(b *testing.B) {
	c, err := projector.NewKeyCipher(bytes.Repeat([]byte{7}, projector.DataKeySize))
	if err != nil {
		b.Fatal(err)
	}
	sealed, err := allocPersonal.SealWith(allocPayload, "c-7", c)
	if err != nil {
		b.Fatal(err)
	}
	byID := func(string) (*projector.KeyCipher, error) { return c, nil }
	b.Run("one-pass", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, _, err := allocPersonal.OpenStoredBy(sealed, byID); err != nil {
				b.Fatal(err)
			}
		}
	})
	one := allocPersonal
	one.OneEnvelope = true
	event, err := one.SealWith(allocPayload, "c-7", c)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("one-pass-event", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, _, err := one.OpenStoredBy(event, byID); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("one-pass-event-in-place", func(b *testing.B) {
		// What a store's read does: over its own copy of the payload
		// (pgx's), here refilled before each open.
		b.ReportAllocs()
		own := make([]byte, len(event))
		for b.Loop() {
			copy(own, event)
			if _, _, _, err := one.OpenStoredByInPlace(own, byID); err != nil {
				b.Fatal(err)
			}
		}
	})
	apart := one
	apart.EnvelopeApart = true
	placeholders, env, _, err := apart.SealPayloadApart(allocPayload, "c-7", c)
	if err != nil || env == nil {
		b.Fatalf("seal apart: %v (envelope %x)", err, env)
	}
	b.Run("one-pass-event-apart", func(b *testing.B) {
		// The envelope kept beside the payload (migration 29's column),
		// opened where it is: no base64, but the opened values do not fit
		// over the placeholders.
		b.ReportAllocs()
		own := make([]byte, len(placeholders))
		for b.Loop() {
			copy(own, placeholders)
			if _, _, _, err := apart.OpenStoredApartByInPlace(own, env, byID); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("one-pass-event-apart-adjacent", func(b *testing.B) {
		// As a store's read lays the row out: the envelope, then the
		// payload, in one array; the open writes over both.
		b.ReportAllocs()
		own := make([]byte, len(env)+len(placeholders))
		for b.Loop() {
			copy(own, env)
			copy(own[len(env):], placeholders)
			if _, _, _, err := apart.OpenStoredApartByInPlace(own[len(env):], own[:len(env)], byID); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("attach-then-open", func(b *testing.B) {
		// The envelope put back in the payload as base64, then opened in
		// place: what a read would do without OpenStoredApart.
		b.ReportAllocs()
		for b.Loop() {
			own, err := projector.AttachEnvelope(placeholders, env)
			if err != nil {
				b.Fatal(err)
			}
			if _, _, _, err := one.OpenStoredByInPlace(own, byID); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("two-pass", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			id, err := allocPersonal.SubjectOf(sealed)
			if err != nil {
				b.Fatal(err)
			}
			if _, _, err := projector.OpenStored(sealed, id, c); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("seal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := allocPersonal.SealWith(allocPayload, "c-7", c); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("unmarshal-clear", func(b *testing.B) {
		b.ReportAllocs()
		var v struct{ Customer, Name, Email, Plan string }
		for b.Loop() {
			if err := json.Unmarshal(allocPayload, &v); err != nil {
				b.Fatal(err)
			}
		}
	})
}
