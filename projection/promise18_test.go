package projection_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
)

// parkChaos is a ParkStream counting projection that fails, until
// deployed: every event of a stream whose id ends in 7 from version 3 on
// (streams that fail repeatedly), about 3 % of the other events always
// (picked by event id), and 5 % of all attempts at random (transient, so
// mostly retried away before MaxAttempts).
func parkChaos(schema string, types testevents.Types, batch int, deployed bool) *projection.Async {
	p := projection.NewAsync("parking", projection.AsyncConfig{ErrorMode: projection.ParkStream, BatchSize: batch,
		MaxAttempts: 2, RetryBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
	count := countingHandler(schema, "parking")
	h := func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		if !deployed {
			hash := fnv.New32a()
			hash.Write(ev.ID[:])
			switch {
			case strings.HasSuffix(ev.Stream.ID, "7") && ev.Version >= 3:
				return errors.New("stream 7 is poisoned")
			case hash.Sum32()%33 == 0:
				return errors.New("this event is poison")
			case rand.IntN(20) == 0:
				return errors.New("transient failure")
			}
		}
		return count(ctx, tx, ev)
	}
	must(projection.OnEvent(p, types.Opened, h))
	must(projection.OnEvent(p, types.Commented, h))
	return p
}

// Promise 18: under ParkStream a stream's events are applied in version
// order or not at all, and a parked event is applied exactly once. Failures
// of a few % of events, streams that fail repeatedly and transient ones,
// under concurrent writers (one holding its transactions open so they
// commit late) and dispatcher processes SIGKILLed at random: until retried,
// every stream's applied events are a prefix of its log (a parked stream's
// up to its parked event), and every event is either applied or parked.
// Then a deploy (new processes whose handler succeeds) and retries of every
// park racing the dispatchers and more appends: every stream's events
// applied exactly once each, in order. The writers append 800 events over
// 80 streams (1,500 in a soak run, see pgtest.EnvSoak), the processes being
// killed every 50–300 ms while they write.
func TestPromise18_ParkedStreamKeepsItsOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	url := pgtest.URL(t)
	const batch = 20
	start := func(mode string) *pgtest.Child { return e.startChild(url, batch, childPark+"="+mode) }
	children := []*pgtest.Child{start("failing"), start("failing")}

	// Writers: four appending concurrently, one holding its transactions
	// open (late commits), while children are killed and replaced.
	var versions map[string]int64
	late := map[string]int64{}
	var wg sync.WaitGroup
	wg.Go(func() { versions = appendWith(t, e.ctx, e.store, 4, pgtest.Size(800, 1500), 80, "s") })
	wg.Go(func() {
		for i := range 30 {
			id := fmt.Sprintf("late-%d", i%5)
			var payload any = testevents.TicketCommented{Body: "late"}
			if late[id] == 0 {
				payload = testevents.TicketOpened{Title: id}
			}
			err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
				if _, err := e.store.Append(e.ctx, tx, projector.Stream("ticket", id), projector.ExactVersion(late[id]), payload); err != nil {
					return err
				}
				_, err := tx.Exec(e.ctx, `SELECT pg_sleep(0.03)`) // commits late: others commit meanwhile
				return err
			})
			if err != nil {
				t.Errorf("late append: %v", err)
				return
			}
			late[id]++
		}
	})
	writing := make(chan struct{})
	go func() { wg.Wait(); close(writing) }()
	rng := rand.New(rand.NewPCG(18, 18))
	kills := 0
	for done := false; !done; {
		select {
		case <-writing:
			done = true
		case <-time.After(time.Duration(50+rng.IntN(250)) * time.Millisecond): // a random moment, not a synchronisation
			i := rng.IntN(len(children))
			children[i].Kill(t)
			children[i] = start("failing")
			kills++
		}
	}
	for id, v := range late {
		versions[id] = v
	}
	want := total(versions)

	// Until retried: every event applied or parked, every stream a prefix.
	held := func() (n int64) {
		if err := e.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+e.table("projector_parked_events")).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	eventually(t, 2*time.Minute, "every event applied or parked", func() bool { return e.applied("parking")+held() >= want })
	got, bad := e.counts("parking")
	if bad != 0 {
		t.Fatalf("%d events applied out of order or twice before any retry", bad)
	}
	parks := e.openParks("parking")
	if len(parks) == 0 {
		t.Fatal("nothing parked: the test's failures did not happen")
	}
	parkedFrom := map[string]projection.Park{}
	for _, pk := range parks {
		parkedFrom[pk.StreamID] = pk
	}
	for id, v := range versions {
		pk, parked := parkedFrom[id]
		switch {
		case parked && (got[id] != pk.Version-1 || int64(pk.Events) != v-pk.Version+1):
			t.Fatalf("stream %s parked at v%d with %d events: applied %d of %d", id, pk.Version, pk.Events, got[id], v)
		case !parked && got[id] != v:
			t.Fatalf("stream %s not parked: applied %d of %d", id, got[id], v)
		}
	}
	if applied := e.applied("parking"); applied+held() != want {
		t.Fatalf("%d applied + %d parked, want %d: an event applied twice or lost", applied, held(), want)
	}

	// The deploy: new processes whose handlers succeed; retries of every
	// park race their passes, appends to the parked streams and a kill.
	for i, c := range children {
		c.Kill(t)
		children[i] = start("deployed")
	}
	fixed := parkChaos(e.schema, e.types, batch, true)
	var ops sync.WaitGroup
	for i, pk := range parks {
		ops.Go(func() {
			res, err := projection.RetryPark(e.ctx, e.store, fixed, pk.ID, "promise18", nil)
			if err != nil || !res.Resolved {
				t.Errorf("retry of park %d: %+v, %v", pk.ID, res, err)
			}
		})
		if i == len(parks)/2 {
			children[0].Kill(t)
			children[0] = start("deployed")
		}
	}
	for _, pk := range parks {
		id := pk.StreamID
		e.appendOne(id, projector.ExactVersion(versions[id]), testevents.TicketCommented{Body: "after the park"})
		versions[id]++
	}
	ops.Wait()
	want = total(versions)
	eventually(t, 2*time.Minute, "every event applied after the retries", func() bool { return e.applied("parking") >= want })
	for _, c := range children {
		c.Terminate(t)
	}
	e.checkCounts("parking", versions)
	if n := held(); n != 0 {
		t.Fatalf("%d events still parked after every park was retried", n)
	}
	t.Logf("%d events, %d kills, %d parks retried", want, kills, len(parks))
}
