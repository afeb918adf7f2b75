package projection_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
)

// upperStream returns a stream id of type ticket (no tenant) in the upper
// of two partitions.
func upperStream(t *testing.T, prefix string) string {
	t.Helper()
	upper := segment(t, 1, 2)
	for i := range 1000 {
		if id := fmt.Sprintf("%s-%d", prefix, i); upper.Contains(streamHash(id)) {
			return id
		}
	}
	t.Fatal("no stream id in the upper half")
	return ""
}

// An upper half standing at its merge hold is passed by the balancing
// round's wakes (its lower half looks for the merge, mergehandoff.go), so
// a merge that gives up must wake it by name when it lifts the holds:
// here nothing else would before Recheck (a minute), and the event held
// back behind the hold must be applied at once. Without the wakes by name
// it waited for Recheck ("applied after the holds were lifted" timed out).
func TestLiftedHoldWakesTheStandingUpperHalf(t *testing.T) {
	t.Parallel()
	e := partitioned(t)
	const consumer = "lifted"
	p := counting(e.schema, e.types, consumer, projection.AsyncConfig{Partitions: 2, BatchSize: 5})
	d := e.dispatcher(projection.Config{Projections: []*projection.Async{p}, Recheck: time.Minute})
	ids := []string{projection.PartitionInstance(0, 2), projection.PartitionInstance(1, 2)}
	stream := upperStream(t, "up")
	e.appendOne(stream, projector.ExactVersion(0), testevents.TicketOpened{Title: "t"})
	e.catchUp(d)

	// The lower half kept from its passes, the upper half ahead of it;
	// the pair held at the upper half's cursor, as a merge holds it.
	unlock := e.sessionShardLocks(consumer, ids[0])
	defer unlock(ids[0])
	e.appendOne(stream, projector.ExactVersion(1), testevents.TicketCommented{Body: "c"})
	eventually(t, 30*time.Second, "the upper half applies its event, past the lower half", func() bool {
		n, _ := e.counts(consumer)
		s := e.partitionShards(consumer)
		return n[stream] == 2 && s[0].Cursor.Less(s[1].Cursor)
	})
	hold, _ := e.holdByHand(consumer, ids[0])
	if s := e.partitionShards(consumer); s[1].Cursor != hold {
		t.Fatalf("held at %s, want the upper half's cursor %s", hold, s[1].Cursor)
	}
	// A pass that found its lock taken by the hold waits for a wake, as
	// the command's NOTIFY brings it; then an event past the hold.
	if err := projection.WakeShards(e.ctx, e.store, projection.ShardID{Consumer: consumer, Instance: ids[1]}); err != nil {
		t.Fatal(err)
	}
	e.appendOne(stream, projector.ExactVersion(2), testevents.TicketCommented{Body: "held back"})
	eventually(t, 30*time.Second, "the upper half stands at its hold", func() bool {
		return projection.StandingAtHold(d, consumer, ids[1])
	})
	if n, _ := e.counts(consumer); n[stream] != 2 {
		t.Fatalf("%d events of %s applied before the holds were lifted, want 2", n[stream], stream)
	}

	if err := projection.UnholdOf(e.ctx, projection.NewAdmin(e.store), consumer, hold); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "the event held back applied after the holds were lifted", func() bool {
		n, _ := e.counts(consumer)
		return n[stream] == 3
	})
	e.checkCounts(consumer, map[string]int64{stream: 3})
}
