package benchmark

import (
	"slices"
	"time"
)

// Throughput is one side-by-side throughput figure: the events each side
// processed and the time it took, added up over every round of a run.
type Throughput struct {
	RawEvents, ProjectorEvents int64
	RawTime, ProjectorTime     time.Duration
}

// RawRate returns the baseline's events per second.
func (t Throughput) RawRate() float64 { return rate(t.RawEvents, t.RawTime) }

// ProjectorRate returns Projector's events per second.
func (t Throughput) ProjectorRate() float64 { return rate(t.ProjectorEvents, t.ProjectorTime) }

// Ratio returns Projector's rate as a fraction of the baseline's (0.85 is
// 85 % of raw), or 0 when the baseline did nothing.
func (t Throughput) Ratio() float64 {
	if t.RawRate() == 0 {
		return 0
	}
	return t.ProjectorRate() / t.RawRate()
}

// Add accumulates another round.
func (t *Throughput) Add(o Throughput) {
	t.RawEvents += o.RawEvents
	t.ProjectorEvents += o.ProjectorEvents
	t.RawTime += o.RawTime
	t.ProjectorTime += o.ProjectorTime
}

// MetricReporter is what receives Go benchmark metrics: a *testing.B.
// Declared here so the Go benchmarks report the same units from one place
// without this package importing testing.
type MetricReporter interface {
	ReportMetric(n float64, unit string)
}

// Report sends the three metrics the Go benchmarks have always reported:
// raw-events/s, projector-events/s and %-of-raw.
func (t Throughput) Report(r MetricReporter) {
	r.ReportMetric(t.RawRate(), "raw-events/s")
	r.ReportMetric(t.ProjectorRate(), "projector-events/s")
	r.ReportMetric(100*t.Ratio(), "%-of-raw")
}

func rate(events int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(events) / d.Seconds()
}

// Percentiles summarise latency samples.
type Percentiles struct {
	Samples  int
	P50, P99 time.Duration
}

// Summarize returns the 50th and 99th percentiles of samples (nearest
// rank), or zeros when there are none.
func Summarize(samples []time.Duration) Percentiles {
	p := Percentiles{Samples: len(samples)}
	if len(samples) == 0 {
		return p
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	at := func(q int) time.Duration { return s[min(len(s)-1, len(s)*q/100)] }
	p.P50, p.P99 = at(50), at(99)
	return p
}

// Report sends p50-ms and p99-ms, the metrics BenchmarkLatency reports.
func (p Percentiles) Report(r MetricReporter) {
	r.ReportMetric(ms(p.P50), "p50-ms")
	r.ReportMetric(ms(p.P99), "p99-ms")
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
