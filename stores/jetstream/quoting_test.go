package jetstream_test

import (
	"context"
	"errors"
	"testing"

	pjs "github.com/projectorhq/projector/stores/jetstream"
)

// A bad park status is named once, quoted once: an unprintable one is
// escaped inside its one pair of quotes, not quoted again around them.
// Nothing is read, so no store is needed.
func TestParkStatusErrorQuotesOnce(t *testing.T) {
	t.Parallel()
	for status, want := range map[string]string{
		"bad\x00": `jetstream: invalid configuration: park status "bad\x00": want parked, resolved, discarded or all`,
		"opened":  `jetstream: invalid configuration: park status "opened": want parked, resolved, discarded or all`,
	} {
		_, err := pjs.ListParks(context.Background(), nil, pjs.ParkFilter{Subscription: "orders", Status: status})
		if !errors.Is(err, pjs.ErrInvalidConfig) || err.Error() != want {
			t.Errorf("status %q: got %v\nwant %s", status, err, want)
		}
	}
}
