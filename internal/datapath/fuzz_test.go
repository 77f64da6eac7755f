package datapath

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
)

// fuzzRulePaths is the one rule of the fuzz test: every path may be chosen.
var fuzzRulePaths = []uint32{1, 2, 3, 4}

// seedFrames are every packet the tests build.
func seedFrames() [][]byte {
	var out [][]byte
	for _, name := range sortedKeys(optionCases) {
		for _, vname := range sortedKeys(frameVariants) {
			out = append(out, optionCases[name].frame(frameVariants[vname]))
		}
	}
	malformed := malformedFrames()
	for _, name := range sortedKeys(malformed) {
		out = append(out, malformed[name].frame)
	}
	broken := brokenOptionLists()
	for _, name := range sortedKeys(broken) {
		out = append(out, broken[name].frame)
	}
	out = append(out, optionListSeeds()...)
	return append(out, syn(clientPod, 1, serverPod, 2, testpkt.MPJoinSYN(1, 2, 3, false)))
}

// FuzzPodEgress feeds pod_egress arbitrary frames. For every input the
// program returns TCX_NEXT without error and leaves every byte as it was,
// or drops (counted) a frame whose MPTCP options the kernel could read
// otherwise (pod_egress runs on selected pods' interfaces only); with no
// rule selecting the frame's source it leaves the mark untouched; with a
// match-all rule (an endpoint for whatever source address the frame
// carries) any mark it gives names one of the rule's paths and keeps the
// foreign mark bits. Under plain `go test` only the seed corpus (every
// packet the tests build) runs.
func FuzzPodEgress(f *testing.F) {
	for _, frame := range seedFrames() {
		f.Add(frame)
	}
	dp := loadForTest(f)
	if err := dp.SetRule(0, Rule{Paths: fuzzRulePaths}); err != nil {
		f.Fatal(err)
	}
	const foreign = 0x4000
	f.Fuzz(func(t *testing.T, frame []byte) {
		if !testRunAccepts(frame) {
			t.Skip("BPF_PROG_TEST_RUN refuses frames this short")
		}
		resetDatapathState(t, dp)

		m, dropped := runFuzzOrAmbiguous(t, dp, dp.objs.PodEgress, frame, skbContext{Mark: foreign})
		if m != foreign {
			t.Fatalf("no rule selects the frame, yet its mark became %#x", m)
		}
		src, _, ok := ipAddresses(frame)
		if !ok || dropped {
			return
		}
		if err := dp.SetEndpoint(src, 0); err != nil {
			t.Fatal(err)
		}
		m, dropped = runFuzzOrAmbiguous(t, dp, dp.objs.PodEgress, frame, skbContext{Mark: foreign})
		if dropped {
			return
		}
		if m&^dp.markMask != foreign {
			t.Fatalf("foreign mark bits became %#x", m&^dp.markMask)
		}
		if v := (m & dp.markMask) >> dp.markShift; v != 0 && !slices.Contains(fuzzRulePaths, v) {
			t.Fatalf("mark %#x names path %d, not one of the rule's %v", m, v, fuzzRulePaths)
		}
	})
}

// FuzzNICIngress feeds nic_ingress arbitrary frames arriving on a path's
// NIC, with the same guarantees as FuzzPodEgress, but that with no rule
// selecting the frame's destination it drops nothing; with a match-all rule
// (an endpoint for whatever destination the frame carries) the only mark it
// may give is the NIC's path, and the only frames it may drop are a
// well-formed join's third ACK for which no handshake was answered and a
// frame whose MPTCP options the kernel could read otherwise (each counted).
func FuzzNICIngress(f *testing.F) {
	for _, frame := range seedFrames() {
		f.Add(frame)
	}
	dp := loadForTest(f)
	const nicIfindex, nicPath = 7, 2
	if err := dp.SetNIC(nicIfindex, nicPath); err != nil {
		f.Fatal(err)
	}
	const foreign = 0x4000
	in := skbContext{Mark: foreign, IngressIfindex: nicIfindex}
	f.Fuzz(func(t *testing.T, frame []byte) {
		if !testRunAccepts(frame) {
			t.Skip("BPF_PROG_TEST_RUN refuses frames this short")
		}
		resetDatapathState(t, dp)

		if m := runFuzz(t, dp.objs.NicIngress, frame, in); m != foreign {
			t.Fatalf("no rule selects the frame, yet its mark became %#x", m)
		}
		_, dst, ok := ipAddresses(frame)
		if !ok {
			return
		}
		if err := dp.SetEndpoint(dst, 0); err != nil {
			t.Fatal(err)
		}
		counted := func() uint64 {
			return stat(t, dp, StatJoinACKDropped) + stat(t, dp, StatMPTCPOptsAmbiguous) + stat(t, dp, StatUnreadableTCPDropped)
		}
		before := counted()
		ret, m := runFuzzVerdict(t, dp.objs.NicIngress, frame, in)
		if ret == tcActShot && counted() == before+1 {
			return
		}
		if ret != tcxNext {
			t.Fatalf("program returned %d, want TCX_NEXT (or a counted drop of a join's third ACK, of ambiguous options or of a TCP fragment)", int32(ret))
		}
		if m != foreign && m != foreign|dp.Mark(nicPath) {
			t.Fatalf("mark became %#x, want %#x or %#x", m, foreign, foreign|dp.Mark(nicPath))
		}
	})
}

