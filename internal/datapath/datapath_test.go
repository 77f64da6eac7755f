package datapath

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// skbContext is struct __sk_buff (192 bytes on this kernel): the test sets
// the fields BPF_PROG_TEST_RUN accepts (mark, ingress_ifindex) and reads the
// mark back. The kernel insists on the whole struct for the output.
type skbContext struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTCI, VlanProto uint32
	Priority, IngressIfindex, Ifindex                                           uint32
	_                                                                           [176 - 11*4]byte
	GSOSize                                                                     uint32 // at 176, as in struct __sk_buff
	_                                                                           [192 - 180]byte
}

const tcxNext = ^uint32(0) // TCX_NEXT (-1)

var (
	clientPod = netip.MustParseAddr("10.244.1.11")
	serverPod = netip.MustParseAddr("10.244.2.11")
)

// run runs prog on frame and returns the mark it leaves; it also checks the
// program let the packet continue and did not change a byte of it.
func run(t *testing.T, prog *ebpf.Program, frame []byte, in skbContext) uint32 {
	t.Helper()
	out := skbContext{}
	data := make([]byte, len(frame)+256)
	ret, err := prog.Run(&ebpf.RunOptions{Data: frame, DataOut: data, Context: in, ContextOut: &out})
	if err != nil {
		t.Fatalf("BPF_PROG_TEST_RUN: %v", err)
	}
	if ret != tcxNext {
		t.Fatalf("program returned %d, want TCX_NEXT", int32(ret))
	}
	if string(data[:len(frame)]) != string(frame) {
		t.Fatalf("program changed the packet")
	}
	return out.Mark
}

// verdict runs prog on frame and returns what it returned.
func verdict(t *testing.T, prog *ebpf.Program, frame []byte, in skbContext) uint32 {
	t.Helper()
	ret, err := prog.Run(&ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256), Context: in, ContextOut: &skbContext{}})
	if err != nil {
		t.Fatal(err)
	}
	return ret
}

func tokenOf(key uint64) uint32 {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], key)
	h := sha256.Sum256(b[:])
	return binary.BigEndian.Uint32(h[:4])
}

func syn(src netip.Addr, sport uint16, dst netip.Addr, dport uint16, opts []byte) []byte {
	return testpkt.Frame{Src: src, Dst: dst, TCP: &testpkt.TCP{SrcPort: sport, DstPort: dport, Seq: 1, Flags: testpkt.SYN, Options: opts}}.Bytes()
}

func synAck(src netip.Addr, sport uint16, dst netip.Addr, dport uint16, opts []byte) []byte {
	return testpkt.Frame{Src: src, Dst: dst, TCP: &testpkt.TCP{SrcPort: sport, DstPort: dport, Seq: 7, Ack: 2, Flags: testpkt.SYN | testpkt.ACK, Options: opts}}.Bytes()
}

// capableACK is the third ACK of an MP_CAPABLE handshake, carrying the
// initiator's and the responder's keys.
func capableACK(src netip.Addr, sport uint16, dst netip.Addr, dport uint16, initiatorKey, responderKey uint64) []byte {
	return testpkt.Frame{Src: src, Dst: dst, TCP: &testpkt.TCP{SrcPort: sport, DstPort: dport, Seq: 2, Ack: 8, Flags: testpkt.ACK,
		Options: testpkt.MPCapableACK(initiatorKey, responderKey)}}.Bytes()
}

func (d *Datapath) pathOfMark(t *testing.T, mark uint32) uint32 {
	t.Helper()
	v := (mark & d.markMask) >> d.markShift
	if v == 0 {
		t.Fatalf("mark %#x carries no path", mark)
	}
	return v
}

// Every program of every BPF object passes this kernel's verifier on its own;
// a rejection prints the verifier's whole log.
func TestObjectsPassVerifier(t *testing.T) {
	testutil.RequireRoot(t)
	objects := map[string]func() (*ebpf.CollectionSpec, error){
		"datapath": loadDatapath,
	}
	for obj, load := range objects {
		spec, err := load()
		if err != nil {
			t.Fatalf("%s: reading the object: %v", obj, err)
		}
		if len(spec.Programs) == 0 {
			t.Fatalf("%s: no programs", obj)
		}
		for name := range spec.Programs {
			t.Run(obj+"/"+name, func(t *testing.T) {
				one := spec.Copy()
				for other := range one.Programs {
					if other != name {
						delete(one.Programs, other)
					}
				}
				for _, m := range one.Maps {
					m.Pinning = ebpf.PinNone
				}
				// Statistics only on success (instructions processed,
				// stack depth per function); the full log on a rejection.
				coll, err := ebpf.NewCollectionWithOptions(one, ebpf.CollectionOptions{
					Programs: ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats},
				})
				if err != nil {
					var ve *ebpf.VerifierError
					if errors.As(err, &ve) {
						t.Fatalf("verifier rejected %s:\n%+v", name, ve)
					}
					t.Fatalf("loading %s: %v", name, err)
				}
				defer coll.Close()
				for _, line := range strings.Split(coll.Programs[name].VerifierLog, "\n") {
					if strings.Contains(line, "processed") || strings.Contains(line, "stack depth") {
						t.Logf("%s: %s", name, line)
					}
				}
			})
		}
	}
}

func TestMarkShiftRejectsBadMasks(t *testing.T) {
	tests := map[string]struct {
		mask    uint32 // mark mask given by the admin
		wantErr bool   // whether Load must refuse it
	}{
		"default":        {mask: DefaultMarkMask},
		"wide":           {mask: 0xff000000},
		"split run":      {mask: 0x00f0f000, wantErr: true},
		"three bits":     {mask: 0x00700000, wantErr: true},
		"lowest nibble":  {mask: 0x0000000f},
		"single bit set": {mask: 0x00000100, wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := markShift(tc.mask)
			if (err != nil) != tc.wantErr {
				t.Fatalf("markShift(%#x) error = %v, want error %v", tc.mask, err, tc.wantErr)
			}
		})
	}
}

