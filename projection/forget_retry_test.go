package projection_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/projection"
)

// Retries racing a forget on a partitioned consumer (promise 19 across
// promise 16). An operator's retry of a parked stream or of a dead letter
// applies a customer's event outside the pass: it reads the event with
// the subject's key still there and hands the handler the name in the
// clear. If the forget commits while the retry runs, and the partition
// holding the subject's stream applies the forgotten event before the
// retry commits, that OnForgotten cannot see the retry's uncommitted row:
// the name would survive the forget. Each test holds the retry in its
// handler (at advisory locks the test holds) across that window, as
// TestPartitionedPassRacingForget holds a pass.
//
// Before the retries guarded against forgets (forgetguard.go
// applyGuarded), each of these failed: the read model kept the name for
// good.

// retryRacingForget runs consumer "customers" in two partitions with
// errors handled by mode: the target's event fails and is parked or
// dead-lettered; then the handler is fixed, and the forget of the target
// commits while the retry prepare returns holds (forgetAcross). The
// retry runs on a goroutine of its own; check, on the test's, then says
// whether it resolved.
func retryRacingForget(t *testing.T, mode projection.ErrorMode,
	prepare func(r *forgetRace, p *projection.Async) (retry func() error, check func()),
) {
	t.Helper()
	r := newForgetRace(t)
	failing := &atomic.Bool{}
	failing.Store(true)
	p := projection.NewAsync("customers", projection.AsyncConfig{Partitions: 2, ErrorMode: mode, MaxAttempts: 1,
		Tables: []string{r.store.Schema() + ".customers"}})
	g1, g2 := r.gate(), r.gate()
	r.copyNames(p, g1, g2, failing)
	d := (&env{t: t, ctx: r.ctx, store: r.store, schema: r.store.Schema()}).dispatcher(projection.Config{Projections: []*projection.Async{p}})
	r.register(r.target)
	ctx, cancel := context.WithTimeout(r.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	retry, check := prepare(r, p)
	failing.Store(false)
	retried := make(chan error, 1)
	r.forgetAcross("customers", g1, g2, func() { go func() { retried <- retry() }() })
	if err := <-retried; err != nil {
		t.Fatal(err)
	}
	check()
	r.noNameAfterCatchUp(d)
	// Not dropped: the retry applied the event again, as it reads now
	// (Forgotten, the name null), and committed that.
	var blank int
	if err := r.pool.QueryRow(r.ctx, `SELECT count(*) FROM `+r.customers+` WHERE customer_id = $1 AND coalesce(name, '') = ''`,
		r.target).Scan(&blank); err != nil || blank != 1 {
		t.Fatalf("the target's rows without a name: %d, %v; want the retry's one, applied again as forgotten", blank, err)
	}
}

// onlyOpenPark returns the id of the consumer's one open park.
func (r *forgetRace) onlyOpenPark() int64 {
	r.t.Helper()
	parks, err := projection.ListParks(r.ctx, r.store, projection.ParkFilter{Consumer: "customers", Status: projection.ParkOpen})
	if err != nil || len(parks) != 1 || parks[0].StreamID != r.target {
		r.t.Fatalf("open parks: %+v, %v; want the target's stream's", parks, err)
	}
	return parks[0].ID
}

func TestPartitionedParkRetryRacingForget(t *testing.T) {
	t.Parallel()
	retryRacingForget(t, projection.ParkStream, func(r *forgetRace, p *projection.Async) (func() error, func()) {
		id := r.onlyOpenPark()
		var res projection.ParkRetryResult
		retry := func() (err error) {
			res, err = projection.RetryPark(r.ctx, r.store, p, id, "tester", nil)
			return err
		}
		return retry, func() {
			if !res.Resolved {
				t.Fatalf("retry: %+v; want it resolved", res)
			}
		}
	})
}

// TestPartitionedParkRetryRequestRacingForget: the same, the retry
// carried out by the dispatcher for a request (`projector parked retry`).
func TestPartitionedParkRetryRequestRacingForget(t *testing.T) {
	t.Parallel()
	retryRacingForget(t, projection.ParkStream, func(r *forgetRace, _ *projection.Async) (func() error, func()) {
		id := r.onlyOpenPark()
		return func() error { return projection.RequestParkRetry(r.ctx, r.store, id, "tester") }, func() {
			var pk projection.Park
			pgtest.Eventually(t, time.Minute, "the dispatcher to carry out the retry request", func() bool {
				var err error
				if pk, _, err = projection.GetPark(r.ctx, r.store, id); err != nil {
					t.Fatal(err)
				}
				return pk.Status != projection.ParkOpen || pk.RetryRequestedAt == nil
			})
			if pk.Status != projection.ParkResolved {
				t.Fatalf("park after the request: %+v; want it resolved", pk)
			}
		}
	})
}

func TestPartitionedDeadLetterRetryRacingForget(t *testing.T) {
	t.Parallel()
	retryRacingForget(t, projection.SkipApplyErrors, func(r *forgetRace, p *projection.Async) (func() error, func()) {
		dls, err := projection.ListDeadLetters(r.ctx, r.store, projection.DeadLetterFilter{Consumer: "customers", Status: projection.DeadLetterOpen})
		if err != nil || len(dls) != 1 || dls[0].StreamID != r.target {
			t.Fatalf("open dead letters: %+v, %v; want the target's event's", dls, err)
		}
		var res projection.RetryResult
		retry := func() (err error) {
			res, err = projection.RetryDeadLetter(r.ctx, r.store, p, dls[0].ID, nil)
			return err
		}
		return retry, func() {
			if !res.Resolved {
				t.Fatalf("retry: %+v; want it resolved", res)
			}
		}
	})
}
