package jetstream_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/testevents"
	pjs "github.com/projectorhq/projector/stores/jetstream"
)

// BenchmarkRelay measures the relay's throughput into JetStream (events
// appended beforehand, timed from dispatcher start to the last commit),
// beside a raw JetStream async-publish loop of the same messages in the
// same run.
func BenchmarkRelay(b *testing.B) {
	const events = 5000
	e := newEnv(b)
	for i := 0; i < events; i += 100 {
		err := pgx.BeginFunc(e.ctx, e.store.Pool(), func(tx pgx.Tx) error {
			for j := range 100 {
				if _, err := e.store.Append(e.ctx, tx, projector.TenantStream("acme", "ticket", fmt.Sprintf("b%d", (i+j)%200)), projector.AnyVersion,
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
	log := e.logEvents()
	if len(log) != events {
		// Another session's open transaction holds the horizon back.
		b.Fatalf("the log reads %d of %d events: an open transaction holds the horizon", len(log), events)
	}
	b.Run("relay", func(b *testing.B) {
		for n := range b.N {
			cfg := e.relayConfig()
			cfg.Name = fmt.Sprintf("bench_relay_%d_%d", b.N, n)
			cfg.Async.BatchSize = 500
			r := e.relay(cfg)
			d := e.dispatcher(r.Async())
			ctx, cancel := context.WithTimeout(e.ctx, 5*time.Minute)
			if err := d.CatchUp(ctx); err != nil {
				b.Fatal(err)
			}
			cancel()
		}
		b.ReportMetric(float64(events*b.N)/b.Elapsed().Seconds(), "events/s")
	})
	b.Run("raw_async_publish", func(b *testing.B) {
		js, err := jetstream.New(e.nc, jetstream.WithPublishAsyncMaxPending(pjs.DefaultMaxPending))
		if err != nil {
			b.Fatal(err)
		}
		for range b.N {
			for _, ev := range log {
				msg, err := pjs.NewMsg(e.prefix, ev)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := js.PublishMsgAsync(msg); err != nil {
					b.Fatal(err)
				}
			}
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(time.Minute):
				b.Fatal("acks did not arrive")
			}
		}
		b.ReportMetric(float64(events*b.N)/b.Elapsed().Seconds(), "events/s")
	})
}
