package datapath

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
)

// The node's and the peer's addresses on paths 1 and 2 in these tests: the
// overlay sends to the peer's address on path 1 (its node address).
var (
	nodeOn1 = netip.MustParseAddr("10.101.1.2")
	peerOn1 = netip.MustParseAddr("10.101.2.2")
	nodeOn2 = netip.MustParseAddr("10.102.1.2")
	peerOn2 = netip.MustParseAddr("10.102.2.2")
)

// outerVXLAN is an overlay's outer packet from src to dst (UDP to dport,
// VXLAN) carrying inner, with a UDP checksum if udpChecksum.
func outerVXLAN(src, dst netip.Addr, dport uint16, inner []byte, udpChecksum bool) []byte {
	udp := make([]byte, 16, 16+len(inner))
	binary.BigEndian.PutUint16(udp[0:], 40000)
	binary.BigEndian.PutUint16(udp[2:], dport)
	binary.BigEndian.PutUint16(udp[4:], uint16(16+len(inner)))
	udp[8] = 0x08 // VNI valid
	udp[14] = 1
	udp = append(udp, inner...)
	if udpChecksum {
		binary.BigEndian.PutUint16(udp[6:], ^fold16(pseudoSum(src, dst, udp)))
	}
	return testpkt.Frame{Src: src, Dst: dst, Protocol: 17, Payload: udp}.Bytes()
}

// pseudoSum is the ones'-complement sum of UDP over IPv4 (pseudo-header
// and datagram) before folding.
func pseudoSum(src, dst netip.Addr, udp []byte) uint32 {
	var s uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			s += uint32(binary.BigEndian.Uint16(b[i:]))
		}
		if len(b)%2 == 1 {
			s += uint32(b[len(b)-1]) << 8
		}
	}
	add(src.AsSlice())
	add(dst.AsSlice())
	s += 17 + uint32(len(udp))
	add(udp)
	return s
}

