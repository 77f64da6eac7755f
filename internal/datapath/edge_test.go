package datapath

import (
	"net"
	"net/netip"
	"os/exec"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
)

// edgeBed is a datapath whose paths 1 and 2 have NICs veth-a and veth-b in
// a throwaway namespace (real devices: the redirect's MTU check reads
// theirs), the client pod's interface podIf, and a rule over paths.
type edgeBed struct {
	dp         *Datapath
	ns         string
	nic1, nic2 int
}

const edgePodIf = 4242

func newEdgeBed(t *testing.T, paths ...uint32) edgeBed {
	t.Helper()
	b := edgeBed{dp: loadForTest(t), ns: throwawayNetns(t)}
	if err := netnsutil.Do(b.ns, func() error {
		for _, n := range []struct {
			name string
			to   *int
		}{{"veth-a", &b.nic1}, {"veth-b", &b.nic2}} {
			ifc, err := net.InterfaceByName(n.name)
			if err != nil {
				return err
			}
			*n.to = ifc.Index
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	dp := b.dp
	if err := dp.SetRule(0, Rule{Paths: paths, CIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	if err := dp.SyncPodInterfaces([]PodInterface{{Ifindex: edgePodIf, Addr: clientPod}}); err != nil {
		t.Fatal(err)
	}
	for path, ifindex := range map[uint32]int{1: b.nic1, 2: b.nic2} {
		if err := dp.SetNIC(ifindex, path); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// nicEgress runs nic_egress on frame leaving by path 1's NIC, and returns
// its verdict.
func (b edgeBed) nicEgress(t *testing.T, frame []byte, ingress uint32) uint32 {
	t.Helper()
	var v uint32
	if err := netnsutil.Do(b.ns, func() error {
		v = verdict(t, b.dp.Program(HookNICEgress), frame, skbContext{Ifindex: uint32(b.nic1), IngressIfindex: ingress})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

// A subflow's packet that leaves by another NIC than its path's (a CNI
// routed it there itself, past the policy routing its mark selects) is
// redirected to its path's NIC, once the agent has named that NIC; never a
// packet already on its path's NIC, one the node sent itself or forwarded
// (it came by a NIC), one another pod sent with the subflow's 4-tuple, what
// an overlay's tunnel device sends, one the path's NIC cannot carry, to a
// path that is down, nor anything in observe-only mode.
func TestASubflowsPacketOnAnotherNICIsSentOnToItsPathsNIC(t *testing.T) {
	const gw2 = "10.102.1.1"
	for _, c := range []struct {
		name       string
		rulePath   uint32 // the subflow's path
		unnamed    bool   // the agent has not named path 2's NIC
		payload    int
		ingress    func(b edgeBed) uint32
		setup      func(t *testing.T, b edgeBed)
		redirected bool
	}{
		{name: "on path 2, leaving by path 1's NIC", rulePath: 2, redirected: true},
		{name: "path 2's NIC not named", rulePath: 2, unnamed: true},
		{name: "on path 1, its own NIC", rulePath: 1},
		{name: "sent by the node itself", rulePath: 2, ingress: func(edgeBed) uint32 { return 0 }},
		{name: "forwarded: it came by a NIC", rulePath: 2, ingress: func(b edgeBed) uint32 { return uint32(b.nic2) }},
		{name: "another pod's interface", rulePath: 2, setup: func(t *testing.T, b edgeBed) {
			if err := b.dp.SyncPodInterfaces([]PodInterface{{Ifindex: edgePodIf, Addr: netip.MustParseAddr("10.244.1.12")}}); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "an overlay's tunnel device", rulePath: 2, setup: func(t *testing.T, b edgeBed) {
			if err := b.dp.SetTunnelNIC(b.nic1); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "more than path 2's NIC carries", rulePath: 2, payload: 1400, setup: func(t *testing.T, b edgeBed) {
			if out, err := exec.Command("ip", "-n", b.ns[len("/var/run/netns/"):], "link", "set", "veth-b", "mtu", "1000").CombinedOutput(); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
		}},
		{name: "path 2 down", rulePath: 2, setup: func(t *testing.T, b edgeBed) {
			if err := b.dp.SetPathDown(2, true); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "observe-only", rulePath: 2, setup: func(t *testing.T, b edgeBed) {
			if err := b.dp.SetObserveOnly(true); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := newEdgeBed(t, c.rulePath)
			if !c.unnamed {
				if err := b.dp.SetPathNIC(2, b.nic2, netip.MustParseAddr(gw2)); err != nil {
					t.Fatal(err)
				}
			}
			run(t, b.dp.Program(HookPodEgress), syn(clientPod, 40000, serverPod, 5201, testpkt.MPCapableSYN()), skbContext{})
			if c.setup != nil {
				c.setup(t, b)
			}
			ingress := uint32(edgePodIf)
			if c.ingress != nil {
				ingress = c.ingress(b)
			}
			data := testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 40000, DstPort: 5201, Seq: 2, Ack: 8,
				Flags: testpkt.ACK, Payload: make([]byte, max(c.payload, 100))}}.Bytes()
			before := stat(t, b.dp, StatEdgeSteered)
			got := b.nicEgress(t, data, ingress)
			if want := map[bool]uint32{true: tcActRedirect, false: tcxNext}[c.redirected]; got != want {
				t.Errorf("nic_egress returned %d, want %d", int32(got), int32(want))
			}
			if n := stat(t, b.dp, StatEdgeSteered) - before; n != map[bool]uint64{true: 1, false: 0}[c.redirected] {
				t.Errorf("edge_steered counted %d", n)
			}
		})
	}
}

// A pod's answer to a peer's join, which has no subflow entry until the
// third ACK, goes on at the edge to the path the join arrived by.
func TestAnAnswerOnAnotherNICIsSentOnToThePathItsSYNCameBy(t *testing.T) {
	b := newEdgeBed(t, 1, 2)
	for path, ifindex := range map[uint32]int{1: b.nic1, 2: b.nic2} {
		if err := b.dp.SetPathNIC(path, ifindex, netip.Addr{}); err != nil {
			t.Fatal(err)
		}
	}
	joiner := netip.AddrPortFrom(serverPod, 50001)
	run(t, b.dp.objs.NicIngress, syn(joiner.Addr(), joiner.Port(), clientPod, 80, testpkt.MPJoinSYN(tokenOf(0x2222), 5, 1, false)),
		skbContext{IngressIfindex: uint32(b.nic2)})
	answer := testpkt.Frame{Src: clientPod, Dst: joiner.Addr(), TCP: &testpkt.TCP{SrcPort: 80, DstPort: joiner.Port(), Seq: 7, Ack: 2,
		Flags: testpkt.SYN | testpkt.ACK, Options: testpkt.MPJoinSYNACK(1, 2, 1, false)}}.Bytes()
	if p := b.dp.pathOfMark(t, run(t, b.dp.objs.PodEgress, answer, skbContext{})); p != 2 {
		t.Fatalf("the answer left the pod marked for path %d, want 2", p)
	}
	if got := b.nicEgress(t, answer, edgePodIf); got != tcActRedirect {
		t.Errorf("nic_egress of path 1's NIC returned %d for the answer, want a redirect to path 2's", int32(got))
	}
}
