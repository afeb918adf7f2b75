package projection_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/projectorhq/projector/projection"
)

// TestDeadLetterFilterStringsAreText: a consumer, instance, event type or
// tenant filter that PostgreSQL text cannot hold (a NUL byte, invalid
// UTF-8) is ErrInvalidFilter before anything is sent, without the raw
// bytes in the message: it once reached the driver as "invalid byte
// sequence for encoding UTF8".
func TestDeadLetterFilterStringsAreText(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, bad := range []string{"a\xffb", "a\x00b", "\xc3"} {
		for _, f := range []projection.DeadLetterFilter{{Consumer: bad}, {Instance: bad}, {EventType: bad}, {Tenant: bad}} {
			_, err := projection.ListDeadLetters(e.ctx, e.store, f)
			if !errors.Is(err, projection.ErrInvalidFilter) {
				t.Fatalf("filter %#v: %v, want ErrInvalidFilter", f, err)
			}
			if strings.Contains(err.Error(), bad) {
				t.Fatalf("filter %#v: the error carries the raw bytes: %q", f, err)
			}
		}
	}
}
