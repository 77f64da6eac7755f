package transfer

import (
	"cmp"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/bench/benchdoc"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// Steady state: one long MPTCP connection over two equal paths, nothing
// failing, and the longest stall in it.
const (
	steadySection  = "## Steady state: longest stall"
	steadyTransfer = 60 * time.Second
	steadySample   = 50 * time.Millisecond
	// steadyStall is the share of the connection's mean rate below which
	// a sample counts as stalled.
	steadyStall = 0.1
	// steadySignalPort is the port the hand-routed server announces for
	// the second path; transfers use others.
	steadySignalPort = 5990
)

// steadyCell is one way of running the connection. The nodes' and pods'
// default congestion control is bbr (this machine's, and many cloud
// images'); cc is the one the agent sets in the pods
// (podMPTCP.congestionControl), "" to leave theirs.
type steadyCell struct {
	agent     bool // the agent places the subflows; else hand routing and the kernel's path manager
	checksums bool
	rate      string
	cc        string
}

func (c steadyCell) String() string {
	routing := "hand-routed"
	if c.agent {
		routing = "agent"
	}
	return fmt.Sprintf("%s, checksums %s, %s, %s", routing, map[bool]string{true: "on", false: "off"}[c.checksums], c.rate, c.ccColumn())
}

// ccColumn says which congestion control the pods run, and who chose it.
func (c steadyCell) ccColumn() string {
	if c.cc == "" {
		return "node's (bbr)"
	}
	return c.cc + " (agent)"
}

// steadyCells are the chart's defaults (the agent, checksums on, cubic in
// the pods), the same leaving the pods the node's bbr, whose subflows'
// PROBE_RTTs the stalls are, with checksums on and off, and the kernel's
// path manager alone under bbr.
var steadyCells = []steadyCell{
	{agent: true, checksums: true, rate: "200mbit", cc: mptcpv1alpha1.DefaultCongestionControl},
	{agent: true, checksums: true, rate: "200mbit"},
	{agent: true, checksums: false, rate: "200mbit"},
	{agent: false, checksums: true, rate: "200mbit"},
}

// steadyBeds holds a bed per cell: the agent's checksums and congestion
// control come from its rule, the hand-routed pods' checksums from a
// sysctl set before each transfer.
type steadyBeds map[steadyCell]*testbed.Bed

func (beds steadyBeds) bedFor(b *testing.B, c steadyCell) *testbed.Bed {
	b.Helper()
	if bed, ok := beds[c]; ok {
		return bed
	}
	bed := testbed.NewForTest(b, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: c.rate})
	// A node whose default is bbr, whatever the machine's.
	for _, n := range bed.Nodes {
		testbed.Must(b, bed.Sysctl(n.NetNS, "net.ipv4.tcp_congestion_control", "bbr"))
		for _, p := range n.Pods {
			testbed.Must(b, bed.Sysctl(p.NetNS, "net.ipv4.tcp_congestion_control", "bbr"))
		}
	}
	if c.agent {
		opts := []framework.AgentOption{}
		if !c.checksums {
			opts = append(opts, framework.WithoutDataChecksums())
		}
		if c.cc != "" {
			// The product's agent adds it to the node's allowed list from the
			// node's namespace; a bed's agents cannot, so the bed does.
			release, err := testbed.AllowCongestionControl(c.cc)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { testbed.Must(b, release()) })
		}
		rule := mptcpv1alpha1.CompiledRule{CongestionControl: c.cc}
		if _, err := framework.StartAgents(b.Context(), bed, bins.Agent, rule, opts...); err != nil {
			b.Fatal(err)
		}
		for _, p := range []*testbed.Pod{bed.Pod(1, 1), bed.Pod(2, 1)} {
			want := cmp.Or(c.cc, "bbr")
			if got, err := netnsutil.ReadSysctl("/var/run/netns/"+p.NetNS, "net.ipv4.tcp_congestion_control"); err != nil || got != want {
				b.Fatalf("pod %s runs %q (%v), want %s", p.NetNS, got, err, want)
			}
		}
	} else {
		testbed.Must(b, bed.HandRoute([]int{steadySignalPort}))
		testbed.Must(b, bed.ConfigureSignalPorts(bed.Pod(2, 1), []int{steadySignalPort}))
		testbed.Must(b, bed.ConfigureClientLimits(bed.Pod(1, 1), 2, 1))
	}
	beds[c] = bed
	return bed
}

