package projection

import (
	"fmt"
	"slices"
	"testing"
)

// simulateBalance runs balancing rounds, each process in turn applying its
// plan as the claim and release statements would (claims are
// compare-and-set on the owner seen), until nothing changes; it returns the
// owners and the rounds it took.
func simulateBalance(t *testing.T, owners []string, live []string) ([]string, int) {
	t.Helper()
	return simulateWeighted(t, owners, nil, live)
}

// simulateWeighted is simulateBalance with the partitions' weights
// (partitionWeights; nil: one each).
func simulateWeighted(t *testing.T, owners []string, weights []int, live []string) ([]string, int) {
	t.Helper()
	for round := 1; round <= 50; round++ {
		changed := false
		for _, me := range live {
			seen := slices.Clone(owners)
			plan := planBalance(me, seen, weights, live)
			for _, p := range plan.release {
				if owners[p] == me {
					owners[p], changed = "", true
				}
			}
			for _, p := range plan.claim {
				if owners[p] == seen[p] {
					owners[p], changed = me, true
				}
			}
		}
		if !changed {
			return owners, round
		}
	}
	t.Fatalf("balancing did not settle in 50 rounds: %v", owners)
	return nil, 0
}

func shares(owners []string) map[string]int {
	out := map[string]int{}
	for _, o := range owners {
		out[o]++
	}
	return out
}

func checkFair(t *testing.T, owners []string, live []string) {
	t.Helper()
	n, p := len(owners), len(live)
	s := shares(owners)
	if s[""] != 0 {
		t.Fatalf("%d partitions unowned: %v", s[""], owners)
	}
	for _, l := range live {
		if s[l] < n/p || s[l] > (n+p-1)/p {
			t.Fatalf("%s owns %d of %d partitions with %d processes: %v", l, s[l], n, p, s)
		}
	}
}

func TestPlanBalanceConverges(t *testing.T) {
	for _, c := range []struct{ n, p int }{{12, 3}, {8, 3}, {10, 4}, {64, 5}, {2, 3}, {16, 1}} {
		t.Run(fmt.Sprintf("%d partitions, %d processes", c.n, c.p), func(t *testing.T) {
			live := make([]string, c.p)
			for i := range live {
				live[i] = fmt.Sprintf("p%d", i)
			}
			owners, _ := simulateBalance(t, make([]string, c.n), live)
			checkFair(t, owners, live)

			// One joins: it gets work, and everyone settles at the new share.
			live2 := append(slices.Clone(live), "new")
			before := slices.Clone(owners)
			owners, rounds := simulateBalance(t, owners, live2)
			checkFair(t, owners, live2)
			if c.n >= len(live2) && shares(owners)["new"] == 0 {
				t.Fatalf("the new process got nothing after %d rounds", rounds)
			}
			// Affinity: a partition changed hands only to make room for
			// the newcomer.
			moved := 0
			for i := range owners {
				if owners[i] != before[i] && owners[i] != "new" {
					moved++
				}
			}
			if moved > 0 {
				t.Errorf("%d partitions moved between old processes when one joined", moved)
			}

			// One dies: its partitions are taken, fairly.
			dead := live2[0]
			live3 := live2[1:]
			owners, _ = simulateBalance(t, owners, live3)
			checkFair(t, owners, live3)
			if shares(owners)[dead] != 0 {
				// still recorded as owner: not live, so passed over
				t.Fatalf("dead process still owns partitions: %v", owners)
			}
		})
	}
}

// TestPlanBalanceWeighsPartitionsBySize: while a split runs, the layout
// mixes parents and halves. Counted, a process whose parents had split
// (four halves) looked twice as loaded as one whose parents had not (two
// partitions of 4): it gave halves up, and took them back once the other's
// parents split, each move in the split's window. Weighed by their share
// of the hash space, both hold half of it, and neither moves anything.
// Mixed layouts (a change of some partitions) still settle with every
// partition owned.
func TestPlanBalanceWeighsPartitionsBySize(t *testing.T) {
	ids := []string{PartitionInstance(0, 8), PartitionInstance(1, 8), PartitionInstance(2, 8), PartitionInstance(3, 8), PartitionInstance(2, 4), PartitionInstance(3, 4)}
	weights := partitionWeights(ids)
	if !slices.Equal(weights, []int{1, 1, 1, 1, 2, 2}) {
		t.Fatalf("weights %v, want 1 for a partition of 8 and 2 for one of 4", weights)
	}
	owners := []string{"a", "a", "a", "a", "b", "b"}
	live := []string{"a", "b"}
	for _, me := range live {
		if plan := planBalance(me, owners, weights, live); len(plan.release) > 0 || len(plan.claim) > 0 {
			t.Fatalf("%s's round in a half-split layout, each process holding half the hash space: %+v, want nothing", me, plan)
		}
		// Counted, as before: a gave a half up.
		if me == "a" {
			if plan := planBalance(me, owners, nil, live); len(plan.release) == 0 {
				t.Fatalf("counted, a (4 partitions against 2) releases nothing: the test no longer shows the old behaviour")
			}
		}
	}

	// A dead process's partition heavier than the room any live process
	// has is still taken (and the taker gives lighter ones up).
	heavy := []string{PartitionInstance(2, 4), PartitionInstance(0, 2), PartitionInstance(6, 8), PartitionInstance(7, 8)}
	settled, _ := simulateWeighted(t, []string{"b", "dead", "c", "c"}, partitionWeights(heavy), []string{"b", "c"})
	if slices.Contains(settled, "dead") || slices.Contains(settled, "") {
		t.Fatalf("the dead process's partition of 2 was left unowned: %v", settled)
	}

	// Mixed layouts settle from nothing, every partition owned, each
	// process within a partition's weight of its share.
	layouts := [][]string{
		ids,
		{PartitionInstance(0, 2), PartitionInstance(2, 4), PartitionInstance(6, 8), PartitionInstance(7, 8)},
		{PartitionInstance(0, 4), PartitionInstance(1, 4), PartitionInstance(4, 8), PartitionInstance(5, 8), PartitionInstance(6, 8), PartitionInstance(14, 16), PartitionInstance(15, 16)},
	}
	for _, layout := range layouts {
		w := partitionWeights(layout)
		for p := 1; p <= 4; p++ {
			live := make([]string, p)
			for i := range live {
				live[i] = fmt.Sprintf("p%d", i)
			}
			owners, _ := simulateWeighted(t, make([]string, len(layout)), w, live)
			total, heaviest := 0, 0
			have := map[string]int{}
			for i, o := range owners {
				if o == "" {
					t.Fatalf("%v, %d processes: partition %s unowned: %v", layout, p, layout[i], owners)
				}
				have[o] += w[i]
				total += w[i]
				heaviest = max(heaviest, w[i])
			}
			for _, l := range live {
				if have[l] > (total+p-1)/p+heaviest-1 || (total >= p*heaviest && have[l] < total/p-heaviest+1) {
					t.Errorf("%v, %d processes: %s holds %d of %d: %v", layout, p, l, have[l], total, have)
				}
			}
		}
	}
}
