package datapath

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
)

// How Linux reads a segment's TCP options (tcp_parse_options, and for MPTCP
// mptcp_get_options, which calls mptcp_parse_option once per MPTCP option):
// it walks them in order and stops at an EOL, at an option of length 0 or 1,
// at one running past the header, or at a kind byte without its length,
// keeping what it read before; an MPTCP option of length 2 has no subtype
// byte, and every subtype refuses that length, so the walk goes on after it.
// Each later MPTCP option of a subtype overwrites what an earlier one wrote:
// the last MP_JOIN's token and B, and one B for MP_JOIN (of SYN or SYN-ACK
// length) and MP_PRIO together. TestTheKernelReadsJoinOptionsAsTheParserDoes
// shows this on the running kernel. The tests below hold the datapath to
// that reading (bpf/include/parse.h, OPTS_END_EOL).

// optionBreaks end the kernel's reading of an option list right after the
// options before them.
var optionBreaks = []struct {
	name string
	add  func(opts []byte) []byte
}{
	{"then 0x42 0x00 (an option of length 0)", func(o []byte) []byte { return testpkt.Join(o, []byte{0x42, 0x00}) }},
	// Timestamps, 2 of its 10 bytes: the header ends first.
	{"then an option running past the header", func(o []byte) []byte { return testpkt.Join(o, []byte{8, 10}) }},
	{"then a kind byte without its length", func(o []byte) []byte {
		o = append([]byte(nil), o...)
		for len(o)%4 != 3 {
			o = append(o, 1) // NOP
		}
		return append(o, 0x42) // the header's last byte
	}},
}

// kernelMPTCPOptions lists the MPTCP options of frame's TCP header as Linux
// reads them: up to an EOL or a broken length, each one of length 3 or more.
func kernelMPTCPOptions(t *testing.T, frame []byte) [][]byte {
	t.Helper()
	s, ok := findTCP(frame)
	if !ok {
		t.Fatalf("no TCP segment in %x", frame)
	}
	opts := frame[s.l4+20 : s.l4+int(frame[s.l4+12]>>4)*4]
	var out [][]byte
	for i := 0; i < len(opts); {
		switch opts[i] {
		case 0:
			return out
		case 1:
			i++
			continue
		}
		if i+1 >= len(opts) || opts[i+1] < 2 || i+int(opts[i+1]) > len(opts) {
			return out
		}
		if n := int(opts[i+1]); opts[i] == testpkt.KindMPTCP && n >= 3 {
			out = append(out, opts[i:i+n])
		}
		i += int(opts[i+1])
	}
	return out
}

// backupBits are the B bits of frame's MPTCP options of subtype, in order,
// as the kernel reads them.
func backupBits(t *testing.T, frame []byte, subtype uint8) []bool {
	t.Helper()
	var out []bool
	for _, o := range kernelMPTCPOptions(t, frame) {
		if o[2]>>4 == subtype {
			out = append(out, o[2]&1 == 1)
		}
	}
	return out
}

// isJoinReset says whether frame is the reset the block actor answers a
// refused join with: RST|ACK carrying MP_TCPRST "administratively
// prohibited".
func isJoinReset(frame []byte) bool {
	s, ok := findTCP(frame)
	if !ok || s.end-s.l4 != 24 {
		return false
	}
	tcp := frame[s.l4:]
	return tcp[13] == testpkt.RST|testpkt.ACK && string(tcp[20:24]) == string([]byte{testpkt.KindMPTCP, 4, testpkt.SubTCPRst << 4, 3}) && s.tcpGood
}

// runVerdict runs prog on frame with ctx and returns its verdict and the
// frame as it left it.
func runVerdict(t *testing.T, prog *ebpf.Program, frame []byte, ctx skbContext) (uint32, []byte) {
	t.Helper()
	opts := &ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256), Context: ctx, ContextOut: &skbContext{}}
	ret, err := prog.Run(opts)
	if err != nil {
		t.Fatalf("BPF_PROG_TEST_RUN: %v", err)
	}
	return ret, opts.DataOut
}

// The NICs of the beds below: paths 1, 2 and 3.
const nicPath1, nicPath2, nicPath3 = 6, 7, 8

