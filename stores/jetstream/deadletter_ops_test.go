package jetstream_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	pjs "github.com/projectorhq/projector/stores/jetstream"
)

// openGauge reads projector_jetstream_dead_letters_open{subscription} from
// reg; ok is false while the series does not exist.
func openGauge(t testing.TB, reg *prometheus.Registry, subscription string) (v float64, ok bool) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "projector_jetstream_dead_letters_open" {
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

// The open dead-letter gauge follows the consumer's own retries and
// discards at once, without a periodic count: it appears with the first
// count (never a zero nobody measured) and drops as dead letters are
// resolved or discarded. Consumers of two subscriptions share one
// Registerer, each with its series; a conflicting collector and a bad
// MetricsEvery are refused.
func TestConsumerOpenDeadLettersGaugeFollowsRetryAndDiscard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.New()
	snk := newSink(t, types.Registry)
	reg := prometheus.NewRegistry()
	c, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: "feed", Handler: snk.record, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	other, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: "other", Handler: snk.record, Registerer: reg})
	if err != nil {
		t.Fatalf("a second subscription's consumer on the same Registerer: %v", err)
	}
	a, _ := snk.deadLetter(t, "feed", "t1")
	b, _ := snk.deadLetter(t, "feed", "t2")
	snk.deadLetter(t, "feed", "t3")
	o, _ := snk.deadLetter(t, "other", "t4")
	if _, ok := openGauge(t, reg, "feed"); ok {
		t.Fatal("the gauge exists before anything counted")
	}

	if err := c.RetryDeadLetter(ctx, a); err != nil {
		t.Fatal(err)
	}
	if v, ok := openGauge(t, reg, "feed"); !ok || v != 2 {
		t.Fatalf("after a retry: gauge %v (exists %v), want 2", v, ok)
	}
	if err := c.DiscardDeadLetter(ctx, b); err != nil {
		t.Fatal(err)
	}
	if v, _ := openGauge(t, reg, "feed"); v != 1 {
		t.Fatalf("after a discard: gauge %v, want 1", v)
	}
	if err := c.DiscardDeadLetter(ctx, b); !errors.Is(err, pjs.ErrDeadLetterNotOpen) {
		t.Fatalf("second discard through the consumer: %v, want ErrDeadLetterNotOpen", err)
	}
	if err := c.DiscardDeadLetter(ctx, o); !errors.Is(err, projector.ErrNotFound) {
		t.Fatalf("discard of another subscription's dead letter: %v, want ErrNotFound", err)
	}
	if _, ok := openGauge(t, reg, "other"); ok {
		t.Fatal("the other subscription's series exists before its consumer counted")
	}
	if err := other.DiscardDeadLetter(ctx, o); err != nil {
		t.Fatal(err)
	}
	if v, ok := openGauge(t, reg, "other"); !ok || v != 0 {
		t.Fatalf("other after its discard: gauge %v (exists %v), want 0", v, ok)
	}
	if v, _ := openGauge(t, reg, "feed"); v != 1 {
		t.Fatalf("feed after other's discard: gauge %v, want 1", v)
	}

	conflicting := prometheus.NewRegistry()
	conflicting.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "projector_jetstream_dead_letters_open", Help: "not ours"}))
	if _, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: "feed", Handler: snk.record, Registerer: conflicting}); err == nil {
		t.Fatal("a Registerer holding another collector of the name was accepted")
	}
	for _, every := range []time.Duration{-time.Second, time.Millisecond, 25 * time.Hour} {
		if _, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: "feed", Handler: snk.record, MetricsEvery: every}); !errors.Is(err, pjs.ErrInvalidConfig) {
			t.Fatalf("MetricsEvery %v: %v, want ErrInvalidConfig", every, err)
		}
	}
}

// A consumer run with Consume counts its subscription's open dead letters:
// the one it writes shows at once, and what other processes do (a discard
// from the CLI, a dead letter another consumer of the subscription wrote)
// shows within MetricsEvery.
func TestConsumerOpenDeadLettersGaugeWhileConsuming(t *testing.T) {
	e := newEnv(t)
	r := e.relay(e.relayConfig())
	d := e.dispatcher(r.Async())
	for i := range 3 {
		e.append("acme", "g", testevents.TicketCommented{Body: map[bool]string{true: "poison", false: "fine"}[i == 1], N: i})
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	snk := newSink(t, e.types.Registry)
	reg := prometheus.NewRegistry()
	c, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: "gauged", MaxDeliver: 2,
		Backoff: 20 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, HoldDelay: 20 * time.Millisecond,
		Registerer: reg, MetricsEvery: 50 * time.Millisecond,
		Handler: snk.failOnPoison(nil)})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := c.Consume(e.ctx, e.jsConsumer("gauged"))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	gauge := func(want float64) func() bool {
		return func() bool { v, ok := openGauge(t, reg, "gauged"); return ok && v == want }
	}
	waitFor(t, "the gauge to count the dead-lettered poison", 30*time.Second, gauge(1))
	dls, err := pjs.ListDeadLetters(e.ctx, snk.store, "gauged", 10)
	if err != nil || len(dls) != 1 {
		t.Fatalf("open dead letters %+v, %v", dls, err)
	}
	snk.deadLetter(t, "gauged", "elsewhere") // as another process's consumer would
	waitFor(t, "the gauge to count another process's dead letter", 10*time.Second, gauge(2))
	if err := pjs.DiscardDeadLetter(e.ctx, snk.store, "gauged", dls[0].ID); err != nil { // as the CLI would
		t.Fatal(err)
	}
	waitFor(t, "the gauge to drop after another process's discard", 10*time.Second, gauge(1))
}

