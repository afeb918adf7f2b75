package projection_test

import (
	"context"
	"testing"
	"time"

	"github.com/projectorhq/projector/projection"
)

// With Config.EventSpans each handled event gets a child span of its batch
// span, linked to the event's append; without it, none.
func TestTrace_EventSpans(t *testing.T) {
	t.Parallel()
	for _, on := range []bool{true, false} {
		e := newTracedEnv(t)
		e.appendTraced("per-event", 2)
		p := projection.NewAsync("evspans", projection.AsyncConfig{})
		must(projection.OnEvent(p, e.types.Opened, nothing))
		d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}, TracerProvider: e.tp, EventSpans: on})
		ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
		if err := d.CatchUp(ctx); err != nil {
			cancel()
			t.Fatal(err)
		}
		cancel()
		batch := e.spans("process evspans", 1)[0]
		producers := e.producers()
		n := 0
		for _, s := range e.rec.Ended() {
			if s.Name() != "process evspans ticket.opened" {
				continue
			}
			n++
			if s.Parent().SpanID() != batch.SpanContext().SpanID() {
				t.Errorf("event span's parent %v, want the batch span", s.Parent())
			}
			if len(s.Links()) != 1 {
				t.Fatalf("event span links %v, want its append", s.Links())
			}
			if _, ok := producers[s.Links()[0].SpanContext.SpanID()]; !ok {
				t.Errorf("event span links to %v, which is no append span", s.Links()[0].SpanContext.SpanID())
			}
		}
		if want := map[bool]int{true: 2, false: 0}[on]; n != want {
			t.Errorf("EventSpans %v: %d event spans, want %d", on, n, want)
		}
	}
}
