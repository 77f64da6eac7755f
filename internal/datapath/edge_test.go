package datapath

import (
	"net/netip"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
)

// A subflow's packet that leaves by another NIC than its path's (a CNI
// routed it there itself, past the policy routing its mark selects) is
// redirected to its path's NIC, once the agent has named that NIC; never a
// packet already on its path's NIC, one the node sent itself, one another
// pod sent with the subflow's 4-tuple, what an overlay's tunnel device
// sends, nor anything in observe-only mode.
func TestASubflowsPacketOnAnotherNICIsSentOnToItsPathsNIC(t *testing.T) {
	const lo, podIf, gw2 = 1, 4242, "10.102.1.1" // lo: the test run's device, path 1's NIC here
	for _, c := range []struct {
		name       string
		rulePath   uint32 // the subflow's path
		named      bool   // the agent named path 2's NIC
		in         skbContext
		setup      func(t *testing.T, dp *Datapath)
		redirected bool
	}{
		{name: "on path 2, leaving by path 1's NIC", rulePath: 2, named: true, in: skbContext{IngressIfindex: podIf}, redirected: true},
		{name: "path 2's NIC not named", rulePath: 2, in: skbContext{IngressIfindex: podIf}},
		{name: "on path 1, its own NIC", rulePath: 1, named: true, in: skbContext{IngressIfindex: podIf}},
		{name: "sent by the node itself", rulePath: 2, named: true},
		{name: "another pod's interface", rulePath: 2, named: true, in: skbContext{IngressIfindex: podIf},
			setup: func(t *testing.T, dp *Datapath) {
				if err := dp.SyncPodInterfaces([]PodInterface{{Ifindex: podIf, Addr: netip.MustParseAddr("10.244.1.12")}}); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "an overlay's tunnel device", rulePath: 2, named: true, in: skbContext{IngressIfindex: podIf},
			setup: func(t *testing.T, dp *Datapath) {
				if err := dp.SetTunnelNIC(lo); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "observe-only", rulePath: 2, named: true, in: skbContext{IngressIfindex: podIf},
			setup: func(t *testing.T, dp *Datapath) {
				if err := dp.SetObserveOnly(true); err != nil {
					t.Fatal(err)
				}
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dp := loadForTest(t)
			if err := dp.SetRule(0, Rule{Paths: []uint32{c.rulePath}}); err != nil {
				t.Fatal(err)
			}
			if err := dp.SetEndpoint(clientPod, 0); err != nil {
				t.Fatal(err)
			}
			if err := dp.SetNIC(lo, 1); err != nil {
				t.Fatal(err)
			}
			if c.named {
				if err := dp.SetPathNIC(2, nic2Ifindex, netip.MustParseAddr(gw2)); err != nil {
					t.Fatal(err)
				}
			}
			run(t, dp.Program(HookPodEgress), syn(clientPod, 40000, serverPod, 5201, testpkt.MPCapableSYN()), skbContext{})
			if c.setup != nil {
				c.setup(t, dp)
			}
			data := testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 40000, DstPort: 5201, Seq: 2, Ack: 8,
				Flags: testpkt.ACK, Payload: make([]byte, 100)}}.Bytes()
			before := stat(t, dp, StatEdgeSteered)
			got := verdict(t, dp.Program(HookNICEgress), data, c.in)
			if want := map[bool]uint32{true: tcActRedirect, false: tcxNext}[c.redirected]; got != want {
				t.Errorf("nic_egress returned %d, want %d", int32(got), int32(want))
			}
			if n := stat(t, dp, StatEdgeSteered) - before; n != map[bool]uint64{true: 1, false: 0}[c.redirected] {
				t.Errorf("edge_steered counted %d", n)
			}
		})
	}
}

// A pod's answer to a peer's join, which has no subflow entry until the
// third ACK, goes on at the edge to the path the join arrived by.
func TestAnAnswerOnAnotherNICIsSentOnToThePathItsSYNCameBy(t *testing.T) {
	const lo, podIf = 1, 4242
	dp := loadForTest(t)
	if err := dp.SetRule(0, Rule{Paths: []uint32{1, 2}, CIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	for _, n := range []struct {
		ifindex int
		path    uint32
	}{{lo, 1}, {nic2Ifindex, 2}} {
		if err := dp.SetNIC(n.ifindex, n.path); err != nil {
			t.Fatal(err)
		}
		if err := dp.SetPathNIC(n.path, n.ifindex, netip.Addr{}); err != nil {
			t.Fatal(err)
		}
	}
	joiner := netip.AddrPortFrom(serverPod, 50001)
	run(t, dp.objs.NicIngress, syn(joiner.Addr(), joiner.Port(), clientPod, 80, testpkt.MPJoinSYN(tokenOf(0x2222), 5, 1, false)),
		skbContext{IngressIfindex: nic2Ifindex})
	answer := testpkt.Frame{Src: clientPod, Dst: joiner.Addr(), TCP: &testpkt.TCP{SrcPort: 80, DstPort: joiner.Port(), Seq: 7, Ack: 2,
		Flags: testpkt.SYN | testpkt.ACK, Options: testpkt.MPJoinSYNACK(1, 2, 1, false)}}.Bytes()
	if p := dp.pathOfMark(t, run(t, dp.objs.PodEgress, answer, skbContext{})); p != 2 {
		t.Fatalf("the answer left the pod marked for path %d, want 2", p)
	}
	if got := verdict(t, dp.Program(HookNICEgress), answer, skbContext{IngressIfindex: podIf}); got != tcActRedirect {
		t.Errorf("nic_egress of path 1's NIC returned %d for the answer, want a redirect to path 2's", int32(got))
	}
}
