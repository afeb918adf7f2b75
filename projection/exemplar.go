package projection

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

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
		Buckets: applyDelayBuckets,
	}, labels)
}

// applyDelayBounds sizes the apply-delay histogram: upper bounds from 1 ms,
// each four times the last, to about 4.5 minutes.
const applyDelayBounds = 10

// applyDelayBuckets are the apply-delay histogram's upper bounds.
var applyDelayBuckets = prometheus.ExponentialBuckets(0.001, 4, applyDelayBounds)

// applied observes the append-to-applied delay of each event of a batch
// committed at now. An event recorded under a sampled span (its stored
// traceparent says so) can carry that trace's id as an exemplar, so a slow
// bucket leads to the request that appended a slow event. With tracing off
// no event carries a traceparent and no header is parsed.
//
// A classic histogram bucket keeps one exemplar, the latest: of a batch's
// sampled events in one bucket only the last one's would survive. So the
// batch is searched from its end for each bucket's last sampled event,
// parsing only the traceparents of events whose bucket has none yet, and
// only those are observed with an exemplar. The histogram ends as one
// ObserveWithExemplar per sampled event would leave it, for a parse and an
// exemplar per bucket rather than per event: the exemplars of a batch of
// 500 traced events cost 1.6 µs an event before (6,000 allocations).
func (m *metrics) applied(id ShardID, events []projector.Event, now time.Time) {
	if len(events) == 0 {
		return
	}
	obs := m.applyDelay.With(prometheus.Labels{"consumer": id.Consumer, "instance_id": id.Instance})
	ex, _ := obs.(prometheus.ExemplarObserver)
	// exemplar[b] is 1 + the index of the event whose trace id becomes
	// bucket b's exemplar (the last bucket is +Inf), 0 for none; decided[b]
	// is set once the search from the end has found it.
	var exemplar [applyDelayBounds + 1]int
	var traceIDs [applyDelayBounds + 1]trace.TraceID
	if ex != nil {
		var decided [applyDelayBounds + 1]bool
		for i := len(events) - 1; i >= 0; i-- {
			ev := &events[i]
			if ev.Metadata.Headers[tracing.HeaderTraceParent] == "" {
				continue
			}
			b := applyDelayBucket(applyDelay(ev, now))
			if decided[b] {
				continue
			}
			if sc := tracing.Extract(ev.Metadata.Headers); sc.IsValid() && sc.IsSampled() {
				exemplar[b], traceIDs[b], decided[b] = i+1, sc.TraceID(), true
			}
		}
	}
	for i := range events {
		delay := applyDelay(&events[i], now)
		if b := applyDelayBucket(delay); exemplar[b] == i+1 {
			ex.ObserveWithExemplar(delay, prometheus.Labels{ExemplarTraceID: traceIDs[b].String()})
			continue
		}
		obs.Observe(delay)
	}
}

// applyDelay is ev's append-to-applied delay in seconds, for a batch
// committed at now; never negative (the clocks may disagree).
func applyDelay(ev *projector.Event, now time.Time) float64 {
	return max(now.Sub(ev.RecordedAt), 0).Seconds()
}

// applyDelayBucket returns the index of the apply-delay histogram's bucket
// that holds v, as the histogram finds it: the first upper bound not below
// v, applyDelayBounds for +Inf.
func applyDelayBucket(v float64) int {
	for i, bound := range applyDelayBuckets {
		if v <= bound {
			return i
		}
	}
	return applyDelayBounds
}
