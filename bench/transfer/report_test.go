package transfer

import (
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/bench/benchdoc"
)

// The reports at their widest (stalls of seconds, four-digit goodputs,
// many rounds) fit the docs' lines.
func TestTheReportsFitTheDocsOnAWideRun(t *testing.T) {
	stalls := []time.Duration{9950 * time.Millisecond, 9950 * time.Millisecond}
	goodput := []float64{9999.9e6, 9999.9e6}

	saved := stallResults
	t.Cleanup(func() { stallResults = saved })
	stallResults = nil
	for _, c := range rateCases {
		stallResults = append(stallResults, stallResult{name: c.name, cap: 9999e6, stalls: stalls, goodput: goodput})
	}
	benchdoc.AssertFits(t, stallReport())

	var steady []steadyResult
	for range steadyCells {
		steady = append(steady, steadyResult{stalls: stalls, goodput: goodput})
	}
	benchdoc.AssertFits(t, steadyReport(steady))
	benchdoc.AssertFits(t, checksumReport(goodput, goodput))

	var holdoffs []holdoffResult
	for _, d := range []time.Duration{0, 20 * time.Millisecond, 999 * time.Millisecond} {
		r := holdoffResult{holdoff: d, seconds: map[int64][]float64{}}
		for _, size := range holdoffSizes {
			r.seconds[size] = []float64{999.999, 999.999}
		}
		holdoffs = append(holdoffs, r)
	}
	benchdoc.AssertFits(t, holdoffReport(holdoffs))

	cpu := map[int]map[string]*cpuResult{}
	for _, n := range cpuConns {
		cpu[n] = map[string]*cpuResult{}
		for _, sc := range cpuScenarios {
			cpu[n][sc] = &cpuResult{goodput: goodput, cpuPerGB: []float64{99.99, 99.99}, stalls: 5}
		}
	}
	benchdoc.AssertFits(t, cpuReport(cpu, 99))

	variants := make([][]float64, len(preloadVariants))
	for i := range variants {
		variants[i] = goodput
	}
	benchdoc.AssertFits(t, preloadTable(variants))
}
