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
	for round := 1; round <= 50; round++ {
		changed := false
		for _, me := range live {
			seen := slices.Clone(owners)
			plan := planBalance(me, seen, live)
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
