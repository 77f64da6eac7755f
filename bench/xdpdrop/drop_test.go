package xdpdrop

import (
	"encoding/binary"
	"errors"
	"flag"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// The flood: peer's address, the pod's and its network.
var (
	peerAddr = netip.MustParseAddr("10.99.0.1")
	podAddr  = netip.MustParseAddr("10.99.1.11")
	podNet   = netip.MustParsePrefix("10.99.1.0/24")
)

var ports = flag.Uint("xdpdrop.ports", 64512, "source ports the flood cycles through (from 1024)")

// Return codes of the programs.
const (
	xdpDrop  = 1
	xdpPass  = 2
	xdpTX    = 3
	tcShot   = 2
	tcxNext  = ^uint32(0) // -1
	joinPort = 5201
	// joinSport is the template's source port; the flood program gives
	// each frame its own.
	joinSport = 40000
)

// joinSYN is a join SYN as Linux sends it: MSS, SACK permitted, timestamps,
// window scale, then MP_JOIN (RFC 8684 3.2) with the receiver's token.
func joinSYN(src, dst netip.Addr) []byte {
	return testpkt.Frame{Src: src, Dst: dst, TCP: &testpkt.TCP{SrcPort: joinSport, DstPort: joinPort, Seq: 1, Flags: testpkt.SYN,
		Window: 64240, Options: testpkt.Join(testpkt.MSS(1460), testpkt.SACKPermitted(), testpkt.Timestamps(1, 0),
			testpkt.NOP(), testpkt.WScale(7), testpkt.MPJoinSYN(0x5eed1234, 7, 1, false))}}.Bytes()
}

// load loads the programs with the pods' network set, or fails the test
// with the verifier's log.
func load(tb testing.TB) *dropObjects {
	tb.Helper()
	testutil.RequireRoot(tb)
	spec, err := loadDrop()
	if err != nil {
		tb.Fatal(err)
	}
	if *ports == 0 || *ports > 64512 {
		tb.Fatalf("-xdpdrop.ports=%d: from 1 to 64512", *ports)
	}
	nw, mask := podNet.Addr().As4(), netip.MustParseAddr("255.255.255.0").As4()
	for name, v := range map[string]any{"pod_net": binary.NativeEndian.Uint32(nw[:]), "pod_mask": binary.NativeEndian.Uint32(mask[:]),
		"flood_ports": uint16(*ports)} {
		if err := spec.Variables[name].Set(v); err != nil {
			tb.Fatalf("setting %s: %v", name, err)
		}
	}
	var objs dropObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			tb.Fatalf("verifier: %+v", ve)
		}
		tb.Fatal(err)
	}
	tb.Cleanup(func() { objs.Close() })
	return &objs
}

// count sums a counter over the CPUs.
func count(tb testing.TB, objs *dropObjects, c uint32) uint64 {
	tb.Helper()
	var perCPU []uint64
	if err := objs.Counters.Lookup(c, &perCPU); err != nil {
		tb.Fatal(err)
	}
	var n uint64
	for _, v := range perCPU {
		n += v
	}
	return n
}

// Counter indexes of drop.c.
const (
	counterXDPDropped = 0
	counterTCDropped  = 1
	counterFloodSent  = 2
)