// A connection's joins land on paths its other subflows do not use, and the
// datapath knows the token from the third ACK, before the first join exists.
func TestSpreadPlacesSubflowsOfOneConnectionOnDistinctPaths(t *testing.T) {
	for _, npaths := range []int{2, 4} {
		t.Run(map[int]string{2: "2 paths", 4: "4 paths"}[npaths], func(t *testing.T) {
			dp := loadForTest(t)
			paths := make([]uint32, npaths)
			for i := range paths {
				paths[i] = uint32(i + 1)
			}
			if err := dp.SetRule(0, Rule{Paths: paths}); err != nil {
				t.Fatal(err)
			}
			if err := dp.SetEndpoint(clientPod, 0); err != nil {
				t.Fatal(err)
			}

			// Two concurrent connections between the same pods and ports
			// differ only by their tokens.
			keys := []uint64{0x0102030405060708, 0x1122334455667788}
			const clientKey = 0x0a0b0c0d0e0f1011
			for c, key := range keys {
				cport := uint16(40000 + c*100)
				used := map[uint32]bool{}
				mark := run(t, dp.objs.PodEgress, syn(clientPod, cport, serverPod, 5201, testpkt.MPCapableSYN()), skbContext{})
				used[dp.pathOfMark(t, mark)] = true

				run(t, dp.objs.PodEgress, capableACK(clientPod, cport, serverPod, 5201, clientKey+uint64(c), key), skbContext{})

				for j := 1; j < npaths; j++ {
					// Joins from the same address to the same server port:
					// only the kernel-chosen source port differs.
					frame := syn(clientPod, cport+uint16(j), serverPod, 5201, testpkt.MPJoinSYN(tokenOf(key), 99, 0, false))
					p := dp.pathOfMark(t, run(t, dp.objs.PodEgress, frame, skbContext{}))
					if used[p] {
						t.Fatalf("connection %d: join %d placed on path %d, already used by %v", c, j, p, used)
					}
					used[p] = true
				}
			}
			stats, err := dp.Stats()
			if err != nil {
				t.Fatal(err)
			}
			if got, want := stats[StatJoinTokenKnown], uint64(len(keys)*(npaths-1)); got != want {
				t.Errorf("joins with known token = %d, want %d", got, want)
			}
			if stats[StatJoinTokenUnknown] != 0 {
				t.Errorf("joins with unknown token = %d, want 0", stats[StatJoinTokenUnknown])
			}
			if got := stats[StatTokenLearnt]; got != uint64(len(keys)) {
				t.Errorf("tokens learnt = %d, want %d", got, len(keys))
			}
		})
	}
}

// Once placed, every later packet of a subflow carries the same path.
func TestPlacedSubflowKeepsItsPath(t *testing.T) {
	dp := loadForTest(t)
	if err := dp.SetRule(0, Rule{Paths: []uint32{1, 2, 3}}); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	first := run(t, dp.objs.PodEgress, syn(clientPod, 40001, serverPod, 80, testpkt.MPCapableSYN()), skbContext{})
	data := testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 40001, DstPort: 80, Seq: 2, Ack: 8, Flags: testpkt.ACK, Payload: []byte("hello")}}.Bytes()
	for i := 0; i < 5; i++ {
		// Open other connections in between: the round-robin cursor moves.
		run(t, dp.objs.PodEgress, syn(clientPod, uint16(41000+i), serverPod, 80, testpkt.MPCapableSYN()), skbContext{})
		if got := run(t, dp.objs.PodEgress, data, skbContext{}); got != first {
			t.Fatalf("data packet mark %#x, want the SYN's %#x", got, first)
		}
	}
}

// A join whose token the datapath never saw is still placed, and counted, so
// the gap is visible.
func TestJoinWithUnknownTokenIsCounted(t *testing.T) {
	dp := loadForTest(t)
	if err := dp.SetRule(0, Rule{Paths: []uint32{1, 2}}); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	run(t, dp.objs.PodEgress, syn(clientPod, 40001, serverPod, 80, testpkt.MPJoinSYN(0xdeadbeef, 1, 1, false)), skbContext{})
	stats, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if stats[StatJoinTokenUnknown] != 1 || stats[StatSubflowPlaced] != 1 {
		t.Fatalf("unknown-token joins = %d, placed = %d; want 1 and 1", stats[StatJoinTokenUnknown], stats[StatSubflowPlaced])
	}
}

// nic2Ifindex is the NIC of path 2 in mirroredJoinBed.
const nic2Ifindex = 7

// mirroredJoinBed selects the server pod (rule 0 over paths 1 and 2), and
// has a peer's join from the client pod (port 45000 to 5201) arrive on
// path 2's NIC, checking the datapath marks it with path 2.
func mirroredJoinBed(t *testing.T) *Datapath {
	t.Helper()
	dp := loadForTest(t)
	if err := dp.SetRule(0, Rule{Paths: []uint32{1, 2}}); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetEndpoint(serverPod, 0); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetNIC(nic2Ifindex, 2); err != nil {
		t.Fatal(err)
	}
	join := syn(clientPod, 45000, serverPod, 5201, testpkt.MPJoinSYN(0x01020304, 5, 2, false))
	if p := dp.pathOfMark(t, run(t, dp.objs.NicIngress, join, skbContext{IngressIfindex: nic2Ifindex})); p != 2 {
		t.Fatalf("arriving join marked with path %d, want 2", p)
	}
	if p := acceptFromWire(t, dp, netip.AddrPortFrom(clientPod, 45000), netip.AddrPortFrom(serverPod, 5201), testpkt.MPJoinSYN(0x01020304, 5, 2, false), nic2Ifindex); p != 2 {
		t.Fatalf("the pod's answer to the join left by path %d, want the arrival path 2", p)
	}
	return dp
}

// The responder's node sends a subflow's replies out of the NIC its SYN
// arrived on, and marks arriving packets so strict rp_filter accepts them.
func TestResponderMirrorsArrivalNIC(t *testing.T) {
	dp := mirroredJoinBed(t)
	reply := testpkt.Frame{Src: serverPod, Dst: clientPod, TCP: &testpkt.TCP{SrcPort: 5201, DstPort: 45000, Seq: 8, Ack: 2, Flags: testpkt.ACK, Payload: []byte("data")}}.Bytes()
	if p := dp.pathOfMark(t, run(t, dp.objs.PodEgress, reply, skbContext{})); p != 2 {
		t.Fatalf("reply marked with path %d, want the arrival path 2", p)
	}
	sfs, err := dp.Subflows()
	if err != nil {
		t.Fatal(err)
	}
	if len(sfs) != 1 || sfs[0].Role != RoleResponder || sfs[0].Local != netip.AddrPortFrom(serverPod, 5201) {
		t.Fatalf("subflow table = %+v, want one responder entry for %v", sfs, serverPod)
	}
	// Packets on a NIC the datapath does not know are left alone.
	join := syn(clientPod, 45001, serverPod, 5201, testpkt.MPJoinSYN(0x01020304, 5, 2, false))
	if m := run(t, dp.objs.NicIngress, join, skbContext{IngressIfindex: 99, Mark: 0x5}); m != 0x5 {
		t.Fatalf("packet on an unknown NIC got mark %#x", m)
	}
}