// runFuzz runs prog once and checks what must hold for any input: it
// passes, unchanged.
func runFuzz(t *testing.T, prog *ebpf.Program, frame []byte, in skbContext) uint32 {
	t.Helper()
	ret, mark := runFuzzVerdict(t, prog, frame, in)
	if ret != tcxNext {
		t.Fatalf("program returned %d, want TCX_NEXT", int32(ret))
	}
	return mark
}

// runFuzzOrAmbiguous runs prog once and checks that it passes the packet
// unchanged, or drops it counted as one whose MPTCP options the kernel
// could read otherwise or as a fragment of TCP (dropped); it returns the
// mark.
func runFuzzOrAmbiguous(t *testing.T, dp *Datapath, prog *ebpf.Program, frame []byte, in skbContext) (mark uint32, dropped bool) {
	t.Helper()
	counted := func() uint64 { return stat(t, dp, StatMPTCPOptsAmbiguous) + stat(t, dp, StatUnreadableTCPDropped) }
	before := counted()
	ret, mark := runFuzzVerdict(t, prog, frame, in)
	if ret == tcActShot && counted() == before+1 {
		return mark, true
	}
	if ret != tcxNext {
		t.Fatalf("program returned %d, want TCX_NEXT (or a counted drop of ambiguous options or of a TCP fragment)", int32(ret))
	}
	return mark, false
}

// runFuzzVerdict runs prog once and checks that the packet is unchanged;
// it returns the verdict and the mark.
func runFuzzVerdict(t *testing.T, prog *ebpf.Program, frame []byte, in skbContext) (uint32, uint32) {
	t.Helper()
	out := skbContext{}
	data := make([]byte, len(frame)+256)
	ret, err := prog.Run(&ebpf.RunOptions{Data: frame, DataOut: data, Context: in, ContextOut: &out})
	if err != nil {
		t.Fatalf("BPF_PROG_TEST_RUN on %x: %v", frame[:min(len(frame), 128)], err)
	}
	if string(data[:len(frame)]) != string(frame) {
		t.Fatalf("program changed the packet %x", frame)
	}
	return ret, out.Mark
}

// maxFuzzFrame bounds the inputs: BPF_PROG_TEST_RUN takes at most a page
// minus the skb's head- and tailroom (about 3.7 KiB on x86-64), and the
// parser reads only the first headers of a frame anyway.
const maxFuzzFrame = 2048

// testRunAccepts mirrors what BPF_PROG_TEST_RUN itself refuses with EINVAL
// before any program runs (checked on 6.18): frames shorter than an
// Ethernet header or longer than it can hold, and untagged IPv4 or IPv6
// frames shorter than the fixed IP header.
func testRunAccepts(frame []byte) bool {
	if len(frame) < 14 || len(frame) > maxFuzzFrame {
		return false
	}
	switch binary.BigEndian.Uint16(frame[12:]) {
	case 0x0800:
		return len(frame) >= 14+20
	case 0x86dd:
		return len(frame) >= 14+40
	}
	return true
}

// ipAddresses finds the IP source and destination of a frame with up to two
// VLAN tags, the way a match-all rule set would list them.
func ipAddresses(frame []byte) (src, dst netip.Addr, ok bool) {
	off := 12
	for range 3 {
		if len(frame) < off+2 {
			return src, dst, false
		}
		ip := frame[off+2:]
		switch binary.BigEndian.Uint16(frame[off:]) {
		case 0x8100, 0x88a8:
			off += 4
			continue
		case 0x0800:
			if len(ip) < 20 {
				return src, dst, false
			}
			return netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20])), true
		case 0x86dd:
			if len(ip) < 40 {
				return src, dst, false
			}
			return netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40])), true
		}
		return src, dst, false
	}
	return src, dst, false
}

// resetDatapathState forgets every endpoint (and its counters), subflow and
// connection, so that each fuzz input starts from nothing selected and
// nothing placed.
func resetDatapathState(t *testing.T, dp *Datapath) {
	t.Helper()
	all := func(datapathEndpointKey) bool { return true }
	eps, err := dp.Endpoints()
	if err != nil {
		t.Fatal(err)
	}
	for addr := range eps {
		if err := dp.DeleteEndpoint(addr); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := deleteKeysWhere(dp.objs.Endpoints, all); err != nil {
		t.Fatal(err)
	}
	sfs, err := dp.Subflows()
	if err != nil {
		t.Fatal(err)
	}
	for _, sf := range sfs {
		if err := dp.ForgetSubflow(sf.Local, sf.Remote); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range []*ebpf.Map{dp.objs.ConnAliases, dp.objs.ConnStates} {
		if _, err := deleteKeysWhere(m, func(datapathConnKey) bool { return true }); err != nil {
			t.Fatal(err)
		}
	}
}
