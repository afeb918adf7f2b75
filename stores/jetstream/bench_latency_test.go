package jetstream_test

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/benchmark"
	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	pjs "github.com/projectorhq/projector/stores/jetstream"
)

// latencyRate and latencyDuration are the steady load of the latency
// benchmark: 500 events/s for five seconds per side.
const (
	latencyRate     = 500
	latencyDuration = 5 * time.Second
)

// BenchmarkRelayLatency measures append-to-JetStream latency at a steady
// 500 events/s: from an append's commit (one event per transaction) to the
// message's delivery by a JetStream ordered consumer, through a running
// relay. Beside it, in the same run, the raw floor: a JetStream
// async-publish loop of the same messages at the same rate, from
// PublishMsgAsync to the delivery by the same kind of consumer. Run with
// -benchtime 1x; it reports p50-ms and p99-ms per side. The third side is
// the relay without its read-back of the stream's tail (the duplicate
// window alone), to show what that look-up costs.
func BenchmarkRelayLatency(b *testing.B) {
	for _, side := range []string{"raw_async_publish", "relay", "relay_without_tail_check"} {
		b.Run(side, func(b *testing.B) {
			e := newEnv(b)
			var p benchmark.Percentiles
			for b.Loop() {
				p = benchmark.Summarize(e.latencySamples(side))
			}
			p.Report(b)
		})
	}
}

// latencyTracker pairs each message's start (commit or publish) with its
// delivery, whichever is noted first.
type latencyTracker struct {
	mu      sync.Mutex
	pending map[string]time.Time
	lat     []time.Duration
	left    int
	done    chan struct{}
}

func (t *latencyTracker) note(id string, at time.Time, start bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	other, ok := t.pending[id]
	if !ok {
		t.pending[id] = at
		return
	}
	delete(t.pending, id)
	if start {
		t.lat = append(t.lat, max(other.Sub(at), 0))
	} else {
		t.lat = append(t.lat, at.Sub(other))
	}
	t.left--
	if t.left == 0 {
		close(t.done)
	}
}

func (e *env) latencySamples(side string) []time.Duration {
	e.t.Helper()
	run := "l" + randomHex(4) + "-"
	total := int(latencyDuration.Seconds() * latencyRate)
	tr := &latencyTracker{pending: map[string]time.Time{}, left: total, done: make(chan struct{})}

	// Both sides: the relay's stream, read by an ordered consumer from
	// now on; a message counts when it is delivered.
	js, err := jetstream.New(e.nc, jetstream.WithPublishAsyncMaxPending(pjs.DefaultMaxPending))
	if err != nil {
		e.t.Fatal(err)
	}
	cfg := e.relayConfig()
	cfg.Name = "bench_latency"
	r := e.relay(cfg) // creates the stream
	pjs.SetTailCheck(r, side != "relay_without_tail_check")
	cons, err := js.OrderedConsumer(e.ctx, e.stream, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverNewPolicy})
	if err != nil {
		e.t.Fatal(err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		now := time.Now()
		if id := m.Headers().Get(pjs.HeaderStreamID); strings.HasPrefix(id, run) {
			tr.note(id, now, false)
		}
	})
	if err != nil {
		e.t.Fatal(err)
	}
	defer cc.Stop()

	var d *projection.Dispatcher
	relayed := strings.HasPrefix(side, "relay")
	if relayed {
		// Projector's defaults: woken by the append's notification.
		d, err = projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{r.Async()}, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			e.t.Fatal(err)
		}
		if err := d.Start(e.ctx); err != nil {
			e.t.Fatal(err)
		}
		// Let it register and pass the (empty) log before the clock runs.
		ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
		if err := d.CatchUp(ctx); err != nil {
			e.t.Fatal(err)
		}
		cancel()
	}
	tick := time.NewTicker(time.Second / latencyRate)
	defer tick.Stop()
	for i := range total {
		<-tick.C
		id := run + strconv.Itoa(i)
		stream := projector.TenantStream("acme", "ticket", id)
		payload := testevents.TicketCommented{Body: "a comment of a realistic length, some forty bytes", N: i}
		if relayed {
			err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
				_, err := e.store.Append(e.ctx, tx, stream, projector.NoStream, payload)
				return err
			})
			if err != nil {
				e.t.Fatal(err)
			}
			tr.note(id, time.Now(), true)
			continue
		}
		// The same message the relay would send for such an event.
		ev := projector.Event{ID: uuid.New(), Type: "ticket.commented", SchemaVersion: 1, Stream: stream, Version: 1,
			Position: projector.Position{TxID: uint64(1000 + i), Seq: 1}, RecordedAt: time.Now(),
			Data: fmt.Appendf(nil, `{"body":%q,"n":%d}`, payload.Body, i)}
		msg, err := pjs.NewMsg(e.prefix, ev)
		if err != nil {
			e.t.Fatal(err)
		}
		tr.note(id, time.Now(), true)
		if _, err := js.PublishMsgAsync(msg, jetstream.WithMsgID(ev.ID.String()), jetstream.WithExpectStream(e.stream)); err != nil {
			e.t.Fatal(err)
		}
	}
	select {
	case <-tr.done:
	case <-time.After(30 * time.Second):
		e.t.Fatalf("%s: %d of %d messages not delivered 30s after the last", side, tr.left, total)
	}
	if d != nil {
		ctx, cancel := context.WithTimeout(e.ctx, 30*time.Second)
		defer cancel()
		if err := d.Stop(ctx); err != nil {
			e.t.Fatal(err)
		}
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.lat
}

