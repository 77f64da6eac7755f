package datapath

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
)

// optionCase is one MPTCP option on the segment that carries it, as a peer
// would send it (RFC 8684 section 3).
type optionCase struct {
	subtype MPTCPSubtype // what the parser must count
	flags   uint8        // TCP flags of the segment
	opts    []byte       // TCP options, the MPTCP one among them
	payload int          // bytes of data the segment carries
	// tshark are fields an independent decoder must show for the option
	// (tshark field name -> value as `tshark -T fields` prints it).
	tshark map[string]string
}

func u16(v uint16) *uint16 { return &v }
func u64(v uint64) *uint64 { return &v }

var (
	announced4 = netip.MustParseAddr("192.0.2.7")
	announced6 = netip.MustParseAddr("2001:db8::7")
)

// optionCases has every subtype of RFC 8684 in each of its forms.
var optionCases = map[string]optionCase{
	"MP_CAPABLE SYN": {subtype: MPCapable, flags: testpkt.SYN,
		opts:   testpkt.Join(testpkt.MSS(1460), testpkt.SACKPermitted(), testpkt.MPCapableSYN()),
		tshark: map[string]string{"tcp.options.mptcp.version": "1"}},
	"MP_CAPABLE SYN-ACK": {subtype: MPCapable, flags: testpkt.SYN | testpkt.ACK,
		opts:   testpkt.MPCapableSYNACK(0x1122334455667788),
		tshark: map[string]string{"tcp.options.mptcp.sendkey": "1234605616436508552"}},
	"MP_CAPABLE ACK": {subtype: MPCapable, flags: testpkt.ACK,
		opts:   testpkt.MPCapableACK(1, 2),
		tshark: map[string]string{"tcp.options.mptcp.sendkey": "1", "tcp.options.mptcp.recvkey": "2"}},
	"MP_CAPABLE ACK with data": {subtype: MPCapable, flags: testpkt.ACK | testpkt.PSH,
		opts: testpkt.MPCapableACKData(1, 2, 100, nil), payload: 100,
		tshark: map[string]string{"tcp.options.mptcp.datalvllen": "100"}},
	"MP_CAPABLE ACK with data and checksum": {subtype: MPCapable, flags: testpkt.ACK | testpkt.PSH,
		opts: testpkt.MPCapableACKData(1, 2, 100, u16(0xbeef)), payload: 100,
		tshark: map[string]string{"tcp.options.mptcp.checksum": "0xbeef"}},
	"MP_JOIN SYN": {subtype: MPJoin, flags: testpkt.SYN,
		opts:   testpkt.MPJoinSYN(0xdeadbeef, 7, 3, true),
		tshark: map[string]string{"tcp.options.mptcp.recvtok": "3735928559", "tcp.options.mptcp.addrid": "3", "tcp.options.mptcp.backup.flag": "1"}},
	"MP_JOIN SYN-ACK": {subtype: MPJoin, flags: testpkt.SYN | testpkt.ACK,
		opts:   testpkt.MPJoinSYNACK(0x0102030405060708, 9, 1, false),
		tshark: map[string]string{"tcp.options.mptcp.sendrand": "9", "tcp.options.mptcp.backup.flag": "0"}},
	"MP_JOIN ACK": {subtype: MPJoin, flags: testpkt.ACK,
		opts: testpkt.MPJoinACK([20]byte{1, 2, 3}), tshark: map[string]string{}},
	"DSS data ACK 4": {subtype: DSS, flags: testpkt.ACK,
		opts:   testpkt.Join(testpkt.NOP(), testpkt.NOP(), testpkt.Timestamps(1, 2), testpkt.DSS{DataACK: u64(1000)}.Bytes()),
		tshark: map[string]string{"tcp.options.mptcp.dataackpresent.flag": "1", "tcp.options.mptcp.dataack8.flag": "0"}},
	"DSS data ACK 8 and mapping 8 with checksum": {subtype: DSS, flags: testpkt.ACK | testpkt.PSH,
		opts: testpkt.DSS{DataACK: u64(1 << 40), DataACK8: true,
			Mapping: &testpkt.DSSMapping{DSN: 1 << 41, DSN8: true, SSN: 1, Length: 1400, Checksum: u16(0x1234)}}.Bytes(),
		tshark: map[string]string{"tcp.options.mptcp.dseqn8.flag": "1", "tcp.options.mptcp.datalvllen": "1400"}},
	"DSS mapping 4 and DATA_FIN": {subtype: DSS, flags: testpkt.ACK | testpkt.FIN,
		opts:   testpkt.DSS{Mapping: &testpkt.DSSMapping{DSN: 5, SSN: 1, Length: 1}, DataFIN: true}.Bytes(),
		tshark: map[string]string{"tcp.options.mptcp.datafin.flag": "1"}},
	"ADD_ADDR IPv4": {subtype: AddAddr, flags: testpkt.ACK,
		opts:   testpkt.AddAddr(2, announced4, 0, false, 0xabcdef),
		tshark: map[string]string{"tcp.options.mptcp.ipv4": "192.0.2.7", "tcp.options.mptcp.echo": "0"}},
	"ADD_ADDR IPv4 with port": {subtype: AddAddr, flags: testpkt.ACK,
		opts:   testpkt.AddAddr(2, announced4, 6002, false, 0xabcdef),
		tshark: map[string]string{"tcp.options.mptcp.ipv4": "192.0.2.7", "tcp.options.mptcp.port": "6002"}},
	"ADD_ADDR IPv4 echo": {subtype: AddAddr, flags: testpkt.ACK,
		opts:   testpkt.AddAddr(2, announced4, 0, true, 0),
		tshark: map[string]string{"tcp.options.mptcp.ipv4": "192.0.2.7", "tcp.options.mptcp.echo": "1"}},
	"ADD_ADDR IPv4 echo with port": {subtype: AddAddr, flags: testpkt.ACK,
		opts:   testpkt.AddAddr(2, announced4, 6002, true, 0),
		tshark: map[string]string{"tcp.options.mptcp.port": "6002", "tcp.options.mptcp.echo": "1"}},
	"ADD_ADDR IPv6": {subtype: AddAddr, flags: testpkt.ACK,
		opts:   testpkt.AddAddr(4, announced6, 0, false, 0x42),
		tshark: map[string]string{"tcp.options.mptcp.ipv6": "2001:db8::7", "tcp.options.mptcp.echo": "0"}},
	"ADD_ADDR IPv6 with port": {subtype: AddAddr, flags: testpkt.ACK,
		opts:   testpkt.AddAddr(4, announced6, 443, false, 0x42),
		tshark: map[string]string{"tcp.options.mptcp.ipv6": "2001:db8::7", "tcp.options.mptcp.port": "443"}},
	"ADD_ADDR IPv6 echo": {subtype: AddAddr, flags: testpkt.ACK,
		opts:   testpkt.AddAddr(4, announced6, 0, true, 0),
		tshark: map[string]string{"tcp.options.mptcp.ipv6": "2001:db8::7", "tcp.options.mptcp.echo": "1"}},
	"ADD_ADDR IPv6 echo with port": {subtype: AddAddr, flags: testpkt.ACK,
		opts:   testpkt.AddAddr(4, announced6, 443, true, 0),
		tshark: map[string]string{"tcp.options.mptcp.port": "443", "tcp.options.mptcp.echo": "1"}},
	"REMOVE_ADDR one id": {subtype: RemoveAddr, flags: testpkt.ACK,
		opts: testpkt.RemoveAddr(2), tshark: map[string]string{"tcp.options.mptcp.addrid": "2"}},
	"REMOVE_ADDR three ids": {subtype: RemoveAddr, flags: testpkt.ACK,
		opts: testpkt.RemoveAddr(2, 3, 4), tshark: map[string]string{"tcp.options.mptcp.addrid": "2,3,4"}},
	"MP_PRIO backup": {subtype: MPPrio, flags: testpkt.ACK,
		opts: testpkt.MPPrio(true), tshark: map[string]string{"tcp.options.mptcp.backup.flag": "1"}},
	"MP_FAIL": {subtype: MPFail, flags: testpkt.ACK,
		opts: testpkt.MPFail(77), tshark: map[string]string{"tcp.options.mptcp.rawdataseqno": "77"}},
	"MP_FASTCLOSE": {subtype: MPFastclose, flags: testpkt.ACK,
		opts: testpkt.MPFastclose(0x55), tshark: map[string]string{"tcp.options.mptcp.recvkey": "85"}},
	"MP_TCPRST administratively prohibited": {subtype: MPTCPRst, flags: testpkt.RST | testpkt.ACK,
		opts:   testpkt.MPTCPRst(testpkt.TCPRstTransient, testpkt.TCPRstReasonProhibited),
		tshark: map[string]string{"tcp.options.mptcp.rst_reason": "0x05", "tcp.options.mptcp.flag_T.flag": "1"}},
}

