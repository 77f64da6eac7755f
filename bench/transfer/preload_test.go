package transfer

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/bench/benchdoc"
	"github.com/mptcp-operator/mptcp-operator/preload"
	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

const preloadSection = "## Preload library: goodput"

// preloadVariant is how the C client gets its socket.
type preloadVariant struct {
	name           string
	preload, mptcp bool
}

var preloadVariants = []preloadVariant{
	{name: "the library (TCP asked, MPTCP given)", preload: true},
	{name: "MPTCP asked by the program", mptcp: true},
	{name: "TCP (no library)"},
}

// BenchmarkPreloadGoodput compares a C client that asks for TCP, made
// MPTCP by the preload library, with the same client asking for MPTCP
// itself, and without the library (TCP, one path): one connection of 8 s
// from pod (1,1) to pod (2,1) over two 200mbit paths, the agents spreading
// the subflows with the chart's defaults.
// preloadTable is the report's table: each variant's goodputs (bit/s), in
// preloadVariants' order.
func preloadTable(goodput [][]float64) string {
	var s strings.Builder
	s.WriteString("| client | rounds | goodput (Mbit/s) | against MPTCP asked |\n|---|---|---|---|\n")
	_, base, _ := minMedMax(goodput[1])
	for i, v := range preloadVariants {
		lo, med, hi := minMedMax(goodput[i])
		fmt.Fprintf(&s, "| %s | %d | %.1f/%.1f/%.1f | %.3f |\n", v.name, len(goodput[i]), lo/1e6, med/1e6, hi/1e6, med/base)
	}
	return s.String()
}

func BenchmarkPreloadGoodput(b *testing.B) {
	dir := b.TempDir()
	prog := testbed.BuildLibcClient(b, dir)
	bed := testbed.NewForTest(b, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: linkRate})
	if _, err := framework.StartAgents(b.Context(), bed, bins.Agent, mptcpv1alpha1.CompiledRule{}); err != nil {
		b.Fatal(err)
	}
	lib, err := preload.Install(dir)
	if err != nil {
		b.Fatal(err)
	}
	client, server := bed.Pod(1, 1), bed.Pod(2, 1)
	goodput := make([][]float64, len(preloadVariants))
	port := 6400
	for b.Loop() {
		for i, v := range preloadVariants {
			port++
			srv, err := bed.StartTrafficServer(b.Context(), bins.Traffic, server, port, true, "-warmup", "1s", "-window", "6s")
			if err != nil {
				b.Fatal(err)
			}
			args := []string{prog, "-s", "8", server.Addr.String(), strconv.Itoa(port)}
			if v.mptcp {
				args = append(args, "-m")
			}
			cmd := bed.CommandContext(b.Context(), client.NetNS, args...)
			cmd.Env = os.Environ()
			if v.preload {
				cmd.Env = append(cmd.Env, "LD_PRELOAD="+lib)
			}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				b.Fatalf("%s: %v: %s", v.name, err, stderr.String())
			}
			if err := srv.Stop(); err != nil {
				b.Fatal(err)
			}
			reps, err := srv.Reports()
			if err != nil || len(reps) != 1 {
				b.Fatalf("%s: server reports %v (%v)", v.name, reps, err)
			}
			sent, err := testbed.LibcClientReports(out)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := testbed.MatchReports(sent, reps); err != nil {
				b.Fatalf("%s: %v", v.name, err)
			}
			if r := reps[0]; r.MPTCP != (v.preload || v.mptcp) {
				b.Fatalf("%s: the server's connection is MPTCP %v, want %v", v.name, r.MPTCP, v.preload || v.mptcp)
			}
			goodput[i] = append(goodput[i], reps[0].GoodputBps)
			b.Logf("%s: %.1f Mbit/s", v.name, reps[0].GoodputBps/1e6)
		}
	}
	var s strings.Builder
	reportHead(&s, preloadSection, "BenchmarkPreloadGoodput", len(goodput[0]))
	fmt.Fprintf(&s, "Two nodes, two %s links, the agents with the chart's defaults; one connection of 8 s from a C client in pod "+
		"(1,1) (hack/libc-client) to `traffic serve -mptcp` in pod (2,1), goodput over [1 s, 7 s]. The variants "+
		"alternate in each round. The ratio is the medians' against the client that asks for MPTCP itself.\n\n", linkRate)
	s.WriteString(preloadTable(goodput))
	b.Log("\n" + s.String())
	if path := os.Getenv("BENCH_REPORT"); path != "" {
		if err := benchdoc.ReplaceSection(path, preloadSection, s.String()); err != nil {
			b.Fatal(err)
		}
	}
}