// A pod released from every rule keeps its subflows' packets acceptable on
// whatever path NIC they arrive: its peer's node may still send them there.
// A packet of no known subflow of an unselected address stays unmarked.
func TestReleasedPodsSubflowsStayAcceptedOnTheirNIC(t *testing.T) {
	dp := mirroredJoinBed(t)
	if err := dp.DeleteEndpoint(serverPod); err != nil {
		t.Fatal(err)
	}
	before, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}

	data := testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 45000, DstPort: 5201, Seq: 2, Ack: 8, Flags: testpkt.ACK, Payload: []byte("late")}}.Bytes()
	if p := dp.pathOfMark(t, run(t, dp.objs.NicIngress, data, skbContext{IngressIfindex: nic2Ifindex})); p != 2 {
		t.Fatalf("released pod's subflow packet marked with path %d, want the arrival path 2", p)
	}
	other := testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 45001, DstPort: 5201, Seq: 2, Ack: 8, Flags: testpkt.ACK, Payload: []byte("late")}}.Bytes()
	if m := run(t, dp.objs.NicIngress, other, skbContext{IngressIfindex: nic2Ifindex, Mark: 0x5}); m != 0x5 {
		t.Fatalf("packet of no known subflow of a released pod got mark %#x", m)
	}
	// A new subflow of the released pod is not mirrored.
	run(t, dp.objs.NicIngress, syn(clientPod, 45002, serverPod, 5201, testpkt.MPCapableSYN()), skbContext{IngressIfindex: nic2Ifindex})
	after, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if n := after[StatSubflowMirrored] - before[StatSubflowMirrored]; n != 0 {
		t.Errorf("%d subflows of the released pod mirrored, want none", n)
	}
	if n := after[StatMarked] - before[StatMarked]; n != 1 {
		t.Errorf("%d packets marked after the release, want 1", n)
	}
}

// Mark bits outside the mask belong to others (kube-proxy, CNIs) and survive.
func TestMarkPreservesForeignBits(t *testing.T) {
	dp := loadForTest(t)
	if err := dp.SetRule(0, Rule{Paths: []uint32{4}}); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	foreign := uint32(0x4000 | 0x0f00 | 0x80000000)
	got := run(t, dp.objs.PodEgress, syn(clientPod, 40001, serverPod, 80, testpkt.MPCapableSYN()), skbContext{Mark: foreign | dp.markMask})
	if got&^dp.markMask != foreign {
		t.Fatalf("foreign mark bits %#x became %#x", foreign, got&^dp.markMask)
	}
	if got&dp.markMask != dp.Mark(4) {
		t.Fatalf("path bits %#x, want %#x", got&dp.markMask, dp.Mark(4))
	}
}

// Packets that are not selected MPTCP SYNs of a selected pod pass with their
// mark untouched.
func TestUnselectedTrafficIsLeftAlone(t *testing.T) {
	dp := loadForTest(t)
	if err := dp.SetRule(0, Rule{Paths: []uint32{1, 2}}); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	other := netip.MustParseAddr("10.244.1.99")
	tests := map[string][]byte{
		"plain TCP SYN":            syn(clientPod, 40001, serverPod, 80, testpkt.MSS(1460)),
		"MPTCP SYN of another pod": syn(other, 40001, serverPod, 80, testpkt.MPCapableSYN()),
		"UDP":                      testpkt.Frame{Src: clientPod, Dst: serverPod, Protocol: 17, Payload: make([]byte, 16)}.Bytes(),
		"truncated TCP header":     syn(clientPod, 40001, serverPod, 80, testpkt.MPCapableSYN())[:14+20+10],
		"option overrunning header": testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 1, DstPort: 2, Flags: testpkt.SYN,
			Options: []byte{30, 40, 0, 0}}}.Bytes(),
		"IPv6 plain TCP": syn(netip.MustParseAddr("fd00::1"), 1, netip.MustParseAddr("fd00::2"), 2, nil),
	}
	for name, frame := range tests {
		t.Run(name, func(t *testing.T) {
			if m := run(t, dp.objs.PodEgress, frame, skbContext{Mark: 0x4000}); m != 0x4000 {
				t.Fatalf("mark became %#x", m)
			}
		})
	}
}

// IPv6 with an extension header and a VLAN tag is parsed like IPv4.
func TestSpreadParsesIPv6WithExtensionHeaderAndVLAN(t *testing.T) {
	dp := loadForTest(t)
	pod6 := netip.MustParseAddr("fd00:244:1::11")
	if err := dp.SetRule(0, Rule{Paths: []uint32{2}}); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetEndpoint(pod6, 0); err != nil {
		t.Fatal(err)
	}
	frame := testpkt.Frame{VLANs: []uint16{100}, IPv6HopByHop: true, Src: pod6, Dst: netip.MustParseAddr("fd00:244:2::11"),
		TCP: &testpkt.TCP{SrcPort: 40001, DstPort: 80, Flags: testpkt.SYN, Options: testpkt.MPCapableSYN()}}.Bytes()
	if p := dp.pathOfMark(t, run(t, dp.objs.PodEgress, frame, skbContext{})); p != 2 {
		t.Fatalf("placed on path %d, want 2", p)
	}
}

// The responder's node learns the connection too: joins its pod opens avoid
// the paths the peer's node already chose for the connection's subflows.
func TestResponderJoinsAvoidPathsThePeerChose(t *testing.T) {
	dp := loadForTest(t)
	if err := dp.SetRule(0, Rule{Paths: []uint32{1, 2, 3}}); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetEndpoint(serverPod, 0); err != nil {
		t.Fatal(err)
	}
	nicOfPath := map[uint32]uint32{1: 11, 2: 12, 3: 13}
	for p, ifindex := range nicOfPath {
		if err := dp.SetNIC(int(ifindex), p); err != nil {
			t.Fatal(err)
		}
	}
	const clientKey, serverKey = 0x1111222233334444, 0x5555666677778888
	// The client's node put the initial subflow on path 1 and a join on path 2.
	server := netip.AddrPortFrom(serverPod, 5201)
	acceptFromWire(t, dp, netip.AddrPortFrom(clientPod, 40000), server, testpkt.MPCapableSYN(), int(nicOfPath[1]), clientKey, serverKey)
	acceptFromWire(t, dp, netip.AddrPortFrom(clientPod, 40001), server, testpkt.MPJoinSYN(tokenOf(serverKey), 1, 1, false), int(nicOfPath[2]))

	// The server's own join toward an address the client announced carries
	// the client's token.
	frame := syn(serverPod, 50000, clientPod, 6001, testpkt.MPJoinSYN(tokenOf(clientKey), 2, 1, false))
	if p := dp.pathOfMark(t, run(t, dp.objs.PodEgress, frame, skbContext{})); p != 3 {
		t.Fatalf("server's join placed on path %d, want 3, the one path the connection does not use", p)
	}
	conns, err := dp.Connections()
	if err != nil {
		t.Fatal(err)
	}
	if len(conns) != 1 || conns[0].Token != tokenOf(serverKey) || conns[0].UsedPaths != 0b1110 {
		t.Fatalf("connections = %+v, want one keyed by the server's token using paths 1, 2 and 3", conns)
	}
}

// Joins beyond the number of paths share paths, and say so.
func TestJoinsBeyondPathsShareAndAreCounted(t *testing.T) {
	dp := loadForTest(t)
	if err := dp.SetRule(0, Rule{Paths: []uint32{1, 2}}); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	const clientKey, serverKey = 1, 2
	run(t, dp.objs.PodEgress, syn(clientPod, 40000, serverPod, 80, testpkt.MPCapableSYN()), skbContext{})
	run(t, dp.objs.PodEgress, capableACK(clientPod, 40000, serverPod, 80, clientKey, serverKey), skbContext{})
	for i := 0; i < 3; i++ {
		run(t, dp.objs.PodEgress, syn(clientPod, uint16(40001+i), serverPod, 80, testpkt.MPJoinSYN(tokenOf(serverKey), 1, 1, false)), skbContext{})
	}
	stats, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if stats[StatPathsExhausted] != 2 {
		t.Fatalf("joins sharing a path = %d, want 2 (three joins, one free path)", stats[StatPathsExhausted])
	}
}

