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
