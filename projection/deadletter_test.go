package projection_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/stores/postgres"
)

// deadLetterEnv runs a continuous-mode consumer over planted poison events
// and returns it with the ids of their dead letters, in log order.
func deadLetterEnv(t *testing.T) (*env, *projection.Async, *atomic.Bool, []int64) {
	return deadLetterEnvIn(t, 0)
}

// deadLetterEnvIn is deadLetterEnv with the consumer in partitions (0: not
// partitioned).
func deadLetterEnvIn(t *testing.T, partitions int) (*env, *projection.Async, *atomic.Bool, []int64) {
	e := newEnv(t)
	if partitions > 1 {
		e = partitioned(t)
	}
	e.traceTable()
	failing := &atomic.Bool{}
	failing.Store(true)
	p := poisoned(e, "tolerant", projection.AsyncConfig{ErrorMode: projection.SkipApplyErrors, MaxAttempts: 1, Partitions: partitions}, failing)
	// The dispatcher of this test catches up once; retries run in-process.
	for i := range 3 {
		e.appendOne("p"+string(rune('a'+i)), projector.NoStream, testevents.TicketOpened{Title: "poison"}, testevents.TicketCommented{Body: "later"})
	}
	e.appendOne("ok", projector.NoStream, testevents.TicketOpened{Title: "ok"})
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	dls, err := projection.ListDeadLetters(e.ctx, e.store, projection.DeadLetterFilter{Consumer: "tolerant"})
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 3 {
		t.Fatalf("dead letters: %d, want 3: %+v", len(dls), dls)
	}
	ids := make([]int64, len(dls))
	for i, dl := range dls {
		ids[i] = dl.ID
	}
	return e, p, failing, ids
}

// A retry of a dead letter whose handler now succeeds applies the event
// exactly once, resolved in the same transaction: a second retry is refused
// and applies nothing; the later event of the stream was applied first, so
// the retry says it applied out of order.
func TestDeadLetterRetryAppliesOnce(t *testing.T) {
	t.Parallel()
	e, p, failing, ids := deadLetterEnv(t)
	dl, ev, err := projection.GetDeadLetter(e.ctx, e.store, ids[0])
	if err != nil || ev == nil || ev.ID != dl.EventID || dl.Status != projection.DeadLetterOpen {
		t.Fatalf("get: %+v, %v, %v", dl, ev, err)
	}
	failing.Store(false)
	res, err := projection.RetryDeadLetter(e.ctx, e.store, p, ids[0], nil)
	if err != nil || !res.Resolved || res.Attempts != 2 || !res.OutOfOrder {
		t.Fatalf("retry: %+v, %v", res, err)
	}
	if n := e.traced("tolerant", dl.EventID); n != 1 {
		t.Fatalf("event applied %d times, want 1", n)
	}
	_, err = projection.RetryDeadLetter(e.ctx, e.store, p, ids[0], nil)
	if !errors.Is(err, projector.ErrInvalidTransition) || !strings.Contains(err.Error(), "resolved") {
		t.Fatalf("second retry: %v, want a refusal saying it is resolved", err)
	}
	if n := e.traced("tolerant", dl.EventID); n != 1 {
		t.Fatalf("event applied %d times after a second retry, want 1", n)
	}
	got, _, err := projection.GetDeadLetter(e.ctx, e.store, ids[0])
	if err != nil || got.Status != projection.DeadLetterResolved || got.ResolvedAt == nil {
		t.Fatalf("after retry: %+v, %v", got, err)
	}
	// Still listed, as the record; filtered by status.
	open, err := projection.ListDeadLetters(e.ctx, e.store, projection.DeadLetterFilter{Consumer: "tolerant", Status: projection.DeadLetterOpen})
	if err != nil || len(open) != 2 {
		t.Fatalf("open after retry: %d, %v", len(open), err)
	}
}