// A forgotten subflow is no longer marked; a forgotten connection is learnt
// again from its next MP_CAPABLE ACK.
func TestForgetSubflowAndConnection(t *testing.T) {
	dp := loadForTest(t)
	if err := dp.SetRule(0, Rule{Paths: []uint32{1, 2}}); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	const clientKey, serverKey = 3, 4
	run(t, dp.Program(HookPodEgress), syn(clientPod, 40000, serverPod, 80, testpkt.MPCapableSYN()), skbContext{})
	ack := capableACK(clientPod, 40000, serverPod, 80, clientKey, serverKey)
	run(t, dp.Program(HookPodEgress), ack, skbContext{})

	if err := dp.ForgetConnection(clientPod, tokenOf(serverKey), tokenOf(clientKey)); err != nil {
		t.Fatal(err)
	}
	if conns, err := dp.Connections(); err != nil || len(conns) != 0 {
		t.Fatalf("connections after ForgetConnection: %+v, %v", conns, err)
	}
	run(t, dp.Program(HookPodEgress), ack, skbContext{})
	if conns, err := dp.Connections(); err != nil || len(conns) != 1 || conns[0].Token != tokenOf(serverKey) {
		t.Fatalf("connections after the next ACK: %+v, %v; want it learnt again", conns, err)
	}

	if err := dp.ForgetSubflow(netip.AddrPortFrom(clientPod, 40000), netip.AddrPortFrom(serverPod, 80)); err != nil {
		t.Fatal(err)
	}
	if m := run(t, dp.Program(HookPodEgress), ack, skbContext{Mark: 0x4000}); m != 0x4000 {
		t.Fatalf("packet of a forgotten subflow marked %#x", m)
	}
	if sfs, err := dp.Subflows(); err != nil || len(sfs) != 0 {
		t.Fatalf("subflows after ForgetSubflow: %+v, %v", sfs, err)
	}
}

// In observe-only mode the programs record what they would do and change
// nothing: a placing SYN, a placed subflow's data and a NIC arrival keep
// their mark (bits inside the mask included) and every byte (run checks
// the bytes), while the subflow table, the connection table and the
// counters show the placement. Switching it off marks again at once, with
// the same programs: no reload, no re-attach.
func TestObserveOnlyRecordsWithoutMarking(t *testing.T) {
	dp := loadForTest(t)
	if on, err := dp.ObserveOnly(); err != nil || on {
		t.Fatalf("ObserveOnly() of a fresh datapath = %v, %v; want off", on, err)
	}
	if err := dp.SetRule(0, Rule{Paths: []uint32{1, 2}}); err != nil {
		t.Fatal(err)
	}
	for _, pod := range []netip.Addr{clientPod, serverPod} {
		if err := dp.SetEndpoint(pod, 0); err != nil {
			t.Fatal(err)
		}
	}
	const nic2Ifindex = 7
	if err := dp.SetNIC(nic2Ifindex, 2); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetObserveOnly(true); err != nil {
		t.Fatal(err)
	}
	if on, err := dp.ObserveOnly(); err != nil || !on {
		t.Fatalf("ObserveOnly() after SetObserveOnly(true) = %v, %v", on, err)
	}

	// Foreign bits and bits inside our mask: all must survive.
	const before = 0x4000 | 0x00300000
	podEgress, nicIngress := dp.Program(HookPodEgress), dp.Program(HookNICIngress)
	const clientKey, serverKey = 0x1111, 0x2222
	data := testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 40000, DstPort: 80, Seq: 2, Ack: 8, Flags: testpkt.ACK, Payload: []byte("hello")}}.Bytes()
	// A peer's join of a connection this node does not know: its SYN, the
	// pod's answer and the third ACK, which writes the entry.
	peer := netip.MustParseAddr("10.244.3.11")
	arrival := syn(peer, 45000, serverPod, 5201, testpkt.MPJoinSYN(0x0a0b0c0d, 1, 1, false))
	answer := synAck(serverPod, 5201, peer, 45000, testpkt.MPJoinSYNACK(1, 2, 1, false))
	thirdACK := testpkt.Frame{Src: peer, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 45000, DstPort: 5201, Seq: 2, Ack: 8, Flags: testpkt.ACK, Options: testpkt.MPJoinACK([20]byte{1})}}.Bytes()
	podNext := podSegment(netip.AddrPortFrom(serverPod, 5201), netip.AddrPortFrom(peer, 45000), 8, 2)
	packets := []struct {
		name  string
		prog  *ebpf.Program
		frame []byte
		in    skbContext
	}{
		{"placing MP_CAPABLE SYN", podEgress, syn(clientPod, 40000, serverPod, 80, testpkt.MPCapableSYN()), skbContext{Mark: before}},
		{"MP_CAPABLE ACK (learns the connection)", podEgress, capableACK(clientPod, 40000, serverPod, 80, clientKey, serverKey), skbContext{Mark: before}},
		{"placing MP_JOIN SYN", podEgress, syn(clientPod, 40001, serverPod, 80, testpkt.MPJoinSYN(tokenOf(serverKey), 1, 1, false)), skbContext{Mark: before}},
		{"data of the placed subflow", podEgress, data, skbContext{Mark: before}},
		{"SYN arriving on a NIC", nicIngress, arrival, skbContext{Mark: before, IngressIfindex: nic2Ifindex}},
		{"the pod's answer to it", podEgress, answer, skbContext{Mark: before}},
		{"the third ACK, arriving on the NIC", nicIngress, thirdACK, skbContext{Mark: before, IngressIfindex: nic2Ifindex}},
		{"the pod's next segment (writes the entry)", podEgress, podNext, skbContext{Mark: before}},
	}
	for _, p := range packets {
		if m := run(t, p.prog, p.frame, p.in); m != before {
			t.Errorf("observe-only: %s: mark %#x became %#x", p.name, uint32(before), m)
		}
	}

	stats, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	want := map[Stat]uint64{
		// Every packet above is one the datapath would have marked.
		StatObserved: uint64(len(packets)), StatMarked: 0,
		StatSubflowPlaced: 2, StatSubflowMirrored: 1, StatTokenLearnt: 1, StatJoinTokenKnown: 1,
	}
	for s, n := range want {
		if stats[s] != n {
			t.Errorf("observe-only: counter %d = %d, want %d", s, stats[s], n)
		}
	}
	sfs, err := dp.Subflows()
	if err != nil {
		t.Fatal(err)
	}
	paths := map[netip.AddrPort]Subflow{}
	for _, sf := range sfs {
		paths[sf.Local] = sf
	}
	initial, join := paths[netip.AddrPortFrom(clientPod, 40000)], paths[netip.AddrPortFrom(clientPod, 40001)]
	mirrored := paths[netip.AddrPortFrom(serverPod, 5201)]
	if len(sfs) != 3 || initial.Role != RoleInitiator || join.Role != RoleInitiator || initial.Path == join.Path ||
		mirrored.Role != RoleResponder || mirrored.Path != 2 {
		t.Fatalf("observe-only: subflow table %+v; want the initial subflow and its join on distinct paths, and the arrival on path 2", sfs)
	}
	if conns, err := dp.Connections(); err != nil || len(conns) != 1 || conns[0].UsedPaths != 0b110 {
		t.Fatalf("observe-only: connections %+v (%v); want one using both paths", conns, err)
	}
	ps, err := dp.PathStats()
	if err != nil {
		t.Fatal(err)
	}
	// The initial subflow's three packets, the join's SYN, and the pod's
	// answer and next segment on the arrival's path 2; the SYN and the
	// third ACK came in on 2.
	wantTx := map[uint32]uint64{}
	wantTx[initial.Path] += 3
	wantTx[join.Path]++
	wantTx[2] += 2
	if ps[1].TxPackets != wantTx[1] || ps[2].TxPackets != wantTx[2] || ps[2].RxPackets != 2 {
		t.Errorf("observe-only: path counters %+v; want what the packets would have carried", ps[:3])
	}

	// Off again: the same programs mark, from the recorded paths.
	if err := dp.SetObserveOnly(false); err != nil {
		t.Fatal(err)
	}
	if on, err := dp.ObserveOnly(); err != nil || on {
		t.Fatalf("ObserveOnly() after SetObserveOnly(false) = %v, %v", on, err)
	}
	m := run(t, podEgress, data, skbContext{Mark: before})
	if m != (before&^dp.markMask)|dp.Mark(initial.Path) {
		t.Errorf("after observe-only: data mark %#x, want path %d's with foreign bits kept", m, initial.Path)
	}
	if m := run(t, nicIngress, arrival, skbContext{Mark: before, IngressIfindex: nic2Ifindex}); dp.pathOfMark(t, m) != 2 {
		t.Errorf("after observe-only: arrival marked %#x, want path 2", m)
	}
	stats, err = dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if stats[StatMarked] != 2 || stats[StatObserved] != uint64(len(packets)) {
		t.Errorf("after observe-only: marked %d, observed %d; want 2 and %d", stats[StatMarked], stats[StatObserved], len(packets))
	}
}