// peerJoinBed is the server pod's node with rule r, its three path NICs,
// and a connection the client opened to the server pod (client port 40000,
// on path 1), plus joins from client ports 40001.. on path 2, each answered
// and acknowledged.
func peerJoinBed(t *testing.T, r Rule, joins int) *Datapath {
	t.Helper()
	dp := loadForTest(t)
	if err := dp.SetRule(0, r); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetEndpoint(serverPod, 0); err != nil {
		t.Fatal(err)
	}
	for i, ifindex := range []int{nicPath1, nicPath2, nicPath3} {
		if err := dp.SetNIC(ifindex, uint32(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	server := netip.AddrPortFrom(serverPod, 5201)
	acceptFromWire(t, dp, netip.AddrPortFrom(clientPod, 40000), server, testpkt.MPCapableSYN(), nicPath1, 0x0a0b0c0d0e0f1011, serverKey)
	for j := range joins {
		acceptFromWire(t, dp, netip.AddrPortFrom(clientPod, 40001+uint16(j)), server, testpkt.MPJoinSYN(tokenOf(serverKey), 7, 1, false), nicPath2)
	}
	return dp
}

// peerJoinSYN is a join SYN from the client's port sport to the server pod
// with TCP options opts.
func peerJoinSYN(sport uint16, opts []byte) []byte {
	return testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: sport, DstPort: 5201, Seq: 1000, Flags: testpkt.SYN, Options: opts}}.Bytes()
}

// A peer's join SYN that its rule refuses (beyond the maximum of 2
// subflows, or on a blocked path) is refused with MP_TCPRST when a broken
// option follows its MP_JOIN, as it is without: the pod's kernel reads the
// MP_JOIN and stops at the break.
func TestAJoinSYNFollowedByABrokenOptionIsRefusedAsTheKernelReadsIt(t *testing.T) {
	for _, refusal := range []struct {
		name    string
		rule    Rule
		joins   int
		ifindex uint32
	}{
		{"beyond the maximum", Rule{Paths: []uint32{1, 2}, MaxSubflows: 2}, 1, nicPath2},
		{"on a blocked path", Rule{Paths: []uint32{1, 2}, Blocked: []uint32{3}}, 0, nicPath3},
	} {
		for _, brk := range optionBreaks {
			t.Run(refusal.name+"/"+brk.name, func(t *testing.T) {
				dp := peerJoinBed(t, refusal.rule, refusal.joins)
				frame := peerJoinSYN(40010, brk.add(testpkt.MPJoinSYN(tokenOf(serverKey), 7, 2, false)))
				ret, out := runVerdict(t, dp.objs.NicIngress, frame, skbContext{IngressIfindex: refusal.ifindex})
				if ret != tcActRedirect || !isJoinReset(out) {
					t.Fatalf("verdict %d, want TC_ACT_REDIRECT with the MP_TCPRST reset; out %x", int32(ret), out)
				}
				if n := stat(t, dp, StatJoinRefused); n != 1 {
					t.Errorf("StatJoinRefused = %d, want 1", n)
				}
			})
		}
	}
}

// A join the pod opens beyond its rule's maximum is refused with MP_TCPRST
// when a broken option follows its MP_JOIN: the peer's kernel reads the
// MP_JOIN.
func TestThePodsJoinSYNFollowedByABrokenOptionIsRefused(t *testing.T) {
	for _, brk := range optionBreaks {
		t.Run(brk.name, func(t *testing.T) {
			dp := loadForTest(t)
			if err := dp.SetRule(0, Rule{Paths: []uint32{1, 2}, MaxSubflows: 2}); err != nil {
				t.Fatal(err)
			}
			if err := dp.SetEndpoint(clientPod, 0); err != nil {
				t.Fatal(err)
			}
			egress := dp.objs.PodEgress
			run(t, egress, syn(clientPod, 40000, serverPod, 5201, testpkt.MPCapableSYN()), skbContext{})
			run(t, egress, capableACK(clientPod, 40000, serverPod, 5201, 0x0a0b0c0d0e0f1011, serverKey), skbContext{})
			run(t, egress, syn(clientPod, 40001, serverPod, 5201, testpkt.MPJoinSYN(tokenOf(serverKey), 7, 1, false)), skbContext{})
			frame := syn(clientPod, 40002, serverPod, 5201, brk.add(testpkt.MPJoinSYN(tokenOf(serverKey), 7, 2, false)))
			if ret, out := runVerdict(t, egress, frame, skbContext{}); ret != tcActRedirect || !isJoinReset(out) {
				t.Fatalf("verdict %d, want TC_ACT_REDIRECT with the MP_TCPRST reset", int32(ret))
			}
			for _, sf := range mustSubflows(t, dp) {
				if sf.Local.Port() == 40002 {
					t.Errorf("the refused join was placed: %+v", sf)
				}
			}
		})
	}
}

func mustSubflows(t *testing.T, dp *Datapath) []Subflow {
	t.Helper()
	sfs, err := dp.Subflows()
	if err != nil {
		t.Fatal(err)
	}
	return sfs
}

// The third ACK of a join no handshake was answered for (here the refused
// join's) is dropped when a broken option follows its MP_JOIN, as it is
// without: the pod's kernel would complete the join uncounted.
func TestAJoinThirdACKFollowedByABrokenOptionIsDropped(t *testing.T) {
	for _, brk := range optionBreaks {
		t.Run(brk.name, func(t *testing.T) {
			dp := peerJoinBed(t, Rule{Paths: []uint32{1, 2}, MaxSubflows: 2}, 1)
			third := testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 40010, DstPort: 5201, Seq: 1001, Ack: 8,
				Flags: testpkt.ACK, Options: brk.add(testpkt.MPJoinACK([20]byte{1}))}}.Bytes()
			if ret, _ := runVerdict(t, dp.objs.NicIngress, third, skbContext{IngressIfindex: nicPath2}); ret != tcActShot {
				t.Fatalf("verdict %d, want TC_ACT_SHOT", int32(ret))
			}
			if n := stat(t, dp, StatJoinACKDropped); n != 1 {
				t.Errorf("StatJoinACKDropped = %d, want 1", n)
			}
		})
	}
}

