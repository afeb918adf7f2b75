package jetstream_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
	pjs "github.com/projectorhq/projector/stores/jetstream"
)

// A relay down longer than the stream's duplicate window between its
// publish and its cursor commit: the events it published come back from the
// cursor when it resumes, and JetStream no longer recognises their ids. The
// relay reads the stream back from its end, finds the events stored past
// its committed cursor and does not publish them again, so the stream holds
// each event once. Without that look-up (the first subtest) the same run
// stores every event twice: the window alone does not cover the downtime.
// A test-owned nats-server, a one-second window.
func TestRelaySkipsEventsStoredPastItsCursorAfterTheDuplicateWindow(t *testing.T) {
	srv := startNATS(t)
	for _, check := range []bool{false, true} {
		t.Run(fmt.Sprintf("tail_check=%v", check), func(t *testing.T) {
			t.Parallel()
			e := newEnvAt(t, srv.url())
			const n = 40
			for i := range n {
				e.append("acme", fmt.Sprintf("w%d", i%5), testevents.TicketCommented{Body: "x", N: i})
			}
			cfg := e.relayConfig()
			cfg.DuplicateWindow = time.Second
			cfg.PublishTimeout = 300 * time.Millisecond
			cfg.Async.BatchTimeout = 300 * time.Millisecond
			cfg.Async.BatchSize = 15

			// The relay publishes everything and commits its cursor; the
			// cursor then goes back to the start, as if the relay had
			// crashed after the acknowledgements and before every commit.
			first := e.relay(cfg)
			catchUpOnce(t, e, first)
			if got := e.msgCount(e.nc); got != n {
				t.Fatalf("%d messages after the first relay, want %d", got, n)
			}
			if _, err := e.store.Pool().Exec(e.ctx, `UPDATE `+e.store.Table("projector_consumers")+
				` SET cursor_tx_id = '0', cursor_seq = 0 WHERE name = $1`, pjs.DefaultRelayName); err != nil {
				t.Fatal(err)
			}
			waitForDuplicateWindow(t, e)

			second := e.relay(cfg)
			pjs.SetTailCheck(second, check)
			catchUpOnce(t, e, second)
			msgs := e.streamMsgs(e.nc)
			if !check {
				if len(msgs) != 2*n {
					t.Fatalf("without the tail check: %d messages, want %d (every event again once the window passed)", len(msgs), 2*n)
				}
				return
			}
			e.checkOnceInOrder(msgs)

			// The relay goes on: new events are published as usual.
			e.append("acme", "w0", testevents.TicketCommented{Body: "after", N: n})
			catchUpOnce(t, e, second)
			e.checkOnceInOrder(e.streamMsgs(e.nc))
		})
	}
}

// catchUpOnce runs r in a dispatcher of its own until it reached the log's
// end, then stops it.
func catchUpOnce(t testing.TB, e *env, r *pjs.Relay) {
	t.Helper()
	d, err := projection.New(projection.Config{Store: e.store, Projections: []*projection.Async{r.Async()}, PollMax: 50 * time.Millisecond,
		Recheck: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

// waitForDuplicateWindow returns once the stream no longer recognises an
// id published now, so none of the ids published before: a probe message
// is published with one id until JetStream stores it a second time. The
// probe messages are purged afterwards.
func waitForDuplicateWindow(t *testing.T, e *env) {
	t.Helper()
	js, err := jetstream.New(e.nc)
	if err != nil {
		t.Fatal(err)
	}
	subject := e.prefix + ".probe"
	id := "probe-" + randomHex(8)
	publish := func() bool {
		ack, err := js.Publish(e.ctx, subject, nil, jetstream.WithMsgID(id))
		if err != nil {
			t.Fatal(err)
		}
		return !ack.Duplicate
	}
	publish()
	waitFor(t, "the duplicate window to pass", 30*time.Second, publish)
	s, err := js.Stream(e.ctx, e.stream)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Purge(e.ctx, jetstream.WithPurgeSubject(subject)); err != nil {
		t.Fatal(err)
	}
}

// counterValue reads the counter name of reg (0 when it has no series yet).
func counterValue(t testing.TB, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			v := 0.0
			for _, m := range f.GetMetric() {
				v += m.GetCounter().GetValue()
			}
			return v
		}
	}
	return 0
}

// The read-back starts from the relay's committed cursor. With the cursor
// at the end of a 2,000-message stream, a relay that starts afresh (no
// knowledge of the tail) reads back one message, the last, and finds it at
// its cursor: nothing is stored past it. Reading the shared shard's cursor
// with the wrong instance id finds none, takes the start of the log for the
// cursor and reads back every message, up to MaxTailWalk, on every start
// and after every failed publish: 2,000 here, where one is wanted (the
// count is exact, so any stream longer than one message shows it; 20,000,
// past MaxTailWalk, only made the first relay's catch-up ten times longer).
func TestRelayTailReadStopsAtTheCommittedCursor(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const n = 2_000
	for i := range n / 1000 {
		payloads := make([]any, 1000)
		for j := range payloads {
			payloads[j] = testevents.TicketCommented{Body: "x", N: i*1000 + j}
		}
		e.append("acme", fmt.Sprintf("big%d", i), payloads...)
	}
	cfg := e.relayConfig()
	cfg.Async.BatchSize = 2000
	catchUpOnce(t, e, e.relay(cfg))
	if got := e.msgCount(e.nc); got != n {
		t.Fatalf("%d messages after the first relay, want %d", got, n)
	}

	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	second := e.relay(cfg)
	e.append("acme", "big0", testevents.TicketCommented{Body: "after", N: n})
	catchUpOnce(t, e, second)
	if got := e.msgCount(e.nc); got != n+1 {
		t.Fatalf("%d messages after the second relay, want %d", got, n+1)
	}
	if reads := counterValue(t, reg, "projector_relay_tail_reads_total"); reads != 1 {
		t.Fatalf("the relay read %v messages back from the stream's end, want 1 (the last, at its committed cursor)", reads)
	}
}
