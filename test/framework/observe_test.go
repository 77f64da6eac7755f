package framework

import (
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
)

// Only a reset its sender sent after its own FIN on the same 4-tuple is a
// teardown's: one before the FIN, one from the other end, or one on a
// 4-tuple with no FIN is not.
func TestSplitTeardownKeepsOnlyResetsAfterTheirSendersFIN(t *testing.T) {
	fins := map[string]float64{"10.0.0.2 5601 10.0.0.1 40000": 100.5}
	after := "node 1 nic1: 100.6 10.0.0.2 5601 10.0.0.1 40000 ·······A·R·· 7 0"
	before := "node 1 nic1: 100.4 10.0.0.2 5601 10.0.0.1 40000 ·········R·· 7 0"
	otherEnd := "node 1 nic1: 100.7 10.0.0.1 40000 10.0.0.2 5601 ·········R·· 9 0"
	noFIN := "node 1 nic2: 100.8 10.0.0.2 5601 10.0.0.1 40001 ·········R·· 9 0"
	teardown, other := splitTeardown(fins, []string{after, before, otherEnd, noFIN, "garbage"})
	if !slices.Equal(teardown, []string{after}) {
		t.Errorf("teardown %q, want only the reset after its sender's FIN", teardown)
	}
	if !slices.Equal(other, []string{before, otherEnd, noFIN, "garbage"}) {
		t.Errorf("other %q, want the rest", other)
	}
}

// ClassifiedResets reads resets and FINs from the captures themselves:
// across captures, a reset after its sender's FIN on the same 4-tuple is
// the teardown's, a reset from the other end is not, and every reset is
// listed with its capture, addresses, ports and MPTCP reset reason.
func TestClassifiedResetsReadsResetsAndFINsFromTheCaptures(t *testing.T) {
	testbed.RequireTools(t, "tshark", "editcap")
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	seg := func(src, dst netip.Addr, sport, dport uint16, flags uint8, opts []byte) []byte {
		return testpkt.Frame{Src: src, Dst: dst, TCP: &testpkt.TCP{SrcPort: sport, DstPort: dport, Flags: flags, Options: opts}}.Bytes()
	}
	dir := t.TempDir()
	capture := func(name string, frames ...[]byte) testbed.CaptureFile {
		pcap, path := filepath.Join(dir, name+".pcap"), filepath.Join(dir, name+".pcapng")
		if err := testpkt.WritePcap(pcap, frames); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("editcap", "-F", "pcapng", pcap, path).CombinedOutput(); err != nil {
			t.Fatalf("editcap: %v: %s", err, out)
		}
		return testbed.CaptureFile{Node: 1, NIC: len(name), Path: path}
	}
	files := []testbed.CaptureFile{
		// nic1: the server's FIN, then data, at 0 and 1 s.
		capture("n", seg(b, a, 5601, 40000, testpkt.FIN|testpkt.ACK, nil), seg(a, b, 40000, 5601, testpkt.ACK, nil)),
		// nic2: its reset after that FIN (2 s), and the client's reset with MP_TCPRST (3 s).
		capture("nn", seg(a, b, 40000, 5601, testpkt.ACK, nil), seg(a, b, 40000, 5601, testpkt.ACK, nil),
			seg(b, a, 5601, 40000, testpkt.RST|testpkt.ACK, nil), seg(a, b, 40001, 5601, testpkt.RST, testpkt.MPTCPRst(0, 6))),
	}
	all, teardown, other, err := ClassifiedResets(files)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || len(teardown) != 1 || len(other) != 1 {
		t.Fatalf("resets %q, teardown %q, other %q: want two resets, the server's the teardown's", all, teardown, other)
	}
	if !strings.HasPrefix(teardown[0], "node 1 nic2: 2.") || !strings.Contains(teardown[0], " 10.0.0.2 5601 10.0.0.1 40000 ") {
		t.Errorf("teardown %q, want the server's reset on nic2 at 2 s", teardown[0])
	}
	if !strings.HasPrefix(other[0], "node 1 nic2: 3.") || !strings.Contains(other[0], " 10.0.0.1 40001 10.0.0.2 5601 ") || !strings.HasSuffix(other[0], " 8 0x06") {
		t.Errorf("other %q, want the client's reset at 3 s with MP_TCPRST (subtype 8) reason 0x06", other[0])
	}
}
