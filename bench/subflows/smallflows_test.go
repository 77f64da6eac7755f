package subflows

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/bench/benchdoc"
	"github.com/mptcp-operator/mptcp-operator/internal/agent"
	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// The flows BenchmarkSmallFlows times: the sizes the research this
// project grew from names (its small flows are those under 220 KB), and a
// bulk flow whose goodput the threshold must keep.
var (
	smallSizes = []int64{16_000, 64_000, 220_000, 1_000_000}
	bulkSize   = int64(64_000_000)
)

// flowsPerSize is how many flows of each small size a round sends, one
// after another: the shorter the flow, the more of them (sub-millisecond
// flows vary most), about a second a round each; bulkPerRound is the bulk
// flows'.
var flowsPerSize = map[int64]int{16_000: 400, 64_000: 200, 220_000: 100, 1_000_000: 25}

const bulkPerRound = 3

// pathCase is the bed's two paths: nic1 always 200 Mbit/s (every
// connection's first subflow: the rule's first path), nic2 as given.
type pathCase struct {
	name, second string
}

var pathCases = []pathCase{
	{name: "equal (200 + 200 Mbit/s)", second: "200mbit"},
	{name: "differ (200 + 50 Mbit/s)", second: "50mbit"},
}

// flowMode is how a flow gets its subflows. Every MPTCP mode holds its
// joins for the agents' default holdoff: joins opened active change
// streams on this kernel (docs/subflows.md, "Held joins"), and one did in
// this benchmark's first runs.
type flowMode struct {
	name      string
	mptcp     bool
	joinAfter int64
}

// flowModes: the first three are the comparison the report's ratios make
// (the default threshold against TCP and against joins at once); the other
// thresholds show what a smaller or a larger one would give.
var flowModes = []flowMode{
	{name: "TCP"},
	{name: "joins at once", mptcp: true},
	{name: "threshold 128 KiB (default)", mptcp: true, joinAfter: mptcpv1alpha1.DefaultJoinAfterBytes},
	{name: "threshold 32 KiB", mptcp: true, joinAfter: 32 << 10},
	{name: "threshold 1 MiB", mptcp: true, joinAfter: 1 << 20},
}

// label is the mode as the report's columns name it: TCP, at once, or
// the threshold.
func (m flowMode) label() string {
	if m.name == "joins at once" {
		return "at once"
	}
	return strings.TrimPrefix(m.name, "threshold ")
}

// smallFlowResult is one path case's rounds: by mode, then size, each
// round's median completion time; by mode, every bulk flow's goodput.
type smallFlowResult struct {
	paths   pathCase
	fct     map[string]map[int64][]time.Duration
	goodput map[string][]float64
	// stalled counts, by mode, the flows that made no progress for 5 s
	// (their bytes arrived unchanged); they are left out of the figures.
	stalled map[string]int
}

