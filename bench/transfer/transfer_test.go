// Package transfer measures what a user of the rate, checksum and join
// holdoff options sees in a transfer: how long a capped connection stalls
// under each rate mode, what DSS checksums cost in goodput, and what
// holding joins as backup costs a transfer's completion time. With BENCH_REPORT=<file> the
// results rewrite their sections of that file (docs/benchmarks.md).
//
//	BENCH_REPORT=$PWD/docs/benchmarks.md go test -run '^$' -bench . -benchtime 5x ./bench/transfer/
package transfer

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/bench/benchdoc"
	"github.com/mptcp-operator/mptcp-operator/internal/agent"
	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// The caps of the e2e rate tests (test/e2e/rate_test.go): a fifth of two
// 200 Mbit/s links for police and shape, a quarter for window.
const (
	rateCap   = 40_000_000
	windowCap = 100_000_000
	linkRate  = "200mbit"
	transfer  = 8 * time.Second
	sample    = 50 * time.Millisecond
	// skip is the connection's start, left out of the stall search.
	skip = time.Second
)

var bins framework.Binaries

func TestMain(m *testing.M) { os.Exit(framework.RunWithBinaries(m, &bins)) }

func quantity(bps int64) *resource.Quantity { return resource.NewQuantity(bps, resource.DecimalSI) }

// rateCase is a rate mode as the e2e rate tests configure it.
type rateCase struct {
	name string
	// node whose agent gets the rule; the other's selects the pod with no cap.
	node int
	rule mptcpv1alpha1.CompiledRule
	cap  float64
	cc   string
}

var rateCases = []rateCase{
	{name: "police, sender's node, cubic", node: 1, cap: rateCap, cc: "cubic",
		rule: mptcpv1alpha1.CompiledRule{RateLimits: &mptcpv1alpha1.CompiledRateLimits{Mode: mptcpv1alpha1.RateModePolice, PerConnection: quantity(rateCap), Direction: mptcpv1alpha1.RateEgress}}},
	{name: "police, sender's node, bbr", node: 1, cap: rateCap, cc: "bbr",
		rule: mptcpv1alpha1.CompiledRule{RateLimits: &mptcpv1alpha1.CompiledRateLimits{Mode: mptcpv1alpha1.RateModePolice, PerConnection: quantity(rateCap), Direction: mptcpv1alpha1.RateEgress}}},
	{name: "police, receiver's node, cubic", node: 2, cap: rateCap, cc: "cubic",
		rule: mptcpv1alpha1.CompiledRule{RateLimits: &mptcpv1alpha1.CompiledRateLimits{Mode: mptcpv1alpha1.RateModePolice, PerConnection: quantity(rateCap), Direction: mptcpv1alpha1.RateIngress}}},
	{name: "shape, sender's node (2 x 20 Mbit/s)", node: 1, cap: rateCap,
		rule: mptcpv1alpha1.CompiledRule{RateLimits: &mptcpv1alpha1.CompiledRateLimits{Mode: mptcpv1alpha1.RateModeShape, PerPath: []mptcpv1alpha1.CompiledPathRate{
			{Path: framework.PathName(1), Rate: *quantity(rateCap / 2)}, {Path: framework.PathName(2), Rate: *quantity(rateCap / 2)}}}}},
	{name: "window, receiver's node", node: 2, cap: windowCap,
		rule: mptcpv1alpha1.CompiledRule{HeaderRewriting: true, RateLimits: &mptcpv1alpha1.CompiledRateLimits{Mode: mptcpv1alpha1.RateModeWindow, PerConnection: quantity(windowCap)}}},
}

// stallResult is one case's rounds.
type stallResult struct {
	name    string
	cap     float64
	stalls  []time.Duration
	goodput []float64
}

var stallResults []stallResult

