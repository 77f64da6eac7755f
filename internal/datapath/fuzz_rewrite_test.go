package datapath

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
)

// tcpSegment locates, in a frame with up to two VLAN tags and an IPv4
// header (any length) or an IPv6 header without extension headers, the IP
// header, the TCP segment (by the IP length) and its ports.
type tcpSegment struct {
	l3, l4, end      int
	v4               bool
	src, dst         netip.Addr
	sport, dport     uint16
	ipValid, tcpGood bool
}

func findTCP(frame []byte) (tcpSegment, bool) {
	var s tcpSegment
	off := 12
	for range 2 {
		if len(frame) >= off+2 && (binary.BigEndian.Uint16(frame[off:]) == 0x8100 || binary.BigEndian.Uint16(frame[off:]) == 0x88a8) {
			off += 4
		}
	}
	if len(frame) < off+2 {
		return s, false
	}
	s.l3 = off + 2
	ip := frame[s.l3:]
	switch binary.BigEndian.Uint16(frame[off:]) {
	case 0x0800:
		if len(ip) < 20 || ip[0]>>4 != 4 || ip[9] != 6 || binary.BigEndian.Uint16(ip[6:])&0x3fff != 0 {
			return s, false
		}
		ihl := int(ip[0]&0x0f) * 4
		s.v4, s.l4, s.end = true, s.l3+ihl, s.l3+int(binary.BigEndian.Uint16(ip[2:]))
		s.src, s.dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
		s.ipValid = ihl >= 20 && len(ip) >= ihl && checksum(0, ip[:ihl]) == 0
	case 0x86dd:
		if len(ip) < 40 || ip[0]>>4 != 6 || ip[6] != 6 {
			return s, false
		}
		s.l4, s.end = s.l3+40, s.l3+40+int(binary.BigEndian.Uint16(ip[4:]))
		s.src, s.dst = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
		s.ipValid = true
	default:
		return s, false
	}
	if s.end > len(frame) || s.end < s.l4+20 {
		return s, false
	}
	s.sport, s.dport = binary.BigEndian.Uint16(frame[s.l4:]), binary.BigEndian.Uint16(frame[s.l4+2:])
	s.tcpGood = tcpChecksumGood(frame, s)
	return s, true
}

// checksum is the Internet checksum's running sum folded and complemented:
// 0 over data that includes a right checksum.
func checksum(sum uint32, b []byte) uint16 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

func tcpChecksumGood(frame []byte, s tcpSegment) bool {
	seg := frame[s.l4:s.end]
	var pseudo []byte
	pseudo = append(pseudo, s.src.AsSlice()...)
	pseudo = append(pseudo, s.dst.AsSlice()...)
	if s.v4 {
		pseudo = append(pseudo, 0, 6)
		pseudo = binary.BigEndian.AppendUint16(pseudo, uint16(len(seg)))
	} else {
		pseudo = binary.BigEndian.AppendUint32(pseudo, uint32(len(seg)))
		pseudo = append(pseudo, 0, 0, 0, 6)
	}
	return checksum(0, append(pseudo, seg...)) == 0
}

