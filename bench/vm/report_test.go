package vm

import (
	"testing"

	"github.com/mptcp-operator/mptcp-operator/bench/benchdoc"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/guest"
)

// The report of every cell at its widest (four-digit goodputs, ten rounds,
// busy vCPUs) fits the docs' lines.
func TestTheReportFitsTheDocsOnAWideRun(t *testing.T) {
	results := make([][]measurement, len(cells))
	for i := range results {
		for range 10 {
			results[i] = append(results[i], measurement{goodput: 1999.9e6, clientCPU: 1, serverCPU: 1})
		}
	}
	benchdoc.AssertFits(t, report(results, guest.KVM))
}
