package sagatest

import (
	"context"
	"testing"
	"time"

	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
	"github.com/projectorhq/projector/stores/postgres"
)

// Live is a saga running against a real database in a test: a dispatcher
// with the saga's consumer, and a timeout runner fired by [Live.Settle].
// Both stop when the test ends.
type Live struct {
	t testing.TB
	d *projection.Dispatcher
	r *saga.Runner
}

// Run starts s on store for the rest of the test. Give the saga an
// injected clock (saga.Config.Now) to move time; then [Live.Settle] fires
// what fell due.
func Run[S any](t testing.TB, store *postgres.Store, s *saga.Saga[S]) *Live {
	t.Helper()
	p, err := s.Projection(store)
	if err != nil {
		t.Fatalf("sagatest: %v", err)
	}
	d, err := projection.New(projection.Config{Store: store, Projections: []*projection.Async{p},
		PollMax: 20 * time.Millisecond, Recheck: 20 * time.Millisecond})
	if err != nil {
		t.Fatalf("sagatest: %v", err)
	}
	r, err := saga.NewRunner(saga.RunnerConfig{Store: store, Sagas: []saga.Definition{s}})
	if err != nil {
		t.Fatalf("sagatest: %v", err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatalf("sagatest: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := d.Stop(ctx); err != nil {
			t.Errorf("sagatest: stop dispatcher: %v", err)
		}
	})
	return &Live{t: t, d: d, r: r}
}

// Settle waits until the saga has handled every committed event and fired
// every timeout due by its clock, including what those steps appended and
// scheduled; a step's error fails the test.
func (l *Live) Settle(ctx context.Context) {
	l.t.Helper()
	for {
		if err := l.d.CatchUp(ctx); err != nil {
			l.t.Fatalf("sagatest: catch up: %v", err)
		}
		n, err := l.r.FireDue(ctx)
		if err != nil {
			l.t.Fatalf("sagatest: fire timeouts: %v", err)
		}
		if n == 0 {
			return
		}
	}
}
