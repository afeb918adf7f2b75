package jetstream_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	pjs "github.com/projectorhq/projector/stores/jetstream"
)

// lockedBuffer is a log sink the consumer's goroutines write while the test
// reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A handler writing to a table that does not exist fails for every message:
// the consumer stops with an error that says so and dead-letters nothing,
// however low MaxDeliver is.
func TestConsumerStopsOnSystemicFailure(t *testing.T) {
	e := newEnv(t)
	r := e.relay(e.relayConfig())
	d := e.dispatcher(r.Async())
	for i := range 10 {
		e.append("acme", "s", testevents.TicketCommented{Body: "x", N: i})
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	snk := newSink(t, e.types.Registry)
	missing := snk.store.Table("no_such_table")
	var logs lockedBuffer
	c, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: "systemic", MaxDeliver: 1,
		Backoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond, HoldDelay: 10 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Handler: func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+missing+` (id) VALUES ($1)`, ev.ID)
			return err
		}})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := c.Consume(e.ctx, e.jsConsumer("systemic"))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	deadLetters := func() int {
		var n int
		if err := snk.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+snk.store.Table("projector_jetstream_dead_letters")).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	stopped := func() bool {
		select {
		case <-cc.Closed():
			return true
		default:
			return false
		}
	}
	waitFor(t, "the consumer to stop or dead-letter", 30*time.Second, func() bool { return stopped() || deadLetters() > 0 })
	if n := deadLetters(); n != 0 {
		t.Fatalf("%d messages dead-lettered by a systemic failure, want none", n)
	}
	waitFor(t, "the consumer to stop", 10*time.Second, stopped)
	if out := logs.String(); !strings.Contains(out, "systemic failure") || !strings.Contains(out, "42P01") {
		t.Fatalf("the log does not say why the consumer stopped:\n%s", out)
	}
}

// A handler whose own backend is terminated loses its connection, not its
// event: the message is neither dead-lettered (however low MaxDeliver is)
// nor does it stop the consumer; it is applied on redelivery.
func TestConsumerGoesOnAfterConnectionLoss(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.relay(e.relayConfig())
	d := e.dispatcher(r.Async())
	for i := range 6 {
		e.append("acme", "k", testevents.TicketCommented{Body: "x", N: i})
	}
	ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
	defer cancel()
	if err := d.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	snk := newSink(t, e.types.Registry)
	var mu sync.Mutex
	killed := map[string]bool{}
	c, err := pjs.NewConsumer(pjs.ConsumerConfig{Store: snk.store, Subscription: "lossy", MaxDeliver: 1,
		Backoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond, HoldDelay: 10 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
		Handler: func(ctx context.Context, tx pgx.Tx, ev projector.Event) error {
			mu.Lock()
			first := !killed[ev.ID.String()] && ev.Version%2 == 0
			killed[ev.ID.String()] = true
			mu.Unlock()
			if first {
				_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
				return err
			}
			return snk.record(ctx, tx, ev)
		}})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := c.Consume(e.ctx, e.jsConsumer("lossy"))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	waitFor(t, "every event applied", time.Minute, func() bool { return snk.count(t) == 6 })
	select {
	case <-cc.Closed():
		t.Fatal("the consumer stopped on a lost connection")
	default:
	}
	var dead int
	if err := snk.store.Pool().QueryRow(e.ctx, `SELECT count(*) FROM `+snk.store.Table("projector_jetstream_dead_letters")).Scan(&dead); err != nil || dead != 0 {
		t.Fatalf("%d dead letters after lost connections (%v), want none", dead, err)
	}
}