// backupJoins is backupBed for the client pod with its connection open and
// two joins placed: 40001 on the other active path, 40002 on the backup
// path 3, whose SYN-ACKs came back without B.
func backupJoins(t *testing.T) *Datapath {
	t.Helper()
	dp := backupBed(t, clientPod)
	egress, ingress := dp.Program(HookPodEgress), dp.Program(HookPodIngress)
	first := openConnection(t, dp, clientPod, serverPod)
	for j, want := range []uint32{3 - first, 3} {
		sport := uint16(40001 + j)
		if p := dp.pathOfMark(t, run(t, egress, syn(clientPod, sport, serverPod, 5201, testpkt.MPJoinSYN(tokenOf(serverKey), 7, uint8(j+1), false)), skbContext{})); p != want {
			t.Fatalf("join %d placed on path %d, want %d", j+1, p, want)
		}
		if want == 3 {
			continue // its SYN-ACK is the test's
		}
		runOut(t, ingress, synAck(serverPod, 5201, clientPod, sport, testpkt.MPJoinSYNACK(0x1122334455667788, 9, 0, false)))
	}
	return dp
}

// requireKernelReadsBackup checks that, in the frame the program left, the
// kernel reads B=1 from the last MPTCP option of subtype (the one it
// obeys), and that the TCP checksum is right.
func requireKernelReadsBackup(t *testing.T, ret uint32, out []byte, subtype uint8) {
	t.Helper()
	if ret != tcxNext {
		t.Fatalf("verdict %d, want TCX_NEXT", int32(ret))
	}
	bits := backupBits(t, out, subtype)
	if len(bits) == 0 || !bits[len(bits)-1] {
		t.Fatalf("the kernel reads B bits %v from the options of subtype %d, want the last set; out %x", bits, subtype, out)
	}
	if s, _ := findTCP(out); !s.tcpGood {
		t.Fatal("TCP checksum broken")
	}
}

// A peer's MP_PRIO B=0 into the pod on a backup path has its B set again
// when a broken option follows it: the pod's kernel reads the options
// before the break. (Two MP_PRIOs are dropped as ambiguous.)
func TestAnMPPrioIntoThePodIsKeptBackupAsTheKernelReadsIt(t *testing.T) {
	base := testpkt.Join(testpkt.NOP(), testpkt.NOP(), testpkt.Timestamps(100, 200), testpkt.DSS{DataACK: u64(5000)}.Bytes())
	cases := map[string][]byte{}
	for _, brk := range optionBreaks {
		cases[brk.name] = brk.add(testpkt.Join(base, testpkt.MPPrio(false)))
	}
	for name, opts := range cases {
		t.Run(name, func(t *testing.T) {
			dp := backupJoins(t)
			runOut(t, dp.objs.PodIngress, synAck(serverPod, 5201, clientPod, 40002, testpkt.MPJoinSYNACK(0x1122334455667788, 9, 0, false)))
			ack := testpkt.Frame{Src: serverPod, Dst: clientPod, TCP: &testpkt.TCP{SrcPort: 5201, DstPort: 40002, Seq: 8, Ack: 2, Flags: testpkt.ACK, Options: opts}}.Bytes()
			ret, out := runVerdict(t, dp.objs.PodIngress, ack, skbContext{})
			requireKernelReadsBackup(t, ret, out, testpkt.SubPrio)
			if len(out) != len(ack) {
				t.Errorf("%d bytes out, %d in: want the MP_PRIO rewritten in place", len(out), len(ack))
			}
		})
	}
}