// acceptFromWire runs, through the datapath, a handshake that a peer opens
// to the pod: its SYN with synOpts (MP_CAPABLE or MP_JOIN, sequence number 1)
// arriving on the NIC ifindex, then completeFromWire. It returns the path
// the pod's answer left by.
func acceptFromWire(t *testing.T, dp *Datapath, client netip.AddrPort, server netip.AddrPort, synOpts []byte, ifindex int, keys ...uint64) uint32 {
	t.Helper()
	run(t, dp.objs.NicIngress, syn(client.Addr(), client.Port(), server.Addr(), server.Port(), synOpts), skbContext{IngressIfindex: uint32(ifindex)})
	return completeFromWire(t, dp, client, server, 1, len(synOpts) > 2 && synOpts[2]>>4 == 1, ifindex, keys...)
}

// podSegment is a segment a pod sends on an established subflow: an ACK
// with sequence number seq and a DSS carrying a Data ACK, as every segment
// of an established subflow has.
func podSegment(pod, peer netip.AddrPort, seq, ack uint32) []byte {
	dataACK := uint64(1)
	return testpkt.Frame{Src: pod.Addr(), Dst: peer.Addr(), TCP: &testpkt.TCP{SrcPort: pod.Port(), DstPort: peer.Port(), Seq: seq, Ack: ack,
		Flags: testpkt.ACK, Options: testpkt.DSS{DataACK: &dataACK}.Bytes()}}.Bytes()
}

// completeFromWire runs the rest of a handshake a peer opened to the pod
// with a SYN of sequence number synSeq: the pod's SYN-ACK (sequence number
// 7), the peer's third ACK on the NIC ifindex, which writes the responder's
// entry (an MP_CAPABLE one carries keys: the initiator's and the
// responder's), and the pod's first segment after it. It returns the path
// the pod's answer left by.
func completeFromWire(t *testing.T, dp *Datapath, client, server netip.AddrPort, synSeq uint32, join bool, ifindex int, keys ...uint64) uint32 {
	t.Helper()
	var answerOpts, thirdOpts []byte
	if join {
		answerOpts, thirdOpts = testpkt.MPJoinSYNACK(1, 2, 1, false), testpkt.MPJoinACK([20]byte{1})
	} else {
		if len(keys) != 2 {
			t.Fatalf("completeFromWire: an MP_CAPABLE handshake needs the initiator's and the responder's keys, got %d", len(keys))
		}
		answerOpts, thirdOpts = testpkt.MPCapableSYNACK(keys[1]), testpkt.MPCapableACK(keys[0], keys[1])
	}
	answer := testpkt.Frame{Src: server.Addr(), Dst: client.Addr(), TCP: &testpkt.TCP{SrcPort: server.Port(), DstPort: client.Port(), Seq: 7, Ack: synSeq + 1,
		Flags: testpkt.SYN | testpkt.ACK, Options: answerOpts}}.Bytes()
	third := testpkt.Frame{Src: client.Addr(), Dst: server.Addr(), TCP: &testpkt.TCP{SrcPort: client.Port(), DstPort: server.Port(), Seq: synSeq + 1, Ack: 8,
		Flags: testpkt.ACK, Options: thirdOpts}}.Bytes()
	next := podSegment(server, client, 8, synSeq+1)
	path := dp.pathOfMark(t, run(t, dp.objs.PodEgress, answer, skbContext{}))
	run(t, dp.objs.NicIngress, third, skbContext{IngressIfindex: uint32(ifindex)})
	run(t, dp.objs.PodEgress, next, skbContext{})
	return path
}