// BenchmarkSmallFlows sends, per round and mode, flowsPerSize flows of
// each small size one after another and bulkPerRound bulk flows, from the pod on
// node 1 to the pod on node 2, over two paths that are equal or differ,
// and reports each size's median flow completion time (connect to the
// server's close, every byte checked) and the bulk flow's goodput. The
// rule is preferredFirst over nic1 then nic2: every first subflow (and
// every TCP connection) takes nic1, joins nic2. The modes of a round share
// the bed: the agents' rule changes between them.
//
//	BENCH_REPORT=$PWD/docs/benchmarks.md go test -run '^$' -bench BenchmarkSmallFlows -benchtime 5x ./bench/subflows/
func BenchmarkSmallFlows(b *testing.B) {
	bins, err := framework.BuildBinaries(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	var results []smallFlowResult
	for _, pc := range pathCases {
		b.Run(pc.name, func(b *testing.B) {
			results = append(results, runSmallFlows(b, bins, pc))
		})
	}
	if path := os.Getenv("BENCH_REPORT"); path != "" && len(results) == len(pathCases) {
		if err := benchdoc.ReplaceSection(path, smallFlowsSection, smallFlowsReport(results)); err != nil {
			b.Fatal(err)
		}
	}
}

func runSmallFlows(b *testing.B, bins framework.Binaries, pc pathCase) smallFlowResult {
	ctx := b.Context()
	bed := testbed.NewForTest(b, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "200mbit"})
	for node := 1; node <= 2; node++ {
		if err := bed.SetLinkRate(node, 2, pc.second); err != nil {
			b.Fatal(err)
		}
	}
	rule := mptcpv1alpha1.CompiledRule{SubflowCreation: mptcpv1alpha1.SubflowCreationUserspace, SpreadMode: mptcpv1alpha1.SpreadPreferredFirst}
	agents, err := framework.StartAgentsWith(ctx, bed, bins.Agent, func(*testbed.Node) mptcpv1alpha1.CompiledRule { return rule },
		framework.WithJoinHoldoff(agent.DefaultJoinHoldoff))
	if err != nil {
		b.Fatal(err)
	}
	r := smallFlowResult{paths: pc, fct: map[string]map[int64][]time.Duration{}, goodput: map[string][]float64{}, stalled: map[string]int{}}
	// The modes take turns within each size, so that whatever else
	// loads the machine for a while loads them alike.
	use := func(m flowMode) {
		if !m.mptcp {
			return
		}
		for _, a := range agents {
			if err := a.Reconfigure(ctx, func(c *framework.NodeConfig) {
				c.Rule().JoinAfterBytes = m.joinAfter
				c.Rule().PolicyGeneration++
			}); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, m := range flowModes {
		r.fct[m.name] = map[int64][]time.Duration{}
	}
	port := 6100
	for b.Loop() {
		for _, size := range smallSizes {
			for _, m := range flowModes {
				use(m)
				port++
				secs, stalled := flows(b, bed, bins, port, m.mptcp, flowsPerSize[size], size)
				r.fct[m.name][size] = append(r.fct[m.name][size], testutil.Median(secs))
				r.stalled[m.name] += stalled
			}
		}
		for _, m := range flowModes {
			use(m)
			port++
			secs, stalled := flows(b, bed, bins, port, m.mptcp, bulkPerRound, bulkSize)
			for _, d := range secs {
				r.goodput[m.name] = append(r.goodput[m.name], float64(bulkSize)*8/d.Seconds())
			}
			r.stalled[m.name] += stalled
		}
	}
	return r
}

// flows sends n flows of size bytes one after another from pod (1,1) to a
// server on pod (2,1) and returns each one's completion time, and how many
// stalled (no progress for 5 s; the sender then gives up on it and goes
// on). A flow whose bytes arrive changed, or that breaks, ends the
// benchmark.
func flows(b *testing.B, bed *testbed.Bed, bins framework.Binaries, port int, mptcp bool, n int, size int64) ([]time.Duration, int) {
	b.Helper()
	ctx, cancel := context.WithTimeout(b.Context(), 2*time.Minute)
	defer cancel()
	client, server := bed.Pod(1, 1), bed.Pod(2, 1)
	srv, err := bed.StartTrafficServer(ctx, bins.Traffic, server, port, true)
	if err != nil {
		b.Fatal(err)
	}
	sent, sendErr := bed.Send(ctx, bins.Traffic, client, netip.AddrPortFrom(server.Addr, uint16(port)), mptcp,
		"-conns", fmt.Sprint(n), "-serial", "-bytes", fmt.Sprint(size), "-seed", fmt.Sprint(port))
	if err := srv.Stop(); err != nil {
		b.Fatal(err)
	}
	got, err := srv.Reports()
	if err != nil {
		b.Fatal(err)
	}
	if len(sent) != n {
		b.Fatalf("%d of %d flows reported: %v", len(sent), n, sendErr)
	}
	stalled := map[string]bool{}
	if _, err := testbed.MatchReports(sent, got); err != nil {
		var te *testbed.TrafficError
		if !errors.As(err, &te) || !te.OnlyStalled() {
			b.Fatal(err)
		}
		for _, f := range te.Failures {
			stalled[f.Sent.Local] = true
		}
		b.Logf("port %d: %v", port, err)
	}
	var out []time.Duration
	for _, s := range sent {
		if !stalled[s.Local] {
			out = append(out, time.Duration(s.Seconds*float64(time.Second)))
		}
	}
	if len(out) == 0 {
		b.Fatalf("port %d: every flow stalled", port)
	}
	return out, len(stalled)
}

const smallFlowsSection = "## Small flows"

func smallFlowsReport(results []smallFlowResult) string {
	var s strings.Builder
	rounds := len(results[0].fct[flowModes[0].name][smallSizes[0]])
	fmt.Fprintf(&s, "%s\n\n", smallFlowsSection)
	fmt.Fprintf(&s, "`BENCH_REPORT=$PWD/docs/benchmarks.md go test -run '^$' -bench BenchmarkSmallFlows -benchtime %dx ./bench/subflows/` "+
		"(`make bench-smallflows`), %s. ", rounds, machineLine())
	fmt.Fprintf(&s, "Two nodes, two paths: nic1 at 200 Mbit/s, nic2 at 200 or 50 Mbit/s each way; the rule is preferredFirst over nic1 "+
		"then nic2, so every first subflow and every TCP connection takes nic1 and the join nic2. Each round sends, in each mode, "+
		"%s, one after another, from the pod on node 1 to the pod on node 2; a flow's completion time runs from connect to the server's close "+
		"after the last byte, every byte checked. The modes share the bed (the agents' rule changes between them) and take turns within each size of each round; the MPTCP "+
		"modes hold joins for the agents' default holdoff (20 ms). Completion times are min/median of the rounds' medians; goodputs min/median of every bulk flow, "+
		"in the last row; the columns name the modes by their join threshold; the ratios compare medians.\n\n", roundFlows())
	for _, r := range results {
		fmt.Fprintf(&s, "Paths %s, flow completion time (ms):\n\n", r.paths.name)
		s.WriteString("| flow |")
		for _, m := range flowModes {
			fmt.Fprintf(&s, " %s |", m.label())
		}
		s.WriteString(" default/TCP | default/at once |\n|---|")
		s.WriteString(strings.Repeat("---|", len(flowModes)+2) + "\n")
		for _, size := range smallSizes {
			fmt.Fprintf(&s, "| %s |", sizeName(size))
			meds := map[string]float64{}
			for _, m := range flowModes {
				v := r.fct[m.name][size]
				meds[m.name] = ms(testutil.Median(v))
				fmt.Fprintf(&s, " %.2f/%.2f |", ms(slices.Min(v)), meds[m.name])
			}
			th := meds[flowModes[2].name]
			fmt.Fprintf(&s, " %.2f | %.2f |\n", th/meds[flowModes[0].name], th/meds[flowModes[1].name])
		}
		fmt.Fprintf(&s, "| %s (Mbit/s) |", sizeName(bulkSize))
		meds := map[string]float64{}
		for _, m := range flowModes {
			v := r.goodput[m.name]
			meds[m.name] = testutil.Median(v)
			fmt.Fprintf(&s, " %.0f/%.0f |", slices.Min(v)/1e6, meds[m.name]/1e6)
		}
		th := meds[flowModes[2].name]
		fmt.Fprintf(&s, " %.2f | %.2f |\n\n", th/meds[flowModes[0].name], th/meds[flowModes[1].name])
		var stalls []string
		for _, m := range flowModes {
			if n := r.stalled[m.name]; n > 0 {
				stalls = append(stalls, fmt.Sprintf("%s %d", m.name, n))
			}
		}
		if len(stalls) > 0 {
			fmt.Fprintf(&s, "Flows that made no progress for 5 s (their bytes arrived unchanged; left out of the figures): %s.\n\n", strings.Join(stalls, ", "))
		}
	}
	return strings.TrimRight(s.String(), "\n") + "\n"
}

// roundFlows says what a round sends in each mode.
func roundFlows() string {
	var parts []string
	for _, size := range smallSizes {
		parts = append(parts, fmt.Sprintf("%d flows of %s", flowsPerSize[size], sizeName(size)))
	}
	return strings.Join(parts, ", ") + fmt.Sprintf(" and %d of %s", bulkPerRound, sizeName(bulkSize))
}

// machineLine says when and where a benchmark ran.
func machineLine() string {
	return fmt.Sprintf("on %s: %s, %d CPUs, Linux %s", time.Now().UTC().Format("2006-01-02"), benchdoc.CPUModel(), runtime.NumCPU(),
		benchdoc.KernelRelease())
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func sizeName(n int64) string {
	if n >= 1_000_000 {
		return fmt.Sprintf("%d MB", n/1_000_000)
	}
	return fmt.Sprintf("%d KB", n/1000)
}
