package saga

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// runnerMetrics are a [Runner]'s Prometheus metrics, labelled by saga.
type runnerMetrics struct {
	firedN   *prometheus.CounterVec
	lateness *prometheus.HistogramVec
}

// newRunnerMetrics registers the runner's metrics on reg. The ignored and
// late counts are kept by each saga as it handles events (on the
// dispatcher's goroutines); they are read when scraped rather than copied.
func newRunnerMetrics(reg prometheus.Registerer, sagas []Definition) (*runnerMetrics, error) {
	m := &runnerMetrics{
		firedN: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "projector_saga_timeouts_fired_total",
			Help: "Saga timeouts whose handler ran and committed, per saga.",
		}, []string{"saga"}),
		lateness: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "projector_saga_timeout_lateness_seconds",
			Help: "How long after its due time (by the saga's clock) a saga timeout fired.",
			// 5 ms to about 80 s: the runner's poll is 250 ms, so anything
			// past a second means it is falling behind.
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 15),
		}, []string{"saga"}),
	}
	cs := []prometheus.Collector{m.firedN, m.lateness}
	for _, s := range sagas {
		m.firedN.WithLabelValues(s.Name()) // a series from the start, so rate() works at once
		labels := prometheus.Labels{"saga": s.Name()}
		cs = append(cs,
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "projector_saga_events_ignored_total", ConstLabels: labels,
				Help: "Events that mapped to no saga instance and may not start one (ignored by design; a rising count may mean a wrong correlation key). Counted by this process when handled, so a step rolled back and taken again counts twice.",
			}, func() float64 { return float64(s.Ignored()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "projector_saga_late_events_total", ConstLabels: labels,
				Help: "Events that reached a completed or failed saga instance and were ignored, counted by this process.",
			}, func() float64 { return float64(s.Late()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "projector_saga_dead_letters_total", ConstLabels: labels,
				Help: "Events whose step failed in continuous mode: dead-lettered, their instance marked failed. Counted by this process.",
			}, func() float64 { return float64(s.DeadLettered()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "projector_saga_parked_total", ConstLabels: labels,
				Help: "Saga instances parked (ParkStream) after a step failed MaxAttempts times. Counted by this process; projector_parked_streams{consumer} is how many are parked now.",
			}, func() float64 { return float64(s.Parked()) }),
		)
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("saga runner: register metrics: %w", err)
		}
	}
	return m, nil
}

// fired returns the observer of saga's fired timeouts, nil without metrics.
func (m *runnerMetrics) fired(saga string) func(time.Duration) {
	if m == nil {
		return nil
	}
	c, h := m.firedN.WithLabelValues(saga), m.lateness.WithLabelValues(saga)
	return func(late time.Duration) {
		c.Inc()
		h.Observe(max(late, 0).Seconds())
	}
}
