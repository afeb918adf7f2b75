package jetstream_test

import (
	"strings"
	"testing"
	"time"

	"github.com/projectorhq/projector/internal/testevents"
	"github.com/projectorhq/projector/projection"
)

// A test-owned nats-server is stopped while events keep being appended and
// started again a few seconds later: appends never fail or wait on NATS, the
// relay's failures show in the consumer's state, and once the server is
// back the relay catches up with every event exactly once, in order.
func TestPromise14_NATSOutage(t *testing.T) {
	srv := startNATS(t)
	e := newEnvAt(t, srv.url())
	r := e.relay(e.relayConfig())
	e.dispatcher(r.Async())
	for i := range 20 {
		e.append("acme", "o"+string(rune('a'+i%4)), testevents.TicketCommented{Body: "up", N: i})
	}
	waitFor(t, "the first events in JetStream", 30*time.Second, func() bool { return e.msgCount(e.nc) == 20 })

	srv.stop()
	started := time.Now()
	for i := range 30 {
		t0 := time.Now()
		e.append("acme", "o"+string(rune('a'+i%4)), testevents.TicketCommented{Body: "down", N: i})
		if d := time.Since(t0); d > 2*time.Second {
			t.Fatalf("an append took %v while NATS was down", d)
		}
	}
	admin := projection.NewAdmin(e.store)
	waitFor(t, "the relay to report the outage", 30*time.Second, func() bool {
		st, err := admin.Status(e.ctx, projection.ShardID{Consumer: "jetstream_relay"})
		if err != nil {
			t.Fatal(err)
		}
		return st.LastError != "" && st.Attempts > 0
	})
	st, _ := admin.Status(e.ctx, projection.ShardID{Consumer: "jetstream_relay"})
	if st.Status == projection.StatusDead {
		t.Fatalf("relay dead after a short outage: %s", st.LastError)
	}
	if !strings.Contains(strings.ToLower(st.LastError), "publish") {
		t.Fatalf("last error %q does not say the publish failed", st.LastError)
	}
	if time.Since(started) < 2*time.Second {
		// Keep the server down a few seconds, as the outage the promise
		// covers; waiting on the clock is the point here.
		time.Sleep(2*time.Second - time.Since(started))
	}
	srv.start()
	waitFor(t, "the relay to catch up after the outage", 60*time.Second, func() bool { return e.msgCount(e.nc) >= 50 })
	e.checkOnceInOrder(e.streamMsgs(e.nc))
}