// frameVariant is the network layer around the TCP segment.
type frameVariant func(tcp *testpkt.TCP) testpkt.Frame

var frameVariants = map[string]frameVariant{
	"IPv4": func(tcp *testpkt.TCP) testpkt.Frame {
		return testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: tcp}
	},
	"IPv4 with options, VLAN": func(tcp *testpkt.TCP) testpkt.Frame {
		// Router alert (RFC 2113) and a NOP: a 24-byte IPv4 header.
		return testpkt.Frame{VLANs: []uint16{100}, Src: clientPod, Dst: serverPod, IPv4Options: []byte{148, 4, 0, 0}, TCP: tcp}
	},
	"IPv6": func(tcp *testpkt.TCP) testpkt.Frame {
		return testpkt.Frame{Src: clientPod6, Dst: serverPod6, TCP: tcp}
	},
	"IPv6 with extension headers, two VLAN tags": func(tcp *testpkt.TCP) testpkt.Frame {
		return testpkt.Frame{VLANs: []uint16{100, 200}, Src: clientPod6, Dst: serverPod6, IPv6HopByHop: true, IPv6DestOpts: 2, TCP: tcp}
	},
}

var (
	clientPod6 = netip.MustParseAddr("fd00:244:1::11")
	serverPod6 = netip.MustParseAddr("fd00:244:2::11")
)