type steadyResult struct {
	stalls  []time.Duration
	goodput []float64
}

// BenchmarkSteadyStateStalls runs, b.N rounds over, one MPTCP connection of
// 60 s per cell (steadyCells), the cells of a round one after another, and
// reports for each the longest stall (50 ms samples after the first
// second below a tenth of the connection's mean rate) and the goodput.
func BenchmarkSteadyStateStalls(b *testing.B) {
	beds := steadyBeds{}
	results := make([]steadyResult, len(steadyCells))
	port := 6100
	for b.Loop() {
		for i, c := range steadyCells {
			bed := beds.bedFor(b, c)
			if !c.agent {
				for _, p := range []*testbed.Pod{bed.Pod(1, 1), bed.Pod(2, 1)} {
					testbed.Must(b, bed.Sysctl(p.NetNS, "net.mptcp.checksum_enabled", map[bool]string{false: "0", true: "1"}[c.checksums]))
				}
			}
			port++
			rep := steadyTransferOnce(b, bed, port)
			mean := float64(rep.Bytes) * 8 / rep.DurationSeconds
			stall := testbed.LongestStall(rep, steadyStall*mean, time.Second)
			results[i].stalls = append(results[i].stalls, stall)
			results[i].goodput = append(results[i].goodput, rep.GoodputBps)
			b.Logf("%v: longest stall %v, goodput %.1f Mbit/s", c, stall, rep.GoodputBps/1e6)
		}
	}
	for i, c := range steadyCells {
		_, med, _ := minMedMax(results[i].stalls)
		b.ReportMetric(float64(med.Milliseconds()), strings.NewReplacer(" ", "", ",", "_").Replace(c.String())+"-stall-ms")
	}
	if path := os.Getenv("BENCH_REPORT"); path != "" {
		if err := benchdoc.ReplaceSection(path, steadySection, steadyReport(results)); err != nil {
			b.Fatal(err)
		}
	}
}

// steadyTransferOnce sends one connection of steadyTransfer from pod (1,1)
// to pod (2,1), its subflows on the pods' congestion control, and returns
// the server's report; a transfer that does not arrive whole ends the
// benchmark.
func steadyTransferOnce(b *testing.B, bed *testbed.Bed, port int) testbed.ServerReport {
	b.Helper()
	_, got := transferOnce(b, bed, port, steadyTransfer+time.Minute,
		[]string{"-warmup", "2s", "-window", (steadyTransfer - 4*time.Second).String(), "-sample", steadySample.String()},
		"-duration", steadyTransfer.String())
	return got
}

func steadyReport(results []steadyResult) string {
	var s strings.Builder
	reportHead(&s, steadySection, "BenchmarkSteadyStateStalls", len(results[0].stalls))
	fmt.Fprintf(&s, "Two nodes, two equal links, nothing failing; one MPTCP connection of %v from a pod on node 1 to a pod on node 2, "+
		"its subflows placed by the agent (the chart's defaults) or by hand routing and the kernel's path manager, with DSS checksums on "+
		"or off in both pods, and the pods' congestion control the node's default (bbr) or the agent's; the server samples what it receives every %v, and a stall is "+
		"the longest stretch after the first second below a tenth of the connection's mean rate. The cells of a round run one after "+
		"another, rounds interleaved.\n\n", steadyTransfer, steadySample)
	s.WriteString("| subflows | checksums | links | cc | rounds | longest stall | goodput (Mbit/s) |\n|---|---|---|---|---|---|---|\n")
	for i, c := range steadyCells {
		r := results[i]
		slo, smed, shi := minMedMax(r.stalls)
		glo, gmed, ghi := minMedMax(r.goodput)
		fmt.Fprintf(&s, "| %s | %s | 2 x %s | %s | %d | %v/%v/%v | %.1f/%.1f/%.1f |\n",
			map[bool]string{true: "agent", false: "hand-routed"}[c.agent], map[bool]string{true: "on", false: "off"}[c.checksums],
			c.rate, c.ccColumn(), len(r.stalls), slo, smed, shi, glo/1e6, gmed/1e6, ghi/1e6)
	}
	return s.String()
}
