package liveness

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// The area of the tests that load a core on purpose: make test runs it
// alone (docs/testing.md, "How the suite runs"), where a busy machine does
// not starve the probers into false downs.
func TestFailover(t *testing.T) {
	t.Run("AFloodFromNoPeerNeverReachesTheProber", testAFloodFromNoPeerNeverReachesTheProber)
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
	var dp *datapath.Datapath
	testutil.InNetNS(t, a, func() {
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
	peers := map[netip.Addr][]netip.Addr{}
	for _, p := range pathsOf("1", "2") {
		for _, peer := range p.Peers {
			peers[p.Local] = append(peers[p.Local], peer.Addr)
		}
	}
	if err := dp.SetLivenessPort(testPort); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetLivenessPeers(peers); err != nil {
		t.Fatal(err)
	}

	run(t, "ip", "-n", b, "addr", "add", "10.201.1.9/24", "dev", "nic1")
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
	for _, s := range pa.States() {
		if s.State != Up || s.Downs != 0 {
			t.Errorf("path %d: the peer is %v after %d downs, want Up after none", s.Path, s.State, s.Downs)
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