func (c optionCase) frame(v frameVariant) []byte { return c.frameFrom(v, 40000) }

// frameFrom builds the case's frame from source port sport.
func (c optionCase) frameFrom(v frameVariant, sport uint16) []byte {
	return v(&testpkt.TCP{SrcPort: sport, DstPort: 5201, Seq: 100, Ack: 200, Flags: c.flags, Options: c.opts,
		Payload: make([]byte, c.payload)}).Bytes()
}

// countEveryVariant runs case c in every frame variant through pod_egress
// (no pod selected) and checks each is counted as c's subtype only, its mark
// untouched.
func countEveryVariant(t *testing.T, dp *Datapath, name string, c optionCase) {
	t.Helper()
	for vname, v := range frameVariants {
		t.Run(name+"/"+vname, func(t *testing.T) {
			before := optionStats(t, dp)
			if m := run(t, dp.objs.PodEgress, c.frame(v), skbContext{Mark: 0x4000}); m != 0x4000 {
				t.Fatalf("mark of an unselected pod's packet became %#x", m)
			}
			requireCountedOnlyAs(t, before, optionStats(t, dp), c.subtype)
		})
	}
}

// requireCountedOnlyAs checks that between before and after one packet was
// counted, as a valid option of subtype only.
func requireCountedOnlyAs(t *testing.T, before, after [NumMPTCPSubtypes]SubtypeCounters, subtype MPTCPSubtype) {
	t.Helper()
	for s := range after {
		want := before[s].Packets
		if MPTCPSubtype(s) == subtype {
			want++
		}
		if after[s].Packets != want || after[s].Invalid != before[s].Invalid {
			t.Errorf("%v: packets %d -> %d, invalid %d -> %d; want one more packet only for %v",
				MPTCPSubtype(s), before[s].Packets, after[s].Packets, before[s].Invalid, after[s].Invalid, subtype)
		}
	}
}

func optionStats(t *testing.T, dp *Datapath) [NumMPTCPSubtypes]SubtypeCounters {
	t.Helper()
	st, err := dp.MPTCPOptionStats()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// Every subtype, in every form RFC 8684 gives it, is recognised and counted
// once, over IPv4 (with IP options and a VLAN tag) and IPv6 (with extension
// headers and two VLAN tags); the packet passes unchanged.
func TestParserCountsEveryMPTCPSubtype(t *testing.T) {
	dp := loadForTest(t)
	for name, c := range optionCases {
		countEveryVariant(t, dp, name, c)
	}
}

// A segment can carry several MPTCP options; each is found, not only the
// first.
func TestParserFindsEveryMPTCPOptionOfASegment(t *testing.T) {
	dp := loadForTest(t)
	opts := testpkt.Join(testpkt.DSS{DataACK: u64(1)}.Bytes(), testpkt.AddAddr(1, announced4, 0, true, 0), testpkt.MPPrio(false),
		testpkt.RemoveAddr(9))
	frame := testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 1, DstPort: 2, Flags: testpkt.ACK, Options: opts}}.Bytes()
	run(t, dp.objs.PodEgress, frame, skbContext{})
	st := optionStats(t, dp)
	for _, s := range []MPTCPSubtype{DSS, AddAddr, MPPrio, RemoveAddr} {
		if st[s].Packets != 1 {
			t.Errorf("%v counted %d times, want 1", s, st[s].Packets)
		}
	}
	if st[MPCapable].Packets+st[MPJoin].Packets != 0 {
		t.Errorf("handshake subtypes counted on a segment without them: %+v", st)
	}
}