// Concurrent retries of one dead letter apply its event once: the row lock
// and the status read after it make the loser a refusal.
func TestDeadLetterConcurrentRetriesApplyOnce(t *testing.T) {
	t.Parallel()
	e, p, failing, ids := deadLetterEnv(t)
	failing.Store(false)
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			_, err := projection.RetryDeadLetter(e.ctx, e.store, p, ids[1], nil)
			errs <- err
		}()
	}
	ok := 0
	for range 4 {
		err := <-errs
		switch {
		case err == nil:
			ok++
		case !errors.Is(err, projector.ErrInvalidTransition):
			t.Fatalf("retry: %v", err)
		}
	}
	dl, _, err := projection.GetDeadLetter(e.ctx, e.store, ids[1])
	if err != nil {
		t.Fatal(err)
	}
	if ok != 1 || e.traced("tolerant", dl.EventID) != 1 {
		t.Fatalf("%d retries succeeded, event applied %d times; want 1 and 1", ok, e.traced("tolerant", dl.EventID))
	}
}

// A retry that fails again keeps the dead letter open, with the new error
// and one more attempt, and leaves none of the handler's writes.
func TestDeadLetterRetryFailingKeepsIt(t *testing.T) {
	t.Parallel()
	e, p, _, ids := deadLetterEnv(t)
	res, err := projection.RetryDeadLetter(e.ctx, e.store, p, ids[0], nil)
	if err != nil || res.Resolved || !strings.Contains(res.Error, "cannot digest poison") || res.Attempts != 2 {
		t.Fatalf("failing retry: %+v, %v", res, err)
	}
	dl, _, err := projection.GetDeadLetter(e.ctx, e.store, ids[0])
	if err != nil || dl.Status != projection.DeadLetterOpen || dl.Attempts != 2 || !strings.HasPrefix(dl.Error, "retry: ") || dl.LastRetriedAt == nil {
		t.Fatalf("after a failing retry: %+v, %v", dl, err)
	}
	if n := e.traced("tolerant", dl.EventID); n != 0 {
		t.Fatalf("a failing retry left %d writes", n)
	}
}

// Discard keeps the row, marked; a discarded one can be neither retried nor
// discarded again, and a batch with one bad id changes nothing.
func TestDeadLetterDiscard(t *testing.T) {
	t.Parallel()
	e, p, _, ids := deadLetterEnv(t)
	if err := projection.DiscardDeadLetters(e.ctx, e.store, []int64{ids[0]}); err != nil {
		t.Fatal(err)
	}
	if err := projection.DiscardDeadLetters(e.ctx, e.store, []int64{ids[1], ids[0]}); !errors.Is(err, projector.ErrInvalidTransition) {
		t.Fatalf("discard again: %v", err)
	}
	if err := projection.DiscardDeadLetters(e.ctx, e.store, []int64{ids[1], 999999}); !errors.Is(err, projector.ErrNotFound) {
		t.Fatalf("discard unknown: %v", err)
	}
	if dl, _, _ := projection.GetDeadLetter(e.ctx, e.store, ids[1]); dl.Status != projection.DeadLetterOpen {
		t.Fatalf("a refused batch discarded %d: %+v", ids[1], dl)
	}
	if _, err := projection.RetryDeadLetter(e.ctx, e.store, p, ids[0], nil); !errors.Is(err, projector.ErrInvalidTransition) {
		t.Fatalf("retry discarded: %v", err)
	}
	dl, _, err := projection.GetDeadLetter(e.ctx, e.store, ids[0])
	if err != nil || dl.Status != projection.DeadLetterDiscarded || dl.ResolvedAt == nil {
		t.Fatalf("discarded: %+v, %v", dl, err)
	}
}

