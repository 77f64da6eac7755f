package datapath

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
)

// nicTunnel1 is an overlay's tunnel device (flannel's flannel.1): on no path
// itself, nic_ingress on it.
const nicTunnel1 = 10

// localVTEP is the node's own tunnel address in these tests; vxlanFrame's
// outer packets are sent to it.
var localVTEP = netip.MustParseAddr("10.100.0.2")

// vxlanFrame is what a path NIC receives on an overlay: inner, encapsulated
// in VXLAN (UDP to dport) between two nodes' VTEP addresses.
func vxlanFrame(dport uint16, inner []byte) []byte {
	return vxlanFrameTo(localVTEP, dport, inner)
}

// vxlanFrameTo is vxlanFrame sent to dst.
func vxlanFrameTo(dst netip.Addr, dport uint16, inner []byte) []byte {
	udp := make([]byte, 16, 16+len(inner))
	binary.BigEndian.PutUint16(udp[0:], 40000)
	binary.BigEndian.PutUint16(udp[2:], dport)
	binary.BigEndian.PutUint16(udp[4:], uint16(16+len(inner)))
	udp[8] = 0x08 // VNI valid
	udp[14] = 1   // VNI 1
	return testpkt.Frame{Src: netip.MustParseAddr("10.100.0.1"), Dst: dst, Protocol: 17,
		Payload: append(udp, inner...)}.Bytes()
}

