package datapath

import (
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// tsharkGood is the value of ip.checksum.status and tcp.checksum.status for
// a checksum tshark verified as right (PROTO_CHECKSUM_E_GOOD).
const tsharkGood = "1"

// decodedFrame is what tshark made of one frame: field name -> value, with
// several occurrences joined by commas.
type decodedFrame map[string]string

// tsharkDecode writes frames to a pcap and has tshark decode them, with IP
// and TCP checksum verification on, returning the requested fields of every
// frame in order.
func tsharkDecode(t *testing.T, frames [][]byte, fields []string) []decodedFrame {
	t.Helper()
	if _, err := exec.LookPath("tshark"); err != nil {
		testutil.Unavailable(t, "needs tshark (Debian package tshark) to decode test packets independently")
	}
	pcap := filepath.Join(t.TempDir(), "frames.pcap")
	if err := testpkt.WritePcap(pcap, frames); err != nil {
		t.Fatal(err)
	}
	args := []string{"-r", pcap, "-n", "-o", "tcp.check_checksum:TRUE", "-o", "ip.check_checksum:TRUE",
		"-T", "fields", "-E", "separator=/t", "-E", "occurrence=a", "-E", "aggregator=,"}
	for _, f := range fields {
		args = append(args, "-e", f)
	}
	out, err := exec.Command("tshark", args...).Output()
	if err != nil {
		var stderr string
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("tshark: %v: %s", err, stderr)
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) != len(frames) {
		t.Fatalf("tshark decoded %d frames, want %d", len(lines), len(frames))
	}
	decoded := make([]decodedFrame, len(lines))
	for i, line := range lines {
		vals := strings.Split(line, "\t")
		decoded[i] = decodedFrame{}
		for j, f := range fields {
			if j < len(vals) {
				decoded[i][f] = vals[j]
			}
		}
	}
	return decoded
}

// The packets the tests feed the datapath are what the tests say they are:
// tshark, a decoder that is not ours, finds in each the MPTCP subtype and the
// fields the case names, and valid IP and TCP checksums.
func TestTsharkAgreesWithTestPackets(t *testing.T) {
	type built struct {
		name  string
		ipv4  bool
		want  map[string]string
		frame []byte
	}
	var all []built
	fields := []string{"ip.checksum.status", "tcp.checksum.status", "tcp.options.mptcp.subtype", "tcp.flags"}
	for _, name := range sortedKeys(optionCases) {
		c := optionCases[name]
		for _, vname := range sortedKeys(frameVariants) {
			// One TCP stream per frame: tshark's MPTCP analysis follows
			// streams, and a segment must not look like a retransmission.
			frame := c.frameFrom(frameVariants[vname], uint16(20000+len(all)))
			want := map[string]string{"tcp.options.mptcp.subtype": fmt.Sprint(uint8(c.subtype))}
			for f, v := range c.tshark {
				want[f] = v
				if !slices.Contains(fields, f) {
					fields = append(fields, f)
				}
			}
			all = append(all, built{name: name + "/" + vname, ipv4: strings.HasPrefix(vname, "IPv4"), want: want, frame: frame})
		}
	}
	several := testpkt.Join(testpkt.DSS{DataACK: u64(1)}.Bytes(), testpkt.AddAddr(1, announced4, 0, true, 0), testpkt.MPPrio(false),
		testpkt.RemoveAddr(9))
	all = append(all, built{name: "several MPTCP options", ipv4: true, want: map[string]string{"tcp.options.mptcp.subtype": "2,3,5,4"},
		frame: testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 1, DstPort: 2, Flags: testpkt.ACK, Options: several}}.Bytes()})

	frames := make([][]byte, len(all))
	for i, b := range all {
		frames[i] = b.frame
	}
	decoded := tsharkDecode(t, frames, fields)
	for i, b := range all {
		got := decoded[i]
		if b.ipv4 && got["ip.checksum.status"] != tsharkGood {
			t.Errorf("%s: tshark says the IPv4 checksum status is %q, want good", b.name, got["ip.checksum.status"])
		}
		if got["tcp.checksum.status"] != tsharkGood {
			t.Errorf("%s: tshark says the TCP checksum status is %q, want good", b.name, got["tcp.checksum.status"])
		}
		for f, v := range b.want {
			if got[f] != v {
				t.Errorf("%s: tshark decodes %s = %q, want %q", b.name, f, got[f], v)
			}
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