// An option whose length RFC 8684 does not define for its subtype is
// ignored, as the receiving stack ignores it, and counted; it neither places
// a subflow nor stops a placed subflow's packets from being marked.
func TestOptionOfUndefinedLengthIsIgnoredAndCounted(t *testing.T) {
	dp := loadForTest(t)
	if err := dp.SetRule(0, Rule{Paths: []uint32{2}}); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	// An MP_JOIN of SYN-ACK length on a SYN is no join.
	badJoin := testpkt.MPJoinSYNACK(1, 2, 3, false)
	if m := run(t, dp.objs.PodEgress, syn(clientPod, 40000, serverPod, 80, badJoin), skbContext{Mark: 0x4000}); m != 0x4000 {
		t.Fatalf("SYN with an MP_JOIN of undefined length marked %#x", m)
	}
	mark := run(t, dp.objs.PodEgress, syn(clientPod, 40001, serverPod, 80, testpkt.MPCapableSYN()), skbContext{})
	// ADD_ADDR with 5 address bytes, on the placed subflow.
	badAddAddr := []byte{testpkt.KindMPTCP, 9, testpkt.SubAddAddr<<4 | 1, 1, 192, 0, 2, 1, 0}
	ack := testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 40001, DstPort: 80, Flags: testpkt.ACK,
		Options: testpkt.Join(testpkt.DSS{DataACK: u64(1)}.Bytes(), badAddAddr)}}.Bytes()
	if m := run(t, dp.objs.PodEgress, ack, skbContext{}); m != mark {
		t.Fatalf("placed subflow's packet with an invalid ADD_ADDR marked %#x, want %#x", m, mark)
	}
	st := optionStats(t, dp)
	if st[MPJoin].Invalid != 1 || st[MPJoin].Packets != 0 || st[AddAddr].Invalid != 1 || st[AddAddr].Packets != 0 || st[DSS].Packets != 1 {
		t.Fatalf("counters %+v: want MP_JOIN and ADD_ADDR invalid once, DSS once", st)
	}
	stats, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if stats[StatMPTCPOptInvalid] != 2 || stats[StatSubflowPlaced] != 1 {
		t.Fatalf("packets with invalid options = %d, placed = %d; want 2 and 1", stats[StatMPTCPOptInvalid], stats[StatSubflowPlaced])
	}
}

// malformedFrames are packets the datapath must pass on byte for byte, mark
// untouched, and count under the reason given.
func malformedFrames() map[string]struct {
	frame  []byte
	reason Stat
} {
	mptcpSYN := syn(clientPod, 40000, serverPod, 80, testpkt.MPCapableSYN())
	withIHL := func(ihl byte) []byte {
		b := append([]byte(nil), mptcpSYN...)
		b[14] = 0x40 | ihl
		return b
	}
	withDoff := func(doff byte) []byte {
		b := append([]byte(nil), mptcpSYN...)
		b[14+20+12] = doff << 4
		return b
	}
	tagged := testpkt.Frame{VLANs: []uint16{100}, Src: clientPod, Dst: serverPod,
		TCP: &testpkt.TCP{SrcPort: 40000, DstPort: 80, Flags: testpkt.SYN, Options: testpkt.MPCapableSYN()}}.Bytes()
	tagged6 := testpkt.Frame{VLANs: []uint16{100}, Src: clientPod6, Dst: serverPod6,
		TCP: &testpkt.TCP{SrcPort: 40000, DstPort: 80, Flags: testpkt.SYN, Options: testpkt.MPCapableSYN()}}.Bytes()
	// Of UDP: a fragment of TCP to or from a selected pod is dropped
	// (TestTCPFragmentsOfSelectedPodsAreDropped).
	fragment := testpkt.Frame{Src: clientPod, Dst: serverPod, Protocol: 17, Payload: make([]byte, 16)}.Bytes()
	fragment[14+6] = 0x20 // more fragments
	arp := append(make([]byte, 12), 0x08, 0x06)
	arp = append(arp, make([]byte, 28)...)
	return map[string]struct {
		frame  []byte
		reason Stat
	}{
		"ARP":           {arp, StatNotTCP},
		"UDP":           {testpkt.Frame{Src: clientPod, Dst: serverPod, Protocol: 17, Payload: make([]byte, 16)}.Bytes(), StatNotTCP},
		"IPv4 fragment": {fragment, StatNotTCP},
		// BPF_PROG_TEST_RUN refuses an untagged IPv4 or IPv6 frame shorter
		// than the fixed IP header; behind a VLAN tag it takes any length.
		"truncated VLAN tag":    {tagged[:14+2], StatMalformed},
		"truncated IPv4 header": {tagged[:14+4+12], StatMalformed},
		"truncated TCP header":  {mptcpSYN[:14+20+10], StatMalformed},
		"truncated TCP options": {mptcpSYN[:len(mptcpSYN)-2], StatMalformed},
		"IHL below 5":           {withIHL(4), StatMalformed},
		"IHL beyond the packet": {withIHL(15), StatMalformed},
		"data offset below 5":   {withDoff(4), StatMalformed},
		"truncated IPv6 header": {tagged6[:14+4+30], StatMalformed},
	}
}

