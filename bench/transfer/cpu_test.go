package transfer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/bench/benchdoc"
	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// Where the CPU, not the link, sets the pace: unshaped links, every way of
// moving a pod's transfer side by side in each round.
const (
	cpuSection = "## Unshaped links: the CPU sets the pace"
	// cpuNoChecksums is the agent with DSS checksums off, the default
	// that costs CPU.
	cpuNoChecksums = "MPTCP, agent, checksums off"
	cpuDuration    = 8 * time.Second
	cpuWarmup      = 2 * time.Second
)

// cpuConns are the connection counts of a round.
var cpuConns = []int{1, 4, 16}

// cpuScenarios are the rows of each connection count, in the order a
// round runs them: framework.Compare's, the hand-written rules with the
// agent's default checksums among them, then the agent without the default
// that costs CPU.
var cpuScenarios = []string{framework.ScenarioSinglePath, framework.ScenarioKernelMPTCP, framework.ScenarioHandRouted,
	framework.ScenarioHandRoutedChecksums, framework.ScenarioAgent, cpuNoChecksums}

// cpuResult is one scenario's rounds at one connection count.
type cpuResult struct {
	goodput  []float64 // bit/s
	cpuPerGB []float64 // busy CPU seconds per gigabyte received
	// stalls are the rounds whose transfer stalled (none of the above).
	stalls int
}

func (r *cpuResult) add(m framework.Measurement) {
	if m.Stalled {
		r.stalls++
		return
	}
	r.goodput = append(r.goodput, m.GoodputBps)
	window := (cpuDuration - cpuWarmup - time.Second).Seconds()
	r.cpuPerGB = append(r.cpuPerGB, m.CPUSeconds/(m.GoodputBps*window/8/1e9))
}

// BenchmarkCPUBound runs, b.N rounds over, on two nodes of two unshaped
// links, each connection count (cpuConns) through every scenario
// (cpuScenarios) one after another, and reports each one's goodput and the
// machine's busy CPU per gigabyte received, with the agent's medians
// against single-path TCP and hand-written rules.
func BenchmarkCPUBound(b *testing.B) {
	bed := testbed.NewForTest(b, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1})
	results := map[int]map[string]*cpuResult{}
	for _, n := range cpuConns {
		results[n] = map[string]*cpuResult{}
		for _, s := range cpuScenarios {
			results[n][s] = &cpuResult{}
		}
	}
	port := 6400
	for b.Loop() {
		for _, conns := range cpuConns {
			o := framework.CompareOptions{Binaries: bins, Duration: cpuDuration, Warmup: cpuWarmup, Conns: conns, Log: b.Logf,
				HandRoutedChecksums: true, KeepStalls: true}
			ms, err := framework.Compare(b.Context(), bed, o)
			if err != nil {
				b.Fatal(err)
			}
			port++
			ms = append(ms, agentWithoutChecksums(b, bed, o, port))
			for _, m := range ms {
				results[conns][m.Scenario].add(m)
				b.Logf("%d connections, %s: %.0f Mbit/s, %.2f CPU s over the window, stalled %v", conns, m.Scenario,
					m.GoodputBps/1e6, m.CPUSeconds, m.Stalled)
			}
		}
	}
	for _, n := range cpuConns {
		agent := medianOf(results[n][framework.ScenarioAgent].goodput)
		tcp := medianOf(results[n][framework.ScenarioSinglePath].goodput)
		handSums := medianOf(results[n][framework.ScenarioHandRoutedChecksums].goodput)
		b.ReportMetric(agent/tcp, fmt.Sprintf("agent/tcp-%dconns", n))
		b.ReportMetric(agent/handSums, fmt.Sprintf("agent/hand-checksums-%dconns", n))
	}
	if path := os.Getenv("BENCH_REPORT"); path != "" {
		if err := benchdoc.ReplaceSection(path, cpuSection, cpuReport(results, b.N)); err != nil {
			b.Fatal(err)
		}
	}
}

// agentWithoutChecksums runs the agent's scenario with DSS checksums off
// in its rule, on agents started for it and uninstalled after.
func agentWithoutChecksums(b *testing.B, bed *testbed.Bed, o framework.CompareOptions, port int) framework.Measurement {
	b.Helper()
	agents, err := framework.StartAgents(b.Context(), bed, bins.Agent, mptcpv1alpha1.CompiledRule{}, framework.WithoutDataChecksums())
	defer func() {
		for _, a := range agents {
			if err := a.Uninstall(context.Background()); err != nil {
				b.Errorf("uninstalling an agent: %v", err)
			}
		}
	}()
	if err != nil {
		b.Fatal(err)
	}
	m, err := framework.Transfer(b.Context(), bed, o, bed.Pod(1, 1), bed.Pod(2, 1), port, true)
	if terr := (*testbed.TrafficError)(nil); errors.As(err, &terr) && terr.OnlyStalled() {
		b.Logf("%s: %v", cpuNoChecksums, err)
		m, err = framework.Measurement{Stalled: true}, nil
	}
	if err != nil {
		b.Fatal(err)
	}
	m.Scenario = cpuNoChecksums
	return m
}

func cpuReport(results map[int]map[string]*cpuResult, rounds int) string {
	var s strings.Builder
	reportHead(&s, cpuSection, "BenchmarkCPUBound", rounds)
	fmt.Fprintf(&s, "Two nodes, two unshaped links; transfers of %v from a pod on node 1 to a pod on node 2 (%v warm-up), "+
		"scenarios one after another in each round. CPU is the machine's busy time (user, system, softirq; both "+
		"nodes') over the goodput window, per gigabyte received. Stalled rounds (5 s without progress, bytes "+
		"intact) are counted, not in the figures.\n\n", cpuDuration, cpuWarmup)
	s.WriteString("| conns | scenario | goodput (Mbit/s) | stalled | CPU s/GB (median) | / TCP | / hand-written | " +
		"/ hand-written, checksums |\n|---|---|---|---|---|---|---|---|\n")
	for _, n := range cpuConns {
		tcp := medianOf(results[n][framework.ScenarioSinglePath].goodput)
		hand := medianOf(results[n][framework.ScenarioHandRouted].goodput)
		handSums := medianOf(results[n][framework.ScenarioHandRoutedChecksums].goodput)
		for _, sc := range cpuScenarios {
			r := results[n][sc]
			if len(r.goodput) == 0 {
				fmt.Fprintf(&s, "| %d | %s | - | %d | - | - | - | - |\n", n, sc, r.stalls)
				continue
			}
			lo, med, hi := minMedMax(r.goodput)
			_, cpu, _ := minMedMax(r.cpuPerGB)
			fmt.Fprintf(&s, "| %d | %s | %.0f/%.0f/%.0f | %d | %.2f | %.2f | %.2f | %.2f |\n", n, sc, lo/1e6, med/1e6, hi/1e6,
				r.stalls, cpu, med/tcp, med/hand, med/handSums)
		}
	}
	return s.String()
}

// medianOf is the median of v, NaN when every round stalled.
func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	_, med, _ := minMedMax(v)
	return med
}
