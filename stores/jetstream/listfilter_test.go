package jetstream_test

import (
	"context"
	"errors"
	"testing"

	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	pjs "github.com/projectorhq/projector/stores/jetstream"
)

// TestListFiltersRefuseAlike: ListParks and ListDeadLettersMatching check
// the subscription, the limit, the after id and the status of their
// filters alike (one validator), refuse a bad one with ErrInvalidConfig
// before anything is read, and say so in the words they always have.
func TestListFiltersRefuseAlike(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := pgtest.Store(t, testevents.New().Registry)
	for _, c := range []struct {
		status     string
		limit      int
		after      int64
		sub        string
		parks, dls string
	}{
		{sub: "fe.ed", parks: `list jetstream parks: jetstream: invalid configuration: subscription "fe.ed": want 1..128 ASCII letters, digits, '-' or '_'`,
			dls: `list jetstream dead letters: jetstream: invalid configuration: subscription "fe.ed": want 1..128 ASCII letters, digits, '-' or '_'`},
		{sub: "feed", limit: -1, parks: `jetstream: invalid configuration: limit -1 outside 1..10000 (0 for 100)`},
		{sub: "feed", limit: 10_001, parks: `jetstream: invalid configuration: limit 10001 outside 1..10000 (0 for 100)`},
		{sub: "feed", after: -1, parks: `jetstream: invalid configuration: after id -1 is negative (0 starts at the oldest)`},
		{sub: "feed", status: "gone", parks: `jetstream: invalid configuration: park status "gone": want parked, resolved, discarded or all`,
			dls: `jetstream: invalid configuration: list jetstream dead letters: projection: invalid dead-letter filter: status "gone" (want open, resolved or discarded)`},
		// The checks run in that order: the first bad field is the one named.
		{sub: "feed", limit: -1, after: -1, status: "gone", parks: `jetstream: invalid configuration: limit -1 outside 1..10000 (0 for 100)`},
	} {
		parks, err := pjs.ListParks(ctx, store, pjs.ParkFilter{Subscription: c.sub, Status: c.status, AfterID: c.after, Limit: c.limit})
		if !errors.Is(err, pjs.ErrInvalidConfig) || parks != nil || err.Error() != c.parks {
			t.Errorf("ListParks %+v: %v, %v; want nothing and %q", c, parks, err, c.parks)
		}
		want := c.dls
		if want == "" {
			want = c.parks
		}
		dls, err := pjs.ListDeadLettersMatching(ctx, store, pjs.DeadLetterFilter{Subscription: c.sub, Status: c.status, AfterID: c.after, Limit: c.limit})
		if !errors.Is(err, pjs.ErrInvalidConfig) || dls != nil || err.Error() != want {
			t.Errorf("ListDeadLettersMatching %+v: %v, %v; want nothing and %q", c, dls, err, want)
		}
		if c.status != "" && c.dls != "" && !errors.Is(err, projection.ErrInvalidFilter) {
			t.Errorf("ListDeadLettersMatching status %q: %v, want projection.ErrInvalidFilter too", c.status, err)
		}
	}
}