// A liveness probe (UDP from and to the agents' port) arriving on a path
// NIC takes the NIC's path mark, so that strict reverse-path filtering
// accepts it on a NIC that is not the main table's way to its sender; other
// UDP, UDP to a selected pod, and every probe while no port is set or the
// node only observes, keeps its mark.
func TestLivenessProbesArrivingOnAPathNICTakeItsMark(t *testing.T) {
	dp := loadForTest(t)
	if err := dp.SetNIC(nic2Ifindex, 2); err != nil {
		t.Fatal(err)
	}
	udp := func(src, dst netip.Addr, sport, dport uint16) []byte {
		payload := binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, sport), dport)
		payload = append(binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(payload, 32), 0), make([]byte, 24)...)
		return testpkt.Frame{Src: src, Dst: dst, Protocol: 17, Payload: payload}.Bytes()
	}
	v4 := udp(netip.MustParseAddr("10.102.2.2"), netip.MustParseAddr("10.102.1.2"), 7471, 7471)
	v6 := udp(netip.MustParseAddr("2001:db8:2::2"), netip.MustParseAddr("2001:db8:1::2"), 7471, 7471)
	if err := dp.SetRule(0, Rule{Paths: []uint32{1, 2}}); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetEndpoint(serverPod, 0); err != nil {
		t.Fatal(err)
	}
	others := map[string][]byte{
		"UDP to port 53":        udp(netip.MustParseAddr("10.102.2.2"), netip.MustParseAddr("10.102.1.2"), 7471, 53),
		"UDP from another port": udp(netip.MustParseAddr("10.102.2.2"), netip.MustParseAddr("10.102.1.2"), 40000, 7471),
		"UDP to a selected pod": udp(clientPod, serverPod, 7471, 7471),
	}
	ctx := skbContext{IngressIfindex: nic2Ifindex, Mark: 0x5}
	if m := run(t, dp.objs.NicIngress, v4, ctx); m != 0x5 {
		t.Fatalf("no liveness port set: a probe got mark %#x", m)
	}
	if err := dp.SetLivenessPort(7471); err != nil {
		t.Fatal(err)
	}
	for name, frame := range map[string][]byte{"IPv4": v4, "IPv6": v6} {
		if m := run(t, dp.objs.NicIngress, frame, ctx); dp.pathOfMark(t, m) != 2 || m&^dp.markMask != 0x5 {
			t.Errorf("%s probe on nic2: mark %#x, want path 2 and the foreign bits kept", name, m)
		}
	}
	for name, frame := range others {
		if m := run(t, dp.objs.NicIngress, frame, ctx); m != 0x5 {
			t.Errorf("%s got mark %#x", name, m)
		}
	}
	if m := run(t, dp.objs.NicIngress, v4, skbContext{IngressIfindex: 99, Mark: 0x5}); m != 0x5 {
		t.Errorf("a probe on a NIC of no path got mark %#x", m)
	}
	if err := dp.SetObserveOnly(true); err != nil {
		t.Fatal(err)
	}
	if m := run(t, dp.objs.NicIngress, v4, ctx); m != 0x5 {
		t.Errorf("observe-only: a probe got mark %#x", m)
	}
	// Writing the port keeps the observe-only switch, and the reverse.
	if on, err := dp.ObserveOnly(); err != nil || !on {
		t.Errorf("observe-only after setting the port: %v, %v", on, err)
	}
}

// udpDatagram is a UDP datagram of a liveness message's size.
func udpDatagram(src, dst netip.Addr, sport, dport uint16) []byte {
	return udpWith(src, dst, sport, dport, make([]byte, 24))
}

// udpWith is a UDP datagram carrying data (no checksum).
func udpWith(src, dst netip.Addr, sport, dport uint16, data []byte) []byte {
	payload := binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(nil, sport), dport)
	payload = append(binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16(payload, uint16(8+len(data))), 0), data...)
	return testpkt.Frame{Src: src, Dst: dst, Protocol: 17, Payload: payload}.Bytes()
}

// livenessDatapath is a datapath with nic2 as path 2's NIC and 7471 as the
// liveness port.
func livenessDatapath(t *testing.T) *Datapath {
	t.Helper()
	dp := loadForTest(t)
	if err := dp.SetNIC(nic2Ifindex, 2); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetLivenessPort(7471); err != nil {
		t.Fatal(err)
	}
	return dp
}

// livenessMessage is a liveness probe or echo as internal/agent/liveness
// writes it (wire.go): version 1 without a key, version 2 with one.
func livenessMessage(kind byte, version byte, nonce, key uint64) []byte {
	b := append([]byte("MPTL"), version, kind, 0, 0)
	b = binary.BigEndian.AppendUint64(b, nonce)
	b = binary.BigEndian.AppendUint64(b, 1) // sequence number
	if version == 2 {
		b = binary.BigEndian.AppendUint64(b, key)
	}
	return b
}

// peersWithoutNonces lists peers with no nonce: their probes are all
// unproven, and no echo is theirs.
func peersWithoutNonces(peers map[netip.Addr][]netip.Addr) map[netip.Addr][]LivenessPeer {
	if peers == nil {
		return nil
	}
	out := map[netip.Addr][]LivenessPeer{}
	for local, addrs := range peers {
		out[local] = []LivenessPeer{}
		for _, a := range addrs {
			out[local] = append(out[local], LivenessPeer{Addr: a})
		}
	}
	return out
}

