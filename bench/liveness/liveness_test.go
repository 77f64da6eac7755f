// Package liveness measures what the agent's liveness probes cost a node
// (docs/agent.md, "Liveness"): the CPU of probing 100 and 1,000 peers over
// 4 paths at the default interval, with every peer busy (as without the
// datapath's traffic record), none, or 50 (the node's pods send to 50
// peers), beside the same process idle; and whether a flood forged with a
// peer's address takes a path down, without a filter and with the
// datapath's (flood_test.go).
//
//	go test -run '^$' -bench . -benchtime 1x ./bench/liveness/
package liveness

import (
	"encoding/json"
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
	paths  = 4
	window = 5 * time.Second
	rounds = 3
)

// cpu is the process's user and system time.
func cpu() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// busyFirst says the peers in slots 1..n have traffic now, the others
// none: what the datapath records when the node's pods send to n peers.
type busyFirst int

func (n busyFirst) Since(slot uint32) (time.Duration, bool) {
	if slot >= 1 && slot <= uint32(n) {
		return 0, true
	}
	return 0, false
}

// probeCase is one row: peers probed over paths, busy of them with
// traffic (-1: no traffic record, every peer busy, as before the datapath
// kept one), the idle peers probed every idle (0: the default).
type probeCase struct {
	peers, busy int
	idle        time.Duration
}

func (c probeCase) String() string {
	var s string
	switch c.busy {
	case -1:
		s = fmt.Sprintf("%d peers, no traffic record (every peer busy)", c.peers)
	case 0:
		s = fmt.Sprintf("%d peers, none busy", c.peers)
	default:
		s = fmt.Sprintf("%d peers, %d busy", c.peers, c.busy)
	}
	if c.idle != 0 {
		s += fmt.Sprintf(", idle interval %v", c.idle)
	}
	return s
}

// probeFigures are one case's rounds: one node's share of a core, and what
// it sent and received a second in the last round.
type probeFigures struct {
	busy           []float64
	sent, received float64
}

// addrOf is peer i's address.
func addrOf(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 210, byte(100 + i/200), byte(10 + i%200)})
}

