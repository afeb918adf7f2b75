package projection_test

import (
	"errors"
	"testing"

	"github.com/projectorhq/projector/projection"
)

// A bad park or dead-letter status is named once, quoted once: an
// unprintable one is escaped inside its one pair of quotes, not quoted
// again around them.
func TestStatusErrorsQuoteOnce(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err      error
		sentinel error
		want     string
	}{
		{projection.ValidateParkStatus("bad\x00"), projection.ErrInvalidParkFilter,
			projection.ErrInvalidParkFilter.Error() + `: status "bad\x00" (want parked, resolved or discarded)`},
		{projection.ValidateParkStatus("opened"), projection.ErrInvalidParkFilter,
			projection.ErrInvalidParkFilter.Error() + `: status "opened" (want parked, resolved or discarded)`},
		{projection.ValidateDeadLetterStatus("x\ny"), projection.ErrInvalidFilter,
			projection.ErrInvalidFilter.Error() + `: status "x\ny" (want open, resolved or discarded)`},
	} {
		if !errors.Is(c.err, c.sentinel) || c.err.Error() != c.want {
			t.Errorf("got %v\nwant %s", c.err, c.want)
		}
	}
}
