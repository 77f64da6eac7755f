package testbed

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// corruptedTransfer sends one MPTCP connection of 8 MB from pod (1,1) to pod
// (2,1) while the wire of node 1's first NIC flips a byte of the 50th large
// segment, and returns what MatchReports makes of it and the watch. The
// transfer takes well under a second; the sender is killed after 8.
func corruptedTransfer(t *testing.T, b *Bed, bin string) (*Watch, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	client, server := b.Pod(1, 1), b.Pod(2, 1)
	Must(t, b.CorruptSegment(1, 1, 50))
	srv, err := b.StartTrafficServer(ctx, bin, server, 5201, true)
	Must(t, err)
	w := b.WatchPayload(t)
	sent, sendErr := b.Send(ctx, bin, client, srv.Addr, true, "-bytes", "8000000")
	Must(t, srv.Stop())
	got, err := srv.Reports()
	Must(t, err)
	if sendErr != nil && len(sent) == 0 {
		return w, sendErr
	}
	_, err = MatchReports(sent, got)
	return w, err
}

// A segment whose payload changes on the wire, its checksum left as it
// was, reaches the receiving pod: between namespaces nothing below MPTCP
// checks a checksum the sender's kernel left to be computed. The transfer
// must fail as a changed stream naming exactly the changed byte (never as
// a stall that a test could retry), and the watch must keep the evidence.
func TestChangedSegmentFailsAsAChangedStreamWithEvidence(t *testing.T) {
	RequireTools(t, CaptureTools...)
	b := NewForTest(t, Config{Nodes: 2, NICs: 1, PodsPerNode: 1, LinkRate: "200mbit"})
	w, err := corruptedTransfer(t, b, BuildTraffic(t))
	var te *TrafficError
	if !errors.As(err, &te) || !te.Changed() {
		t.Fatalf("MatchReports: %v, want a changed stream", err)
	}
	v := te.Failures[0].Got.Verification
	if len(v.Ranges) != 1 || v.Ranges[0].End-v.Ranges[0].Start != 1 || v.Samples[0].FoundAt != -1 {
		t.Errorf("verification %+v, want one changed byte that was never sent", v)
	}
	t.Logf("reported as: %v", err)

	dir := w.save(err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, want := range []string{"failure.txt", b.Pod(1, 1).NetNS + "-ss.txt", b.Pod(2, 1).NetNS + "-nstat.txt", "*node1-nic1.pcapng", "*node2-nic1.pcapng"} {
		if m, _ := filepath.Glob(filepath.Join(dir, want)); len(m) != 1 {
			t.Errorf("evidence %s: no %s", dir, want)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "failure.txt")); !strings.Contains(string(b), "changed") {
		t.Errorf("failure.txt says %q", b)
	}
	// The packet that carried the changed byte, as both ends' wires saw it.
	carriers, err := os.ReadFile(filepath.Join(dir, "changed-packets.txt"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("changed-packets.txt:\n%s", carriers)
	// The sender's wire saw the bytes as sent (a capture taps a packet
	// before tc ingress changes it), the receiver's the changed ones: the
	// change happened in between.
	for _, want := range []string{"node1 nic1 out", "node2 nic1 in"} {
		if !strings.Contains(string(carriers), want) {
			t.Errorf("changed-packets.txt names no packet seen at %s", want)
		}
	}
	// The connection's start, per node: its handshake and its first data
	// with data sequence numbers and data ACKs.
	for _, node := range []string{"node1", "node2"} {
		start, err := os.ReadFile(filepath.Join(dir, "connection-start-0-"+node+".txt"))
		if err != nil {
			t.Fatal(err)
		}
		if s := string(start); !strings.Contains(s, "[0]") || !strings.Contains(s, " dsn 1 ") || !strings.Contains(s, " ack ") {
			t.Errorf("connection-start-0-%s.txt shows no MP_CAPABLE handshake or first mapping:\n%.2000s", node, s)
		}
	}
	for _, line := range strings.Split(string(carriers), "\n") {
		switch {
		case strings.Contains(line, "node1 nic1 out") && !strings.Contains(line, "payload as sent"):
			t.Errorf("the sender's wire saw a changed payload: %s", line)
		case strings.Contains(line, "node2 nic1 in") && !strings.Contains(line, "PAYLOAD DIFFERS"):
			t.Errorf("the receiver's wire did not see the changed payload: %s", line)
		}
	}
}

// checksumCounters logs the MPTCP counters of a DSS checksum failure in
// both pods and returns the receiving pod's data checksum errors.
func checksumCounters(t *testing.T, b *Bed) float64 {
	t.Helper()
	for _, name := range []string{"MPTcpExtDataCsumErr", "MPTcpExtMPFailTx", "MPTcpExtMPFailRx", "MPTcpExtMPRstTx", "MPTcpExtInfiniteMapTx", "MPTcpExtInfiniteMapRx"} {
		for _, p := range []*Pod{b.Pod(1, 1), b.Pod(2, 1)} {
			v, err := b.KernelCounter(p.NetNS, name)
			Must(t, err)
			t.Logf("%s %s = %v", p.Name, name, v)
		}
	}
	v, err := b.KernelCounter(b.Pod(2, 1).NetNS, "MPTcpExtDataCsumErr")
	Must(t, err)
	return v
}

// enableChecksums turns on DSS checksums (RFC 8684 3.3.1) in both pods.
func enableChecksums(t *testing.T, b *Bed) {
	t.Helper()
	for _, p := range []*Pod{b.Pod(1, 1), b.Pod(2, 1)} {
		Must(t, b.Sysctl(p.NetNS, "net.mptcp.checksum_enabled", "1"))
	}
}

// With DSS checksums on in both pods and a second subflow to fall back on,
// MPTCP itself catches the same change: the receiver counts a data
// checksum error, resets the subflow that carried it (MP_FAIL, then
// MP_TCPRST), the data goes again over the other subflow, and the stream
// arrives whole.
func TestDSSChecksumsRecoverAChangedSegmentOverAnotherSubflow(t *testing.T) {
	RequireTools(t, CaptureTools...)
	b := NewForTest(t, Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "200mbit"})
	enableChecksums(t, b)
	ports := []int{5202}
	Must(t, b.HandRoute(ports))
	Must(t, b.ConfigureSignalPorts(b.Pod(2, 1), ports))
	Must(t, b.ConfigureClientLimits(b.Pod(1, 1), 2, 1))
	w, err := corruptedTransfer(t, b, BuildTraffic(t))
	errs := checksumCounters(t, b)
	if err != nil {
		w.Fail(err)
	}
	if errs < 1 {
		t.Errorf("the receiving pod counted %v data checksum errors, want the changed segment's", errs)
	}
	if rst, _ := b.KernelCounter(b.Pod(2, 1).NetNS, "MPTcpExtMPRstTx"); rst < 1 {
		t.Errorf("the receiving pod reset %v subflows, want the one that carried the changed segment", rst)
	}
}

// With a single subflow, this kernel (6.18) detects the change but does not
// recover from it: after MP_FAIL the sender falls back to TCP (an infinite
// mapping) and the connection either stalls for good or delivers the
// changed byte to the application, run by run (docs/testing.md, "DSS
// checksums"). This test pins that behaviour: a kernel that recovers fails
// it, and then the docs and the checksum option's description change.
func TestDSSChecksumsOnASingleSubflowDetectButDoNotRecover(t *testing.T) {
	RequireTools(t, CaptureTools...)
	b := NewForTest(t, Config{Nodes: 2, NICs: 1, PodsPerNode: 1, LinkRate: "200mbit"})
	enableChecksums(t, b)
	_, err := corruptedTransfer(t, b, BuildTraffic(t))
	if errs := checksumCounters(t, b); errs < 1 {
		t.Errorf("the receiving pod counted %v data checksum errors, want the changed segment's", errs)
	}
	var te *TrafficError
	switch {
	case err == nil:
		t.Errorf("the stream arrived whole over a single subflow: this kernel recovers from a DSS checksum failure; update docs/testing.md and this test")
	case errors.As(err, &te) && te.Changed():
		t.Logf("the changed byte reached the application: %v", err)
	default:
		t.Logf("the connection stalled: %v", err)
	}
}

// The MP_CAPABLE stripper on the server's wire makes an MPTCP client see a
// TCP server, and the server's connection fall back to TCP after it offered
// MPTCP (MPTcpExtMPCapableFallbackACK), with the stream whole; once removed,
// the next connection is MPTCP again.
func TestStrippedMPCapableMakesTheServerFallBack(t *testing.T) {
	b := NewForTest(t, Config{Nodes: 2, NICs: 1, PodsPerNode: 1, LinkRate: "200mbit"})
	bin := BuildTraffic(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	client, server := b.Pod(1, 1), b.Pod(2, 1)
	stripped, remove, err := b.StripMPCapable(2, 1)
	Must(t, err)
	srv, err := b.StartTrafficServer(ctx, bin, server, 5202, true)
	Must(t, err)
	defer srv.Stop()
	sent, err := b.Send(ctx, bin, client, srv.Addr, true, "-bytes", "100000")
	Must(t, err)
	if len(sent) != 1 || sent[0].MPTCP {
		t.Errorf("through the stripper the client's connection reports %+v, want one TCP connection", sent)
	}
	got, err := srv.WaitReports(ctx, 1)
	Must(t, err)
	if _, err := MatchReports(sent, got); err != nil {
		t.Fatal(err)
	}
	if n, err := stripped(); err != nil || n < 1 {
		t.Errorf("the stripper changed %d SYN-ACKs (%v), want the connection's", n, err)
	}
	if v, err := b.KernelCounter(server.NetNS, "MPTcpExtMPCapableFallbackACK"); err != nil || v < 1 {
		t.Errorf("server's MPTcpExtMPCapableFallbackACK = %v (%v), want the connection that fell back", v, err)
	}
	Must(t, remove())
	sent, err = b.Send(ctx, bin, client, srv.Addr, true, "-bytes", "100000")
	Must(t, err)
	if len(sent) != 1 || !sent[0].MPTCP {
		t.Errorf("with the stripper removed the client's connection reports %+v, want MPTCP", sent)
	}
	got, err = srv.WaitReports(ctx, 2)
	Must(t, err)
	if _, err := MatchReports(sent, got[1:]); err != nil {
		t.Fatal(err)
	}
}