// Packets that are not TCP, or are malformed or truncated, pass byte for byte
// unchanged with their mark untouched, even from a selected pod, and each is
// counted under its reason.
func TestMalformedAndNonTCPPacketsPassUnchanged(t *testing.T) {
	dp := loadForTest(t)
	if err := dp.SetRule(0, Rule{Paths: []uint32{1, 2}}); err != nil {
		t.Fatal(err)
	}
	for _, a := range []netip.Addr{clientPod, clientPod6} {
		if err := dp.SetEndpoint(a, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := dp.SetNIC(7, 1); err != nil {
		t.Fatal(err)
	}
	for name, tc := range malformedFrames() {
		t.Run(name, func(t *testing.T) {
			for prog, in := range map[*ebpf.Program]skbContext{
				dp.objs.PodEgress:  {Mark: 0x4000},
				dp.objs.NicIngress: {Mark: 0x4000, IngressIfindex: 7},
			} {
				before, err := dp.Stats()
				if err != nil {
					t.Fatal(err)
				}
				if m := run(t, prog, tc.frame, in); m != 0x4000 {
					t.Fatalf("mark became %#x", m)
				}
				after, err := dp.Stats()
				if err != nil {
					t.Fatal(err)
				}
				if after[tc.reason] != before[tc.reason]+1 {
					t.Errorf("counter %d went %d -> %d, want one more", tc.reason, before[tc.reason], after[tc.reason])
				}
			}
		})
	}
}

// brokenOptionLists are SYNs whose option list a broken option ends before
// the header does, with or without an MP_CAPABLE before it (capable), and a
// SYN with an MPTCP option of length 2, which breaks nothing.
func brokenOptionLists() map[string]struct {
	frame   []byte
	capable bool // an MP_CAPABLE the kernel reads
	cut     bool // counted as cut short
} {
	frame := func(sport uint16, o ...[]byte) []byte {
		return testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: sport, DstPort: 80, Flags: testpkt.SYN, Options: testpkt.Join(o...)}}.Bytes()
	}
	mpc := testpkt.MPCapableSYN()
	return map[string]struct {
		frame   []byte
		capable bool
		cut     bool
	}{
		"option of length 0 after MP_CAPABLE":            {frame(40000, mpc, []byte{2, 0, 0, 0}), true, true},
		"option overrunning the header after MP_CAPABLE": {frame(40001, mpc, []byte{30, 40, 0, 0}), true, true},
		"option length byte missing after MP_CAPABLE":    {frame(40002, mpc, []byte{1, 1, 1, 30}), true, true},
		"option of length 1 before MP_CAPABLE":           {frame(40003, []byte{2, 1, 1, 1}, mpc), false, true},
		"MPTCP option without subtype before MP_CAPABLE": {frame(40004, []byte{30, 2, 1, 1}, mpc), true, false},
		"EOL before MP_CAPABLE (an end, not a break)":    {frame(40005, []byte{1, 1, 1, 0}, mpc), false, false},
	}
}

