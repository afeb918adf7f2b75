package projector_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/projectorhq/projector"
)

// The payload of the sealed-read and sealed-append benchmarks
// (BenchmarkPersonalFields): two personal fields, in the order jsonb gives
// them back (shorter names first, so the subject comes last).
var (
	allocPersonal = projector.Personal{Subject: "customer", Fields: []string{"name", "email"}}
	allocPayload  = json.RawMessage(`{"name": "Ada Lovelace c-7", "plan": "pro", "email": "ada.c-7@example.com", "customer": "c-7"}`)
)

// TestSealAllocs holds sealing an event's two personal fields to one
// allocation, the sealed payload: each envelope is written straight into
// it. Sealing an event took 16 allocations when each envelope went through
// a string of its own and json.Marshal to quote it.
func TestSealAllocs(t *testing.T) {
	// Not parallel: testing.AllocsPerRun refuses to run in a parallel test.
	if raceBuild {
		t.Skip("the race detector drops pooled buffers at random")
	}
	c, err := projector.NewKeyCipher(bytes.Repeat([]byte{7}, projector.DataKeySize))
	if err != nil {
		t.Fatal(err)
	}
	var out json.RawMessage
	got := testing.AllocsPerRun(200, func() {
		if out, err = allocPersonal.SealWith(allocPayload, "c-7", c); err != nil {
			t.Fatal(err)
		}
	})
	if opened, _, err := projector.OpenWith(out, "c-7", c); err != nil || !bytes.Equal(opened, allocPayload) {
		t.Fatalf("sealed %s opens as %s (%v)", out, opened, err)
	}
	if got > 1 {
		t.Fatalf("sealing two fields: %.1f allocations, want 1 (the sealed payload)", got)
	}
}

// TestOpenStoredAllocs holds opening a stored event's two sealed fields to
// one allocation, the opened payload: the envelopes are decoded in a
// scratch buffer shared across calls, not one made per event.
func TestOpenStoredAllocs(t *testing.T) {
	if raceBuild {
		t.Skip("the race detector drops pooled buffers at random")
	}
	c, err := projector.NewKeyCipher(bytes.Repeat([]byte{7}, projector.DataKeySize))
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := allocPersonal.SealWith(allocPayload, "c-7", c)
	if err != nil {
		t.Fatal(err)
	}
	var out json.RawMessage
	got := testing.AllocsPerRun(200, func() {
		if out, _, err = projector.OpenStored(sealed, "c-7", c); err != nil {
			t.Fatal(err)
		}
	})
	if !bytes.Equal(out, allocPayload) {
		t.Fatalf("opened %s, want %s", out, allocPayload)
	}
	if got > 1 {
		t.Fatalf("opening two fields: %.1f allocations, want 1 (the opened payload)", got)
	}
}

// TestOpenStoredByAllocs holds opening a stored event whose subject is not
// known yet to two allocations: the subject's id and the opened payload.
func TestOpenStoredByAllocs(t *testing.T) {
	if raceBuild {
		t.Skip("the race detector drops pooled buffers at random")
	}
	c, err := projector.NewKeyCipher(bytes.Repeat([]byte{7}, projector.DataKeySize))
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := allocPersonal.SealWith(allocPayload, "c-7", c)
	if err != nil {
		t.Fatal(err)
	}
	byID := func(string) (*projector.KeyCipher, error) { return c, nil }
	var out json.RawMessage
	var subject string
	got := testing.AllocsPerRun(200, func() {
		if out, subject, _, err = allocPersonal.OpenStoredBy(sealed, byID); err != nil {
			t.Fatal(err)
		}
	})
	if !bytes.Equal(out, allocPayload) || subject != "c-7" {
		t.Fatalf("opened %s of %q, want %s of c-7", out, subject, allocPayload)
	}
	if got > 2 {
		t.Fatalf("opening two fields: %.1f allocations, want 2 (the subject, the opened payload)", got)
	}
}
