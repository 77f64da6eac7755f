package e2e

import (
	"slices"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// The agent must give a pod what an expert's hand-written policy routing
// gives it, without anyone writing a route: with two NICs of 200 Mbit/s,
// goodput at least 0.97 of the hand-routed baseline and 1.8 times single-path
// TCP. Goodput is what the server received over a 5 s window after a 2 s
// warm-up; the three scenarios compared (kernel routing alone is not one)
// run in turn on one bed, three rounds, and the medians are compared,
// because two cores make single transfers noisy.
func testAgentThroughputMatchesHandRoutedBaseline(t *testing.T) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "200mbit"})
	const rounds = 3
	goodput := map[string][]float64{}
	for round := 1; round <= rounds; round++ {
		// Every scenario runs under the same captures, so their cost
		// does not tilt the comparison.
		w := bed.Watch(t, framework.DatapathEvidence(bed))
		results, err := framework.Compare(background(t), bed, framework.CompareOptions{
			Binaries: bins, Duration: 8 * time.Second, Warmup: 2 * time.Second, Conns: 1,
			// Kernel routing alone is no bound here (it is the
			// demo's column).
			SkipKernelRouting: true,
		})
		if err != nil {
			w.Fail(err)
		}
		w.Close()
		for _, r := range results {
			t.Logf("round %d: %-30s goodput %6.1f Mbit/s, per NIC %.1f Mbit/s", round, r.Scenario, r.GoodputBps/1e6, r.NICMbps)
			goodput[r.Scenario] = append(goodput[r.Scenario], r.GoodputBps)
		}
	}
	median := func(scenario string) float64 {
		v := slices.Clone(goodput[scenario])
		slices.Sort(v)
		return v[len(v)/2]
	}
	single, hand, agent := median(framework.ScenarioSinglePath), median(framework.ScenarioHandRouted), median(framework.ScenarioAgent)
	t.Logf("medians: single path %.1f, hand-routed %.1f, agent %.1f Mbit/s; agent/hand %.3f, agent/single %.2f",
		single/1e6, hand/1e6, agent/1e6, agent/hand, agent/single)
	if agent < 0.97*hand {
		t.Errorf("agent goodput %.1f Mbit/s is below 0.97 of the hand-routed baseline %.1f Mbit/s", agent/1e6, hand/1e6)
	}
	if agent < 1.8*single {
		t.Errorf("agent goodput %.1f Mbit/s is below 1.8 times single-path TCP %.1f Mbit/s", agent/1e6, single/1e6)
	}
}
