package projection_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
)

// The append-to-applied histogram observes each applied event, and an
// event appended under a sampled span carries its trace id as an exemplar
// in the registry's gathered output; an untraced event adds none.
func TestTrace_ApplyDelayExemplars(t *testing.T) {
	t.Parallel()
	e := newTracedEnv(t)
	requests := e.appendTraced("exemplar", 2)
	err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
		_, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", "untraced"), projector.NoStream, testevents.TicketOpened{Title: "x"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	p := projection.NewAsync("delayed", projection.AsyncConfig{})
	must(projection.OnEvent(p, e.types.Opened, nothing))
	reg := prometheus.NewRegistry()
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}, TracerProvider: e.tp, Registerer: reg})
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}

	// CatchUp returns once the cursors are committed; the pass observes
	// the delays just after its COMMIT returns, so they may trail by a
	// moment on a loaded machine (CI once saw none yet).
	var count uint64
	var exemplars map[string]bool
	gather := func() {
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		count, exemplars = 0, map[string]bool{}
		for _, f := range families {
			if f.GetName() != "projector_event_apply_delay_seconds" {
				continue
			}
			for _, m := range f.GetMetric() {
				h := m.GetHistogram()
				count += h.GetSampleCount()
				for _, b := range h.GetBucket() {
					if ex := b.GetExemplar(); ex != nil {
						for _, l := range ex.GetLabel() {
							if l.GetName() == projection.ExemplarTraceID {
								exemplars[l.GetValue()] = true
							}
						}
					}
				}
			}
		}
	}
	eventually(t, 10*time.Second, "three apply delay observations", func() bool { gather(); return count >= 3 })
	if count != 3 {
		t.Fatalf("apply delay observations: got %d, want 3", count)
	}
	// A bucket keeps its latest exemplar: both traced events may land in
	// one bucket, so at least one of the two requests' ids is there, and
	// no other id.
	if len(exemplars) == 0 {
		t.Fatal("no trace id exemplar on the apply delay histogram")
	}
	for id := range exemplars {
		if id != requests[0].TraceID().String() && id != requests[1].TraceID().String() {
			t.Errorf("exemplar trace id %s is no request's", id)
		}
	}
}
