package projection

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/projectorhq/projector"
)

// groupBatch keeps every event exactly once, each tenant in its own batch,
// each stream's events in log order, streams in order of first appearance.
func TestGroupBatch(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 50 {
		var events []projector.Event
		versions := map[projector.StreamRef]int64{}
		for i := range rng.IntN(300) {
			ref := projector.TenantStream(fmt.Sprint("t", rng.IntN(3)), "x", fmt.Sprint(rng.IntN(20)))
			versions[ref]++
			events = append(events, projector.Event{Stream: ref, Version: versions[ref], Position: projector.Position{TxID: 1, Seq: int64(i)}})
		}
		batches := groupBatch(events)
		seen := 0
		tenants := map[string]bool{}
		for _, b := range batches {
			if tenants[b.Tenant] {
				t.Fatalf("round %d: tenant %s in two batches", round, b.Tenant)
			}
			tenants[b.Tenant] = true
			var lastFirst int64 = -1
			for _, s := range b.Streams {
				if s.Events[0].Position.Seq <= lastFirst {
					t.Fatalf("round %d: streams out of first-appearance order", round)
				}
				lastFirst = s.Events[0].Position.Seq
				for i, ev := range s.Events {
					if ev.Stream != s.Stream || ev.Stream.Tenant != b.Tenant || ev.Version != int64(i+1) {
						t.Fatalf("round %d: stream %s event %d: %+v", round, s.Stream, i, ev)
					}
				}
				seen += len(s.Events)
			}
		}
		if seen != len(events) {
			t.Fatalf("round %d: %d events grouped, want %d", round, seen, len(events))
		}
	}
}