// A broken option list (an option of length 0 or 1, one overrunning the
// header, a kind without its length) is read up to the break, as the
// kernel reads it, and counted: an MP_CAPABLE before the break opens a
// subflow the pod's node places, one after it is not read. An MPTCP option
// of length 2 breaks nothing: the kernel reads on after it.
func TestABrokenOptionListIsReadUpToTheBreak(t *testing.T) {
	dp := loadForTest(t)
	if err := dp.SetRule(0, Rule{Paths: []uint32{1, 2}}); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetNIC(7, 1); err != nil {
		t.Fatal(err)
	}
	cases := brokenOptionLists()
	for _, name := range sortedKeys(cases) {
		c := cases[name]
		t.Run(name, func(t *testing.T) {
			stats, err := dp.Stats()
			if err != nil {
				t.Fatal(err)
			}
			opts := optionStats(t, dp)
			// To no selected pod: read and counted, passed as it is.
			if m := run(t, dp.objs.NicIngress, c.frame, skbContext{Mark: 0x4000, IngressIfindex: 7}); m != 0x4000 {
				t.Fatalf("mark of a packet to no selected pod became %#x", m)
			}
			after, err := dp.Stats()
			if err != nil {
				t.Fatal(err)
			}
			if cut := after[StatTCPOptsCut] - stats[StatTCPOptsCut]; cut != map[bool]uint64{true: 1}[c.cut] || after[StatMalformed] != stats[StatMalformed] {
				t.Errorf("cut short %d times, malformed %d -> %d; want cut %v, never malformed", cut, stats[StatMalformed], after[StatMalformed], c.cut)
			}
			if n := optionStats(t, dp)[MPCapable].Packets - opts[MPCapable].Packets; n != map[bool]uint64{true: 1}[c.capable] {
				t.Errorf("MP_CAPABLE counted %d times, want it counted %v", n, c.capable)
			}
		})
	}
	// Selected: the MP_CAPABLE before a break places its subflow.
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	c := cases["option of length 0 after MP_CAPABLE"]
	dp.pathOfMark(t, run(t, dp.objs.PodEgress, c.frame, skbContext{}))
	c = cases["option of length 1 before MP_CAPABLE"]
	if m := run(t, dp.objs.PodEgress, c.frame, skbContext{Mark: 0x4000}); m != 0x4000 {
		t.Errorf("an MP_CAPABLE after a break (unread by the kernel) was placed: mark %#x", m)
	}
}

// Plain TCP, without MPTCP options, is parsed and left alone.
func TestPlainTCPIsNotCountedAsMPTCP(t *testing.T) {
	dp := loadForTest(t)
	frame := syn(clientPod, 1, serverPod, 2, testpkt.Join(testpkt.MSS(1460), testpkt.SACKPermitted(), testpkt.Timestamps(1, 0)))
	run(t, dp.objs.PodEgress, frame, skbContext{})
	for s, c := range optionStats(t, dp) {
		if c != (SubtypeCounters{}) {
			t.Errorf("%v counted %+v for plain TCP", MPTCPSubtype(s), c)
		}
	}
}

// Go's subtype numbers are the ones the BPF code uses (enum mptcp_subtype,
// emitted by bpf2go from BTF).
func TestGoAndBPFAgreeOnMPTCPSubtypes(t *testing.T) {
	for goVal, cVal := range map[MPTCPSubtype]datapathMptcpSubtype{
		MPCapable:      datapathMptcpSubtypeMPTCP_SUB_CAPABLE,
		MPJoin:         datapathMptcpSubtypeMPTCP_SUB_JOIN,
		DSS:            datapathMptcpSubtypeMPTCP_SUB_DSS,
		AddAddr:        datapathMptcpSubtypeMPTCP_SUB_ADD_ADDR,
		RemoveAddr:     datapathMptcpSubtypeMPTCP_SUB_REMOVE_ADDR,
		MPPrio:         datapathMptcpSubtypeMPTCP_SUB_PRIO,
		MPFail:         datapathMptcpSubtypeMPTCP_SUB_FAIL,
		MPFastclose:    datapathMptcpSubtypeMPTCP_SUB_FASTCLOSE,
		MPTCPRst:       datapathMptcpSubtypeMPTCP_SUB_TCPRST,
		MPExperimental: datapathMptcpSubtypeMPTCP_SUB_EXPERIMENTAL,
	} {
		if uint32(goVal) != uint32(cVal) {
			t.Errorf("%v is %d in Go and %d in BPF", goVal, goVal, cVal)
		}
	}
}

