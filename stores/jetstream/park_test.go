package jetstream_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	pjs "github.com/projectorhq/projector/stores/jetstream"
	"github.com/projectorhq/projector/stores/postgres"
)

// gaugeValue reads name{subscription} from reg; ok is false while the
// series does not exist.
func gaugeValue(t testing.TB, reg *prometheus.Registry, name, subscription string) (v float64, ok bool) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "subscription" && l.GetValue() == subscription {
					return m.GetGauge().GetValue(), true
				}
			}
		}
	}
	return 0, false
}

// parkedCount is how many messages the open parks of subscription hold.
func (s *sink) parkedCount(t testing.TB, subscription string) int {
	t.Helper()
	var n int
	if err := s.store.Pool().QueryRow(context.Background(), `SELECT count(*) FROM `+s.store.Table("projector_jetstream_parked_messages")+` m
		JOIN `+s.store.Table("projector_jetstream_parks")+` p ON p.id = m.park_id WHERE p.subscription = $1 AND p.status = 'parked'`, subscription).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func openParks(t testing.TB, store *postgres.Store, subscription string) []pjs.Park {
	t.Helper()
	parks, err := pjs.ListParks(context.Background(), store, pjs.ParkFilter{Subscription: subscription, Status: projection.ParkOpen})
	if err != nil {
		t.Fatal(err)
	}
	return parks
}

// Under ParkStream a poisoned event parks its stream: it and the stream's
// later events are stored, claimed and acknowledged, never reaching the
// handler, while other streams go on. A failed retry keeps the park and
// records the error; a retry through the fixed handler applies the whole
// sequence in order, and the stream's later events apply after it.
func TestConsumerParkStreamHoldsTheStreamUntilRetried(t *testing.T) {
	e := newEnv(t)
	r := e.relay(e.relayConfig())
	d := e.dispatcher(r.Async())
	for i := range 6 {
		body := "fine"
		if i == 1 {
			body = "poison"
		}
		e.append("acme", "p", testevents.TicketCommented{Body: body, N: i})
		if i < 3 {
			e.append("acme", "q", testevents.TicketCommented{Body: "fine", N: i})
		}
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	log := e.logEvents()
	snk := newSink(t, e.types.Registry)
	var cured atomic.Bool
	reg := prometheus.NewRegistry()
	c, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: "parking", MaxDeliver: 2, ErrorMode: pjs.ParkStream,
		Backoff: 20 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, HoldDelay: 20 * time.Millisecond, Registerer: reg,
		Logger:  slog.New(slog.DiscardHandler),
		Handler: snk.failOnPoison(&cured)})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := c.Consume(e.ctx, e.jsConsumer("parking"))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	waitFor(t, "q applied and p parked from v2", 30*time.Second, func() bool { return snk.count(t) == 4 && snk.parkedCount(t, "parking") == 5 })
	var applied, parked []projector.Event
	for _, ev := range log {
		if ev.Stream.ID == "p" && ev.Version >= 2 {
			parked = append(parked, ev)
		} else {
			applied = append(applied, ev)
		}
	}
	snk.check(t, applied)
	parks := openParks(t, snk.store, "parking")
	if len(parks) != 1 || parks[0].StreamID != "p" || parks[0].Version != 2 || parks[0].EventID != parked[0].ID ||
		parks[0].Messages != 5 || parks[0].Failures != 2 || parks[0].Error == "" {
		t.Fatalf("parks %+v, want p parked at v2 with 5 messages after 2 failures", parks)
	}
	_, msgs, err := pjs.GetPark(e.ctx, snk.store, "parking", parks[0].ID)
	if err != nil || len(msgs) != 5 {
		t.Fatalf("parked messages %+v, %v", msgs, err)
	}
	for i, m := range msgs {
		if m.EventID != parked[i].ID || m.Version != parked[i].Version {
			t.Fatalf("parked message %d: %s v%d, want %s v%d", i, m.EventID, m.Version, parked[i].ID, parked[i].Version)
		}
	}
	waitFor(t, "the parked-streams gauge at 1", 10*time.Second, func() bool {
		v, ok := gaugeValue(t, reg, "projector_jetstream_parked_streams", "parking")
		return ok && v == 1
	})
	if age, ok := gaugeValue(t, reg, "projector_jetstream_parked_oldest_age_seconds", "parking"); !ok || age < 0 || age > 600 {
		t.Fatalf("oldest park age %v (%v), want the seconds since the park opened", age, ok)
	}

	// Still failing: nothing applied, the park kept with the new error.
	var failed *pjs.ParkRetryFailedError
	if _, err := c.RetryPark(e.ctx, parks[0].ID, "ops"); !errors.As(err, &failed) || failed.Version != 2 {
		t.Fatalf("retry of a still-failing park: %v, want a ParkRetryFailedError at v2", err)
	}
	if p, _, err := pjs.GetPark(e.ctx, snk.store, "parking", parks[0].ID); err != nil || p.Status != projection.ParkOpen ||
		p.Failures != 3 || p.LastRetriedAt == nil || p.Messages != 5 || p.Error != "retry: v2: cannot handle poison" {
		t.Fatalf("after a failed retry: %+v, %v", p, err)
	}
	if n := snk.count(t); n != 4 {
		t.Fatalf("%d effects after a failed retry, want 4", n)
	}

	cured.Store(true)
	if n, err := c.RetryPark(e.ctx, parks[0].ID, "ops"); err != nil || n != 5 {
		t.Fatalf("retry: %d, %v", n, err)
	}
	if _, err := c.RetryPark(e.ctx, parks[0].ID, "ops"); !errors.Is(err, pjs.ErrParkNotOpen) {
		t.Fatalf("second retry: %v, want ErrParkNotOpen", err)
	}
	if _, err := c.DiscardPark(e.ctx, parks[0].ID, "ops"); !errors.Is(err, pjs.ErrParkNotOpen) {
		t.Fatalf("discard after the retry: %v, want ErrParkNotOpen", err)
	}
	if p, msgs, err := pjs.GetPark(e.ctx, snk.store, "parking", parks[0].ID); err != nil || p.Status != projection.ParkResolved ||
		p.ResolvedBy != "ops" || p.Messages != 5 || len(msgs) != 0 {
		t.Fatalf("after the retry: %+v, %d messages, %v", p, len(msgs), err)
	}
	if v, _ := gaugeValue(t, reg, "projector_jetstream_parked_streams", "parking"); v != 0 {
		t.Fatalf("parked-streams gauge %v after the retry, want 0", v)
	}
	if v, _ := gaugeValue(t, reg, "projector_jetstream_parked_oldest_age_seconds", "parking"); v != 0 {
		t.Fatalf("oldest park age %v after the retry, want 0", v)
	}
	// Live again: later events of p apply after the parked ones.
	e.append("acme", "p", testevents.TicketCommented{Body: "after", N: 7}, testevents.TicketCommented{Body: "after", N: 8})
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	log = e.logEvents()
	waitFor(t, "every event applied", 30*time.Second, func() bool { return snk.count(t) == len(log) })
	snk.check(t, log)
}

