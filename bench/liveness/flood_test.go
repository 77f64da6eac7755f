package liveness

import (
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/bench/benchdoc"
	"github.com/mptcp-operator/mptcp-operator/internal/agent"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/liveness"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

const (
	floodFor    = 3 * time.Second
	floodRounds = 3
)

// floodRun is one flood: how many datagrams went, and what the two
// probers saw.
type floodRun struct {
	sent        int
	downs       uint64 // the peers' transitions to Down, both probers
	notUp       int    // peer paths not Up once the flood ended
	socketDrops uint64 // node a's socket overflowed
}

// BenchmarkAFloodForgedWithAPeersAddress: node a and its peer b probe each
// other over one path at the defaults, and b's namespace floods a's
// liveness port with probes forged with b's own address and port (a raw
// socket, one thread, as fast as it writes) for floodFor. Without a filter
// the flood reaches a's socket, with the datapath's it meets nic_ingress
// configured as the agent does (a's peers and nonces). Reported per case:
// the flood's rate, and whether either node took the path down.
func BenchmarkAFloodForgedWithAPeersAddress(b *testing.B) {
	testutil.RequireRoot(b, "ip")
	a, p := testutil.NetNS(b, "lfa"), testutil.NetNS(b, "lfp")
	testutil.Run(b, "ip", "-n", a, "link", "add", "nic1", "type", "veth", "peer", "name", "nic1", "netns", p)
	testutil.Run(b, "ip", "-n", a, "addr", "add", "10.211.1.1/24", "dev", "nic1")
	testutil.Run(b, "ip", "-n", p, "addr", "add", "10.211.1.2/24", "dev", "nic1")
	testutil.Run(b, "ip", "-n", a, "link", "set", "nic1", "up")
	testutil.Run(b, "ip", "-n", p, "link", "set", "nic1", "up")
	time.Sleep(200 * time.Millisecond)

	defaults := agent.NodeDefaults("bench").Liveness
	cfg := liveness.Config{Port: defaults.Port, Interval: defaults.Interval.Duration, Multiplier: defaults.DetectMultiplier}
	local, peer := netip.MustParseAddr("10.211.1.1"), netip.MustParseAddr("10.211.1.2")
	pathOf := func(self, other netip.Addr) []liveness.Path {
		return []liveness.Path{{Index: 1, Name: "path1", Interface: "nic1", Local: self, Peers: []liveness.Peer{{Node: "other", Addr: other}}}}
	}

	var dp *datapath.Datapath
	var ifindex int
	testutil.InNetNS(b, a, func() {
		var err error
		if dp, err = datapath.Load(datapath.Options{}); err != nil {
			b.Errorf("loading the datapath: %v", err)
			return
		}
		ifc, err := net.InterfaceByName("nic1")
		if err != nil {
			b.Error(err)
			return
		}
		ifindex = ifc.Index
	})
	if b.Failed() {
		b.FailNow()
	}
	b.Cleanup(func() { _ = dp.Close() })
	if err := dp.SetNIC(ifindex, 1); err != nil {
		b.Fatal(err)
	}
	if err := dp.SetLivenessPort(uint16(cfg.Port)); err != nil {
		b.Fatal(err)
	}

	cases := []flood{{"no filter", false}, {"`nic_ingress`, as the agent configures it", true}}
	runs := map[string][]floodRun{}
	for range b.N {
		for round := range floodRounds {
			for i := range cases {
				c := cases[(i+round)%len(cases)]
				runs[c.name] = append(runs[c.name], floodOnce(b, a, p, cfg, pathOf(local, peer), pathOf(peer, local), dp, ifindex, c.filter))
			}
		}
	}

	var body strings.Builder
	fmt.Fprintf(&body, "## Liveness under a forged flood\n\n")
	fmt.Fprintf(&body, "Measured by `make bench-liveness` (bench/liveness; alone: `go test -run '^$' -bench AFlood -benchtime=1x ./bench/liveness/`, as root) on %s, %s, %d CPUs, %s. "+
		"Nodes a and b probe each other over one path at the defaults (every %v, port %d), in two network namespaces joined by a veth; "+
		"once both have each other `Up` (and speak version 2), b's namespace floods a's liveness port for %v with version 1 probes forged with "+
		"b's own address and port, from a raw socket, one thread writing as fast as it can. Without a filter, the flood reaches a's socket; "+
		"with one, it meets `nic_ingress` configured as the agent does ([agent](agent.md#liveness)). %d rounds, the cases in turn.\n\n",
		time.Now().Format("2006-01-02"), benchdoc.CPUModel(), runtime.NumCPU(), runtime.Version(), cfg.Interval, cfg.Port, floodFor, floodRounds)
	body.WriteString(floodTable(cases, runs))
	for _, c := range cases {
		down := 0
		for _, r := range runs[c.name] {
			if r.downs > 0 || r.notUp > 0 {
				down++
			}
		}
		b.ReportMetric(float64(down), "down-runs/"+map[bool]string{false: "unfiltered", true: "filtered"}[c.filter])
	}
	fmt.Fprintf(&body, "\nWhat it means: a flood forged with a peer's address and port passes the peer filter that stops every other "+
		"sender; what keeps the path up under it is the key the peer's probes carry and the budgets of `nic_ingress`, which leave the "+
		"forged probes two a probe interval. One thread's flood is what this machine's sender reaches, not a bound: past it, the "+
		"node's CPU is what a flood spends (see \"XDP or TC for dropping a flood\").\n")
	if path := os.Getenv("BENCH_REPORT"); path != "" {
		if err := benchdoc.ReplaceSection(path, "## Liveness under a forged flood", body.String()); err != nil {
			b.Fatal(err)
		}
	}
	b.Log(body.String())
}

// flood is a case of the flood benchmark: nic_ingress filters or not.
type flood struct {
	name   string
	filter bool
}

// floodTable is the report's table of the cases' runs.
func floodTable(cases []flood, runs map[string][]floodRun) string {
	var body strings.Builder
	body.WriteString("| case | runs | flood, datagrams/s min/median | runs with the path down | downs, all runs | " +
		"a's socket overflowed, median |\n|---|---|---|---|---|---|\n")
	for _, c := range cases {
		rs := runs[c.name]
		var rates []float64
		var drops []uint64
		var downs uint64
		down := 0
		for _, r := range rs {
			rates = append(rates, float64(r.sent)/floodFor.Seconds())
			drops = append(drops, r.socketDrops)
			downs += r.downs
			if r.downs > 0 || r.notUp > 0 {
				down++
			}
		}
		slices.Sort(rates)
		slices.Sort(drops)
		fmt.Fprintf(&body, "| %s | %d | %.0f/%.0f | %d of %d | %d | %d |\n", c.name, len(rs), rates[0], rates[len(rates)/2],
			down, len(rs), downs, drops[len(drops)/2])
	}
	return body.String()
}

// floodOnce starts both probers, waits until each has the other Up, floods
// a from p's namespace with probes forged with b's address for floodFor,
// and reports what it cost.
func floodOnce(b *testing.B, a, p string, cfg liveness.Config, nodeA, nodeB []liveness.Path, dp *datapath.Datapath, ifindex int, filter bool) floodRun {
	b.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	pa, err := liveness.New(cfg, log, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer pa.Close()
	pb, err := liveness.New(cfg, log, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer pb.Close()
	testutil.InNetNS(b, a, func() {
		if err := pa.Sync(nodeA); err != nil {
			b.Error(err)
		}
	})
	testutil.InNetNS(b, p, func() {
		if err := pb.Sync(nodeB); err != nil {
			b.Error(err)
		}
	})
	if filter {
		var peers = map[netip.Addr][]datapath.LivenessPeer{}
		for _, path := range nodeA {
			for _, peer := range path.Peers {
				peers[path.Local] = append(peers[path.Local], datapath.LivenessPeer{Addr: peer.Addr, Nonce: pa.Nonce(path.Local, peer)})
			}
		}
		if err := dp.SetLivenessPeers(peers, cfg.Interval, cfg.Interval); err != nil {
			b.Fatal(err)
		}
		// In a's namespace: ifindex is its nic1's there.
		var l link.Link
		testutil.InNetNS(b, a, func() {
			if l, err = link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: dp.Program(datapath.HookNICIngress), Attach: ebpf.AttachTCXIngress}); err != nil {
				b.Errorf("attaching nic_ingress: %v", err)
			}
		})
		if l == nil {
			b.FailNow()
		}
		defer l.Close()
	}
	upOnBoth := func() bool {
		for _, pr := range []*liveness.Prober{pa, pb} {
			for _, s := range pr.States() {
				if s.State != liveness.Up {
					return false
				}
			}
		}
		return true
	}
	for deadline := time.Now().Add(5 * time.Second); !upOnBoth(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatal("the probers did not have each other Up within 5 s")
		}
	}
	time.Sleep(10 * cfg.Interval) // the keys learnt: version 2 both ways
	drops := pa.Counters().SocketDrops
	var r floodRun
	testutil.InNetNS(b, p, func() {
		r.sent = forgedFlood(b, nodeB[0].Local, nodeA[0].Local, cfg.Port)
	})
	time.Sleep(2 * time.Duration(cfg.Multiplier) * cfg.Interval)
	for _, pr := range []*liveness.Prober{pa, pb} {
		for _, s := range pr.States() {
			r.downs += s.Downs
			if s.State != liveness.Up {
				r.notUp++
			}
		}
	}
	r.socketDrops = pa.Counters().SocketDrops - drops
	return r
}

// forgedFlood sends version 1 liveness probes from `from`, port port, to
// `to` for floodFor through a raw socket, in the calling thread's
// namespace, and returns how many it sent.
func forgedFlood(b *testing.B, from, to netip.Addr, port int) int {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_UDP)
	if err != nil {
		b.Fatalf("flooder: %v", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: from.As4()}); err != nil {
		b.Fatalf("flooder: binding to the peer's address: %v", err)
	}
	// A UDP header (no checksum) and a version 1 probe (wire.go).
	probe := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64([]byte("MPTL\x01\x01\x00\x00"), 1), 1)
	datagram := binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, uint16(port)), uint16(port))
	datagram = binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(datagram, uint16(8+len(probe))), 0)
	datagram = append(datagram, probe...)
	dst := &unix.SockaddrInet4{Addr: to.As4()}
	sent := 0
	for end := time.Now().Add(floodFor); time.Now().Before(end); {
		for range 256 {
			if unix.Sendto(fd, datagram, 0, dst) == nil {
				sent++
			}
		}
	}
	return sent
}
