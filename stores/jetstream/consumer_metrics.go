package jetstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// newConsumerMetrics registers the open dead-letter, parked-stream and
// oldest-park-age gauges on reg, or returns the ones a consumer of another subscription (or
// of the same one) registered there before: one vector per Registerer, one
// series per subscription. Nil without a Registerer.
func newConsumerMetrics(reg prometheus.Registerer) (dead, parked, parkedAge *prometheus.GaugeVec, err error) {
	if reg == nil {
		return nil, nil, nil, nil
	}
	dead, err = registerGauge(reg, "projector_jetstream_dead_letters_open",
		"Open dead letters of the JetStream claims consumer's subscription (neither retried successfully nor discarded), counted from the table: the same from every process that runs the subscription.")
	if err != nil {
		return nil, nil, nil, err
	}
	parked, err = registerGauge(reg, "projector_jetstream_parked_streams",
		"Streams the JetStream claims consumer's subscription has parked (ParkStream) and no retry or discard has resolved yet, counted from the table.")
	if err != nil {
		return nil, nil, nil, err
	}
	// The age of the oldest open park: a count that stays at 1 for a week
	// looks like one that changes every minute, the age tells them apart
	// (the dispatcher's projector_parked_oldest_age_seconds, per subscription).
	parkedAge, err = registerGauge(reg, "projector_jetstream_parked_oldest_age_seconds",
		"Seconds since the oldest open park of the JetStream claims consumer's subscription was parked (ParkStream); 0 when none is open.")
	if err != nil {
		return nil, nil, nil, err
	}
	return dead, parked, parkedAge, nil
}

func registerGauge(reg prometheus.Registerer, name, help string) (*prometheus.GaugeVec, error) {
	vec := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"subscription"})
	if err := reg.Register(vec); err != nil {
		var already prometheus.AlreadyRegisteredError
		if errors.As(err, &already) {
			if existing, ok := already.ExistingCollector.(*prometheus.GaugeVec); ok {
				return existing, nil
			}
		}
		return nil, fmt.Errorf("jetstream consumer: register metrics: %w", err)
	}
	return vec, nil
}

// metricsLoop counts the open dead letters at once and every MetricsEvery
// until ctx is done or closed is: the retries and discards of other
// processes (the CLI) show within a period.
func (c *Consumer) metricsLoop(ctx context.Context, closed <-chan struct{}) {
	tick := time.NewTicker(c.cfg.MetricsEvery)
	defer tick.Stop()
	for {
		c.refreshMetrics(ctx)
		select {
		case <-ctx.Done():
			return
		case <-closed:
			return
		case <-tick.C:
		}
	}
}

// refreshMetrics sets the subscription's open dead-letter gauge from the
// table, on the partial index of the open ones. The series appears with the
// first count, never as a zero nobody measured. A failed count leaves the
// last value and is logged at debug level: the next period tries again.
func (c *Consumer) refreshMetrics(ctx context.Context) {
	if c.openDeadLetters == nil {
		return
	}
	var n int64
	if err := c.cfg.Store.Pool().QueryRow(ctx, c.sql.countOpen, c.cfg.Subscription).Scan(&n); err != nil {
		if ctx.Err() == nil {
			c.logger.DebugContext(ctx, "jetstream consumer: count open dead letters", "subscription", c.cfg.Subscription, slog.Any("error", err))
		}
		return
	}
	c.openDeadLetters.WithLabelValues(c.cfg.Subscription).Set(float64(n))
	if c.cfg.ErrorMode != ParkStream {
		return
	}
	var age float64
	if err := c.cfg.Store.Pool().QueryRow(ctx, c.park.countOpen, c.cfg.Subscription).Scan(&n, &age); err != nil {
		if ctx.Err() == nil {
			c.logger.DebugContext(ctx, "jetstream consumer: count parked streams", "subscription", c.cfg.Subscription, slog.Any("error", err))
		}
		return
	}
	c.parkedStreams.WithLabelValues(c.cfg.Subscription).Set(float64(n))
	c.parkedAge.WithLabelValues(c.cfg.Subscription).Set(age)
}
