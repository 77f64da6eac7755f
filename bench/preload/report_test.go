package preload

import (
	"testing"

	"github.com/mptcp-operator/mptcp-operator/bench/benchdoc"
)

// The table at its widest (six-digit nanoseconds, a variant many times the
// base) fits the docs' lines.
func TestTheReportFitsTheDocsOnAWideRun(t *testing.T) {
	ns := map[string][]float64{}
	for _, op := range operations {
		for i, v := range variants {
			ns[op.name+"|"+v.name] = []float64{999999, 999999}
			if i == 2 {
				ns[op.name+"|"+v.name] = []float64{1, 1}
			}
		}
	}
	benchdoc.AssertFits(t, costTable(ns))
}
