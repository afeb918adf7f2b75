package projector

import (
	"reflect"
	"strings"
	"testing"
)

// An encoded payload over MaxPayloadBytes is refused before it is sent
// (Encode wraps the refusal in ErrInvalidPayload); one at the limit passes
// the size check. The slice over the limit is never written, so the
// operating system never backs it with memory.
func TestCheckSize(t *testing.T) {
	t.Parallel()
	if MaxPayloadBytes != 1<<28-1 {
		t.Fatalf("MaxPayloadBytes %d, want jsonb's longest string, 2^28-1", MaxPayloadBytes)
	}
	if err := checkSize(MaxPayloadBytes); err != nil {
		t.Fatalf("at the limit: %v", err)
	}
	err := checkEncoded(make([]byte, MaxPayloadBytes+1), reflect.ValueOf(""))
	if err == nil || !strings.Contains(err.Error(), "over the limit of 268435455 (projector.MaxPayloadBytes") {
		t.Fatalf("over the limit: %v", err)
	}
}