// Every length RFC 8684 does not define for a subtype (on the segment that
// carries it) is counted as invalid, never as the subtype.
func TestOptionLengthsRFC8684DoesNotDefineAreInvalid(t *testing.T) {
	dp := loadForTest(t)
	tests := map[string]struct {
		subtype MPTCPSubtype // subtype of the option
		flags   uint8        // TCP flags of the segment
		opt     []byte       // the option
	}{
		"MP_CAPABLE with both keys on a SYN":  {MPCapable, testpkt.SYN, testpkt.MPCapableACK(1, 2)},
		"MP_CAPABLE without key on a SYN-ACK": {MPCapable, testpkt.SYN | testpkt.ACK, testpkt.MPCapableSYN()},
		"MP_CAPABLE with one key on an ACK":   {MPCapable, testpkt.ACK, testpkt.MPCapableSYNACK(1)},
		"MP_JOIN of SYN length on an ACK":     {MPJoin, testpkt.ACK, testpkt.MPJoinSYN(1, 2, 3, false)},
		"MP_JOIN of ACK length on a SYN-ACK":  {MPJoin, testpkt.SYN | testpkt.ACK, testpkt.MPJoinACK([20]byte{})},
		"DSS shorter than its flags say": {DSS, testpkt.ACK,
			[]byte{testpkt.KindMPTCP, 8, testpkt.SubDSS << 4, 0x05, 0, 0, 0, 1}},
		"DSS with a checksum but no mapping": {DSS, testpkt.ACK,
			[]byte{testpkt.KindMPTCP, 10, testpkt.SubDSS << 4, 0x01, 0, 0, 0, 1, 0xbe, 0xef}},
		"ADD_ADDR with 5 address bytes": {AddAddr, testpkt.ACK,
			[]byte{testpkt.KindMPTCP, 9, testpkt.SubAddAddr<<4 | 1, 1, 192, 0, 2, 1, 0}},
		"ADD_ADDR IPv4 without HMAC, not an echo": {AddAddr, testpkt.ACK,
			[]byte{testpkt.KindMPTCP, 8, testpkt.SubAddAddr << 4, 1, 192, 0, 2, 1}},
		"REMOVE_ADDR without an address id": {RemoveAddr, testpkt.ACK, []byte{testpkt.KindMPTCP, 3, testpkt.SubRemoveAddr << 4}},
		"MP_PRIO of length 5":               {MPPrio, testpkt.ACK, []byte{testpkt.KindMPTCP, 5, testpkt.SubPrio << 4, 0, 0}},
		"MP_FAIL of length 8":               {MPFail, testpkt.ACK, testpkt.MPFail(1)[:8]},
		"MP_FASTCLOSE of length 8":          {MPFastclose, testpkt.ACK, testpkt.MPFastclose(1)[:8]},
		"MP_TCPRST of length 3":             {MPTCPRst, testpkt.RST, testpkt.MPTCPRst(0, 0)[:3]},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			opt := append([]byte(nil), tc.opt...)
			opt[1] = byte(len(opt))
			before := optionStats(t, dp)
			frame := testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 1, DstPort: 2, Flags: tc.flags, Options: opt}}.Bytes()
			run(t, dp.objs.PodEgress, frame, skbContext{})
			after := optionStats(t, dp)
			if after[tc.subtype].Invalid != before[tc.subtype].Invalid+1 || after[tc.subtype].Packets != before[tc.subtype].Packets {
				t.Fatalf("%v: invalid %d -> %d, packets %d -> %d; want one more invalid only", tc.subtype,
					before[tc.subtype].Invalid, after[tc.subtype].Invalid, before[tc.subtype].Packets, after[tc.subtype].Packets)
			}
		})
	}
}

// Older and unassigned forms: MP_PRIO with an address id (RFC 6824), an
// unassigned subtype and MP_EXPERIMENTAL are counted under their number.
func TestParserCountsOtherSubtypesByNumber(t *testing.T) {
	dp := loadForTest(t)
	opts := testpkt.Join(
		[]byte{testpkt.KindMPTCP, 4, testpkt.SubPrio<<4 | 1, 2},          // MP_PRIO, v0 form
		[]byte{testpkt.KindMPTCP, 6, 0x9 << 4, 0, 0, 0},                  // unassigned 0x9
		[]byte{testpkt.KindMPTCP, 4, testpkt.SubExperimental << 4, 0xaa}) // MP_EXPERIMENTAL
	run(t, dp.objs.PodEgress, testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 1, DstPort: 2, Flags: testpkt.ACK, Options: opts}}.Bytes(), skbContext{})
	st := optionStats(t, dp)
	for _, s := range []MPTCPSubtype{MPPrio, 0x9, MPExperimental} {
		if st[s].Packets != 1 || st[s].Invalid != 0 {
			t.Errorf("%v: %+v, want one packet", s, st[s])
		}
	}
}

