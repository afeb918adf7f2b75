package saga_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	"github.com/projectorhq/projector/saga"
)

// TestPromise18_SagaParksSurviveKills runs the parking saga in child
// processes SIGKILLed at random moments while tickets are opened, commented
// on (one comment in eight a poison) and assigned from another stream.
// Once a last child has caught up, every instance has applied exactly the
// events before its first poison, in order, and is parked with all the
// rest, or has applied all of them; after the fix, retries of every park
// leave each instance with its whole sequence applied once, in log order.
func TestPromise18_SagaParksSurviveKills(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills child processes")
	}
	t.Parallel()
	e := newEnv(t)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 18))
	want := map[string][]string{} // each instance's steps, in log order
	var keys []string
	appendSome := func() {
		for range 3 {
			id := fmt.Sprintf("t-%d", len(keys))
			keys = append(keys, id)
			e.append(ticket(id), testevents.TicketOpened{Title: id})
			want[id] = []string{"opened"}
		}
		for range 12 {
			id := keys[rng.IntN(len(keys))]
			body := fmt.Sprintf("c%d", len(want[id]))
			if rng.IntN(8) == 0 {
				body = "poison"
			}
			e.append(ticket(id), testevents.TicketCommented{Body: body})
			want[id] = append(want[id], body)
		}
		if rng.IntN(2) == 0 {
			id := keys[rng.IntN(len(keys))]
			e.append(projector.Stream("agent", "ann"), Assigned{Ticket: id, Agent: "ann"})
			want[id] = append(want[id], "agent ann")
		}
	}
	// Three kills by default (a few dozen poisons among the events),
	// PROJECTOR_SOAK eight.
	for kills := 0; kills < 8; kills++ {
		c := e.startChild(0, childPark+"=1")
		appendSome()
		// Kill at a random moment; the child never exits on its own.
		select {
		case <-c.Done():
			t.Fatalf("child exited without being killed:\n%s", c.Output())
		case <-time.After(time.Duration(30+rng.IntN(150)) * time.Millisecond):
			c.Kill(t)
		}
	}
	c := e.startChild(0, childPark+"=1")
	// Until retried: the prefix before the first poison applied, the rest
	// parked.
	applied := func(seq []string) []string {
		if i := slices.Index(seq, "poison"); i >= 0 {
			return seq[:i]
		}
		return seq
	}
	for deadline := time.Now().Add(60 * time.Second); ; {
		diff := converged(t, e, want, applied)
		if diff == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the last child did not apply or park every event in 60s: %s", diff)
		}
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
	c.Terminate(t)

	fixed, poison := newParking(e, newClock())
	poison.Store(false)
	p, err := fixed.Projection(e.store)
	if err != nil {
		t.Fatal(err)
	}
	parks, err := projection.ListParks(e.ctx, e.store, projection.ParkFilter{Consumer: "sla", Status: projection.ParkOpen, Limit: 10_000})
	if err != nil {
		t.Fatal(err)
	}
	for _, pk := range parks {
		if res, err := projection.RetryPark(e.ctx, e.store, p, pk.ID, "op", nil); err != nil || !res.Resolved {
			t.Fatalf("retry park %d of %s: %+v, %v", pk.ID, pk.SagaKey(), res, err)
		}
	}
	if diff := converged(t, e, want, func(seq []string) []string { return seq }); diff != "" {
		t.Fatal(diff)
	}
	t.Logf("%d instances, %d parked and retried", len(keys), len(parks))
}

// converged compares every instance with what it should have applied
// (applied of its whole sequence; parked, holding the rest, when that is
// not all of it) and returns the first difference, "" when none.
func converged(t *testing.T, e *env, want map[string][]string, applied func([]string) []string) string {
	t.Helper()
	list, err := saga.List(e.ctx, e.store, saga.ListQuery{Saga: "sla", Limit: 10_000})
	if err != nil {
		t.Fatal(err)
	}
	parks, err := projection.ListParks(e.ctx, e.store, projection.ParkFilter{Consumer: "sla", Status: projection.ParkOpen, Limit: 10_000})
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]int{}
	for _, pk := range parks {
		held[pk.SagaKey()] = pk.Events
	}
	if len(list) != len(want) {
		return fmt.Sprintf("%d instances, want %d", len(list), len(want))
	}
	for _, in := range list {
		var st seenState
		if err := json.Unmarshal(in.State, &st); err != nil {
			t.Fatal(err)
		}
		seq := want[in.Key]
		got, wantApplied := st.Seen, applied(seq)
		parked := len(wantApplied) < len(seq)
		switch {
		case !slices.Equal(got, wantApplied):
			return fmt.Sprintf("%s applied %v, want %v", in.Key, got, wantApplied)
		case parked && (in.Status != saga.Parked || held[in.Key] != len(seq)-len(wantApplied)):
			return fmt.Sprintf("%s is %s with %d events held, want parked with %d", in.Key, in.Status, held[in.Key], len(seq)-len(wantApplied))
		case !parked && (in.Status != saga.Active || held[in.Key] != 0):
			return fmt.Sprintf("%s is %s with %d events held, want active", in.Key, in.Status, held[in.Key])
		}
	}
	return ""
}
