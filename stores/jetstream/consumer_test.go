package jetstream_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/pgtest"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	pjs "github.com/projectorhq/projector/stores/jetstream"
	"github.com/projectorhq/projector/stores/postgres"
)

// sink is the consumer side: its own Projector schema (the claims tables)
// and an effects table without any unique key, so an effect applied twice
// shows as two rows.
type sink struct {
	store   *postgres.Store
	effects string
}

func newSink(t testing.TB, reg *projector.Registry) *sink {
	t.Helper()
	s := &sink{store: pgtest.Store(t, reg)}
	s.effects = s.store.Table("effects")
	if _, err := s.store.Pool().Exec(context.Background(), `CREATE TABLE `+s.effects+` (n bigserial PRIMARY KEY, event_id uuid NOT NULL, stream text NOT NULL, version bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *sink) record(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+s.effects+` (event_id, stream, version) VALUES ($1, $2, $3)`, ev.ID, ev.Stream.String(), ev.Version)
	return err
}

// comments are versions 1..n of stream, comments as the relay would
// publish them, event i with the id uuidFor(i).
func comments(stream projector.StreamRef, n int) []projector.Event {
	evs := make([]projector.Event, n)
	for i := range evs {
		evs[i] = projector.Event{ID: uuidFor(i), Stream: stream, Version: int64(i + 1), Type: "ticket.commented", SchemaVersion: 1,
			Data: []byte(fmt.Sprintf(`{"body":"b","n":%d}`, i)), Position: projector.Position{TxID: 10, Seq: int64(i + 1)}, RecordedAt: time.Now()}
	}
	return evs
}

// publish publishes ev to r's stream as the relay would.
func (e *env) publish(r *pjs.Relay, ev projector.Event) {
	e.t.Helper()
	msg, err := pjs.NewMsg(e.prefix, ev)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := r.JetStream().PublishMsg(e.ctx, msg); err != nil {
		e.t.Fatal(err)
	}
}

// failOnPoison is a handler that records each event's effect but fails,
// with "cannot handle poison", on a comment "poison" until cured is set
// (for ever when cured is nil): the consumer before the fix.
func (s *sink) failOnPoison(cured *atomic.Bool) pjs.ConsumerHandler {
	return func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		if ev.Payload.(testevents.TicketCommented).Body == "poison" && (cured == nil || !cured.Load()) {
			return errors.New("cannot handle poison")
		}
		return s.record(ctx, tx, ev)
	}
}

// check asserts each of want's events has exactly one effect and that each
// stream's effects came in version order.
func (s *sink) check(t testing.TB, want []projector.Event) {
	t.Helper()
	rows, err := s.store.Pool().Query(context.Background(), `SELECT event_id::text, stream, version FROM `+s.effects+` ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	type effect struct {
		id, stream string
		version    int64
	}
	effects, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (effect, error) {
		var e effect
		return e, r.Scan(&e.id, &e.stream, &e.version)
	})
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	last := map[string]int64{}
	for _, e := range effects {
		count[e.id]++
		if e.version <= last[e.stream] {
			t.Fatalf("stream %s: effect of version %d after %d", e.stream, e.version, last[e.stream])
		}
		last[e.stream] = e.version
	}
	for _, ev := range want {
		if n := count[ev.ID.String()]; n != 1 {
			t.Errorf("event %s (%s v%d) applied %d times", ev.ID, ev.Stream, ev.Version, n)
		}
	}
	if len(effects) != len(want) {
		t.Fatalf("%d effects, want %d", len(effects), len(want))
	}
}

