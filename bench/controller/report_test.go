package controller

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

// The reports at their widest (every resource written tens of thousands of
// times, minutes-long phases, 5,000 nodes) are written whole and fit the
// docs' lines: ReplaceSection refuses a line it cannot wrap.
func TestTheReportsFitTheDocsOnAWideRun(t *testing.T) {
	writes := testenv.Writes{}
	for _, r := range append(append([]string{}, writeResources...), scaleWrites...) {
		writes[r] = 99999
	}
	path := filepath.Join(t.TempDir(), "benchmarks.md")
	var results []result
	for _, phase := range []string{"cold start", "policy change", "second controller started, nothing changed (time until idle)"} {
		results = append(results, result{phase: phase, duration: 99 * time.Minute, writes: writes, largestState: 999999,
			largestName: "mptcp-node-99999"})
	}
	if err := writeReport(path, scale{nodes: 5000, podsPerNode: 20, policies: 100, namespaces: 100}, results); err != nil {
		t.Fatal(err)
	}
	var phases []scalePhase
	for _, name := range []string{"cold start: every node state enforced and every peer written", "one node's new address",
		"one policy change: every node enforced"} {
		phases = append(phases, scalePhase{name: name, duration: 99 * time.Minute, writes: writes, apiCPU: 99 * time.Minute,
			apiRSS: 99999e6, p50: 99 * time.Minute, p99: 99 * time.Minute})
	}
	runs := []scaleRun{{nodes: 5000, phases: phases, largestState: 999999, largestPeer: 999999, peers: 5000,
		populate: 99 * time.Minute}}
	if err := writeScaleReport(path, runs); err != nil {
		t.Fatal(err)
	}
}
