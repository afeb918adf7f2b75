package projection

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/projectorhq/projector"
	"github.com/projectorhq/projector/internal/tracing"
)

// ExemplarTraceID is the exemplar label under which the append-to-applied
// histogram records an event's trace id, the name Grafana and Prometheus
// look for to link a bucket to its trace.
const ExemplarTraceID = "trace_id"

// newApplyDelay returns the projector_event_apply_delay_seconds histogram:
// the answer to "how late was my read model", per event rather than per
// batch, from 1 ms to about 4.5 minutes.
func newApplyDelay(labels []string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "projector_event_apply_delay_seconds",
		Help: "Time from an event's append (its recorded_at, the database clock) to the commit of the batch that applied it " +
			"(this process's clock). Observations of traced, sampled events carry their trace id as an exemplar.",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
	}, labels)
}

// applied observes the append-to-applied delay of each event of a batch
// committed at now. An event recorded under a sampled span (its stored
// traceparent says so) is observed with that trace's id as an exemplar, so
// a slow bucket leads to the request that appended a slow event. With
// tracing off no event carries a traceparent and no header is parsed.
func (m *metrics) applied(id ShardID, events []projector.Event, now time.Time) {
	if len(events) == 0 {
		return
	}
	obs := m.applyDelay.With(prometheus.Labels{"consumer": id.Consumer, "instance_id": id.Instance})
	ex, _ := obs.(prometheus.ExemplarObserver)
	for _, ev := range events {
		delay := max(now.Sub(ev.RecordedAt), 0).Seconds()
		if ex != nil && ev.Metadata.Headers[tracing.HeaderTraceParent] != "" {
			if sc := tracing.Extract(ev.Metadata.Headers); sc.IsValid() && sc.IsSampled() {
				ex.ObserveWithExemplar(delay, prometheus.Labels{ExemplarTraceID: sc.TraceID().String()})
				continue
			}
		}
		obs.Observe(delay)
	}
}