// On an overlay, nic_ingress on a path's NIC gives an outer packet to the
// tunnel's port and the node's tunnel address (or, where the tunnel has
// none, from a peer's path address to the node's) its NIC's path mark
// (decapsulation keeps it on the inner packet), and leaves other UDP, an
// outer packet the node would forward, and everything once the agent names
// no tunnel, unmarked. What the tunnel decapsulates for no selected pod
// loses the mark. On the tunnel device it judges the decapsulated
// join on the path the mark names, as on that path's NIC: staged within
// the rule's maximum (and then passed at the pod's veth), refused with a
// reset beyond it. A decapsulated join whose outer packet came by no path
// (no mark) is on no path: nic_ingress leaves it, and the pod's veth
// refuses it when its rule limits joins.
func TestAnOverlaysArrivalsAreJudgedOnThePathTheirOuterPacketCameBy(t *testing.T) {
	join := func(sport uint16) []byte {
		return peerJoinSYN(sport, testpkt.MPJoinSYN(tokenOf(serverKey), 7, 1, false))
	}
	tunnelBed := func(t *testing.T, r Rule) *Datapath {
		dp := peerJoinBed(t, r, 0)
		if err := dp.SetTunnel(8472, localVTEP); err != nil {
			t.Fatal(err)
		}
		if err := dp.SetTunnelNIC(nicTunnel1); err != nil {
			t.Fatal(err)
		}
		return dp
	}

	t.Run("outer packets take their NIC's path", func(t *testing.T) {
		dp := tunnelBed(t, Rule{Paths: []uint32{1, 2}})
		on2 := skbContext{IngressIfindex: nicPath2}
		if m := run(t, dp.objs.NicIngress, vxlanFrame(8472, join(40001)), on2); m != dp.Mark(2) {
			t.Errorf("an outer packet to the tunnel port on path 2's NIC: mark %#x, want %#x", m, dp.Mark(2))
		}
		if m := run(t, dp.objs.NicIngress, vxlanFrame(4789, join(40001)), on2); m != 0 {
			t.Errorf("UDP to another port on path 2's NIC: mark %#x, want none", m)
		}
		if m := run(t, dp.objs.NicIngress, vxlanFrameTo(netip.MustParseAddr("10.100.0.9"), 8472, join(40001)), on2); m != 0 {
			t.Errorf("an outer packet to another node's tunnel address (forwarded): mark %#x, want none", m)
		}
		if err := dp.SetTunnel(0, localVTEP); err != nil {
			t.Fatal(err)
		}
		if m := run(t, dp.objs.NicIngress, vxlanFrame(8472, join(40001)), on2); m != 0 {
			t.Errorf("an outer packet with no tunnel port set: mark %#x, want none", m)
		}
	})

	t.Run("outer packets between a peer's and the node's path addresses take their NIC's path where the tunnel has no address", func(t *testing.T) {
		dp := tunnelBed(t, Rule{Paths: []uint32{1, 2}})
		if err := dp.SetTunnel(8472, netip.Addr{}); err != nil {
			t.Fatal(err)
		}
		if err := dp.SyncTunnelHops([]TunnelArrival{{From: peerOn2, To: nodeOn2}}, nil); err != nil {
			t.Fatal(err)
		}
		on2 := skbContext{IngressIfindex: nicPath2}
		if m := run(t, dp.objs.NicIngress, outerVXLAN(peerOn2, nodeOn2, 8472, join(40001), false), on2); m != dp.Mark(2) {
			t.Errorf("an outer packet from the peer's address on path 2 to the node's: mark %#x, want %#x", m, dp.Mark(2))
		}
		if m := run(t, dp.objs.NicIngress, outerVXLAN(netip.MustParseAddr("10.102.9.2"), nodeOn2, 8472, join(40001), false), on2); m != 0 {
			t.Errorf("an outer packet from no peer's address to the node's: mark %#x, want none", m)
		}
		if m := run(t, dp.objs.NicIngress, outerVXLAN(peerOn2, peerOn1, 8472, join(40001), false), on2); m != 0 {
			t.Errorf("an outer packet to another node's address (forwarded): mark %#x, want none", m)
		}
	})

	t.Run("a decapsulated join within the maximum is staged on its outer packet's path", func(t *testing.T) {
		dp := tunnelBed(t, Rule{Paths: []uint32{1, 2}, MaxSubflows: 3})
		via2 := skbContext{IngressIfindex: nicTunnel1, Mark: dp.Mark(2)}
		before := stat(t, dp, StatArrivalStaged)
		if m := run(t, dp.objs.NicIngress, join(40001), via2); m != dp.Mark(2) {
			t.Errorf("the join from the tunnel: mark %#x, want path 2's %#x", m, dp.Mark(2))
		}
		if n := stat(t, dp, StatArrivalStaged); n != before+1 {
			t.Errorf("StatArrivalStaged = %d, want %d", n, before+1)
		}
		if ret, _ := runVerdict(t, dp.objs.PodIngress, join(40001), via2); ret != tcxNext {
			t.Errorf("the staged join at the pod's veth: verdict %d, want TCX_NEXT", int32(ret))
		}
		// By no path: the outer packet came unmarked.
		none := skbContext{IngressIfindex: nicTunnel1}
		if m := run(t, dp.objs.NicIngress, join(40002), none); m != 0 {
			t.Errorf("a join decapsulated without a path: mark %#x, want none", m)
		}
		if ret, _ := runVerdict(t, dp.objs.PodIngress, join(40002), none); ret != tcActRedirect {
			t.Errorf("a join decapsulated without a path at the pod's veth: verdict %d, want TC_ACT_REDIRECT (refused)", int32(ret))
		}
	})

	t.Run("what is decapsulated for no selected pod loses the mark", func(t *testing.T) {
		dp := tunnelBed(t, Rule{Paths: []uint32{1, 2}})
		via2 := skbContext{IngressIfindex: nicTunnel1, Mark: dp.Mark(2) | 0x1}
		other := testpkt.Frame{Src: netip.MustParseAddr("10.244.9.9"), Dst: netip.MustParseAddr("10.244.9.10"),
			TCP: &testpkt.TCP{SrcPort: 40000, DstPort: 80, Flags: testpkt.ACK, Window: 512}}.Bytes()
		if m := run(t, dp.objs.NicIngress, other, via2); m != 0x1 {
			t.Errorf("TCP to an address no pod is selected for, from the tunnel: mark %#x, want the path's bits off (0x1)", m)
		}
		udp := vxlanFrameTo(netip.MustParseAddr("10.244.9.10"), 53, nil)
		if m := run(t, dp.objs.NicIngress, udp, via2); m != 0x1 {
			t.Errorf("UDP from the tunnel: mark %#x, want the path's bits off (0x1)", m)
		}
	})

	t.Run("a decapsulated join beyond the maximum is refused at the tunnel", func(t *testing.T) {
		dp := tunnelBed(t, Rule{Paths: []uint32{1, 2}, MaxSubflows: 1})
		before := stat(t, dp, StatJoinRefused)
		if ret, _ := runVerdict(t, dp.objs.NicIngress, join(40001), skbContext{IngressIfindex: nicTunnel1, Mark: dp.Mark(2)}); ret != tcActRedirect {
			t.Errorf("a join beyond the maximum from the tunnel: verdict %d, want TC_ACT_REDIRECT (the reset)", int32(ret))
		}
		if n := stat(t, dp, StatJoinRefused); n != before+1 {
			t.Errorf("StatJoinRefused = %d, want %d", n, before+1)
		}
	})
}