// ListDeadLettersMatching pages through a subscription's record with
// AfterID, in id order, by status; bad filters match ErrInvalidConfig and
// read nothing. CountOpenDeadLetters counts the open ones per subscription.
func TestListDeadLettersPagesAndCountOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	types := testevents.New()
	snk := newSink(t, types.Registry)
	c, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: "feed", Handler: snk.record})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := pjs.CountOpenDeadLetters(ctx, snk.store); err != nil || got == nil || len(got) != 0 {
		t.Fatalf("count with no dead letters: %#v, %v; want an empty slice", got, err)
	}
	var all []int64
	for i := range 7 {
		id, _ := snk.deadLetter(t, "feed", fmt.Sprintf("p%d", i))
		all = append(all, id)
	}
	snk.deadLetter(t, "other", "o1")
	if err := c.RetryDeadLetter(ctx, all[1]); err != nil {
		t.Fatal(err)
	}
	if err := c.DiscardDeadLetter(ctx, all[4]); err != nil {
		t.Fatal(err)
	}

	page := func(status string, limit int) []int64 {
		t.Helper()
		var got []int64
		f := pjs.DeadLetterFilter{Subscription: "feed", Status: status, Limit: limit}
		for range 20 {
			dls, err := pjs.ListDeadLettersMatching(ctx, snk.store, f)
			if err != nil {
				t.Fatal(err)
			}
			if len(dls) > limit {
				t.Fatalf("page of %d, limit %d", len(dls), limit)
			}
			if len(dls) == 0 {
				return got
			}
			got = append(got, ids(dls)...)
			f.AfterID = dls[len(dls)-1].ID
		}
		t.Fatal("paging did not end")
		return nil
	}
	if got := page("", 2); fmt.Sprint(got) != fmt.Sprint(all) {
		t.Fatalf("every page of all: %v, want %v", got, all)
	}
	wantOpen := []int64{all[0], all[2], all[3], all[5], all[6]}
	if got := page(projection.DeadLetterOpen, 3); fmt.Sprint(got) != fmt.Sprint(wantOpen) {
		t.Fatalf("every page of open: %v, want %v", got, wantOpen)
	}
	if got := page(projection.DeadLetterDiscarded, 1); fmt.Sprint(got) != fmt.Sprint([]int64{all[4]}) {
		t.Fatalf("every page of discarded: %v", got)
	}
	if dls, err := pjs.ListDeadLettersMatching(ctx, snk.store, pjs.DeadLetterFilter{Subscription: "feed", AfterID: all[6]}); err != nil || len(dls) != 0 {
		t.Fatalf("after the last id: %v, %v", ids(dls), err)
	}
	if dls, err := pjs.ListDeadLettersMatching(ctx, snk.store, pjs.DeadLetterFilter{Subscription: "feed"}); err != nil || len(dls) != len(all) {
		t.Fatalf("limit 0 (100): %v, %v", ids(dls), err)
	}
	for _, bad := range []pjs.DeadLetterFilter{
		{Subscription: "feed", AfterID: -1},
		{Subscription: "feed", Limit: -1},
		{Subscription: "feed", Limit: 10_001},
		{Subscription: "feed", Status: "gone"},
		{Subscription: ""},
		{Subscription: "fe.ed"},
		{Subscription: "feed\x00"},
	} {
		if dls, err := pjs.ListDeadLettersMatching(ctx, snk.store, bad); !errors.Is(err, pjs.ErrInvalidConfig) || dls != nil {
			t.Fatalf("%+v: %v, %v; want ErrInvalidConfig and nothing", bad, ids(dls), err)
		}
	}

	got, err := pjs.CountOpenDeadLetters(ctx, snk.store)
	if want := []pjs.OpenDeadLetters{{Schema: snk.store.Schema(), Subscription: "feed", Open: 5}, {Schema: snk.store.Schema(), Subscription: "other", Open: 1}}; err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("open per subscription: %v, %v; want %v", got, err, want)
	}
}
