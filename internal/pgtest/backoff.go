package pgtest

import (
	"testing"
	"time"
)

// EventuallyBackoff is Eventually with a polling interval that grows from
// 5 ms to 50 ms. Most waits of the crash and concurrency tests are for a
// read model that takes seconds to fill, checked by a query: polled every
// 5 ms, the checks alone were a noticeable part of a CPU-bound suite's work
// (the query and the server's side of it), while a condition that holds at
// once is still seen at once and a late one at most 50 ms late.
func EventuallyBackoff(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	interval := 5 * time.Millisecond
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(interval) // polling interval, not synchronisation
		interval = min(interval*3/2, 50*time.Millisecond)
	}
}