func (s *sink) count(t testing.TB) int {
	var n int
	if err := s.store.Pool().QueryRow(context.Background(), `SELECT count(*) FROM `+s.effects).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// jsConsumer creates a durable pull consumer on the test's stream with a
// short AckWait, so unacknowledged messages come back quickly.
func (e *env) jsConsumer(name string) jetstream.Consumer {
	e.t.Helper()
	js, err := jetstream.New(e.nc)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	c, err := js.CreateOrUpdateConsumer(ctx, e.stream, jetstream.ConsumerConfig{Durable: name, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: time.Second, MaxDeliver: -1})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// lostAck is a delivered message whose acknowledgement never reaches the
// server, as when the consumer dies right after its commit.
// lose reports whether this acknowledgement is the one to lose.
type lostAck struct {
	jetstream.Msg
	lose func() bool
}

func (m lostAck) DoubleAck(ctx context.Context) error {
	if m.lose() {
		return nil
	}
	return m.Msg.DoubleAck(ctx)
}

// Redeliveries forced three ways — acknowledgements lost after the commit,
// handler failures, and the consumer's own database connection killed in
// the middle of its transaction — never apply an effect twice; every event
// is applied once, per stream in version order.
func TestPromise14_ClaimsApplyOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.relay(e.relayConfig())
	d := e.dispatcher(r.Async())
	for i := range 60 {
		e.append("acme", fmt.Sprintf("c%d", i%5), testevents.TicketCommented{Body: "x", N: i})
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	want := e.logEvents()

	snk := newSink(t, e.types.Registry)
	var mu sync.Mutex
	seen := map[string]int{} // handler runs per event
	handler := func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
		mu.Lock()
		seen[ev.ID.String()]++
		run := seen[ev.ID.String()]
		mu.Unlock()
		if err := snk.record(ctx, tx, ev); err != nil {
			return err
		}
		switch {
		case ev.Version%4 == 1 && run == 1:
			return errors.New("transient failure")
		case ev.Version%4 == 2 && run == 1:
			// Kill our own backend mid-transaction: the effect is lost
			// with the claim, and the message comes back.
			_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
			return err
		}
		return nil
	}
	c, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: "effects", Handler: handler,
		Backoff: 50 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, HoldDelay: 50 * time.Millisecond, MaxDeliver: 100})
	if err != nil {
		t.Fatal(err)
	}
	var lost sync.Map
	var outcomes sync.Map
	cc, err := e.jsConsumer("effects").Consume(func(msg jetstream.Msg) {
		// The first acknowledgement of every third message is lost.
		m := lostAck{msg, func() bool {
			md, err := msg.Metadata()
			if err != nil || md.Sequence.Stream%3 != 0 {
				return false
			}
			_, done := lost.LoadOrStore(md.Sequence.Stream, true)
			return !done
		}}
		o, _ := c.Handle(e.ctx, m)
		n, _ := outcomes.LoadOrStore(o, new(int))
		mu.Lock()
		*n.(*int)++
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	waitFor(t, "every event applied", 60*time.Second, func() bool { return snk.count(t) >= len(want) })
	// Let the lost acks' redeliveries arrive and be absorbed.
	waitFor(t, "the redeliveries of lost acks", 30*time.Second, func() bool {
		n, ok := outcomes.Load(pjs.Duplicate)
		mu.Lock()
		defer mu.Unlock()
		return ok && *n.(*int) >= len(want)/3
	})
	snk.check(t, want)
}

// A message whose predecessor in its stream has not been handled is held
// (nak with delay, visible in projector_jetstream_streams) and applied once
// the predecessor is; a real gap is left with SkipTo.
func TestConsumerHoldsOutOfOrderAndSkipsGaps(t *testing.T) {
	e := newEnv(t)
	r := e.relay(e.relayConfig())
	if _, err := r.Ensure(e.ctx); err != nil {
		t.Fatal(err)
	}
	snk := newSink(t, e.types.Registry)
	c, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: "ordered", Handler: snk.record, HoldDelay: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stream := projector.TenantStream("acme", "ticket", "o1")
	evs := comments(stream, 4)
	publish := func(ev projector.Event) { e.publish(r, ev) }
	cons := e.jsConsumer("ordered")
	next := func() pjs.Outcome {
		t.Helper()
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		msg, ok := <-batch.Messages()
		if !ok {
			t.Fatal("no message delivered")
		}
		o, err := c.Handle(e.ctx, msg)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	publish(evs[1]) // version 2 before version 1
	if o := next(); o != pjs.Held {
		t.Fatalf("version 2 before 1: %s, want held", o)
	}
	var held *int64
	if err := snk.store.Pool().QueryRow(e.ctx, `SELECT held_version FROM `+snk.store.Table("projector_jetstream_streams")+` WHERE subscription = 'ordered'`).Scan(&held); err != nil || held == nil || *held != 2 {
		t.Fatalf("held version %v, %v; want 2", held, err)
	}
	publish(evs[0])
	for snk.count(t) < 2 {
		next()
	}
	// Version 4 without 3: a real gap, held until an operator skips it.
	publish(evs[3])
	if o := next(); o != pjs.Held {
		t.Fatalf("version 4 after 2: %s, want held", o)
	}
	if err := pjs.SkipTo(e.ctx, snk.store, "ordered", stream, 4); err != nil {
		t.Fatal(err)
	}
	if err := pjs.SkipTo(e.ctx, snk.store, "ordered", stream, 2); !errors.Is(err, projector.ErrInvalidTransition) {
		t.Fatalf("SkipTo backwards: %v", err)
	}
	if o := next(); o != pjs.Applied {
		t.Fatalf("version 4 after the skip: %s, want applied", o)
	}
	snk.check(t, []projector.Event{evs[0], evs[1], evs[3]})
}

// A handler that always fails on one event dead-letters it after
// MaxDeliver deliveries, with its error; the stream's later events are
// applied after it.
func TestConsumerDeadLettersPoison(t *testing.T) {
	e := newEnv(t)
	r := e.relay(e.relayConfig())
	d := e.dispatcher(r.Async())
	for i := range 4 {
		e.append("acme", "p", testevents.TicketCommented{Body: map[bool]string{true: "poison", false: "fine"}[i == 1], N: i})
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	log := e.logEvents()
	snk := newSink(t, e.types.Registry)
	var cured atomic.Bool
	c, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: "poisoned", MaxDeliver: 3,
		Backoff: 20 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, HoldDelay: 20 * time.Millisecond,
		Handler: snk.failOnPoison(&cured)})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := c.Consume(e.ctx, e.jsConsumer("poisoned"))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	waitFor(t, "the other events applied", 30*time.Second, func() bool { return snk.count(t) == 3 })
	var id, msg string
	var deliveries int64
	if err := snk.store.Pool().QueryRow(e.ctx, `SELECT event_id::text, error, deliveries FROM `+snk.store.Table("projector_jetstream_dead_letters")).Scan(&id, &msg, &deliveries); err != nil {
		t.Fatal(err)
	}
	if id != log[1].ID.String() || deliveries != 3 || msg == "" {
		t.Fatalf("dead letter %s after %d deliveries (%q), want %s after 3", id, deliveries, msg, log[1].ID)
	}
	snk.check(t, []projector.Event{log[0], log[2], log[3]})

	// Listed (open), then retried once the handler is fixed: applied once,
	// the dead letter kept as resolved; a second retry is refused.
	dls, err := pjs.ListDeadLetters(e.ctx, snk.store, "poisoned", 10)
	if err != nil || len(dls) != 1 || dls[0].EventID != log[1].ID || dls[0].Header.Get(pjs.HeaderEventID) != log[1].ID.String() ||
		dls[0].Status != projection.DeadLetterOpen || dls[0].ResolvedAt != nil || dls[0].LastRetriedAt != nil {
		t.Fatalf("dead letters %+v, %v", dls, err)
	}
	if err := c.RetryDeadLetter(e.ctx, dls[0].ID); err == nil || !strings.Contains(err.Error(), "cannot handle poison") {
		t.Fatalf("retry of a still-failing dead letter: %v, want the handler's error", err)
	}
	if d, err := pjs.GetDeadLetter(e.ctx, snk.store, "poisoned", dls[0].ID); err != nil || d.Status != projection.DeadLetterOpen ||
		d.LastRetriedAt == nil || d.Error != "retry: cannot handle poison" {
		t.Fatalf("after a failed retry: %+v, %v; want it open with the retry's error and time", d, err)
	}
	cured.Store(true)
	if err := c.RetryDeadLetter(e.ctx, dls[0].ID); err != nil {
		t.Fatal(err)
	}
	if err := c.RetryDeadLetter(e.ctx, dls[0].ID); !errors.Is(err, pjs.ErrDeadLetterNotOpen) {
		t.Fatalf("second retry: %v, want ErrDeadLetterNotOpen", err)
	}
	if dls, err := pjs.ListDeadLetters(e.ctx, snk.store, "poisoned", 10); err != nil || len(dls) != 0 {
		t.Fatalf("open dead letters after the retry: %+v, %v", dls, err)
	}
	if dls, err := pjs.ListDeadLettersMatching(e.ctx, snk.store, pjs.DeadLetterFilter{Subscription: "poisoned", Status: projection.DeadLetterResolved, Limit: 10}); err != nil || len(dls) != 1 ||
		dls[0].ResolvedAt == nil || dls[0].EventID != log[1].ID {
		t.Fatalf("resolved dead letters after the retry: %+v, %v", dls, err)
	}
	if n := snk.count(t); n != 4 {
		t.Fatalf("%d effects after the retry, want 4", n)
	}
}

// PurgeClaims deletes only claims older than the window, refuses a window
// not longer than the duplicate window plus the redelivery time, and a
// purged event is still recognised as a duplicate by its stream's version.
func TestPurgeClaims(t *testing.T) {
	e := newEnv(t)
	snk := newSink(t, e.types.Registry)
	claims := snk.store.Table("projector_jetstream_claims")
	if _, err := snk.store.Pool().Exec(e.ctx, `INSERT INTO `+claims+` (subscription, event_id, claimed_at) VALUES
		('s', gen_random_uuid(), now() - interval '25 hours'), ('s', gen_random_uuid(), now() - interval '23 hours'),
		('other', gen_random_uuid(), now() - interval '25 hours')`); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []pjs.ClaimsRetention{
		{OlderThan: time.Minute, DuplicateWindow: 2 * time.Minute},
		{OlderThan: 10 * time.Minute, DuplicateWindow: 5 * time.Minute, MaxRedelivery: 5 * time.Minute},
		{OlderThan: time.Hour},
		{OlderThan: time.Hour, DuplicateWindow: time.Minute, Subscription: "a.b"},
	} {
		if _, err := pjs.PurgeClaims(e.ctx, snk.store, bad); !errors.Is(err, pjs.ErrInvalidConfig) {
			t.Fatalf("%+v: %v, want ErrInvalidConfig", bad, err)
		}
	}
	n, err := pjs.PurgeClaims(e.ctx, snk.store, pjs.ClaimsRetention{Subscription: "s", OlderThan: 24 * time.Hour, DuplicateWindow: 5 * time.Minute, MaxRedelivery: 10 * time.Minute})
	if err != nil || n != 1 {
		t.Fatalf("purged %d, %v; want 1", n, err)
	}
	var left int
	if err := snk.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+claims).Scan(&left); err != nil || left != 2 {
		t.Fatalf("%d claims left, %v; want the younger one and the other subscription's", left, err)
	}
}