// testEvent is version v of stream, as the relay would publish it.
func testEvent(stream projector.StreamRef, v int) projector.Event {
	return projector.Event{ID: uuidFor(int(randUint16())<<16 | v), Stream: stream, Version: int64(v), Type: "ticket.commented", SchemaVersion: 1,
		Data: []byte(fmt.Sprintf(`{"body":"b","n":%d}`, v)), Position: projector.Position{TxID: 10, Seq: int64(v)}, RecordedAt: time.Now()}
}

var randCounter atomic.Uint32

func randUint16() uint32 { return randCounter.Add(1) & 0x7fff }

// parkOf writes, as the consumer does, a park of subscription for stream
// holding versions from..to (the stream's version moved to to) and returns
// its id and the events.
func (s *sink) parkOf(t testing.TB, subscription string, stream projector.StreamRef, from, to int) (int64, []projector.Event) {
	t.Helper()
	ctx := context.Background()
	var evs []projector.Event
	var id int64
	err := pgx.BeginFunc(ctx, s.store.Pool(), func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+s.store.Table("projector_jetstream_streams")+` (subscription, tenant_id, stream_type, stream_id, last_version)
			VALUES ($1, $2, $3, $4, $5)`, subscription, stream.Tenant, stream.Type, stream.ID, to); err != nil {
			return err
		}
		first := testEvent(stream, from)
		if err := tx.QueryRow(ctx, `INSERT INTO `+s.store.Table("projector_jetstream_parks")+` (subscription, tenant_id, stream_type, stream_id, event_id, event_type, version, error, failures)
			VALUES ($1, $2, $3, $4, $5, $6, $7, 'boom', 5) RETURNING id`, subscription, stream.Tenant, stream.Type, stream.ID, first.ID, first.Type, from).Scan(&id); err != nil {
			return err
		}
		for v := from; v <= to; v++ {
			ev := testEvent(stream, v)
			if v == from {
				ev = first
			}
			evs = append(evs, ev)
			msg, err := pjs.NewMsg("projector", ev)
			if err != nil {
				return err
			}
			headers, err := json.Marshal(msg.Header)
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+s.store.Table("projector_jetstream_claims")+` (subscription, event_id) VALUES ($1, $2)`, subscription, ev.ID); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO `+s.store.Table("projector_jetstream_parked_messages")+` (park_id, version, event_id, subject, headers, data)
				VALUES ($1, $2, $3, $4, $5, $6)`, id, ev.Version, ev.ID, msg.Subject, headers, msg.Data); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return id, evs
}

// Operators racing on one park, in real concurrent transactions released
// at once: of a retry and a discard, or of two retries, exactly one wins;
// the sequence is applied exactly when a retry won, once, and a discard is
// recorded with who and how many.
func TestJetStreamParkRetryDiscardRace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.New()
	snk := newSink(t, types.Registry)
	c, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: "feed", Handler: snk.record, ErrorMode: pjs.ParkStream,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	second, err := postgres.New(ctx, pgtest.NewPool(t, 4), postgres.Config{Schema: snk.store.Schema(), Registry: types.Registry})
	if err != nil {
		t.Fatal(err)
	}
	c2, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: second, Subscription: "feed", Handler: snk.record, ErrorMode: pjs.ParkStream,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	wins := map[string]int{}
	for i := range 16 {
		id, evs := snk.parkOf(t, "feed", projector.TenantStream("acme", "ticket", fmt.Sprintf("race-%d", i)), 3, 5)
		start := make(chan struct{})
		var wg sync.WaitGroup
		var errA, errB error
		twoRetries := i%4 == 3
		wg.Go(func() { <-start; _, errA = c.RetryPark(ctx, id, "alice") })
		wg.Go(func() {
			<-start
			if twoRetries {
				_, errB = c2.RetryPark(ctx, id, "bob")
			} else {
				_, errB = pjs.DiscardPark(ctx, second, "feed", id, "bob")
			}
		})
		close(start)
		wg.Wait()
		applied := 0
		for _, ev := range evs {
			applied += snk.effectsOf(t, ev)
		}
		p, msgs, err := pjs.GetPark(ctx, snk.store, "feed", id)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case errA == nil && errors.Is(errB, pjs.ErrParkNotOpen) && applied == 3 && p.Status == projection.ParkResolved && p.ResolvedBy == "alice":
			wins["alice"]++
		case errB == nil && errors.Is(errA, pjs.ErrParkNotOpen) && twoRetries && applied == 3 && p.Status == projection.ParkResolved && p.ResolvedBy == "bob":
			wins["bob"]++
		case errB == nil && errors.Is(errA, pjs.ErrParkNotOpen) && !twoRetries && applied == 0 && p.Status == projection.ParkDiscarded && p.ResolvedBy == "bob":
			wins["bob"]++
		default:
			t.Fatalf("round %d: alice %v, bob %v, applied %d, park %+v", i, errA, errB, applied, p)
		}
		if len(msgs) != 0 || p.Messages != 3 || p.ResolvedAt == nil {
			t.Fatalf("round %d: park %+v with %d messages left, want 3 recorded and none left", i, p, len(msgs))
		}
	}
	t.Logf("winners: %v", wins)
	if _, err := pjs.DiscardPark(ctx, snk.store, "feed", 1, ""); !errors.Is(err, projector.ErrInvalidTransition) {
		t.Fatalf("discard without saying who: %v", err)
	}
	if _, err := pjs.DiscardPark(ctx, snk.store, "feed", 1<<40, "ops"); !errors.Is(err, projector.ErrNotFound) {
		t.Fatalf("discard of a missing park: %v", err)
	}
}

// A message of the parked stream arriving while a retry runs waits for it
// (the stream's row lock) and is then applied after the whole parked
// sequence: neither lost (joining a park the retry is emptying) nor applied
// ahead of it.
func TestJetStreamParkRetryHoldsANewMessageBehind(t *testing.T) {
	e := newEnv(t)
	r := e.relay(e.relayConfig())
	if _, err := r.Ensure(e.ctx); err != nil {
		t.Fatal(err)
	}
	snk := newSink(t, e.types.Registry)
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	var block atomic.Bool
	block.Store(true)
	c, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: "gap", ErrorMode: pjs.ParkStream, Logger: slog.New(slog.DiscardHandler),
		Handler: func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
			if block.CompareAndSwap(true, false) {
				entered <- struct{}{}
				<-release
			}
			return snk.record(ctx, tx, ev)
		}})
	if err != nil {
		t.Fatal(err)
	}
	// The consumer of the new message works through a pool of one
	// connection, so the test sees its backend queue behind the retry.
	pool := pgtest.NewPool(t, 1)
	other, err := postgres.New(e.ctx, pool, postgres.Config{Schema: snk.store.Schema(), Registry: e.types.Registry})
	if err != nil {
		t.Fatal(err)
	}
	var pid uint32
	if err := pool.QueryRow(e.ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	c2, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: other, Subscription: "gap", Handler: snk.record, ErrorMode: pjs.ParkStream,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	stream := projector.TenantStream("acme", "ticket", "g")
	id, evs := snk.parkOf(t, "gap", stream, 1, 3)
	next := testEvent(stream, 4)
	msg, err := pjs.NewMsg(e.prefix, next)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.JetStream().PublishMsg(e.ctx, msg); err != nil {
		t.Fatal(err)
	}
	batch, err := e.jsConsumer("gap").Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	delivered, ok := <-batch.Messages()
	if !ok {
		t.Fatal("no message delivered")
	}

	var wg sync.WaitGroup
	var retried int
	var retryErr, handleErr error
	var outcome pjs.Outcome
	wg.Go(func() { retried, retryErr = c.RetryPark(e.ctx, id, "ops") })
	<-entered // the retry holds the stream now, its sequence half applied
	wg.Go(func() { outcome, handleErr = c2.Handle(e.ctx, delivered) })
	pgtest.WaitUntilBlocked(t, pgtest.Pool(t), pid)
	close(release)
	wg.Wait()
	if retryErr != nil || retried != 3 || handleErr != nil || outcome != pjs.Applied {
		t.Fatalf("retry %d, %v; new message %s, %v; want 3 retried and the new one applied", retried, retryErr, outcome, handleErr)
	}
	snk.check(t, append(evs, next))
}

// The process span of the message whose handler failed for the last time
// and parked its stream is marked failed (outcome parked); the span of a
// later message that only joins the park is not.
func TestConsumerParkStreamSpans(t *testing.T) {
	e := newTracedEnv(t)
	e.append("acme", "sp", testevents.TicketCommented{Body: "poison", N: 1}, testevents.TicketCommented{Body: "fine", N: 2})
	e.relayAll()
	snk := newSink(t, e.types.Registry)
	c, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: "spans", TracerProvider: e.tp, ErrorMode: pjs.ParkStream,
		MaxDeliver: 1, HoldDelay: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
		Handler: snk.failOnPoison(nil)})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := c.Consume(e.ctx, e.jsConsumer("spans"))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	waitFor(t, "both messages parked", 30*time.Second, func() bool { return snk.parkedCount(t, "spans") == 2 })
	byVersion := map[int64]sdktrace.ReadOnlySpan{}
	for _, s := range e.ended("process spans", 2) {
		if attr(s, "projector.outcome").AsString() == string(pjs.Parked) {
			byVersion[attr(s, "projector.stream.version").AsInt64()] = s
		}
	}
	if byVersion[1] == nil || byVersion[2] == nil {
		t.Fatalf("parked process spans by version: %v", byVersion)
	}
	if st := byVersion[1].Status(); st.Code != codes.Error || !strings.Contains(st.Description, "parked") {
		t.Errorf("the failing message's span: status %v, want an error", st)
	}
	if st := byVersion[2].Status(); st.Code == codes.Error {
		t.Errorf("the message that joined the park: status %v, want no error", st)
	}
}
