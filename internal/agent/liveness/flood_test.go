package liveness

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// The area of the tests that load a core on purpose: make test runs it
// alone (docs/testing.md, "How the suite runs"), where a busy machine does
// not starve the probers into false downs.
func TestFailover(t *testing.T) {
	t.Run("AFloodFromNoPeerNeverReachesTheProber", testAFloodFromNoPeerNeverReachesTheProber)
	t.Run("AFloodForgedWithThePeersAddressLeavesThePathsUp", testAFloodForgedWithThePeersAddressLeavesThePathsUp)
}

// floodFor is how long the flood lasts: 30 detect times of the test's
// probers.
const floodFor = 3 * time.Second

// A flood at the liveness port of node a's path address, from an address
// on the path's subnet that is no peer's and from the probers' own port,
// never reaches a's prober: nic_ingress, given the prober's peers as the
// agent gives them, drops it before the socket. The peer stays Up on both
// paths and no path goes down; the prober reads none of the flood. The
// flood is what one sending thread writes for floodFor, its rate logged.
func testAFloodFromNoPeerNeverReachesTheProber(t *testing.T) {
	a, b, pa, _, _ := probingPair(t)
	dp := filterLivenessIn(t, a, pa)

	testutil.Run(t, "ip", "-n", b, "addr", "add", "10.201.1.9/24", "dev", "nic1")
	ignored := pa.Counters().Ignored
	refused0 := refused(t, dp)
	var sent int
	testutil.InNetNS(t, b, func() {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP("10.201.1.9"), Port: testPort})
		if err != nil {
			t.Errorf("flooder: %v", err)
			return
		}
		defer c.Close()
		to := &net.UDPAddr{IP: net.ParseIP("10.201.1.1"), Port: testPort}
		probe := message{kind: kindProbe, nonce: 1, seq: 1}.marshal()
		for end := time.Now().Add(floodFor); time.Now().Before(end); {
			for range 256 {
				if _, err := c.WriteToUDP(probe, to); err == nil {
					sent++
				}
			}
		}
	})
	time.Sleep(2 * time.Duration(testMult) * testInterval) // the prober's last reads and verdicts
	read := pa.Counters().Ignored - ignored
	dropped := refused(t, dp) - refused0
	t.Logf("flood of %d datagrams in %v (%.0f a second): %d dropped by nic_ingress, %d read by the prober",
		sent, floodFor, float64(sent)/floodFor.Seconds(), dropped, read)
	if sent < 10_000 {
		t.Fatalf("the flood was %d datagrams: too few to tell", sent)
	}
	if read > uint64(sent)/100 {
		t.Errorf("the prober read %d of the flood's %d datagrams, want none past nic_ingress", read, sent)
	}
	if dropped < uint64(sent)/2 {
		t.Errorf("nic_ingress dropped %d of the flood's %d datagrams", dropped, sent)
	}
	checkUpWithoutDowns(t, pa)
}

