package projection_test

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/projectorhq/projector/internal/pgtest"
)

// BenchmarkPartitionsProcesses is BenchmarkPartitions' catch-up (the
// per-event counting handler, 1,000 streams, default batches) worked by
// dispatcher processes: 1, 2, 4 and 8 partitions in one process and in
// two (issue 21), each process this test binary run as a child. The time
// runs from the first event applied to the last, so a process's start
// (exec, connect, register) is not counted; the second process of a pair
// joins a consumer the first may have begun, and takes its share as it
// would in a fleet. PROJECTOR_BENCH_PARTITION_EVENTS sets the backlog.
func BenchmarkPartitionsProcesses(b *testing.B) {
	e := partitioned(b)
	events := 20_000
	if n, err := strconv.Atoi(os.Getenv("PROJECTOR_BENCH_PARTITION_EVENTS")); err == nil && n > 0 {
		events = n
	}
	want := total(appendWith(b, e.ctx, e.store, 4, events, 1000, "s"))
	url := pgtest.URL(b)
	run := 0
	for _, n := range []int{1, 2, 4, 8} {
		for _, procs := range []int{1, 2} {
			b.Run(fmt.Sprintf("partitions=%d/processes=%d", n, procs), func(b *testing.B) {
				var wall time.Duration
				for b.Loop() {
					run++
					name := fmt.Sprintf("procs-%d", run)
					children := make([]*pgtest.Child, procs)
					for i := range children {
						children[i] = e.startChild(url, 0, childCounting+"="+name, childPartitions+"="+strconv.Itoa(n))
					}
					for e.applied(name) == 0 {
						time.Sleep(time.Millisecond) // polling the model: the measured run is the children's
					}
					start := time.Now()
					for e.applied(name) < want {
						time.Sleep(5 * time.Millisecond)
					}
					wall += time.Since(start)
					if got := e.applied(name); got != want {
						b.Fatalf("%s applied %d events, want %d", name, got, want)
					}
					for _, c := range children {
						c.Terminate(b)
					}
				}
				b.ReportMetric(float64(want)*float64(b.N)/wall.Seconds(), "events/s")
			})
		}
	}
}
