package projection_test

import (
	"strings"
	"testing"

	"github.com/projectorhq/projector/projection"
)

// A direct retry whose handler fails for a reason that is not about the
// event (here the handler's table is gone: SQLSTATE 42P01, systemic)
// returns that failure and records nothing: no attempt counted, the dead
// letter's or park's error left as it was, the event not applied. Before,
// it was recorded as the event failing again, once per item of a bulk
// retry, which went on through every item.
func TestDirectRetryWithASystemicHandlerFailureRecordsNothing(t *testing.T) {
	t.Parallel()
	t.Run("dead letter", func(t *testing.T) {
		t.Parallel()
		e, p, failing, ids := deadLetterEnv(t)
		failing.Store(false)
		before, _, err := projection.GetDeadLetter(e.ctx, e.store, ids[0])
		if err != nil {
			t.Fatal(err)
		}
		e.exec(`ALTER TABLE ` + e.table("trace") + ` RENAME TO trace_gone`)
		res, err := projection.RetryDeadLetter(e.ctx, e.store, p, ids[0], nil)
		if err == nil || !projection.IsSystemic(err) || res.Resolved || res.Error != "" ||
			!strings.Contains(err.Error(), "nothing recorded") {
			t.Fatalf("retry: %+v, %v; want a systemic error with nothing recorded", res, err)
		}
		after, _, err := projection.GetDeadLetter(e.ctx, e.store, ids[0])
		if err != nil {
			t.Fatal(err)
		}
		if after.Status != projection.DeadLetterOpen || after.Attempts != before.Attempts || after.Error != before.Error || after.LastRetriedAt != nil {
			t.Fatalf("dead letter after the retry: %+v; want it as before: %+v", after, before)
		}
		// Fixed, the same retry goes through.
		e.exec(`ALTER TABLE ` + e.schema + `.trace_gone RENAME TO trace`)
		res, err = projection.RetryDeadLetter(e.ctx, e.store, p, ids[0], nil)
		if err != nil || !res.Resolved || res.Attempts != before.Attempts+1 {
			t.Fatalf("retry once the table is back: %+v, %v", res, err)
		}
		if n := e.traced("tolerant", before.EventID); n != 1 {
			t.Fatalf("event applied %d times, want 1", n)
		}
	})
	t.Run("park", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		_, pk, failing := e.parkedPoison()
		failing.Store(false)
		p := poisoned(e, "parking", parkCfg, failing)
		e.exec(`ALTER TABLE ` + e.table("trace") + ` RENAME TO trace_gone`)
		res, err := projection.RetryPark(e.ctx, e.store, p, pk.ID, "tester", nil)
		if err == nil || !projection.IsSystemic(err) || res.Resolved || res.Error != "" {
			t.Fatalf("retry: %+v, %v; want a systemic error with nothing recorded", res, err)
		}
		after, _, err := projection.GetPark(e.ctx, e.store, pk.ID)
		if err != nil {
			t.Fatal(err)
		}
		if after.Status != projection.ParkOpen || after.Attempts != pk.Attempts || after.Error != pk.Error || after.LastRetriedAt != nil {
			t.Fatalf("park after the retry: %+v; want it as before: %+v", after, pk)
		}
		e.exec(`ALTER TABLE ` + e.schema + `.trace_gone RENAME TO trace`)
		res, err = projection.RetryPark(e.ctx, e.store, p, pk.ID, "tester", nil)
		if err != nil || !res.Resolved || res.Events != 2 {
			t.Fatalf("retry once the table is back: %+v, %v", res, err)
		}
	})
}
