package postgres

import (
	"strings"
	"sync"
	"testing"
)

// The per-type and per-segment reads are built on first use: each
// variant has the branches its index says, is built once, and goroutines
// asking at once all get the same text.
func TestLazyStatements(t *testing.T) {
	sql := buildStatements(`"lazy"`)
	unions := func(sql string) int { return strings.Count(sql, "UNION ALL") }
	for mode := range sql.read {
		// A key mode may add a union of its own: count from the smallest.
		reads := &sql.read[mode]
		one, archivedOne := unions(reads.logTypes.get(0)), unions(reads.archived.logTypes.get(0))
		for k := 1; k <= maxMergedTypes; k++ {
			if n := unions(reads.logTypes.get(k-1)) - one; n != k-1 {
				t.Fatalf("mode %d: the read of %d types has %d branches more than that of one", mode, k, n)
			}
			if n := unions(reads.archived.logTypes.get(k-1)) - archivedOne; n != 2*(k-1) {
				t.Fatalf("mode %d: the archived read of %d types has %d branches more than that of one, want %d", mode, k, n, 2*(k-1))
			}
		}
		widest := unions(reads.logPartition.get(BucketBits))
		for b := 1; b <= BucketBits; b++ {
			if n := unions(reads.logPartition.get(b)) - widest; n != 1<<(BucketBits-b)-1 {
				t.Fatalf("mode %d: the read of a %d-bit segment has %d branches more than a %d-bit one's", mode, b, n, BucketBits)
			}
		}
	}
	fresh := buildStatements(`"lazy"`).read[0].logTypes
	var wg sync.WaitGroup
	got := make([]string, 8)
	for i := range got {
		wg.Go(func() { got[i] = fresh.get(maxMergedTypes - 1) })
	}
	wg.Wait()
	for i := range got {
		if got[i] != sql.read[0].logTypes.get(maxMergedTypes-1) {
			t.Fatalf("goroutine %d got another text of the %d-type read", i, maxMergedTypes)
		}
	}
}

// BenchmarkBuildStatements is what New spends on its statements, once per
// store (docs/performance.md, Test suite wall time).
func BenchmarkBuildStatements(b *testing.B) {
	for b.Loop() {
		_ = buildStatements(`"pt_1764806400_abc"`)
	}
}