// A message delivered again inside the claims retention, after a purge of
// older claims, is still absorbed: acknowledged, its handler not run again.
func TestRedeliveryInsideRetentionAbsorbedAfterPurge(t *testing.T) {
	e := newEnv(t)
	r := e.relay(e.relayConfig())
	e.append("acme", "k1", testevents.TicketCommented{Body: "once", N: 1})
	catchUpOnce(t, e, r)
	snk := newSink(t, e.types.Registry)
	c, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: "keep", Handler: snk.record})
	if err != nil {
		t.Fatal(err)
	}
	deliver := func(name string) pjs.Outcome {
		t.Helper()
		msgs, err := e.jsConsumer(name).Fetch(1, jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		m, ok := <-msgs.Messages()
		if !ok {
			t.Fatalf("no message delivered: %v", msgs.Error())
		}
		o, err := c.Handle(e.ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	if o := deliver("first"); o != pjs.Applied {
		t.Fatalf("first delivery: %s", o)
	}
	claims := snk.store.Table("projector_jetstream_claims")
	// An older claim that must go, beside the fresh one that must stay.
	if _, err := snk.store.Pool().Exec(e.ctx, `INSERT INTO `+claims+` (subscription, event_id, claimed_at) VALUES ('keep', gen_random_uuid(), now() - interval '2 days')`); err != nil {
		t.Fatal(err)
	}
	n, err := pjs.PurgeClaims(e.ctx, snk.store, pjs.ClaimsRetention{OlderThan: 24 * time.Hour, DuplicateWindow: pjs.DefaultDuplicateWindow, MaxRedelivery: c.MaxRedelivery(30 * time.Second)})
	if err != nil || n != 1 {
		t.Fatalf("purged %d, %v; want the two-day-old claim", n, err)
	}
	// Another JetStream consumer delivers the stream again: the same
	// message, as a redelivery would.
	if o := deliver("again"); o != pjs.Duplicate {
		t.Fatalf("redelivery inside the retention: %s, want duplicate", o)
	}
	if got := snk.count(t); got != 1 {
		t.Fatalf("%d effects, want 1", got)
	}
}