func fold16(s uint32) uint16 {
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// outerOf reads an outer frame's addresses and whether its IPv4 header's
// and its UDP checksums hold (a zero UDP checksum: none, which holds).
func outerOf(t *testing.T, frame []byte) (src, dst netip.Addr, udpSum uint16, ok bool) {
	t.Helper()
	ip := frame[14:]
	var udp []byte
	ipOK := true
	if binary.BigEndian.Uint16(frame[12:]) == 0x86dd {
		src, dst = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
		udp = ip[40 : 40+binary.BigEndian.Uint16(ip[4:])]
	} else {
		ihl := int(ip[0]&0x0f) * 4
		var ipSum uint32
		for i := 0; i < ihl; i += 2 {
			ipSum += uint32(binary.BigEndian.Uint16(ip[i:]))
		}
		ipOK = fold16(ipSum) == 0xffff
		src, dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
		udp = ip[ihl:binary.BigEndian.Uint16(ip[2:])]
	}
	udpSum = binary.BigEndian.Uint16(udp[6:])
	ok = ipOK && (udpSum == 0 || fold16(pseudoSum(src, dst, udp)) == 0xffff)
	return src, dst, udpSum, ok
}

// An overlay's outer packet the node sends by path 1's NIC (a tunnel that
// picks its route itself) that carries a selected pod's subflow of path 2
// is readdressed from the node's address on path 2 to the peer's there,
// its checksums amended (a zero UDP checksum stays zero), marked with path
// 2 and redirected to path 2's NIC. Never one to an address no hop names,
// to a pod outside the hop's peer's pod CIDRs, of a subflow of its NIC's
// own path, to another UDP port, carrying no selected pod's subflow,
// forwarded (it came by an interface), with a UDP checksum that is not a
// segmentation's seed, to a path that is down, nor in observe-only mode:
// those leave as they are.
func TestAnOverlaysOuterPacketFollowsTheSubflowItCarries(t *testing.T) {
	node6On1, peer6On1 := netip.MustParseAddr("fd00:101::1:2"), netip.MustParseAddr("fd00:101::2:2")
	node6On2, peer6On2 := netip.MustParseAddr("fd00:102::1:2"), netip.MustParseAddr("fd00:102::2:2")
	hops := []TunnelHop{{To: peerOn1, Path: 2, Local: nodeOn2, Remote: peerOn2, Slot: 7},
		{To: peer6On1, Path: 2, Local: node6On2, Remote: peer6On2, Slot: 7}}
	peerPods := netip.MustParsePrefix("10.244.2.0/24") // serverPod's
	data := func(src netip.Addr) []byte {
		return testpkt.Frame{Src: src, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 40000, DstPort: 5201, Seq: 2, Ack: 8,
			Flags: testpkt.ACK, Payload: make([]byte, 100)}}.Bytes()
	}
	for _, c := range []struct {
		name       string
		rulePath   uint32
		outer      []byte
		ingress    uint32
		gso        uint32
		want       [2]netip.Addr // the new outer addresses; zero: path 2's IPv4 ones
		setup      func(t *testing.T, b edgeBed)
		redirected bool
	}{
		{name: "a subflow of path 2", rulePath: 2, outer: outerVXLAN(nodeOn1, peerOn1, 8472, data(clientPod), false), redirected: true},
		{name: "a subflow of path 2, segmented later, with a UDP checksum", rulePath: 2, gso: 1400,
			outer: outerVXLAN(nodeOn1, peerOn1, 8472, data(clientPod), true), redirected: true},
		{name: "over IPv6, segmented later", rulePath: 2, gso: 1400,
			outer: outerVXLAN(node6On1, peer6On1, 8472, data(clientPod), true), want: [2]netip.Addr{node6On2, peer6On2}, redirected: true},
		// Its checksum may be whole while the skb's partial one is the
		// inner TCP's: not amended, it keeps the tunnel's NIC.
		{name: "not segmented, with a UDP checksum", rulePath: 2, outer: outerVXLAN(nodeOn1, peerOn1, 8472, data(clientPod), true)},
		{name: "to a pod of another peer than the hop's", rulePath: 2, outer: outerVXLAN(nodeOn1, peerOn1, 8472, data(clientPod), false),
			setup: func(t *testing.T, b edgeBed) {
				if err := b.dp.SetPeerSlots(map[netip.Prefix]uint32{peerPods: 8}); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "to an address no hop names", rulePath: 2, outer: outerVXLAN(nodeOn1, netip.MustParseAddr("10.101.3.2"), 8472, data(clientPod), true)},
		{name: "a subflow of path 1", rulePath: 1, outer: outerVXLAN(nodeOn1, peerOn1, 8472, data(clientPod), true)},
		{name: "to another UDP port", rulePath: 2, outer: outerVXLAN(nodeOn1, peerOn1, 4789, data(clientPod), true)},
		{name: "no selected pod's", rulePath: 2, outer: outerVXLAN(nodeOn1, peerOn1, 8472, data(netip.MustParseAddr("10.244.1.99")), true)},
		{name: "forwarded", rulePath: 2, outer: outerVXLAN(nodeOn1, peerOn1, 8472, data(clientPod), true), ingress: edgePodIf},
		{name: "path 2 down", rulePath: 2, outer: outerVXLAN(nodeOn1, peerOn1, 8472, data(clientPod), true), setup: func(t *testing.T, b edgeBed) {
			if err := b.dp.SetPathDown(2, true); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "observe-only", rulePath: 2, outer: outerVXLAN(nodeOn1, peerOn1, 8472, data(clientPod), true), setup: func(t *testing.T, b edgeBed) {
			if err := b.dp.SetObserveOnly(true); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := newEdgeBed(t, c.rulePath)
			if err := b.dp.SetPathNIC(2, b.nic2, netip.Addr{}); err != nil {
				t.Fatal(err)
			}
			if err := b.dp.SetTunnel(8472, netip.Addr{}); err != nil {
				t.Fatal(err)
			}
			if err := b.dp.SyncTunnelHops(nil, hops); err != nil {
				t.Fatal(err)
			}
			if err := b.dp.SetPeerSlots(map[netip.Prefix]uint32{peerPods: 7}); err != nil {
				t.Fatal(err)
			}
			run(t, b.dp.Program(HookPodEgress), syn(clientPod, 40000, serverPod, 5201, testpkt.MPCapableSYN()), skbContext{})
			if c.setup != nil {
				c.setup(t, b)
			}
			before := stat(t, b.dp, StatTunnelSteered)
			var ret uint32
			var out skbContext
			frame := make([]byte, len(c.outer))
			if err := netnsutil.Do(b.ns, func() error {
				r, err := b.dp.Program(HookNICEgress).Run(&ebpf.RunOptions{Data: c.outer, DataOut: frame,
					Context: skbContext{Ifindex: uint32(b.nic1), IngressIfindex: c.ingress, GSOSize: c.gso}, ContextOut: &out})
				ret = r
				return err
			}); err != nil {
				t.Fatal(err)
			}
			_, _, sumBefore, _ := outerOf(t, c.outer)
			src, dst, sum, ok := outerOf(t, frame)
			if !c.redirected {
				if ret == tcActRedirect || string(frame) != string(c.outer) {
					t.Errorf("nic_egress returned %d and sent %v to %v: want the packet as it was (TCX_NEXT)", int32(ret), src, dst)
				}
				if n := stat(t, b.dp, StatTunnelSteered) - before; n != 0 {
					t.Errorf("tunnel_steered counted %d", n)
				}
				return
			}
			if ret != tcActRedirect {
				t.Fatalf("nic_egress returned %d, want TC_ACT_REDIRECT", int32(ret))
			}
			want := c.want
			if !want[0].IsValid() {
				want = [2]netip.Addr{nodeOn2, peerOn2}
			}
			if src != want[0] || dst != want[1] {
				t.Errorf("the outer packet goes from %v to %v, want from %v to %v", src, dst, want[0], want[1])
			}
			if !ok || (sumBefore == 0) != (sum == 0) {
				t.Errorf("checksums wrong after the rewrite (UDP checksum %#x, was %#x)", sum, sumBefore)
			}
			if p := b.dp.pathOfMark(t, out.Mark); p != 2 {
				t.Errorf("the outer packet is marked for path %d, want 2 (the redirect's route lookup)", p)
			}
			if inner := len(c.outer) - len(data(clientPod)); string(frame[inner:]) != string(c.outer[inner:]) {
				t.Errorf("the inner packet changed")
			}
			if n := stat(t, b.dp, StatTunnelSteered) - before; n != 1 {
				t.Errorf("tunnel_steered counted %d, want 1", n)
			}
		})
	}
}
