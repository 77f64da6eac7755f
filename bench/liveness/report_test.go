package liveness

import (
	"strings"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/bench/benchdoc"
)

// The reports' tables at their widest (every case, six-digit rates, busy
// cores, many runs) fit the docs' lines; their prose is wrapped by
// benchdoc.
func TestTheReportsFitTheDocsOnAWideRun(t *testing.T) {
	cases := []probeCase{{peers: 1000, busy: -1}, {peers: 1000, busy: 1000, idle: 10 * time.Second}}
	figures := map[probeCase]probeFigures{}
	wide := make([]float64, rounds)
	for i := range wide {
		wide[i] = 1
	}
	for _, c := range cases {
		figures[c] = probeFigures{busy: wide, sent: 999999, received: 999999}
	}
	benchdoc.AssertFits(t, probesTable(cases, figures, wide))

	floods := []flood{{"no filter", false}, {"`nic_ingress`, as the agent configures it", true}}
	runs := map[string][]floodRun{}
	for _, c := range floods {
		for range 100 {
			runs[c.name] = append(runs[c.name], floodRun{sent: 9_999_999, downs: 9999, notUp: 1, socketDrops: 9_999_999})
		}
	}
	table := floodTable(floods, runs)
	if !strings.Contains(table, "| 100 of 100 |") {
		t.Errorf("the table counts no run with the path down:\n%s", table)
	}
	benchdoc.AssertFits(t, table)
}