// A flood of probes forged with the peer's own address and port (a raw
// socket on the peer's node, the peer's prober running beside it) at node
// a's liveness port: nic_ingress lets through only the budget of probes
// that do not carry a's nonce as their key, and the peer's own probes and
// echoes, which do, reach a's prober as before. Both nodes keep each other
// Up on both paths, with no down; a's prober reads a few of the flood at
// most. The flood is what one sending thread writes for floodFor, its rate
// logged (docs/benchmarks.md).
func testAFloodForgedWithThePeersAddressLeavesThePathsUp(t *testing.T) {
	a, b, pa, pb, _ := probingPair(t)
	dp := filterLivenessIn(t, a, pa)
	// Both probers speak version 2 by now: b's probes carry a's nonce.
	waitFor(t, "b's probes to a carry a's key", time.Second, func() bool {
		pb.mu.Lock()
		defer pb.mu.Unlock()
		for _, pp := range pb.paths {
			for _, tg := range pp.targets {
				if !tg.peerV2 || tg.key == 0 {
					return false
				}
			}
		}
		return true
	})
	answered := pa.Counters().ProbesAnswered
	refused0 := refused(t, dp)
	var sent int
	testutil.InNetNS(t, b, func() {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_UDP)
		if err != nil {
			t.Errorf("flooder: %v", err)
			return
		}
		defer unix.Close(fd)
		if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{10, 201, 1, 2}}); err != nil {
			t.Errorf("flooder: binding to the peer's address: %v", err)
			return
		}
		to := &unix.SockaddrInet4{Addr: [4]byte{10, 201, 1, 1}}
		probe := message{kind: kindProbe, nonce: 1, seq: 1}.marshal()
		// The UDP header (no checksum), then the probe.
		datagram := binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, testPort), testPort)
		datagram = binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(datagram, uint16(8+len(probe))), 0)
		datagram = append(datagram, probe...)
		for end := time.Now().Add(floodFor); time.Now().Before(end); {
			for range 256 {
				if unix.Sendto(fd, datagram, 0, to) == nil {
					sent++
				}
			}
		}
	})
	time.Sleep(2 * time.Duration(testMult) * testInterval)
	forgedAnswered := pa.Counters().ProbesAnswered - answered
	dropped := refused(t, dp) - refused0
	t.Logf("flood forged with the peer's address: %d datagrams in %v (%.0f a second): %d dropped by nic_ingress, %d probes answered by a (the peer's own included); a counted %d socket drops",
		sent, floodFor, float64(sent)/floodFor.Seconds(), dropped, forgedAnswered, pa.Counters().SocketDrops)
	if sent < 10_000 {
		t.Fatalf("the flood was %d datagrams: too few to tell", sent)
	}
	if dropped < uint64(sent)*9/10 {
		t.Errorf("nic_ingress dropped %d of the flood's %d datagrams, want all but the budget", dropped, sent)
	}
	checkUpWithoutDowns(t, pa, pb)
}

// filterLivenessIn loads the datapath in ns, attaches nic_ingress to both
// NICs, and lists p's peers with p's nonces, as the agent does.
func filterLivenessIn(t *testing.T, ns string, p *Prober) *datapath.Datapath {
	t.Helper()
	var dp *datapath.Datapath
	testutil.InNetNS(t, ns, func() {
		var err error
		if dp, err = datapath.Load(datapath.Options{}); err != nil {
			t.Errorf("loading the datapath: %v", err)
			return
		}
		t.Cleanup(func() { _ = dp.Close() })
		for k, nic := range []string{"nic1", "nic2"} {
			ifc, err := net.InterfaceByName(nic)
			if err != nil {
				t.Error(err)
				return
			}
			if err := dp.SetNIC(ifc.Index, uint32(k+1)); err != nil {
				t.Error(err)
				return
			}
			l, err := link.AttachTCX(link.TCXOptions{Interface: ifc.Index, Program: dp.Program(datapath.HookNICIngress), Attach: ebpf.AttachTCXIngress})
			if err != nil {
				t.Errorf("attaching nic_ingress to %s: %v", nic, err)
				return
			}
			t.Cleanup(func() { _ = l.Close() })
		}
	})
	if t.Failed() {
		t.FailNow()
	}
	peers := map[netip.Addr][]datapath.LivenessPeer{}
	for _, path := range pathsOf("1", "2") {
		for _, peer := range path.Peers {
			peers[path.Local] = append(peers[path.Local], datapath.LivenessPeer{Addr: peer.Addr, Nonce: p.Nonce(path.Local, peer)})
		}
	}
	if err := dp.SetLivenessPort(testPort); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetLivenessPeers(peers, testInterval, testInterval); err != nil {
		t.Fatal(err)
	}
	return dp
}

// checkUpWithoutDowns asserts that each prober has its peer Up on every
// path, after no down.
func checkUpWithoutDowns(t *testing.T, probers ...*Prober) {
	t.Helper()
	for i, p := range probers {
		for _, s := range p.States() {
			if s.State != Up || s.Downs != 0 {
				t.Errorf("prober %d, path %d: the peer is %v after %d downs, want Up after none", i+1, s.Path, s.State, s.Downs)
			}
		}
	}
}

func refused(t *testing.T, dp *datapath.Datapath) uint64 {
	t.Helper()
	st, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return st[datapath.StatLivenessRefused]
}