// BenchmarkRateModeStalls runs b.N transfers of 8 s for each rate mode at
// the caps the e2e tests use, one MPTCP connection over two paths, and
// reports the longest stretch (50 ms samples, after the first second) in
// which the connection received less than 10 % of its cap, and its
// goodput.
func BenchmarkRateModeStalls(b *testing.B) {
	for _, c := range rateCases {
		b.Run(c.name, func(b *testing.B) {
			bed := testbed.NewForTest(b, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: linkRate})
			if _, err := framework.StartAgentsWith(b.Context(), bed, bins.Agent, func(n *testbed.Node) mptcpv1alpha1.CompiledRule {
				if n.Index == c.node {
					return c.rule
				}
				return mptcpv1alpha1.CompiledRule{}
			}); err != nil {
				b.Fatal(err)
			}
			r := stallResult{name: c.name, cap: c.cap}
			port := 5700
			for b.Loop() {
				port++
				rep := run(b, bed, port, c.cc, nil)
				r.stalls = append(r.stalls, testbed.LongestStall(rep, c.cap/10, skip))
				r.goodput = append(r.goodput, rep.GoodputBps)
			}
			b.ReportMetric(float64(slices.Max(r.stalls).Milliseconds()), "max-stall-ms")
			stallResults = append(stallResults, r)
		})
	}
	if path := os.Getenv("BENCH_REPORT"); path != "" {
		if err := benchdoc.ReplaceSection(path, stallSection, stallReport()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDSSChecksumCost alternates transfers with DSS checksums off and
// on in both pods over unshaped links (so that the CPU, not a link, sets
// the pace) and reports the goodput of each; the ratio is the cost.
func BenchmarkDSSChecksumCost(b *testing.B) {
	bed := testbed.NewForTest(b, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1})
	if _, err := framework.StartAgents(b.Context(), bed, bins.Agent, mptcpv1alpha1.CompiledRule{}); err != nil {
		b.Fatal(err)
	}
	var off, on []float64
	port := 5800
	for b.Loop() {
		for _, checksums := range []bool{false, true} {
			port++
			rep := run(b, bed, port, "", func() {
				for _, p := range []*testbed.Pod{bed.Pod(1, 1), bed.Pod(2, 1)} {
					if err := bed.Sysctl(p.NetNS, "net.mptcp.checksum_enabled", map[bool]string{false: "0", true: "1"}[checksums]); err != nil {
						b.Fatal(err)
					}
				}
			})
			if checksums {
				on = append(on, rep.GoodputBps)
			} else {
				off = append(off, rep.GoodputBps)
			}
		}
	}
	_, offMed, _ := minMedMax(off)
	_, onMed, _ := minMedMax(on)
	b.ReportMetric(onMed/offMed, "on/off")
	if path := os.Getenv("BENCH_REPORT"); path != "" {
		if err := benchdoc.ReplaceSection(path, checksumSection, checksumReport(off, on)); err != nil {
			b.Fatal(err)
		}
	}
}

// run sends one 8 s MPTCP transfer from pod (1,1) to pod (2,1), after
// setup (when set), and returns the server's report; a transfer that does
// not arrive whole ends the benchmark.
func run(b *testing.B, bed *testbed.Bed, port int, cc string, setup func()) testbed.ServerReport {
	b.Helper()
	args := []string{"-duration", transfer.String()}
	if cc != "" {
		args = append(args, "-cc", cc)
	}
	_, got := send(b, bed, port, setup, args...)
	return got
}

// send runs one MPTCP connection from pod (1,1) to pod (2,1) with the
// sender's args, after setup (when set), and returns both ends' reports; a
// transfer that does not arrive whole ends the benchmark.
func send(b *testing.B, bed *testbed.Bed, port int, setup func(), args ...string) (testbed.SenderReport, testbed.ServerReport) {
	b.Helper()
	if setup != nil {
		setup()
	}
	return transferOnce(b, bed, port, time.Minute, []string{"-warmup", "1500ms", "-window", "6s", "-sample", sample.String()}, args...)
}

// transferOnce runs one MPTCP connection from pod (1,1) to pod (2,1),
// the server started with serverArgs and the sender with args, within
// timeout, and returns both ends' reports; a transfer that does not arrive
// whole ends the benchmark.
func transferOnce(b *testing.B, bed *testbed.Bed, port int, timeout time.Duration, serverArgs []string, args ...string) (testbed.SenderReport, testbed.ServerReport) {
	b.Helper()
	ctx, cancel := context.WithTimeout(b.Context(), timeout)
	defer cancel()
	client, server := bed.Pod(1, 1), bed.Pod(2, 1)
	srv, err := bed.StartTrafficServer(ctx, bins.Traffic, server, port, true, serverArgs...)
	if err != nil {
		b.Fatal(err)
	}
	args = append([]string{"-conns", "1", "-seed", fmt.Sprint(port)}, args...)
	sent, sendErr := bed.Send(ctx, bins.Traffic, client, netip.AddrPortFrom(server.Addr, uint16(port)), true, args...)
	if err := srv.Stop(); err != nil {
		b.Fatal(err)
	}
	got, err := srv.Reports()
	if err != nil {
		b.Fatal(err)
	}
	if len(sent) != 1 {
		b.Fatalf("sender: %v", sendErr)
	}
	byRemote, err := testbed.MatchReports(sent, got)
	if err != nil {
		b.Fatal(err)
	}
	return sent[0], byRemote[sent[0].Local]
}

func minMedMax[T float64 | time.Duration](v []T) (lo, med, hi T) {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[0], s[len(s)/2], s[len(s)-1]
}

const (
	stallSection    = "## Rate modes: longest stall"
	checksumSection = "## DSS checksums: cost"
	holdoffSection  = "## Held joins: cost"
)

func machine() string {
	return fmt.Sprintf("on %s: %s, %d CPUs, Linux %s", time.Now().UTC().Format("2006-01-02"), benchdoc.CPUModel(), runtime.NumCPU(), benchdoc.KernelRelease())
}

// reportHead starts a report's section: its heading, and the command that
// wrote it (rounds per case) on this machine.
func reportHead(s *strings.Builder, section, bench string, rounds int) {
	fmt.Fprintf(s, "%s\n\n", section)
	fmt.Fprintf(s, "`BENCH_REPORT=$PWD/docs/benchmarks.md go test -run '^$' -bench %s -benchtime %dx ./bench/transfer/`, %s. ",
		bench, rounds, machine())
}

func stallReport() string {
	var s strings.Builder
	reportHead(&s, stallSection, "BenchmarkRateModeStalls", len(stallResults[0].stalls))
	fmt.Fprintf(&s, "Two nodes, two %s links, one MPTCP connection of %v from a pod on node 1 to a pod on node 2, capped as the e2e rate tests cap it; "+
		"the server samples what it receives every %v, and a stall is the longest stretch after the first second in which the connection "+
		"received less than 10 %% of its cap. The cases run one after another in one process; other jobs may share the machine.\n\n",
		linkRate, transfer, sample)
	s.WriteString("| mode | cap | rounds | longest stall | goodput (Mbit/s) |\n|---|---|---|---|---|\n")
	for _, r := range stallResults {
		slo, smed, shi := minMedMax(r.stalls)
		glo, gmed, ghi := minMedMax(r.goodput)
		fmt.Fprintf(&s, "| %s | %.0f Mbit/s | %d | %v/%v/%v | %.1f/%.1f/%.1f |\n", r.name, r.cap/1e6, len(r.stalls), slo, smed, shi,
			glo/1e6, gmed/1e6, ghi/1e6)
	}
	return s.String()
}

func checksumReport(off, on []float64) string {
	var s strings.Builder
	reportHead(&s, checksumSection, "BenchmarkDSSChecksumCost", len(off))
	fmt.Fprintf(&s, "Two nodes, two unshaped links (the CPU sets the pace), the agent spreading one MPTCP connection of %v over both; transfers "+
		"with `net.mptcp.checksum_enabled` off and on in both pods alternate in the same run, so that whatever else loads the machine "+
		"loads both alike; on these shared 2-core machines single rounds vary by a third, so only medians over many rounds say something.\n\n", transfer)
	olo, omed, ohi := minMedMax(off)
	nlo, nmed, nhi := minMedMax(on)
	s.WriteString("| checksums | rounds | goodput (Mbit/s) |\n|---|---|---|\n")
	fmt.Fprintf(&s, "| off | %d | %.0f/%.0f/%.0f |\n", len(off), olo/1e6, omed/1e6, ohi/1e6)
	fmt.Fprintf(&s, "| on | %d | %.0f/%.0f/%.0f |\n", len(on), nlo/1e6, nmed/1e6, nhi/1e6)
	fmt.Fprintf(&s, "\nMedian with checksums / median without: %.2f.\n", nmed/omed)
	return s.String()
}

// holdoffSizes are the transfers BenchmarkJoinHoldoffCost times: one over
// in a few tens of milliseconds, where a held join may sit idle for much of
// it, and one long beside the hold.
var holdoffSizes = []int64{4 << 20, 64 << 20}

// holdoffResult is one join holdoff's completion times, by size.
type holdoffResult struct {
	holdoff time.Duration
	seconds map[int64][]float64
}

// BenchmarkJoinHoldoffCost times fixed-size transfers over two 200 Mbit/s
// paths with the agents' joins held as backup for 0 (opened active), the
// default and 100 ms (docs/subflows.md, "Held joins"): what the defence
// against the kernel's relabelled joins costs a short and a long transfer.
func BenchmarkJoinHoldoffCost(b *testing.B) {
	var results []holdoffResult
	for _, d := range []time.Duration{0, agent.DefaultJoinHoldoff, 100 * time.Millisecond} {
		b.Run(fmt.Sprintf("holdoff=%v", d), func(b *testing.B) {
			bed := testbed.NewForTest(b, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: linkRate})
			if _, err := framework.StartAgentsWith(b.Context(), bed, bins.Agent, func(*testbed.Node) mptcpv1alpha1.CompiledRule {
				return mptcpv1alpha1.CompiledRule{SubflowCreation: mptcpv1alpha1.SubflowCreationUserspace}
			}, framework.WithJoinHoldoff(d)); err != nil {
				b.Fatal(err)
			}
			r := holdoffResult{holdoff: d, seconds: map[int64][]float64{}}
			port := 5900
			for b.Loop() {
				for _, size := range holdoffSizes {
					port++
					sent, _ := send(b, bed, port, nil, "-bytes", fmt.Sprint(size))
					r.seconds[size] = append(r.seconds[size], sent.Seconds)
				}
			}
			results = append(results, r)
		})
	}
	if path := os.Getenv("BENCH_REPORT"); path != "" {
		if err := benchdoc.ReplaceSection(path, holdoffSection, holdoffReport(results)); err != nil {
			b.Fatal(err)
		}
	}
}

func holdoffReport(results []holdoffResult) string {
	var s strings.Builder
	reportHead(&s, holdoffSection, "BenchmarkJoinHoldoffCost", len(results[0].seconds[holdoffSizes[0]]))
	fmt.Fprintf(&s, "Two nodes, two %s links, the agents as the pods' path managers with their joins held as backup for the holdoff after they are "+
		"established (0: opened active, the baseline); one MPTCP connection at a time from a pod on node 1 to a pod on node 2 sends a fixed "+
		"number of bytes, timed from connect to close. The holdoffs run one after another in one process, each on a fresh bed.\n\n",
		linkRate)
	s.WriteString("| holdoff | transfer | rounds | seconds | median/baseline median |\n|---|---|---|---|---|\n")
	for _, r := range results {
		for _, size := range holdoffSizes {
			lo, med, hi := minMedMax(r.seconds[size])
			_, base, _ := minMedMax(results[0].seconds[size])
			fmt.Fprintf(&s, "| %v | %d MiB | %d | %.3f/%.3f/%.3f | %.2f |\n", r.holdoff, size>>20, len(r.seconds[size]), lo, med, hi,
				med/base)
		}
	}
	return s.String()
}
