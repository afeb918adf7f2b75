package projection_test

import (
	"errors"
	"testing"

	"github.com/projectorhq/projector/projection"
)

// TestListPagesRefuseAlike: ListDeadLetters and ListParks check their
// filters' page (limit, after id) and status alike (one validator), each
// with its own sentinel, before anything is read, in the words they always
// have.
func TestListPagesRefuseAlike(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, c := range []struct {
		status     string
		limit      int
		after      int64
		dls, parks string
	}{
		{limit: -1, dls: "limit -1 (want 1 to 10000, 0 for 100)"},
		{limit: 10_001, dls: "limit 10001 (want 1 to 10000, 0 for 100)"},
		{after: -1, dls: "after id -1 is negative"},
		{status: "gone", dls: `status "gone" (want open, resolved or discarded)`, parks: `status "gone" (want parked, resolved or discarded)`},
		// The checks run in that order: the first bad field is the one named.
		{limit: -1, after: -1, status: "gone", dls: "limit -1 (want 1 to 10000, 0 for 100)"},
	} {
		dls, err := projection.ListDeadLetters(e.ctx, e.store, projection.DeadLetterFilter{Status: c.status, AfterID: c.after, Limit: c.limit})
		if want := "projection: invalid dead-letter filter: " + c.dls; !errors.Is(err, projection.ErrInvalidFilter) || dls != nil || err.Error() != want {
			t.Errorf("ListDeadLetters %+v: %v, %v; want nothing and %q", c, dls, err, want)
		}
		if c.parks == "" {
			c.parks = c.dls
		}
		parks, err := projection.ListParks(e.ctx, e.store, projection.ParkFilter{Status: c.status, AfterID: c.after, Limit: c.limit})
		if want := "projection: invalid park filter: " + c.parks; !errors.Is(err, projection.ErrInvalidParkFilter) || parks != nil || err.Error() != want {
			t.Errorf("ListParks %+v: %v, %v; want nothing and %q", c, parks, err, want)
		}
	}
}