// A join into the pod on a backup path gets its B bit when a broken option
// follows its MP_JOIN: the SYN-ACK of a join the pod opened, and the SYN of a
// join the peer opened (staged at the NIC of the backup path).
func TestAJoinIntoThePodFollowedByABrokenOptionIsFlaggedBackup(t *testing.T) {
	for _, brk := range optionBreaks {
		t.Run("SYN-ACK of the pod's join/"+brk.name, func(t *testing.T) {
			dp := backupJoins(t)
			sa := synAck(serverPod, 5201, clientPod, 40002, brk.add(testpkt.MPJoinSYNACK(0x1122334455667788, 9, 0, false)))
			ret, out := runVerdict(t, dp.objs.PodIngress, sa, skbContext{})
			requireKernelReadsBackup(t, ret, out, testpkt.SubJoin)
		})
		t.Run("SYN of the peer's join/"+brk.name, func(t *testing.T) {
			dp := backupBed(t, serverPod)
			if err := dp.SetNIC(nicPath3, 3); err != nil {
				t.Fatal(err)
			}
			join := peerJoinSYN(45001, brk.add(testpkt.MPJoinSYN(0x01020304, 5, 2, false)))
			if ret, _ := runVerdict(t, dp.objs.NicIngress, join, skbContext{IngressIfindex: nicPath3}); ret != tcxNext {
				t.Fatalf("nic_ingress: verdict %d, want TCX_NEXT", int32(ret))
			}
			ret, out := runVerdict(t, dp.objs.PodIngress, join, skbContext{})
			requireKernelReadsBackup(t, ret, out, testpkt.SubJoin)
		})
	}
}