// measure sets node a on one veth with 4 addresses (its paths) and the
// case's peers on the other end, an address each, and probes: node a, in
// this process, probes every peer over its 4 paths, and the peers, a
// socket per address in one prober of another process (startPeers), probe
// a's 4 addresses, both following the same traffic. a does what one node
// of the cluster does (sends, answers and receives a datagram per peer and
// path at each peer's pace), and this process's CPU is a's alone.
func measure(b *testing.B, c probeCase) probeFigures {
	b.Helper()
	testutil.RequireRoot(b, "ip")
	a, p := testutil.NetNS(b, "lba"), testutil.NetNS(b, "lbp")
	testutil.Run(b, "ip", "-n", a, "link", "add", "nic1", "type", "veth", "peer", "name", "nic1", "netns", p)
	for k := 1; k <= paths; k++ {
		testutil.Run(b, "ip", "-n", a, "addr", "add", fmt.Sprintf("10.210.%d.1/16", k), "dev", "nic1")
	}
	var batch strings.Builder
	for i := range c.peers {
		fmt.Fprintf(&batch, "addr add %s/16 dev nic1\n", addrOf(i))
	}
	cmd := exec.Command("ip", "-n", p, "-batch", "-")
	cmd.Stdin = strings.NewReader(batch.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("adding the peers' addresses: %v: %s", err, out)
	}
	testutil.Run(b, "ip", "-n", a, "link", "set", "nic1", "up")
	testutil.Run(b, "ip", "-n", p, "link", "set", "nic1", "up")
	// The peers' neighbour entries, permanent: a thousand resolved on
	// demand overflow the neighbour table's collection thresholds (global,
	// not the bed's to change), and a probe that waits for an answer to
	// ARP is dropped, which at the idle pace costs a peer 2 s.
	out, err := exec.Command("ip", "-n", p, "-j", "link", "show", "nic1").Output()
	if err != nil {
		b.Fatalf("reading the peers' MAC address: %v", err)
	}
	var links []struct {
		Address string `json:"address"`
	}
	if err := json.Unmarshal(out, &links); err != nil || len(links) != 1 {
		b.Fatalf("reading the peers' MAC address from %s: %v", out, err)
	}
	batch.Reset()
	for i := range c.peers {
		fmt.Fprintf(&batch, "neigh replace %s lladdr %s dev nic1 nud permanent\n", addrOf(i), links[0].Address)
	}
	cmd = exec.Command("ip", "-n", a, "-batch", "-")
	cmd.Stdin = strings.NewReader(batch.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("adding the peers' neighbour entries: %v: %s", err, out)
	}
	time.Sleep(200 * time.Millisecond)

	config := cfg()
	config.IdleInterval = c.idle
	if c.busy >= 0 {
		config.Traffic = busyFirst(c.busy)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var node []liveness.Path
	for k := 1; k <= paths; k++ {
		path := liveness.Path{Index: uint32(k), Name: fmt.Sprintf("path%d", k), Interface: "nic1",
			Local: netip.MustParseAddr(fmt.Sprintf("10.210.%d.1", k))}
		for i := range c.peers {
			path.Peers = append(path.Peers, liveness.Peer{Node: fmt.Sprintf("peer%d", i), Addr: addrOf(i), Slot: uint32(i + 1)})
		}
		node = append(node, path)
	}

	var f probeFigures
	for range rounds {
		peers := startPeers(b, p, c)
		pa, err := liveness.New(config, log, nil)
		if err != nil {
			b.Fatal(err)
		}
		testutil.InNetNS(b, a, func() {
			if err := pa.Sync(node); err != nil {
				b.Error(err)
			}
		})
		// Every peer Up: an idle one answers its first probe, which
		// goes within an idle interval.
		deadline := time.Now().Add(max(c.idle, liveness.IdleInterval) + 3*time.Second)
		up := 0
		for time.Now().Before(deadline) {
			up = 0
			for _, s := range pa.States() {
				if s.State == liveness.Up {
					up++
				}
			}
			if up == c.peers*paths {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if up != c.peers*paths {
			pa.Close()
			b.Fatalf("%v: %d of %d peer paths up", c, up, c.peers*paths)
		}
		before := pa.Counters()
		c0 := cpu()
		time.Sleep(window)
		used := (cpu() - c0).Seconds() / window.Seconds()
		after := pa.Counters()
		pa.Close()
		peers.stop()
		f.busy = append(f.busy, used)
		f.sent = float64(after.ProbesSent-before.ProbesSent) / window.Seconds()
		f.received = float64(after.EchoesReceived-before.EchoesReceived) / window.Seconds()
	}
	slices.Sort(f.busy)
	return f
}

// BenchmarkProbes: one node's CPU for its liveness probes, by peers and
// busy peers; beside it, the same process idle. Reported: min and median of
// the rounds.
func BenchmarkProbes(b *testing.B) {
	target := probeCase{peers: 1000, busy: 50}
	cases := []probeCase{{peers: 100, busy: -1}, {peers: 100}, {peers: 100, busy: 100}, {peers: 1000}, target,
		{peers: 1000, busy: 50, idle: 10 * time.Second}}
	var idle []float64
	figures := map[probeCase]probeFigures{}
	for range b.N {
		for range rounds {
			c0 := cpu()
			time.Sleep(window)
			idle = append(idle, (cpu()-c0).Seconds()/window.Seconds())
		}
		for _, c := range cases {
			figures[c] = measure(b, c)
		}
	}
	slices.Sort(idle)
	b.ReportMetric(figures[target].busy[rounds/2]*100, "cpu-%/node@1000peers,50busy")
	if path := os.Getenv("BENCH_REPORT"); path != "" {
		var body strings.Builder
		fmt.Fprintf(&body, "## Liveness probes\n\n")
		fmt.Fprintf(&body, "Measured by `make bench-liveness` (bench/liveness) on %s, %s, %d CPUs, %s: one node probing its peers over %d paths "+
			"at the defaults (every %v while the peer is busy, every %v while it is idle; port %d), in network namespaces over one veth. "+
			"A peer is busy while the node's pods sent to it within %v (the datapath's record, here a stand-in that names the busy peers). "+
			"The peers (an address and a socket each, on the veth's far end) probe the node back at the same pace from another process: "+
			"the CPU is the node's process alone. Beside it, the same process idle over the same %v window; %d rounds each.\n\n",
			time.Now().Format("2006-01-02"), benchdoc.CPUModel(), runtime.NumCPU(), runtime.Version(), paths,
			cfg().Interval, liveness.IdleInterval, cfg().Port, liveness.BusyFor, window, rounds)
		body.WriteString(probesTable(cases, figures, idle))
		fmt.Fprintf(&body, "\nThe cost grows with the busy peers' paths at the interval and the idle peers' paths at the idle interval. "+
			"1,000 peers all busy (133,000 probes a second each way) are not run: the two cores cannot carry both sides. "+
			"`interval`, `detectMultiplier` and `idleInterval` trade the cost against detection time ([agent](agent.md#liveness)).\n\n")
		all := figures[probeCase{peers: 100, busy: 100}]
		perProbe := time.Duration(all.busy[rounds/2] / all.sent * float64(time.Second))
		busyProbes := float64(target.busy*paths) * float64(time.Second/cfg().Interval)
		fmt.Fprintf(&body, "Against the target of 2 %% of a core at 1,000 peers of which 50 are busy: %.1f %% (median). What stops it is what "+
			"a probe costs here: with 100 busy peers, %v of CPU per probe sent (the node's probe and its echo, and the peer's probe it answers: "+
			"four system calls and two wake-ups). The 50 busy peers' %.0f probes a second alone take about %.0f %%; the 950 idle peers' "+
			"about %.0f %% at the default idle interval, and %.1f %% at 10 s. Below 2 %% needs the busy peers judged from their own "+
			"traffic, without probes: the datapath would have to tell loss and silence per path and peer from the subflows' "+
			"acknowledgements and retransmissions, which it does not.\n",
			figures[target].busy[rounds/2]*100, perProbe.Round(100*time.Nanosecond), busyProbes, busyProbes*perProbe.Seconds()*100,
			(figures[target].busy[rounds/2]-busyProbes*perProbe.Seconds())*100,
			(figures[probeCase{peers: 1000, busy: 50, idle: 10 * time.Second}].busy[rounds/2]-busyProbes*perProbe.Seconds())*100)
		if err := benchdoc.ReplaceSection(path, "## Liveness probes", body.String()); err != nil {
			b.Fatal(err)
		}
	}
}

// probesTable is the report's table: each case's probes and one node's
// CPU, min and median of the rounds, then the process idle.
func probesTable(cases []probeCase, figures map[probeCase]probeFigures, idle []float64) string {
	var body strings.Builder
	body.WriteString("| case | probes sent a second | echoes received a second | one node's share of a core, min | median |\n" +
		"|---|---|---|---|---|\n")
	for _, c := range cases {
		f := figures[c]
		fmt.Fprintf(&body, "| %v | %.0f | %.0f | %.2f %% | %.2f %% |\n", c, f.sent, f.received, f.busy[0]*100, f.busy[rounds/2]*100)
	}
	fmt.Fprintf(&body, "| the process idle | | | %.2f %% | %.2f %% |\n", idle[0]*100, idle[rounds/2]*100)
	return body.String()
}

// cfg is the prober's configuration at the defaults.
func cfg() liveness.Config {
	d := agent.NodeDefaults("bench").Liveness
	return liveness.Config{Port: d.Port, Interval: d.Interval.Duration, Multiplier: d.DetectMultiplier}
}

// peersEnv, set in a child of the benchmark, makes it the peers' side of a
// case (peersMain) instead of running benchmarks: "PEERS/BUSY/IDLE".
const peersEnv = "BENCH_LIVENESS_PEERS"

func TestMain(m *testing.M) {
	if v := os.Getenv(peersEnv); v != "" {
		os.Exit(peersMain(v))
	}
	os.Exit(m.Run())
}

// peersMain probes node a from the case's peers, one "path" per peer
// address (its socket answers a's four addresses and probes them, as peer
// i, slot i+1, busy as a finds it), in the process's network namespace,
// until killed.
func peersMain(v string) int {
	var c probeCase
	if _, err := fmt.Sscanf(v, "%d/%d/%d", &c.peers, &c.busy, &c.idle); err != nil {
		fmt.Fprintf(os.Stderr, "%s=%q: %v\n", peersEnv, v, err)
		return 2
	}
	config := cfg()
	config.IdleInterval = c.idle
	if c.busy >= 0 {
		config.Traffic = busyFirst(c.busy)
	}
	var others []liveness.Path
	for i := range c.peers {
		path := liveness.Path{Index: uint32(100 + i), Name: fmt.Sprintf("peer%d", i), Interface: "nic1", Local: addrOf(i)}
		for k := 1; k <= paths; k++ {
			path.Peers = append(path.Peers, liveness.Peer{Node: fmt.Sprintf("a-of-peer%d", i),
				Addr: netip.MustParseAddr(fmt.Sprintf("10.210.%d.1", k)), Slot: uint32(i + 1)})
		}
		others = append(others, path)
	}
	p, err := liveness.New(config, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := p.Sync(others); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	select {}
}

// peersProcess is the peers' side of a case, a child process.
type peersProcess struct{ cmd *exec.Cmd }

// startPeers starts the case's peers in namespace ns: this benchmark's
// binary again, as peersMain.
func startPeers(b *testing.B, ns string, c probeCase) *peersProcess {
	b.Helper()
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", ns, self)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d/%d/%d", peersEnv, c.peers, c.busy, int64(c.idle)))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatalf("starting the peers: %v", err)
	}
	p := &peersProcess{cmd: cmd}
	b.Cleanup(p.stop)
	return p
}

// stop kills the peers' process, by the PID this benchmark started.
func (p *peersProcess) stop() {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
}
