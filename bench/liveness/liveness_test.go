// Package liveness measures what the agent's liveness probes cost a node
// (docs/agent.md, "Liveness"): the CPU of probing 100 peers over 4 paths at
// the default interval, beside the same process idle; and whether a flood
// forged with a peer's address takes a path down, without a filter and
// with the datapath's (flood_test.go).
//
//	go test -run '^$' -bench . -benchtime 1x ./bench/liveness/
package liveness

import (
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/bench/benchdoc"
	"github.com/mptcp-operator/mptcp-operator/internal/agent"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/liveness"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

const (
	peers  = 100
	paths  = 4
	window = 5 * time.Second
	rounds = 3
)

func run(b *testing.B, args ...string) {
	b.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		b.Fatalf("%v: %v: %s", args, err, out)
	}
}

// cpu is the process's user and system time.
func cpu() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkProbes100Peers4Paths: node a probes 100 peers over 4 paths (4
// addresses on one veth), and the 100 peers, each a socket per path on the
// other end, probe a back: a does what one node of a 101-node cluster does
// (sends, answers and receives 400 datagrams per interval each), and the
// peers' side does the same in sum, so the process's CPU is twice one
// node's. Reported: one node's share of a core, beside the same process
// idle for the same window, min and median of the rounds.
func BenchmarkProbes100Peers4Paths(b *testing.B) {
	testutil.RequireRoot(b, "ip")
	a, p := testutil.NetNS(b, "lba"), testutil.NetNS(b, "lbp")
	run(b, "ip", "-n", a, "link", "add", "nic1", "type", "veth", "peer", "name", "nic1", "netns", p)
	for k := 1; k <= paths; k++ {
		run(b, "ip", "-n", a, "addr", "add", fmt.Sprintf("10.210.%d.1/16", k), "dev", "nic1")
	}
	for i := range peers {
		run(b, "ip", "-n", p, "addr", "add", fmt.Sprintf("10.210.100.%d/16", 10+i), "dev", "nic1")
	}
	run(b, "ip", "-n", a, "link", "set", "nic1", "up")
	run(b, "ip", "-n", p, "link", "set", "nic1", "up")
	// Let DAD-free IPv4 addresses and the veth settle.
	time.Sleep(200 * time.Millisecond)

	defaults := agent.NodeDefaults("bench").Liveness
	cfg := liveness.Config{Port: defaults.Port, Interval: defaults.Interval.Duration, Multiplier: defaults.DetectMultiplier}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var node, others []liveness.Path
	for k := 1; k <= paths; k++ {
		local := netip.MustParseAddr(fmt.Sprintf("10.210.%d.1", k))
		path := liveness.Path{Index: uint32(k), Name: fmt.Sprintf("path%d", k), Interface: "nic1", Local: local}
		for i := range peers {
			remote := netip.MustParseAddr(fmt.Sprintf("10.210.100.%d", 10+i))
			path.Peers = append(path.Peers, liveness.Peer{Node: fmt.Sprintf("peer%d", i), Addr: remote})
		}
		node = append(node, path)
	}
	for i := range peers {
		// One "path" per peer address: its socket answers a's four
		// addresses and probes them.
		path := liveness.Path{Index: uint32(100 + i), Name: fmt.Sprintf("peer%d", i), Interface: "nic1",
			Local: netip.MustParseAddr(fmt.Sprintf("10.210.100.%d", 10+i))}
		for k := 1; k <= paths; k++ {
			path.Peers = append(path.Peers, liveness.Peer{Node: "a", Addr: netip.MustParseAddr(fmt.Sprintf("10.210.%d.1", k))})
		}
		others = append(others, path)
	}

	var idle, busy []float64
	var sent, echoes uint64
	for range b.N {
		for range rounds {
			c0 := cpu()
			time.Sleep(window)
			idle = append(idle, (cpu()-c0).Seconds()/window.Seconds())

			pa, err := liveness.New(cfg, log, nil)
			if err != nil {
				b.Fatal(err)
			}
			pp, err := liveness.New(cfg, log, nil)
			if err != nil {
				b.Fatal(err)
			}
			testutil.InNetNS(b, a, func() {
				if err := pa.Sync(node); err != nil {
					b.Error(err)
				}
			})
			testutil.InNetNS(b, p, func() {
				if err := pp.Sync(others); err != nil {
					b.Error(err)
				}
			})
			time.Sleep(time.Second) // every peer Up
			before := pa.Counters()
			c0 = cpu()
			time.Sleep(window)
			used := (cpu() - c0).Seconds() / window.Seconds()
			after := pa.Counters()
			up := 0
			for _, s := range pa.States() {
				if s.State == liveness.Up {
					up++
				}
			}
			pa.Close()
			pp.Close()
			if up != peers*paths {
				b.Fatalf("%d of %d peer paths up", up, peers*paths)
			}
			// One node's share: the process ran two.
			busy = append(busy, used/2)
			sent, echoes = after.ProbesSent-before.ProbesSent, after.EchoesReceived-before.EchoesReceived
		}
	}
	slices.Sort(idle)
	slices.Sort(busy)
	b.ReportMetric(busy[len(busy)/2]*100, "cpu-%/node")
	b.ReportMetric(float64(sent)/window.Seconds(), "probes/s")
	if path := os.Getenv("BENCH_REPORT"); path != "" {
		var body strings.Builder
		fmt.Fprintf(&body, "## Liveness probes\n\n")
		fmt.Fprintf(&body, "Measured by `make bench-liveness` (bench/liveness) on %s, %s, %d CPUs, %s: one node probing %d peers over %d paths "+
			"at the defaults (every %v, port %d), in network namespaces over one veth: it sends, answers and receives %d datagrams per interval each "+
			"(%.0f probes a second sent in the last window, %.0f echoes received). The process ran the node and its peers, which do as much in sum: "+
			"one node's share is half the process's CPU. Beside it, the same process idle over the same %v window, %d rounds each.\n\n",
			time.Now().Format("2006-01-02"), benchdoc.CPUModel(), runtime.NumCPU(), runtime.Version(), peers, paths, cfg.Interval, cfg.Port,
			peers*paths, float64(sent)/window.Seconds(), float64(echoes)/window.Seconds(), window, rounds)
		fmt.Fprintf(&body, "| | min | median |\n|---|---|---|\n")
		fmt.Fprintf(&body, "| one node probing (share of one core) | %.2f %% | %.2f %% |\n", busy[0]*100, busy[len(busy)/2]*100)
		fmt.Fprintf(&body, "| the process idle | %.2f %% | %.2f %% |\n", idle[0]*100, idle[len(idle)/2]*100)
		fmt.Fprintf(&body, "\nThe cost grows with paths x peers; `interval` and `detectMultiplier` trade it against detection time "+
			"([agent](agent.md#liveness)).\n")
		if err := benchdoc.ReplaceSection(path, "## Liveness probes", body.String()); err != nil {
			b.Fatal(err)
		}
	}
}
