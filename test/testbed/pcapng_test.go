package testbed

import (
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
)

// A capture cut down to its control segments keeps every SYN, FIN and RST
// (IPv4 and IPv6, tagged or not) and nothing else, reads in tshark as the
// whole capture does, and still says how many packets the whole held and
// when its last one was captured.
func TestControlSegmentsKeepSYNsFINsAndResetsOnly(t *testing.T) {
	RequireTools(t, "tshark", "editcap")
	a4, b4 := netip.MustParseAddr("10.0.1.1"), netip.MustParseAddr("10.0.2.1")
	a6, b6 := netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	seg := func(src, dst netip.Addr, flags uint8, vlans ...uint16) []byte {
		return testpkt.Frame{VLANs: vlans, Src: src, Dst: dst, TCP: &testpkt.TCP{SrcPort: 40000, DstPort: 5201, Flags: flags,
			Options: testpkt.MPCapableSYN(), Payload: make([]byte, 64)}}.Bytes()
	}
	frames := [][]byte{
		seg(a4, b4, testpkt.SYN),                  // kept
		seg(b4, a4, testpkt.SYN|testpkt.ACK),      // kept
		seg(a4, b4, testpkt.ACK),                  // data
		seg(a4, b4, testpkt.ACK|testpkt.PSH),      // data
		seg(a4, b4, testpkt.FIN|testpkt.ACK),      // kept
		seg(b4, a4, testpkt.RST),                  // kept
		seg(a6, b6, testpkt.SYN),                  // kept
		seg(a6, b6, testpkt.ACK),                  // data
		seg(a4, b4, testpkt.RST|testpkt.ACK, 100), // kept, behind a VLAN tag
		testpkt.Frame{Src: a4, Dst: b4, Protocol: 17, Payload: []byte{0, 1, 0, 2, 0, 8, 0, 0}}.Bytes(), // UDP
	}
	dir := t.TempDir()
	pcap, whole := filepath.Join(dir, "in.pcap"), filepath.Join(dir, "in.pcapng")
	if err := testpkt.WritePcap(pcap, frames); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("editcap", "-F", "pcapng", pcap, whole).CombinedOutput(); err != nil {
		t.Fatalf("editcap: %v: %s", err, out)
	}
	cs, err := ControlSegments([]CaptureFile{{Node: 1, NIC: 2, Path: whole, NodeMAC: "02:00:00:00:00:01"}})
	if err != nil {
		t.Fatal(err)
	}
	c := cs[0]
	if c.Node != 1 || c.NIC != 2 || c.NodeMAC != "02:00:00:00:00:01" || c.Path == whole {
		t.Errorf("the copy is %+v, want node 1 nic 2's, in a file of its own", c.CaptureFile)
	}
	if c.Packets != len(frames) || c.Kept != 6 {
		t.Errorf("the capture held %d packets of which %d were kept, want %d and 6", c.Packets, c.Kept, len(frames))
	}
	// WritePcap stamps frame i at i seconds.
	if want := time.Unix(int64(len(frames)-1), 0); !c.Last.Equal(want) {
		t.Errorf("the last packet was captured at %v, want %v", c.Last, want)
	}
	out, err := exec.Command("tshark", "-n", "-r", c.Path, "-T", "fields", "-e", "frame.time_epoch", "-e", "tcp.flags").Output()
	if err != nil {
		t.Fatalf("tshark cannot read the copy: %v", err)
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		at, flags, _ := strings.Cut(line, "\t")
		got = append(got, EpochTime(at).Format("05")+" "+flags)
	}
	want := []string{"00 0x0002", "01 0x0012", "04 0x0011", "05 0x0004", "06 0x0002", "08 0x0014"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("tshark reads the copy as\n%s\nwant (second, flags)\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// FlowHeads keeps the control segments and the first flowHead segments of
// each direction of each subflow, and no other.
func TestFlowHeadsKeepTheFirstSegmentsOfEachDirectionAndEveryControlSegment(t *testing.T) {
	RequireTools(t, "editcap")
	a, b := netip.MustParseAddr("10.0.1.1"), netip.MustParseAddr("10.0.2.1")
	seg := func(src, dst netip.Addr, sport, dport uint16, flags uint8) []byte {
		return testpkt.Frame{Src: src, Dst: dst, TCP: &testpkt.TCP{SrcPort: sport, DstPort: dport, Flags: flags}}.Bytes()
	}
	var frames [][]byte
	want := 0
	for i := range 10 { // two subflows, both directions, ten data segments each way
		for _, f := range [][]byte{
			seg(a, b, 40000, 5201, testpkt.ACK), seg(b, a, 5201, 40000, testpkt.ACK),
			seg(a, b, 40001, 5201, testpkt.ACK), seg(b, a, 5201, 40001, testpkt.ACK),
		} {
			frames = append(frames, f)
			if i < flowHead {
				want++
			}
		}
	}
	frames = append(frames, seg(a, b, 40000, 5201, testpkt.FIN|testpkt.ACK), seg(b, a, 5201, 40001, testpkt.RST))
	want += 2
	dir := t.TempDir()
	pcap, whole := filepath.Join(dir, "in.pcap"), filepath.Join(dir, "in.pcapng")
	if err := testpkt.WritePcap(pcap, frames); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("editcap", "-F", "pcapng", pcap, whole).CombinedOutput(); err != nil {
		t.Fatalf("editcap: %v: %s", err, out)
	}
	hs, err := FlowHeads([]CaptureFile{{Node: 1, NIC: 1, Path: whole}})
	if err != nil {
		t.Fatal(err)
	}
	if hs[0].Packets != len(frames) || hs[0].Kept != want {
		t.Errorf("kept %d of %d packets, want %d: the first %d of each of four directions and two control segments",
			hs[0].Kept, hs[0].Packets, want, flowHead)
	}
}