// A segment whose MPTCP options the pod's kernel could read otherwise than
// the datapath (one that repeats MP_CAPABLE, MP_JOIN, DSS, ADD_ADDR or
// MP_PRIO, that carries MP_JOIN with MP_CAPABLE, an MP_JOIN of SYN or
// SYN-ACK length with MP_PRIO, or an MPTCP option of length 2) is
// dropped, to or from a selected pod, and counted: no MPTCP stack sends one,
// and judging it by any one of its options could let a join past its rule
// or a backup path turn active. Each case below, judged by its first option,
// did.
func TestSegmentsWhoseMPTCPOptionsTheKernelCouldReadOtherwiseAreDropped(t *testing.T) {
	const unknownToken = 0x01020304
	fromPeer := func(sport uint16, flags uint8, opts []byte) []byte {
		return testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: sport, DstPort: 5201, Seq: 1001, Ack: 8, Flags: flags, Options: opts}}.Bytes()
	}
	toPod := func(dport uint16, flags uint8, opts []byte) []byte {
		return testpkt.Frame{Src: serverPod, Dst: clientPod, TCP: &testpkt.TCP{SrcPort: 5201, DstPort: dport, Seq: 8, Ack: 2, Flags: flags, Options: opts}}.Bytes()
	}
	maxTwo := Rule{Paths: []uint32{1, 2}, MaxSubflows: 2}
	for _, c := range []struct {
		name string
		// bed returns the datapath, the program and the frame to run, and
		// the context to run it in.
		bed func(t *testing.T) (*Datapath, *ebpf.Program, []byte, skbContext)
	}{
		{"a peer's join SYN beyond the maximum with two MP_JOINs, the last (the kernel's) with the connection's token", func(t *testing.T) (*Datapath, *ebpf.Program, []byte, skbContext) {
			dp := peerJoinBed(t, maxTwo, 1)
			return dp, dp.objs.NicIngress, peerJoinSYN(40010, testpkt.Join(testpkt.MPJoinSYN(unknownToken, 7, 2, false), testpkt.MPJoinSYN(tokenOf(serverKey), 7, 3, false))),
				skbContext{IngressIfindex: nicPath2}
		}},
		{"a peer's join SYN beyond the maximum after an MPTCP option of length 2", func(t *testing.T) (*Datapath, *ebpf.Program, []byte, skbContext) {
			dp := peerJoinBed(t, maxTwo, 1)
			return dp, dp.objs.NicIngress, peerJoinSYN(40010, testpkt.Join([]byte{testpkt.KindMPTCP, 2, 1, 1}, testpkt.MPJoinSYN(tokenOf(serverKey), 7, 2, false))),
				skbContext{IngressIfindex: nicPath2}
		}},
		{"the pod's join SYN beyond the maximum with two MP_JOINs, the last with the connection's token", func(t *testing.T) (*Datapath, *ebpf.Program, []byte, skbContext) {
			dp := loadForTest(t)
			if err := dp.SetRule(0, maxTwo); err != nil {
				t.Fatal(err)
			}
			if err := dp.SetEndpoint(clientPod, 0); err != nil {
				t.Fatal(err)
			}
			openConnection(t, dp, clientPod, serverPod)
			run(t, dp.objs.PodEgress, syn(clientPod, 40001, serverPod, 5201, testpkt.MPJoinSYN(tokenOf(serverKey), 7, 1, false)), skbContext{})
			return dp, dp.objs.PodEgress, syn(clientPod, 40002, serverPod, 5201, testpkt.Join(testpkt.MPJoinSYN(unknownToken, 7, 2, false), testpkt.MPJoinSYN(tokenOf(serverKey), 7, 3, false))), skbContext{}
		}},
		{"a join's third ACK with two MP_JOINs", func(t *testing.T) (*Datapath, *ebpf.Program, []byte, skbContext) {
			dp := peerJoinBed(t, maxTwo, 0)
			// The join is answered; its third ACK carries an MP_JOIN of
			// SYN length before its HMAC (two HMACs do not fit).
			run(t, dp.objs.NicIngress, peerJoinSYN(40010, testpkt.MPJoinSYN(tokenOf(serverKey), 7, 2, false)), skbContext{IngressIfindex: nicPath2})
			answer := testpkt.Frame{Src: serverPod, Dst: clientPod, TCP: &testpkt.TCP{SrcPort: 5201, DstPort: 40010, Seq: 7, Ack: 1001,
				Flags: testpkt.SYN | testpkt.ACK, Options: testpkt.MPJoinSYNACK(1, 2, 1, false)}}.Bytes()
			run(t, dp.objs.PodEgress, answer, skbContext{})
			return dp, dp.objs.NicIngress, fromPeer(40010, testpkt.ACK, testpkt.Join(testpkt.MPJoinSYN(tokenOf(serverKey), 7, 2, false), testpkt.MPJoinACK([20]byte{1}))), skbContext{IngressIfindex: nicPath2}
		}},
		{"an MP_CAPABLE third ACK with two pairs of keys, the last (the kernel's) the connection's", func(t *testing.T) (*Datapath, *ebpf.Program, []byte, skbContext) {
			dp := peerJoinBed(t, maxTwo, 0)
			run(t, dp.objs.NicIngress, peerJoinSYN(40010, testpkt.MPCapableSYN()), skbContext{IngressIfindex: nicPath1})
			answer := testpkt.Frame{Src: serverPod, Dst: clientPod, TCP: &testpkt.TCP{SrcPort: 5201, DstPort: 40010, Seq: 7, Ack: 1001,
				Flags: testpkt.SYN | testpkt.ACK, Options: testpkt.MPCapableSYNACK(0x77)}}.Bytes()
			run(t, dp.objs.PodEgress, answer, skbContext{})
			return dp, dp.objs.NicIngress, fromPeer(40010, testpkt.ACK, testpkt.Join(testpkt.MPCapableACK(1, 2), testpkt.MPCapableACK(0x66, 0x77))), skbContext{IngressIfindex: nicPath1}
		}},
		{"a peer's join SYN into the pod on a backup path with MP_JOIN B=0 then MP_PRIO B=0", func(t *testing.T) (*Datapath, *ebpf.Program, []byte, skbContext) {
			dp := backupBed(t, serverPod)
			if err := dp.SetNIC(nicPath3, 3); err != nil {
				t.Fatal(err)
			}
			// Staged at the backup path's NIC as a plain join, with the
			// same sequence number.
			run(t, dp.objs.NicIngress, peerJoinSYN(45001, testpkt.MPJoinSYN(unknownToken, 5, 2, false)), skbContext{IngressIfindex: nicPath3})
			return dp, dp.objs.PodIngress, peerJoinSYN(45001, testpkt.Join(testpkt.MPJoinSYN(unknownToken, 5, 2, false), testpkt.MPPrio(false))), skbContext{}
		}},
		{"the SYN-ACK of the pod's join on a backup path with two MP_JOINs, the last of SYN length", func(t *testing.T) (*Datapath, *ebpf.Program, []byte, skbContext) {
			dp := backupJoins(t)
			return dp, dp.objs.PodIngress, synAck(serverPod, 5201, clientPod, 40002,
				testpkt.Join(testpkt.MPJoinSYNACK(0x1122334455667788, 9, 0, false), testpkt.MPJoinSYN(1, 2, 0, false))), skbContext{}
		}},
		{"an MP_PRIO B=0 into the pod on a backup path followed by an MP_JOIN B=0", func(t *testing.T) (*Datapath, *ebpf.Program, []byte, skbContext) {
			dp := backupJoins(t)
			runOut(t, dp.objs.PodIngress, synAck(serverPod, 5201, clientPod, 40002, testpkt.MPJoinSYNACK(0x1122334455667788, 9, 0, false)))
			return dp, dp.objs.PodIngress, toPod(40002, testpkt.ACK, testpkt.Join(testpkt.DSS{DataACK: u64(1)}.Bytes(), testpkt.MPPrio(false),
				testpkt.MPJoinSYNACK(1, 2, 0, false))), skbContext{}
		}},
		{"two MP_PRIOs into the pod on a backup path, B=1 then B=0 (an older kernel obeys the last, a newer the first)", func(t *testing.T) (*Datapath, *ebpf.Program, []byte, skbContext) {
			dp := backupJoins(t)
			runOut(t, dp.objs.PodIngress, synAck(serverPod, 5201, clientPod, 40002, testpkt.MPJoinSYNACK(0x1122334455667788, 9, 0, false)))
			return dp, dp.objs.PodIngress, toPod(40002, testpkt.ACK, testpkt.Join(testpkt.DSS{DataACK: u64(1)}.Bytes(), testpkt.MPPrio(false),
				testpkt.MPPrio(false))), skbContext{}
		}},
		{"a peer's join SYN beyond the maximum whose MP_JOIN comes with an MP_CAPABLE", func(t *testing.T) (*Datapath, *ebpf.Program, []byte, skbContext) {
			dp := peerJoinBed(t, maxTwo, 1)
			return dp, dp.objs.NicIngress, peerJoinSYN(40010, testpkt.Join(testpkt.MPJoinSYN(tokenOf(serverKey), 7, 2, false), testpkt.MPCapableSYN())),
				skbContext{IngressIfindex: nicPath2}
		}},
		{"two ADD_ADDRs into a pod whose rule allows no join", func(t *testing.T) (*Datapath, *ebpf.Program, []byte, skbContext) {
			dp := loadForTest(t)
			if err := dp.SetRule(0, Rule{Paths: []uint32{1, 2}, MaxSubflows: 1, RewriteHeaders: true}); err != nil {
				t.Fatal(err)
			}
			if err := dp.SetEndpoint(clientPod, 0); err != nil {
				t.Fatal(err)
			}
			run(t, dp.objs.PodEgress, syn(clientPod, 40000, serverPod, 5201, testpkt.MPCapableSYN()), skbContext{})
			return dp, dp.objs.PodIngress, toPod(40000, testpkt.ACK, testpkt.Join(testpkt.AddAddr(3, netip.MustParseAddr("10.244.2.12"), 0, true, 0),
				testpkt.AddAddr(4, netip.MustParseAddr("10.244.2.13"), 0, true, 0))), skbContext{}
		}},
		{"a pod's segment with two DSS", func(t *testing.T) (*Datapath, *ebpf.Program, []byte, skbContext) {
			dp := loadForTest(t)
			if err := dp.SetRule(0, Rule{Paths: []uint32{1, 2}}); err != nil {
				t.Fatal(err)
			}
			if err := dp.SetEndpoint(clientPod, 0); err != nil {
				t.Fatal(err)
			}
			run(t, dp.objs.PodEgress, syn(clientPod, 40000, serverPod, 5201, testpkt.MPCapableSYN()), skbContext{})
			return dp, dp.objs.PodEgress, testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 40000, DstPort: 5201, Seq: 2, Ack: 8, Flags: testpkt.ACK,
				Options: testpkt.Join(testpkt.DSS{DataACK: u64(1)}.Bytes(), testpkt.DSS{DataACK: u64(9)}.Bytes())}}.Bytes(), skbContext{}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dp, prog, frame, ctx := c.bed(t)
			conns, err := dp.Connections()
			if err != nil {
				t.Fatal(err)
			}
			before := stat(t, dp, StatMPTCPOptsAmbiguous)
			if ret, _ := runVerdict(t, prog, frame, ctx); ret != tcActShot {
				t.Fatalf("verdict %d, want TC_ACT_SHOT", int32(ret))
			}
			if n := stat(t, dp, StatMPTCPOptsAmbiguous); n != before+1 {
				t.Errorf("StatMPTCPOptsAmbiguous = %d, want %d", n, before+1)
			}
			if after, err := dp.Connections(); err != nil || len(after) != len(conns) {
				t.Errorf("connections %+v -> %+v (%v): the dropped segment taught one", conns, after, err)
			}
		})
	}
}