// A dead letter whose event is gone from the log says so: show returns no
// event, retry is refused with ErrEventPruned, discard still works.
func TestDeadLetterPrunedEvent(t *testing.T) {
	t.Parallel()
	e, p, failing, ids := deadLetterEnv(t)
	dl, _, err := projection.GetDeadLetter(e.ctx, e.store, ids[2])
	if err != nil {
		t.Fatal(err)
	}
	e.exec(`DELETE FROM `+e.store.Table("projector_events")+` WHERE id = $1`, dl.EventID)
	_, ev, err := projection.GetDeadLetter(e.ctx, e.store, ids[2])
	if err != nil || ev != nil {
		t.Fatalf("pruned: event %v, %v", ev, err)
	}
	failing.Store(false)
	if _, err := projection.RetryDeadLetter(e.ctx, e.store, p, ids[2], nil); !errors.Is(err, projection.ErrEventPruned) {
		t.Fatalf("retry of a pruned event: %v", err)
	}
	if err := projection.RequestDeadLetterRetry(e.ctx, e.store, []int64{ids[2]}); !errors.Is(err, projection.ErrEventPruned) {
		t.Fatalf("retry request of a pruned event: %v", err)
	}
	if err := projection.DiscardDeadLetters(e.ctx, e.store, []int64{ids[2]}); err != nil {
		t.Fatal(err)
	}
}

// A retry request recorded in the database is carried out by a running
// dispatcher that has the projection, partitioned or not (a partition's
// dead letters are filed under the partition's instance id).
func TestDeadLetterRetryRequestRunsInDispatcher(t *testing.T) {
	t.Parallel()
	for _, partitions := range []int{0, 4} {
		t.Run(fmt.Sprintf("partitions=%d", partitions), func(t *testing.T) {
			t.Parallel()
			retryRequestRunsInDispatcher(t, partitions)
		})
	}
}

func retryRequestRunsInDispatcher(t *testing.T, partitions int) {
	e, _, failing, ids := deadLetterEnvIn(t, partitions)
	failing.Store(false)
	if err := projection.RequestDeadLetterRetry(e.ctx, e.store, ids[:2]); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the dispatcher to carry out the retry requests", func() bool {
		dls, err := projection.ListDeadLetters(e.ctx, e.store, projection.DeadLetterFilter{Status: projection.DeadLetterResolved})
		return err == nil && len(dls) == 2
	})
	for _, id := range ids[:2] {
		dl, _, _ := projection.GetDeadLetter(e.ctx, e.store, id)
		if n := e.traced("tolerant", dl.EventID); n != 1 || dl.RetryRequestedAt != nil {
			t.Fatalf("dead letter %d: applied %d times, request %v", id, n, dl.RetryRequestedAt)
		}
	}
}

