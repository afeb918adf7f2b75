package jetstream_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	pjs "github.com/projectorhq/projector/stores/jetstream"
	"github.com/projectorhq/projector/stores/postgres"
)

// Promise 18 for the claims consumer: poison events in a few streams (one
// of them poisoned twice) under concurrent writers with late commits, a
// relay publishing meanwhile, and claims-consumer processes SIGKILLed at
// random. Per stream the applied sequence is a prefix of the stream's, up
// to the first poisoned event, the rest parked in order; after a retry of
// every park through the fixed handler (the deploy), every event is
// applied exactly once, in stream order.
func TestPromise18_ClaimsConsumerParksSurviveKills(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.relay(e.relayConfig())
	e.dispatcher(r.Async())
	snk := newSink(t, e.types.Registry)
	e.jsConsumer("p18")

	const streams, perStream = 8, 18
	// poison[k] lists the versions of stream k the child's handler fails on.
	poison := map[int][]int{1: {5}, 4: {7, 12}, 6: {1}}
	isPoison := func(k, v int) bool {
		for _, p := range poison[k] {
			if p == v {
				return true
			}
		}
		return false
	}
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for w := range 4 {
		wg.Go(func() {
			for v := 1; v <= perStream; v++ {
				for _, k := range []int{w, w + 4} {
					body := "fine"
					if isPoison(k, v) {
						body = "poison"
					}
					err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
						_, err := e.store.Append(e.ctx, tx, projector.TenantStream("acme", "ticket", "s"+strconv.Itoa(k)), projector.ExactVersion(int64(v-1)),
							testevents.TicketCommented{Body: body, N: v})
						if err == nil && (v+k)%5 == 0 {
							// Commit late, behind other writers' later
							// sequence values.
							_, err = tx.Exec(e.ctx, `SELECT pg_sleep(0.03)`)
						}
						return err
					})
					if err != nil {
						errs <- err
						return
					}
				}
			}
		})
	}
	// prefix checks, at any moment, that each stream's applied versions are
	// 1..k in order, none twice, and none at or past its first poison.
	prefix := func(when string) map[string][]int64 {
		t.Helper()
		rows, err := snk.store.Pool().Query(e.ctx, `SELECT stream, version FROM `+snk.effects+` ORDER BY n`)
		if err != nil {
			t.Fatal(err)
		}
		applied := map[string][]int64{}
		for rows.Next() {
			var s string
			var v int64
			if err := rows.Scan(&s, &v); err != nil {
				t.Fatal(err)
			}
			applied[s] = append(applied[s], v)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		for k := range streams {
			ref := projector.TenantStream("acme", "ticket", "s"+strconv.Itoa(k)).String()
			for i, v := range applied[ref] {
				if v != int64(i+1) || (len(poison[k]) > 0 && v >= int64(poison[k][0])) {
					t.Fatalf("%s: %s applied %v: not a prefix before the first poison", when, ref, applied[ref])
				}
			}
		}
		return applied
	}
	childEnvs := claimsChildEnv(e, "park", snk.store.Schema(), "p18")
	writing := make(chan struct{})
	go func() { wg.Wait(); close(writing) }()
	kills := 0
	for done := false; !done || kills < 6; kills++ {
		select {
		case <-writing:
			done = true
		default:
		}
		before := snk.count(t) + snk.parkedCount(t, "p18")
		child := pgtest.StartChild(t, childEnvs...)
		if kills%2 == 0 {
			// Once it has settled some messages, so the kill lands in
			// the middle of its work, not before it started.
			deadline := time.Now().Add(10 * time.Second)
			for snk.count(t)+snk.parkedCount(t, "p18") == before && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond) // polling
			}
		}
		// Chaos, not synchronisation: kill it at a random moment of its work.
		time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond)
		child.Kill(t)
		prefix(fmt.Sprintf("after kill %d", kills+1))
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d consumer processes SIGKILLed, %d of %d events settled by then", kills, snk.count(t)+snk.parkedCount(t, "p18"), streams*perStream)

	// A last child runs until every event is applied or parked.
	pgtest.StartChild(t, childEnvs...)
	total := streams * perStream
	waitFor(t, "every event applied or parked", 90*time.Second, func() bool { return snk.count(t)+snk.parkedCount(t, "p18") == total })
	log := e.logEvents()
	if len(log) != total {
		t.Fatalf("%d events in the log, want %d", len(log), total)
	}

	// Per stream: a prefix applied, the rest parked in order.
	applied := prefix("drained")
	parks := openParks(t, snk.store, "p18")
	parkOf := map[string]pjs.Park{}
	for _, p := range parks {
		parkOf[p.Stream().String()] = p
	}
	for k := range streams {
		ref := projector.TenantStream("acme", "ticket", "s"+strconv.Itoa(k))
		applies := perStream
		if len(poison[k]) > 0 {
			applies = poison[k][0] - 1
		}
		got := applied[ref.String()]
		if len(got) != applies {
			t.Errorf("%s: applied %v, want versions 1..%d", ref, got, applies)
			continue
		}
		for i, v := range got {
			if v != int64(i+1) {
				t.Errorf("%s: applied %v, want versions 1..%d in order", ref, got, applies)
				break
			}
		}
		p, parked := parkOf[ref.String()]
		if parked != (applies < perStream) {
			t.Errorf("%s: parked %v, want %v", ref, parked, applies < perStream)
			continue
		}
		if !parked {
			continue
		}
		_, msgs, err := pjs.GetPark(e.ctx, snk.store, "p18", p.ID)
		if err != nil {
			t.Fatal(err)
		}
		if p.Version != int64(applies+1) || len(msgs) != perStream-applies {
			t.Errorf("%s: parked at v%d with %d messages, want v%d with %d", ref, p.Version, len(msgs), applies+1, perStream-applies)
		}
		for i, m := range msgs {
			if m.Version != int64(applies+1+i) {
				t.Errorf("%s: parked message %d is v%d, want v%d", ref, i, m.Version, applies+1+i)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// The deploy: the fixed handler retries every park.
	fixed, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: "p18", Handler: snk.record, ErrorMode: pjs.ParkStream,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range parks {
		if _, err := fixed.RetryPark(e.ctx, p.ID, "deploy"); err != nil {
			t.Fatal(err)
		}
	}
	snk.check(t, log)
}

// runParkChild is a claims consumer process of
// TestPromise18_ClaimsConsumerParksSurviveKills: under ParkStream, its
// handler records each event's effect and fails on poison ones, until the
// parent kills it.
func runParkChild() int {
	return consumeInChild(context.Background(), postgres.Config{Registry: testevents.New().Registry}, func(store *postgres.Store) pjs.ConsumerConfig {
		snk := &sink{store: store, effects: store.Table("effects")}
		return pjs.ConsumerConfig{Subscription: "p18", ErrorMode: pjs.ParkStream, MaxDeliver: 2,
			Backoff: 10 * time.Millisecond, MaxBackoff: 40 * time.Millisecond, HoldDelay: 20 * time.Millisecond,
			Logger:  slog.New(slog.DiscardHandler),
			Handler: snk.failOnPoison(nil)}
	})
}
