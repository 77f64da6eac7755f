package failover

import (
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/bench/benchdoc"
	"github.com/mptcp-operator/mptcp-operator/test/framework"
)

// The report of every case with the widest figures a run gives (stalls of
// seconds, failures never detected, paths never back, ten rounds, every
// one missed) fits the docs' lines, so that `make bench-failover` writes
// what hack/docs accepts. A stall is under the transfer's 10 s.
func TestTheReportFitsTheDocsOnAWideRun(t *testing.T) {
	wide := make([]framework.FailoverFigures, 10)
	for i := range wide {
		wide[i] = framework.FailoverFigures{Live: 1, During: 0.95, Stall: 9990 * time.Millisecond,
			PathBack: -1, Detected: -1, Reopened: 12, Resets: make([]string, 20)}
	}
	var results []result
	for _, c := range cases {
		results = append(results, result{c: c, agent: wide, kernel: wide, agentProblems: 10, kernelProblems: 10})
	}
	benchdoc.AssertFits(t, report(results))
}