// Filters combine, paging by id returns every row once, bad filters are
// typed errors.
func TestDeadLetterListFilters(t *testing.T) {
	t.Parallel()
	e, _, _, ids := deadLetterEnv(t)
	var got []int64
	f := projection.DeadLetterFilter{Consumer: "tolerant", EventType: e.types.Opened.Name(), Reason: "apply-error", Limit: 2,
		Tenant: projector.SystemTenant, Instance: projection.SharedInstance, Since: time.Now().Add(-time.Hour)}
	for {
		page, err := projection.ListDeadLetters(e.ctx, e.store, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, dl := range page {
			got = append(got, dl.ID)
		}
		if len(page) < f.Limit {
			break
		}
		f.AfterID = page[len(page)-1].ID
	}
	if len(got) != len(ids) {
		t.Fatalf("paged %v, want %v", got, ids)
	}
	for _, f := range []projection.DeadLetterFilter{{Consumer: "other"}, {EventType: "ticket.closed"}, {Since: time.Now().Add(time.Hour)}, {Tenant: "t9"}} {
		if dls, err := projection.ListDeadLetters(e.ctx, e.store, f); err != nil || len(dls) != 0 {
			t.Fatalf("filter %+v: %d rows, %v", f, len(dls), err)
		}
	}
	for _, f := range []projection.DeadLetterFilter{{Limit: -1}, {Status: "gone"}, {Reason: "bad"}, {AfterID: -1}} {
		if _, err := projection.ListDeadLetters(e.ctx, e.store, f); !errors.Is(err, projection.ErrInvalidFilter) {
			t.Fatalf("filter %+v: %v", f, err)
		}
	}
}

// Two dispatchers of the projection may both pick up a retry request; only
// one tries it: a request that fails again costs one attempt, not two.
func TestDeadLetterRetryRequestTriedOnce(t *testing.T) {
	t.Parallel()
	e, p, _, ids := deadLetterEnv(t)
	e.dispatcher(projection.Config{Projections: []*projection.Async{p}})
	for round := 2; round <= 4; round++ {
		if err := projection.RequestDeadLetterRetry(e.ctx, e.store, ids[:1]); err != nil {
			t.Fatal(err)
		}
		var dl projection.DeadLetter
		eventually(t, 30*time.Second, "the retry request to be carried out", func() bool {
			var err error
			dl, _, err = projection.GetDeadLetter(e.ctx, e.store, ids[0])
			return err == nil && dl.RetryRequestedAt == nil
		})
		if dl.Attempts != round || dl.Status != projection.DeadLetterOpen || !strings.HasPrefix(dl.Error, "retry: ") {
			t.Fatalf("round %d: %+v", round, dl)
		}
	}
}

// projector_dead_letters_open counts a consumer's open dead letters from
// the table (every instance, whoever recorded them) and follows discards
// and successful retries.
func TestDeadLettersOpenGauge(t *testing.T) {
	t.Parallel()
	e, p, failing, ids := deadLetterEnv(t)
	reg := prometheus.NewRegistry()
	e.dispatcher(projection.Config{Projections: []*projection.Async{p}, Registerer: reg, MetricsEvery: 20 * time.Millisecond})
	open := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "projector_dead_letters_open" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "consumer" && l.GetValue() == "tolerant" {
						return m.GetGauge().GetValue()
					}
				}
			}
		}
		return -1
	}
	eventually(t, 30*time.Second, "the gauge to count 3 open dead letters", func() bool { return open() == 3 })
	if err := projection.DiscardDeadLetters(e.ctx, e.store, ids[:1]); err != nil {
		t.Fatal(err)
	}
	failing.Store(false)
	if res, err := projection.RetryDeadLetter(e.ctx, e.store, p, ids[1], nil); err != nil || !res.Resolved {
		t.Fatalf("retry: %+v, %v", res, err)
	}
	eventually(t, 30*time.Second, "the gauge to count the one still open", func() bool { return open() == 1 })
}

// Retention keeps the event of an open dead letter, however old and passed
// by every consumer, so it can still be retried; once the dead letter is
// discarded or resolved, the next prune deletes its event like any other.
func TestPruneKeepsOpenDeadLettersEvents(t *testing.T) {
	t.Parallel()
	e, p, failing, ids := deadLetterEnv(t)
	prune := func() int64 {
		t.Helper()
		res, err := e.store.Prune(e.ctx, postgres.PruneOptions{OlderThan: time.Nanosecond, StreamTypes: []string{"ticket"}, IncludeAggregates: true})
		if err != nil {
			t.Fatal(err)
		}
		return res.Deleted
	}
	kept := func(id int64) bool {
		t.Helper()
		_, ev, err := projection.GetDeadLetter(e.ctx, e.store, id)
		if err != nil {
			t.Fatal(err)
		}
		return ev != nil
	}
	// Every event but the three dead-lettered ones: the comments and "ok".
	if n := prune(); n != 4 {
		t.Fatalf("first prune deleted %d events, want 4", n)
	}
	for _, id := range ids {
		if !kept(id) {
			t.Fatalf("prune deleted the event of open dead letter %d", id)
		}
	}
	if err := projection.DiscardDeadLetters(e.ctx, e.store, ids[:1]); err != nil {
		t.Fatal(err)
	}
	failing.Store(false)
	if res, err := projection.RetryDeadLetter(e.ctx, e.store, p, ids[1], nil); err != nil || !res.Resolved {
		t.Fatalf("retry: %+v, %v", res, err)
	}
	if n := prune(); n != 2 {
		t.Fatalf("prune after a discard and a resolve deleted %d events, want their 2", n)
	}
	if kept(ids[0]) || kept(ids[1]) || !kept(ids[2]) {
		t.Fatalf("after the second prune: discarded kept %v, resolved kept %v, open kept %v; want false, false, true", kept(ids[0]), kept(ids[1]), kept(ids[2]))
	}
}