// A join's third ACK (MP_JOIN with the full HMAC, which carries no B) with
// an MP_PRIO is what Linux sends when its path manager changes the join's
// role before the join is fully established (the agent releasing a held
// join to a distant peer): it is not ambiguous, and it passes.
func TestAJoinsThirdACKWithAnMPPrioPasses(t *testing.T) {
	fromPeer := func(sport uint16, flags uint8, opts []byte) []byte {
		return testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: sport, DstPort: 5201, Seq: 1001, Ack: 8, Flags: flags, Options: opts}}.Bytes()
	}
	dp := peerJoinBed(t, Rule{Paths: []uint32{1, 2}, MaxSubflows: 2}, 0)
	run(t, dp.objs.NicIngress, peerJoinSYN(40010, testpkt.MPJoinSYN(tokenOf(serverKey), 7, 2, true)), skbContext{IngressIfindex: nicPath2})
	answer := testpkt.Frame{Src: serverPod, Dst: clientPod, TCP: &testpkt.TCP{SrcPort: 5201, DstPort: 40010, Seq: 7, Ack: 1001,
		Flags: testpkt.SYN | testpkt.ACK, Options: testpkt.MPJoinSYNACK(1, 2, 1, true)}}.Bytes()
	run(t, dp.objs.PodEgress, answer, skbContext{})
	before := stat(t, dp, StatMPTCPOptsAmbiguous)
	third := fromPeer(40010, testpkt.ACK, testpkt.Join(testpkt.MPJoinACK([20]byte{1}), testpkt.MPPrio(false)))
	if ret, _ := runVerdict(t, dp.objs.NicIngress, third, skbContext{IngressIfindex: nicPath2}); ret == tcActShot {
		t.Fatal("the join's third ACK with an MP_PRIO was dropped")
	}
	if n := stat(t, dp, StatMPTCPOptsAmbiguous); n != before {
		t.Errorf("StatMPTCPOptsAmbiguous = %d, want %d: the pair is not ambiguous", n, before)
	}
}