// FuzzPodIngressRewrites feeds pod_ingress arbitrary frames with every
// actor that rewrites packets going into a pod switched on: a match-all
// rule whose backup path the frame's subflow is on (B bit, MP_PRIO) and
// which allows no join (ADD_ADDR NOPs), with the header-rewriting opt-in.
// For every input the program returns TCX_NEXT without error, or drops
// (counted) a frame whose MPTCP options the kernel could read otherwise
// (pod_ingress runs on selected pods' interfaces only); with no subflow
// known (no rule selects the frame) it leaves every byte as it was;
// on a known subflow, a frame it changes keeps valid IP and TCP checksums
// and consistent lengths if it had them. Under plain `go test` only the seed
// corpus runs, with the frames of the backup and block tests added.
func FuzzPodIngressRewrites(f *testing.F) {
	for _, frame := range seedFrames() {
		f.Add(frame)
	}
	for _, opts := range [][]byte{
		testpkt.MPJoinSYNACK(0x1122334455667788, 9, 0, false),
		testpkt.Join(testpkt.DSS{DataACK: u64(1)}.Bytes(), testpkt.AddAddr(3, netip.MustParseAddr("10.244.2.12"), 5301, false, 1)),
		testpkt.Join(testpkt.NOP(), testpkt.NOP(), testpkt.Timestamps(1, 2), testpkt.DSS{DataACK: u64(5)}.Bytes()),
	} {
		f.Add(synAck(serverPod, 5201, clientPod, 40001, opts))
		f.Add(testpkt.Frame{Src: serverPod, Dst: clientPod, TCP: &testpkt.TCP{SrcPort: 5201, DstPort: 40001, Seq: 8, Ack: 2, Flags: testpkt.ACK, Options: opts}}.Bytes())
	}
	f.Add(syn(clientPod, 40002, serverPod, 5201, testpkt.MPJoinSYN(1, 2, 3, false)))
	dp := loadForTest(f)
	if err := dp.SetRule(0, Rule{Paths: []uint32{1, 2}, Backup: []uint32{3}, RewriteHeaders: true, MaxSubflows: 1}); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		if !testRunAccepts(frame) {
			t.Skip("BPF_PROG_TEST_RUN refuses frames this short")
		}
		resetDatapathState(t, dp)
		out, dropped := runIngress(t, dp, frame)
		if string(out) != string(frame) {
			t.Fatalf("no subflow is known, yet the packet changed: %x", frame)
		}
		s, ok := findTCP(frame)
		if !ok || dropped {
			return
		}
		// The subflow, keyed as the pod sends (the frame goes into it),
		// on the backup path; either role, chosen by the input.
		k := datapathFlowKey{Family: family(s.dst), Sport: htons(s.dport), Dport: htons(s.sport)}
		copy(k.Saddr[:], s.dst.AsSlice())
		copy(k.Daddr[:], s.src.AsSlice())
		role := RoleInitiator
		if frame[len(frame)-1]&1 == 1 {
			role = RoleResponder
		}
		putSubflow(t, dp, k, datapathSubflow{PathIndex: 3, Role: uint32(role), Rule: 0})
		if out, _ = runIngress(t, dp, frame); string(out) == string(frame) {
			return
		}
		after, ok := findTCP(out)
		if !ok {
			t.Fatalf("the program changed %x into %x, which no longer parses", frame, out)
		}
		if after.end != len(out) && s.end == len(frame) {
			t.Fatalf("IP length says %d bytes, the packet has %d", after.end, len(out))
		}
		if s.ipValid && !after.ipValid {
			t.Fatalf("IPv4 header checksum broken: %x -> %x", frame, out)
		}
		if s.tcpGood && !after.tcpGood {
			t.Fatalf("TCP checksum broken: %x -> %x", frame, out)
		}
	})
}

// runIngress runs pod_ingress on frame and requires TCX_NEXT without error,
// or a drop counted as one of ambiguous MPTCP options (dropped); it returns
// the packet as the program left it.
func runIngress(t *testing.T, dp *Datapath, frame []byte) (out []byte, dropped bool) {
	t.Helper()
	before := stat(t, dp, StatMPTCPOptsAmbiguous)
	opts := &ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256), Context: skbContext{}, ContextOut: &skbContext{}}
	ret, err := dp.objs.PodIngress.Run(opts)
	if err != nil {
		t.Fatalf("BPF_PROG_TEST_RUN on %x: %v", frame[:min(len(frame), 128)], err)
	}
	if ret == tcActShot && stat(t, dp, StatMPTCPOptsAmbiguous) == before+1 {
		return opts.DataOut, true
	}
	if ret != tcxNext {
		t.Fatalf("program returned %d, want TCX_NEXT", int32(ret))
	}
	return opts.DataOut, false
}