// Both drop programs take a join SYN to a pod and nothing else: not the
// initial subflow's SYN, not a join to another address, not the SYN-ACK
// that answers a join, not a plain SYN or a datagram.
func TestTheDropProgramsTakeOnlyJoinSYNsToPods(t *testing.T) {
	objs := load(t)
	other := netip.MustParseAddr("10.99.2.11")
	tcp := func(flags uint8, opts []byte) []byte {
		return testpkt.Frame{Src: peerAddr, Dst: podAddr, TCP: &testpkt.TCP{SrcPort: 40000, DstPort: joinPort, Flags: flags, Options: opts}}.Bytes()
	}
	cases := map[string]struct {
		frame []byte // what arrives on the interface
		drop  bool   // whether both programs drop it
	}{
		"join SYN to a pod":                     {frame: joinSYN(peerAddr, podAddr), drop: true},
		"join SYN, MP_JOIN the only option":     {frame: tcp(testpkt.SYN, testpkt.MPJoinSYN(1, 2, 0, false)), drop: true},
		"join SYN to an address outside pods":   {frame: joinSYN(peerAddr, other)},
		"MP_CAPABLE SYN to a pod":               {frame: tcp(testpkt.SYN, testpkt.Join(testpkt.MSS(1460), testpkt.MPCapableSYN()))},
		"plain SYN to a pod":                    {frame: tcp(testpkt.SYN, testpkt.MSS(1460))},
		"join SYN-ACK to a pod":                 {frame: tcp(testpkt.SYN|testpkt.ACK, testpkt.MPJoinSYNACK(1, 2, 0, false))},
		"UDP to a pod":                          {frame: testpkt.Frame{Src: peerAddr, Dst: podAddr, Protocol: 17, Payload: make([]byte, 32)}.Bytes()},
		"join SYN with an option of length one": {frame: tcp(testpkt.SYN, []byte{2, 1, 0, 0, 30, 12, 0x10, 0})},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			xdp, err := objs.XdpDrop.Run(&ebpf.RunOptions{Data: c.frame})
			if err != nil {
				t.Fatal(err)
			}
			tc, err := objs.TcDrop.Run(&ebpf.RunOptions{Data: c.frame})
			if err != nil {
				t.Fatal(err)
			}
			wantXDP, wantTC := uint32(xdpPass), tcxNext
			if c.drop {
				wantXDP, wantTC = xdpDrop, tcShot
			}
			if xdp != wantXDP || tc != wantTC {
				t.Errorf("xdp_drop returned %d, tc_drop %d; want %d and %d", xdp, tc, wantXDP, int32(wantTC))
			}
		})
	}
	if got := count(t, objs, counterXDPDropped); got != 2 {
		t.Errorf("xdp_drop counted %d drops, want 2", got)
	}
	if got := count(t, objs, counterTCDropped); got != 2 {
		t.Errorf("tc_drop counted %d drops, want 2", got)
	}
}

// tcpChecksumOK checks the TCP checksum of an IPv4 frame without IP options.
func tcpChecksumOK(frame []byte) bool {
	ip, seg := frame[14:34], frame[34:]
	s := uint32(6) + uint32(len(seg))
	for _, b := range [][]byte{ip[12:20], seg} {
		for i := 0; i+1 < len(b); i += 2 {
			s += uint32(binary.BigEndian.Uint16(b[i:]))
		}
		if len(b)%2 == 1 {
			s += uint32(b[len(b)-1]) << 8
		}
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return s == 0xffff
}

// The flood sends each frame from the next source port, and the segment's
// checksum stays right.
func TestTheFloodGivesEachFrameItsPortAndAValidChecksum(t *testing.T) {
	objs := load(t)
	frame := joinSYN(peerAddr, podAddr)
	seen := map[uint16]bool{}
	for range 5 {
		out := make([]byte, len(frame))
		ret, err := objs.Flood.Run(&ebpf.RunOptions{Data: frame, DataOut: out})
		if err != nil {
			t.Fatal(err)
		}
		if ret != xdpTX {
			t.Fatalf("flood returned %d, want XDP_TX", ret)
		}
		if !tcpChecksumOK(out) {
			t.Fatalf("bad TCP checksum on %x", out)
		}
		port := binary.BigEndian.Uint16(out[34:])
		if port < 1024 || seen[port] {
			t.Fatalf("source port %d: below 1024 or seen before (%v)", port, seen)
		}
		seen[port] = true
		// The next frame starts from this one, as a recycled page does.
		frame = out
	}
	if got := count(t, objs, counterFloodSent); got != 5 {
		t.Errorf("flood counted %d frames, want 5", got)
	}
}