// In observe-only mode such a segment passes, counted as observed, and the
// datapath reads it as it reads any: here a peer's join SYN beyond the
// maximum, with two MP_JOINs, is staged and not refused.
func TestObserveOnlyPassesSegmentsWhoseMPTCPOptionsTheKernelCouldReadOtherwise(t *testing.T) {
	dp := peerJoinBed(t, Rule{Paths: []uint32{1, 2}, MaxSubflows: 2}, 1)
	if err := dp.SetObserveOnly(true); err != nil {
		t.Fatal(err)
	}
	observed := stat(t, dp, StatObserved)
	frame := peerJoinSYN(40010, testpkt.Join(testpkt.MPJoinSYN(0x01020304, 7, 2, false), testpkt.MPJoinSYN(tokenOf(serverKey), 7, 3, false)))
	if ret, out := runVerdict(t, dp.objs.NicIngress, frame, skbContext{IngressIfindex: nicPath2}); ret != tcxNext || string(out) != string(frame) {
		t.Fatalf("verdict %d, changed %v; want it passed unchanged", int32(ret), string(out) != string(frame))
	}
	if stat(t, dp, StatObserved) <= observed || stat(t, dp, StatMPTCPOptsAmbiguous) != 1 {
		t.Errorf("observed %d -> %d, ambiguous %d; want the drop observed and counted", observed, stat(t, dp, StatObserved), stat(t, dp, StatMPTCPOptsAmbiguous))
	}
}

// optionListSeeds are the fuzz tests' seeds for option lists the kernel
// reads up to a break or could read otherwise: a join SYN, SYN-ACK and third
// ACK and an MP_PRIO ACK, each followed by every break, and segments that
// repeat an MPTCP option or carry MP_JOIN with MP_PRIO.
func optionListSeeds() [][]byte {
	toPod := func(flags uint8, opts []byte) []byte {
		return testpkt.Frame{Src: serverPod, Dst: clientPod, TCP: &testpkt.TCP{SrcPort: 5201, DstPort: 40002, Seq: 8, Ack: 2, Flags: flags, Options: opts}}.Bytes()
	}
	prioACK := testpkt.Join(testpkt.NOP(), testpkt.NOP(), testpkt.Timestamps(100, 200), testpkt.DSS{DataACK: u64(5000)}.Bytes(), testpkt.MPPrio(false))
	var out [][]byte
	for _, brk := range optionBreaks {
		out = append(out,
			peerJoinSYN(40010, brk.add(testpkt.MPJoinSYN(1, 7, 2, false))),
			toPod(testpkt.SYN|testpkt.ACK, brk.add(testpkt.MPJoinSYNACK(1, 9, 0, false))),
			toPod(testpkt.ACK, brk.add(testpkt.MPJoinACK([20]byte{1}))),
			toPod(testpkt.ACK, brk.add(prioACK)))
	}
	for _, opts := range [][]byte{
		testpkt.Join(testpkt.MPJoinSYN(1, 7, 2, false), testpkt.MPJoinSYN(2, 7, 3, false)),
		testpkt.Join(testpkt.MPJoinSYN(1, 7, 2, true), testpkt.MPPrio(false)),
		testpkt.Join([]byte{testpkt.KindMPTCP, 2, 1, 1}, testpkt.MPJoinSYN(1, 7, 2, false)),
	} {
		out = append(out, peerJoinSYN(40011, opts))
	}
	for _, opts := range [][]byte{
		testpkt.Join(testpkt.MPJoinSYNACK(1, 9, 0, false), testpkt.MPJoinSYN(1, 2, 0, false)),
		testpkt.Join(testpkt.MPJoinSYN(1, 7, 2, false), testpkt.MPJoinACK([20]byte{1})),
		testpkt.Join(testpkt.MPCapableACK(1, 2), testpkt.MPCapableACK(3, 4)),
		testpkt.Join(testpkt.DSS{DataACK: u64(1)}.Bytes(), testpkt.MPPrio(false), testpkt.MPJoinSYNACK(1, 2, 0, false)),
		testpkt.Join(testpkt.MPPrio(true), testpkt.MPPrio(false), testpkt.DSS{DataACK: u64(1)}.Bytes()),
		testpkt.Join(testpkt.MPJoinACK([20]byte{1}), testpkt.MPPrio(false)),
	} {
		out = append(out, toPod(testpkt.ACK, opts), toPod(testpkt.SYN|testpkt.ACK, opts))
	}
	return out
}

