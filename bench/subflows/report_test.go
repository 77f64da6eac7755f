package subflows

import (
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/bench/benchdoc"
)

// The reports at their widest (slow flows, four-digit goodputs, stalls in
// every mode, many rounds) fit the docs' lines.
func TestTheReportsFitTheDocsOnAWideRun(t *testing.T) {
	slow := []time.Duration{9999 * time.Millisecond, 9999 * time.Millisecond}
	var small []smallFlowResult
	for _, p := range pathCases {
		r := smallFlowResult{paths: p, fct: map[string]map[int64][]time.Duration{}, goodput: map[string][]float64{},
			stalled: map[string]int{}}
		for _, m := range flowModes {
			r.fct[m.name] = map[int64][]time.Duration{}
			for _, size := range smallSizes {
				r.fct[m.name][size] = slow
			}
			r.goodput[m.name] = []float64{9999e6, 9999e6}
			r.stalled[m.name] = 999
		}
		small = append(small, r)
	}
	benchdoc.AssertFits(t, smallFlowsReport(small))

	wide := make([]time.Duration, 200)
	for i := range wide {
		wide[i] = 99999999 * time.Microsecond
	}
	benchdoc.AssertFits(t, watchReport([]watchResult{{conns: 100000, per: wide, one: wide, lookupMax: wide}}))
}