// nic_ingress parses and counts with the same parser, on the NICs it knows.
func TestNICIngressCountsMPTCPSubtypes(t *testing.T) {
	dp := loadForTest(t)
	if err := dp.SetNIC(7, 1); err != nil {
		t.Fatal(err)
	}
	frame := optionCases["ADD_ADDR IPv6 with port"].frame(frameVariants["IPv6 with extension headers, two VLAN tags"])
	run(t, dp.objs.NicIngress, frame, skbContext{IngressIfindex: 7})
	run(t, dp.objs.NicIngress, frame, skbContext{IngressIfindex: 8}) // not a path NIC: not parsed
	if st := optionStats(t, dp); st[AddAddr].Packets != 1 {
		t.Fatalf("ADD_ADDR counted %d times on nic_ingress, want 1", st[AddAddr].Packets)
	}
}

// The parser reads NOP, NOP, timestamps (followed by at most one MPTCP
// option that ends the options) in place instead of walking the options:
// every subtype behind the timestamps is found as the walk finds it, an
// option of undefined length behind them is ignored and counted, and
// options cut short by the end of the packet make it malformed.
func TestParserReadsTheTimestampLayoutAsTheWalkDoes(t *testing.T) {
	dp := loadForTest(t)
	prefix := testpkt.Join(testpkt.NOP(), testpkt.NOP(), testpkt.Timestamps(1, 2))
	for name, c := range optionCases {
		if bytes.HasPrefix(c.opts, prefix[:4]) || len(prefix)+len(c.opts) > 40 {
			continue // already the layout, or no room for the timestamps
		}
		c.opts = testpkt.Join(prefix, c.opts)
		countEveryVariant(t, dp, name, c)
	}

	// Linux ends a DSS with a mapping and no checksum (26 bytes) with two
	// NOPs; padding that is neither NOP nor EOL leaves the packet to the
	// walk, which counts the same.
	mapping := testpkt.DSS{DataACK: u64(1 << 33), DataACK8: true, Mapping: &testpkt.DSSMapping{DSN: 1 << 34, DSN8: true, SSN: 1, Length: 1000}}.Bytes()
	for name, pad := range map[string][]byte{"NOP": {1, 1}, "EOL": {0, 0}, "NOP then EOL": {1, 0}, "not padding": {0x55, 2}} {
		c := optionCase{subtype: DSS, flags: testpkt.ACK | testpkt.PSH, payload: 1000, opts: testpkt.Join(prefix, mapping, pad)}
		if len(c.opts) != 40 {
			t.Fatalf("options of %d bytes, want the 40 Linux sends", len(c.opts))
		}
		countEveryVariant(t, dp, "DSS mapping, padded: "+name, c)
	}

	t.Run("undefined length", func(t *testing.T) {
		// A DSS without flags is 4 bytes; this one claims 8.
		bad := []byte{testpkt.KindMPTCP, 8, testpkt.SubDSS << 4, 0, 0, 0, 0, 0}
		frame := testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 1, DstPort: 2, Flags: testpkt.ACK,
			Options: testpkt.Join(prefix, bad)}}.Bytes()
		before := optionStats(t, dp)
		run(t, dp.objs.PodEgress, frame, skbContext{})
		after := optionStats(t, dp)
		if after[DSS].Invalid != before[DSS].Invalid+1 || after[DSS].Packets != before[DSS].Packets {
			t.Errorf("DSS of undefined length behind timestamps: %+v -> %+v, want counted invalid only", before[DSS], after[DSS])
		}
	})

	t.Run("cut short", func(t *testing.T) {
		full := testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 1, DstPort: 2, Flags: testpkt.ACK,
			Options: testpkt.Join(prefix, testpkt.DSS{DataACK: u64(1)}.Bytes())}}.Bytes()
		for _, cut := range []int{2, 9, 14} { // inside the DSS, its header, the timestamps
			frame := full[:len(full)-cut]
			before, err := dp.Stats()
			if err != nil {
				t.Fatal(err)
			}
			run(t, dp.objs.PodEgress, frame, skbContext{})
			after, err := dp.Stats()
			if err != nil {
				t.Fatal(err)
			}
			if after[StatMalformed] != before[StatMalformed]+1 {
				t.Errorf("options cut %d bytes short: malformed %d -> %d, want one more", cut, before[StatMalformed], after[StatMalformed])
			}
		}
	})
}