// The MP_PRIO that tells the pod its subflow's path became a backup path is
// added at the tail of a pure ACK's options only where the pod's kernel
// reads it: not after an EOL, nor after a broken option (each counted as
// no room); the next ACK whose options the kernel reads to their end
// carries it.
func TestAnMPPrioIsAddedOnlyWhereThePodReadsIt(t *testing.T) {
	dp := backupBed(t, clientPod)
	egress, ingress := dp.Program(HookPodEgress), dp.Program(HookPodIngress)
	first := openConnection(t, dp, clientPod, serverPod)
	const sport = 40001
	if p := dp.pathOfMark(t, run(t, egress, syn(clientPod, sport, serverPod, 5201, testpkt.MPJoinSYN(tokenOf(serverKey), 7, 1, false)), skbContext{})); p != 3-first {
		t.Fatalf("join placed on path %d, want the other active path %d", p, 3-first)
	}
	runOut(t, ingress, synAck(serverPod, 5201, clientPod, sport, testpkt.MPJoinSYNACK(0x1122334455667788, 9, 0, false)))
	// The join's path becomes a backup path: an MP_PRIO B=1 is due.
	if err := dp.SetRule(0, Rule{Paths: []uint32{first}, Backup: []uint32{3 - first, 3}, RewriteHeaders: true}); err != nil {
		t.Fatal(err)
	}
	base := testpkt.Join(testpkt.NOP(), testpkt.NOP(), testpkt.Timestamps(100, 200), testpkt.DSS{DataACK: u64(5000)}.Bytes())
	ack := func(opts []byte) []byte {
		return testpkt.Frame{Src: serverPod, Dst: clientPod, TCP: &testpkt.TCP{SrcPort: 5201, DstPort: sport, Seq: 8, Ack: 2, Flags: testpkt.ACK, Options: opts}}.Bytes()
	}
	unread := map[string][]byte{
		"options ended by an EOL": testpkt.Join(base, testpkt.NOP(), []byte{0}),
	}
	for _, brk := range optionBreaks {
		unread["options "+brk.name] = brk.add(base)
	}
	for _, name := range sortedKeys(unread) {
		frame := ack(unread[name])
		noRoom := stat(t, dp, StatBackupPrioNoRoom)
		if ret, out := runVerdict(t, ingress, frame, skbContext{}); ret != tcxNext || string(out) != string(frame) {
			t.Errorf("%s: verdict %d, changed %v; want it passed unchanged", name, int32(ret), string(out) != string(frame))
		}
		if n := stat(t, dp, StatBackupPrioNoRoom); n != noRoom+1 {
			t.Errorf("%s: StatBackupPrioNoRoom %d -> %d, want one more", name, noRoom, n)
		}
	}
	if n := stat(t, dp, StatBackupPrioSent); n != 0 {
		t.Fatalf("StatBackupPrioSent = %d, want none yet", n)
	}
	_, out := runVerdict(t, ingress, ack(base), skbContext{})
	if bits := backupBits(t, out, testpkt.SubPrio); len(bits) != 1 || !bits[0] {
		t.Errorf("the ACK the pod reads to its end: MP_PRIO B bits %v, want one, set", bits)
	}
}