// BenchmarkClaimsConsumer measures the claims consumer's throughput over
// 5,000 relayed events (one JetStream pull consumer, messages handled one
// at a time: decode, claim and order check, the handler's insert, commit,
// double acknowledgement) beside the same handler without claims in the
// same run: decode, a transaction with the same insert, commit, double
// acknowledgement. Each side reads the stream from its start with a
// durable consumer of its own into an effects table of its own. A third
// side runs the claims consumer under ParkStream with nothing parked: the
// cost of looking for its stream's park under each message's stream lock.
func BenchmarkClaimsConsumer(b *testing.B) {
	const events = 5000
	e := newEnv(b)
	for i := 0; i < events; i += 100 {
		err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
			for j := range 100 {
				if _, err := e.store.Append(e.ctx, tx, projector.TenantStream("acme", "ticket", fmt.Sprintf("c%d", (i+j)%200)), projector.AnyVersion,
					testevents.TicketCommented{Body: "a comment of a realistic length, some forty bytes", N: i + j}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	cfg := e.relayConfig()
	cfg.Async.BatchSize = 500
	catchUpOnce(b, e, e.relay(cfg))
	if n := e.msgCount(e.nc); n != events {
		b.Fatalf("%d messages relayed, want %d", n, events)
	}
	js, err := jetstream.New(e.nc)
	if err != nil {
		b.Fatal(err)
	}
	for _, side := range []string{"without_claims", "claims", "claims_park_stream"} {
		b.Run(side, func(b *testing.B) {
			for n := range b.N {
				snk := newSink(b, e.types.Registry)
				handle := func(m jetstream.Msg) error {
					ev, err := pjs.Decode(snk.store.Registry(), m.Headers(), m.Data())
					if err != nil {
						return err
					}
					if err := pgx.BeginFunc(e.ctx, snk.store.Pool(), func(tx pgx.Tx) error { return snk.record(e.ctx, tx, ev) }); err != nil {
						return err
					}
					return m.DoubleAck(e.ctx)
				}
				if side != "without_claims" {
					mode := pjs.DeadLetterMessage
					if side == "claims_park_stream" {
						mode = pjs.ParkStream
					}
					c, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: "bench", Handler: snk.record, ErrorMode: mode})
					if err != nil {
						b.Fatal(err)
					}
					handle = func(m jetstream.Msg) error {
						o, err := c.Handle(e.ctx, m)
						if err == nil && o != pjs.Applied {
							err = fmt.Errorf("outcome %s", o)
						}
						return err
					}
				}
				done := make(chan error, 1)
				count := 0
				// AckWait well above the time a message waits in the
				// client's buffer, so nothing is redelivered.
				cons, err := js.CreateOrUpdateConsumer(e.ctx, e.stream, jetstream.ConsumerConfig{Durable: fmt.Sprintf("bench_%s_%d_%d", side, b.N, n),
					AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Minute, MaxDeliver: -1})
				if err != nil {
					b.Fatal(err)
				}
				start := time.Now()
				cc, err := cons.Consume(func(m jetstream.Msg) {
					if err := handle(m); err != nil {
						select {
						case done <- err:
						default:
						}
						return
					}
					if count++; count == events {
						done <- nil
					}
				})
				if err != nil {
					b.Fatal(err)
				}
				select {
				case err := <-done:
					if err != nil {
						b.Fatal(err)
					}
				case <-time.After(5 * time.Minute):
					b.Fatalf("%d of %d handled after 5 minutes", count, events)
				}
				elapsed := time.Since(start)
				cc.Stop()
				b.ReportMetric(float64(events)/elapsed.Seconds(), "events/s")
			}
		})
	}
}