// What arrives at the liveness port of a node's path address comes only
// from its peers' probers there: a datagram from an address that is no
// peer's on the path, or from a peer's address but another port, is dropped
// and counted, as is a peer's first fragment; peers' probes and echoes pass
// with their path mark (within their budgets: the next test), as does
// what goes to another port, to an address not filtered, and everything
// before the agent lists the peers or once it lists none. Observe-only
// counts and passes.
func TestOnlyPeersReachTheLivenessPort(t *testing.T) {
	dp := livenessDatapath(t)
	local, peer := netip.MustParseAddr("10.102.1.2"), netip.MustParseAddr("10.102.2.2")
	local6, peer6 := netip.MustParseAddr("2001:db8:1::2"), netip.MustParseAddr("2001:db8:2::2")
	stranger := netip.MustParseAddr("10.102.9.9")
	ctx := skbContext{IngressIfindex: nic2Ifindex}
	passes := func(what string, frame []byte, want bool) {
		t.Helper()
		refused := stat(t, dp, StatLivenessRefused)
		ret := verdict(t, dp.objs.NicIngress, frame, ctx)
		dropped := stat(t, dp, StatLivenessRefused)-refused == 1
		switch {
		case want && (ret != tcxNext || dropped):
			t.Errorf("%s: verdict %d, counted refused %v; want it passed", what, int32(ret), dropped)
		case !want && (ret != tcActShot || !dropped):
			t.Errorf("%s: verdict %d, counted refused %v; want it dropped and counted", what, int32(ret), dropped)
		}
	}
	fromStranger := udpDatagram(stranger, local, 7471, 7471)
	passes("before the peers are listed, from a stranger", fromStranger, true)

	if err := dp.SetLivenessPeers(peersWithoutNonces(map[netip.Addr][]netip.Addr{local: {peer, local6}, local6: {peer6}}), 30*time.Millisecond, 30*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	passes("from a stranger", fromStranger, false)
	passes("from a peer's address, another port", udpDatagram(peer, local, 40000, 7471), false)
	passes("IPv6 from a stranger", udpDatagram(netip.MustParseAddr("2001:db8:9::9"), local6, 7471, 7471), false)
	passes("from a stranger to another port", udpDatagram(stranger, local, 7471, 53), true)
	// An all-zero source is the key of the address's own entry, which
	// has no budget.
	passes("from 0.0.0.0", udpDatagram(netip.IPv4Unspecified(), local, 7471, 7471), false)
	passes("from ::", udpDatagram(netip.IPv6Unspecified(), local6, 7471, 7471), false)
	// The first fragment carries the ports, and the rest never
	// reassemble without it; what hides its transport behind more IPv6
	// extension headers than the parser reads is refused too.
	udpFrame := func(src, dst netip.Addr) testpkt.Frame {
		frame := udpDatagram(src, dst, 7471, 7471)
		return testpkt.Frame{Src: src, Dst: dst, Protocol: 17, Payload: frame[len(frame)-32:]}
	}
	frags := udpFrame(stranger, local).Fragments(16)
	passes("the first fragment of a stranger's datagram", frags[0], false)
	passes("the second fragment of a stranger's datagram", frags[1], true)
	// A prober's datagram is never fragmented: a peer's first fragment
	// holds no whole message to judge.
	passes("the first fragment of a peer's datagram", udpFrame(peer, local).Fragments(16)[0], false)
	deep := udpFrame(netip.MustParseAddr("2001:db8:9::9"), local6)
	deep.IPv6HopByHop, deep.IPv6DestOpts = true, 4
	passes("IPv6 from a stranger behind five extension headers", deep.Bytes(), false)
	passes("from a stranger to an address not filtered", udpDatagram(stranger, netip.MustParseAddr("10.102.1.3"), 7471, 7471), true)
	for name, frame := range map[string][]byte{"IPv4": udpDatagram(peer, local, 7471, 7471), "IPv6": udpDatagram(peer6, local6, 7471, 7471)} {
		passes(name+" from the peer", frame, true)
		if m := run(t, dp.objs.NicIngress, frame, ctx); dp.pathOfMark(t, m) != 2 {
			t.Errorf("%s from the peer: mark %#x, want path 2", name, m)
		}
	}

	if err := dp.SetObserveOnly(true); err != nil {
		t.Fatal(err)
	}
	// From another port: refused, and no probe to mark (which
	// observe-only counts as observed too).
	observed := stat(t, dp, StatObserved)
	if ret := verdict(t, dp.objs.NicIngress, udpDatagram(stranger, local, 40000, 7471), ctx); ret != tcxNext || stat(t, dp, StatObserved) != observed+1 {
		t.Errorf("observe-only, from a stranger: verdict %d, observed %d more; want passed and observed once",
			int32(ret), stat(t, dp, StatObserved)-observed)
	}
	if err := dp.SetObserveOnly(false); err != nil {
		t.Fatal(err)
	}
	// The peer goes: its datagrams are a stranger's; then nothing is listed.
	if err := dp.SetLivenessPeers(peersWithoutNonces(map[netip.Addr][]netip.Addr{local: nil}), 30*time.Millisecond, 30*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	passes("from a peer no longer listed", udpDatagram(peer, local, 7471, 7471), false)
	if err := dp.SetLivenessPeers(peersWithoutNonces(nil), 30*time.Millisecond, 30*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	passes("once nothing is listed, from a stranger", fromStranger, true)
	// A list it cannot write filters nothing: no peer is refused for it.
	if err := dp.SetLivenessPeers(peersWithoutNonces(map[netip.Addr][]netip.Addr{local: {peer}}), 30*time.Millisecond, 30*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetLivenessPeers(peersWithoutNonces(map[netip.Addr][]netip.Addr{local: {peer}, {}: nil}), 30*time.Millisecond, 30*time.Millisecond); err == nil {
		t.Fatal("SetLivenessPeers took an invalid local address")
	}
	passes("after a list that could not be written, from a stranger", fromStranger, true)
}

// A flood of probes forged with a peer's address spends the budget of the
// probes that do not carry the node's nonce (the earlier version's, one not
// learnt yet, forged): the peer's own probes, which carry it as their key,
// and its echoes, which carry it as theirs, still pass, within their own
// budget; an echo without the nonce never does.
func TestAFloodForgedWithAPeersAddressLeavesThePeersOwnProbesAndEchoes(t *testing.T) {
	dp := livenessDatapath(t)
	local, peer := netip.MustParseAddr("10.102.1.2"), netip.MustParseAddr("10.102.2.2")
	const nonce = 0x1122334455667788
	// A long interval: the budgets do not refill while the test runs.
	if err := dp.SetLivenessPeers(map[netip.Addr][]LivenessPeer{local: {{Addr: peer, Nonce: nonce}}}, time.Minute, time.Minute); err != nil {
		t.Fatal(err)
	}
	ctx := skbContext{IngressIfindex: nic2Ifindex}
	passed := func(data []byte, n int) (pass int) {
		t.Helper()
		frame := udpWith(peer, local, 7471, 7471, data)
		for range n {
			if verdict(t, dp.objs.NicIngress, frame, ctx) == tcxNext {
				pass++
			}
		}
		return pass
	}
	refused := stat(t, dp, StatLivenessRefused)
	if n := passed(livenessMessage(1, 1, 7, 0), 100); n < 1 || n > 10 {
		t.Errorf("%d of 100 version 1 probes from the peer's address passed, want the peer's one of the interval and the budget's 9 at most", n)
	}
	if n := passed(livenessMessage(1, 2, 7, 0x99), 10); n != 0 {
		t.Errorf("%d version 2 probes with a wrong key passed once the budget was spent", n)
	}
	if got := stat(t, dp, StatLivenessRefused) - refused; got < 100 {
		t.Errorf("%d datagrams counted refused, want the flood's 100 at least", got)
	}
	if n := passed(livenessMessage(1, 2, 7, nonce), 1); n != 1 {
		t.Error("the peer's probe carrying the node's nonce as its key was refused during the flood")
	}
	if n := passed(livenessMessage(2, 1, nonce, 0), 1); n != 1 {
		t.Error("the peer's version 1 echo of the node's nonce was refused during the flood")
	}
	if n := passed(livenessMessage(2, 2, nonce, 5), 1); n != 1 {
		t.Error("the peer's version 2 echo of the node's nonce was refused during the flood")
	}
	if n := passed(livenessMessage(2, 1, nonce+1, 0), 1); n != 0 {
		t.Error("an echo of another nonce passed")
	}
	if n := passed(livenessMessage(2, 1, nonce, 0)[:20], 1); n != 0 {
		t.Error("a datagram of no message's length passed")
	}
	// The peer itself, flooding with its key, gets its own budget: four
	// per interval, a burst of eight.
	if n := passed(livenessMessage(1, 2, 7, nonce), 100); n > 9 {
		t.Errorf("%d of 100 probes carrying the key passed, want the budget's 9 at most", n)
	}
	// Written again unchanged, a peer keeps its spent budget; with a new
	// nonce (its prober restarted) it starts afresh.
	if err := dp.SetLivenessPeers(map[netip.Addr][]LivenessPeer{local: {{Addr: peer, Nonce: nonce}}}, time.Minute, time.Minute); err != nil {
		t.Fatal(err)
	}
	if n := passed(livenessMessage(1, 1, 7, 0), 1); n != 0 {
		t.Error("a peer written again unchanged got a new budget")
	}
	if err := dp.SetLivenessPeers(map[netip.Addr][]LivenessPeer{local: {{Addr: peer, Nonce: nonce + 1}}}, time.Minute, time.Minute); err != nil {
		t.Fatal(err)
	}
	if n := passed(livenessMessage(1, 2, 7, nonce+1), 1); n != 1 {
		t.Error("a probe with the peer's new key was refused")
	}
}

// A flood forged with many peers' addresses at once, each within its own
// unproven budget, shares one more budget per node address: the socket
// gets no more unproven probes than that and each peer's one of the
// interval, whatever the number of peers; every peer's own proven probes
// and echoes still pass, and so does the one unproven probe of the
// interval of a peer whose address the flood did not forge.
func TestAFloodForgedWithManyPeersAddressesSharesOneBudget(t *testing.T) {
	dp := livenessDatapath(t)
	local := netip.MustParseAddr("10.102.1.2")
	const nonce = 0x1122334455667788
	var peers []LivenessPeer
	for i := range 51 {
		peers = append(peers, LivenessPeer{Addr: netip.AddrFrom4([4]byte{10, 102, 3, byte(i + 1)}), Nonce: nonce + uint64(i)})
	}
	// A long interval: the budgets do not refill while the test runs.
	if err := dp.SetLivenessPeers(map[netip.Addr][]LivenessPeer{local: peers}, time.Minute, time.Minute); err != nil {
		t.Fatal(err)
	}
	ctx := skbContext{IngressIfindex: nic2Ifindex}
	passed := 0
	for _, p := range peers[:50] {
		frame := udpWith(p.Addr, local, 7471, 7471, livenessMessage(1, 1, 7, 0))
		for range 3 {
			if verdict(t, dp.objs.NicIngress, frame, ctx) == tcxNext {
				passed++
			}
		}
	}
	// Each peer's own budget would let all 150 by; the shared one holds
	// its burst of eight and one more, besides each peer's one.
	if passed < 50 || passed > 59 {
		t.Errorf("%d of 150 unproven probes from 50 peers' addresses passed, want each peer's one and the shared budget's 9 at most", passed)
	}
	if verdict(t, dp.objs.NicIngress, udpWith(peers[50].Addr, local, 7471, 7471, livenessMessage(1, 1, 7, 0)), ctx) != tcxNext {
		t.Error("a peer whose address the flood did not forge had its version 1 probe refused")
	}
	for i, p := range peers {
		if verdict(t, dp.objs.NicIngress, udpWith(p.Addr, local, 7471, 7471, livenessMessage(1, 2, 7, p.Nonce)), ctx) != tcxNext {
			t.Fatalf("peer %d's probe carrying its key was refused after the flood", i)
		}
		if verdict(t, dp.objs.NicIngress, udpWith(p.Addr, local, 7471, 7471, livenessMessage(2, 2, p.Nonce, 5)), ctx) != tcxNext {
			t.Fatalf("peer %d's echo was refused after the flood", i)
		}
	}
}

// Where paths share a risk group, a connection's join goes first to a path
// of a group its subflows do not use yet, the first subflow's included;
// then to a free path of a group it uses; and only then shares a path.
// The rule reads back with its groups.
func TestJoinsGoToPathsOfAGroupTheConnectionDoesNotUseFirst(t *testing.T) {
	dp := loadForTest(t)
	// Paths 1 and 2 share an uplink, 3 and 4 another; preferredFirst
	// puts every first subflow on path 1 and starts each join's search at
	// the top of the list.
	rule := Rule{Paths: []uint32{1, 2, 3, 4}, Spread: SpreadPreferred, SharedRisk: [][]uint32{{1, 2}, {3, 4}}}
	if err := dp.SetRule(0, rule); err != nil {
		t.Fatal(err)
	}
	if got, err := dp.RuleAt(0); err != nil || !reflect.DeepEqual(got.SharedRisk, rule.SharedRisk) {
		t.Fatalf("rule read back with groups %v (%v), want %v", got.SharedRisk, err, rule.SharedRisk)
	}
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	const clientKey, serverKey = 5, 6
	first := run(t, dp.objs.PodEgress, syn(clientPod, 40000, serverPod, 80, testpkt.MPCapableSYN()), skbContext{})
	if p := dp.pathOfMark(t, first); p != 1 {
		t.Fatalf("first subflow on path %d, want 1", p)
	}
	run(t, dp.objs.PodEgress, capableACK(clientPod, 40000, serverPod, 80, clientKey, serverKey), skbContext{})
	// Without groups the first join would take path 2, beside the
	// first subflow on its uplink.
	var got []uint32
	for i := 0; i < 4; i++ {
		frame := syn(clientPod, uint16(40001+i), serverPod, 80, testpkt.MPJoinSYN(tokenOf(serverKey), 1, 1, false))
		got = append(got, dp.pathOfMark(t, run(t, dp.objs.PodEgress, frame, skbContext{})))
	}
	// Join 1: path 3, the other uplink. Join 2: both groups are used, so
	// the first free path, 2. Join 3: path 4. Join 4: every path is used,
	// it shares one.
	if want := []uint32{3, 2, 4}; !slices.Equal(got[:3], want) {
		t.Fatalf("joins placed on paths %v, want %v first", got, want)
	}
	stats, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if stats[StatPathsExhausted] != 1 {
		t.Errorf("joins sharing a path = %d, want 1 (the fourth join)", stats[StatPathsExhausted])
	}

	// A backup path takes a join only after the active paths, groups or
	// not: active paths 1 and 2 share a group, backup path 3 none.
	backup := Rule{Paths: []uint32{1, 2}, Backup: []uint32{3}, RewriteHeaders: true, Spread: SpreadPreferred, SharedRisk: [][]uint32{{1, 2}}}
	if err := dp.SetRule(0, backup); err != nil {
		t.Fatal(err)
	}
	run(t, dp.objs.PodEgress, syn(clientPod, 41000, serverPod, 80, testpkt.MPCapableSYN()), skbContext{})
	run(t, dp.objs.PodEgress, capableACK(clientPod, 41000, serverPod, 80, clientKey+10, serverKey+10), skbContext{})
	join := syn(clientPod, 41001, serverPod, 80, testpkt.MPJoinSYN(tokenOf(serverKey+10), 1, 1, false))
	if p := dp.pathOfMark(t, run(t, dp.objs.PodEgress, join, skbContext{})); p != 2 {
		t.Errorf("with a free active path in the first subflow's group, the join took path %d, want active path 2 before backup path 3", p)
	}

	// Groups are a rule's own paths, two or more each, a path in one.
	for _, bad := range [][][]uint32{{{1}}, {{1, 5}}, {{1, 2}, {2, 3}}} {
		if err := dp.SetRule(1, Rule{Paths: []uint32{1, 2, 3, 4}, SharedRisk: bad}); err == nil {
			t.Errorf("a rule with shared-risk groups %v was accepted", bad)
		}
	}
}
