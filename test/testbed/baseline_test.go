package testbed

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// reversePathDrops reads TcpExtIPReversePathFilter (packets strict rp_filter dropped) of a namespace.
func reversePathDrops(t *testing.T, b *Bed, ns string) int {
	t.Helper()
	out, err := b.Command(ns, "cat", "/proc/net/netstat").Output()
	Must(t, err)
	lines := strings.Split(string(out), "\n")
	for i := 0; i+1 < len(lines); i += 2 {
		keys, vals := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		for j := range keys {
			if keys[j] == "IPReversePathFilter" && j < len(vals) {
				v, _ := strconv.Atoi(vals[j])
				return v
			}
		}
	}
	t.Fatalf("no IPReversePathFilter counter in %s", ns)
	return 0
}

// testHandRoutedBaselineUsesBothNICs runs the hand-routed baseline on two 200 Mbit/s NICs: a server pod announces
// port 5202, the nodes route that port over NIC 2, and one MPTCP connection should use both NICs and get close to
// twice the goodput of a single TCP connection measured on the same bed.
func testHandRoutedBaselineUsesBothNICs(t *testing.T) {
	const rate = "200mbit"
	b := NewForTest(t, Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: rate})
	bin := BuildTraffic(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	client, server := b.Pod(1, 1), b.Pod(2, 1)
	linkRate, _ := ParseRate(rate)

	single := singlePath(t, ctx, b, bin, client, server, 5301)
	t.Logf("single-path TCP: %s over [1 s, 5 s] (%.3f of %s)", Mbps(single.GoodputBps), single.GoodputBps/linkRate, rate)

	ports := []int{5202}
	Must(t, b.HandRoute(ports))
	Must(t, b.ConfigureSignalPorts(server, ports))
	Must(t, b.ConfigureClientLimits(client, 2, 1))
	// DSS checksums on, as the product's default: without them this
	// kernel sometimes places data at the wrong DSN when a connection's
	// subflows deliver out of order at its start, with no agent at all
	// (docs/testing.md, "Data integrity"; seen here too, a range of the
	// first 100 KB holding bytes from 24 KB further on).
	for _, p := range []*Pod{client, server} {
		Must(t, b.Sysctl(p.NetNS, "net.mptcp.checksum_enabled", "1"))
	}
	srv, err := b.StartTrafficServer(ctx, bin, server, 5201, true, "-warmup", "1s", "-window", "4s")
	Must(t, err)
	// The machine is shared (2 cores; other tests and builds may run): a measurement below the bar is repeated
	// once, and every attempt is logged.
	var r ServerReport
	var ratio float64
	for attempt := 1; attempt <= 2; attempt++ {
		before := counters(t, b)
		w := b.Watch(t)
		sent, err := b.Send(ctx, bin, client, srv.Addr, true, "-duration", "6s")
		Must(t, err)
		// The client's kernel opened its join before the first byte:
		// nothing else does, and Send waited for it.
		if sent[0].JoinsAwaited != 1 || sent[0].JoinWaitTimedOut {
			t.Errorf("the sender started with %d joins (timed out: %v), want the 1 join its kernel opens before any data",
				sent[0].JoinsAwaited, sent[0].JoinWaitTimedOut)
		}
		got, err := srv.WaitReports(ctx, attempt)
		Must(t, err)
		m := w.Match(sent, got)
		w.Close()
		d := delta(before, counters(t, b))
		r = m[sent[0].Local]
		if !r.MPTCP || !sent[0].MPTCP {
			t.Fatalf("the connection fell back to TCP (server mptcp=%v, client mptcp=%v)", r.MPTCP, sent[0].MPTCP)
		}
		ratio = r.GoodputBps / single.GoodputBps
		t.Logf("attempt %d: hand-routed MPTCP over 2 NICs: %s over [1 s, 5 s] = %.2fx single path", attempt, Mbps(r.GoodputBps), ratio)
		t.Logf("attempt %d: bytes sent per NIC: node1 nic1 %d nic2 %d; node2 nic1 rx %d nic2 rx %d", attempt, d[0][0][1], d[0][1][1], d[1][0][0], d[1][1][0])
		for k := range 2 {
			// Each NIC carried at least a third of the data in the forward direction, and ACKs came back on it.
			if d[0][k][1] < uint64(r.Bytes/3) || d[1][k][0] < uint64(r.Bytes/3) {
				t.Errorf("nic%d carried too little of the %d bytes: node1 tx %d, node2 rx %d", k+1, r.Bytes, d[0][k][1], d[1][k][0])
			}
			if d[1][k][1] == 0 || d[0][k][0] == 0 {
				t.Errorf("nic%d carried no ACKs back", k+1)
			}
		}
		if ratio >= 1.7 || t.Failed() {
			break
		}
		if attempt == 1 {
			// Counted in make test's summary with the stall retries: a
			// measurement taken again, its stream whole.
			recordRetry(t, "goodput below 1.7x single path on a shared machine: measured once more", "")
		}
	}
	if ratio < 1.7 {
		t.Errorf("MPTCP goodput is %.2fx single path, want >= 1.7x", ratio)
	}
	for _, n := range b.Nodes {
		if drops := reversePathDrops(t, b, n.NetNS); drops != 0 {
			t.Errorf("strict rp_filter dropped %d packets in %s", drops, n.NetNS)
		}
	}
}

// TestPortRulesNeedPodCIDRRule records the rp_filter finding behind HandRoute's "to <pod CIDR> lookup main" rule:
// with the port rules alone, strict rp_filter on the client node drops the client pod's join SYNs (its reverse
// lookup swaps the ports and lands in table 102, which points at nic2, not at the pod), so the connection stays on
// nic1; with the pod CIDR rule added, the join comes up and uses nic2.
func TestPortRulesNeedPodCIDRRule(t *testing.T) {
	b := NewForTest(t, Config{Nodes: 2, NICs: 2, PodsPerNode: 1})
	bin := BuildTraffic(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client, server := b.Pod(1, 1), b.Pod(2, 1)
	Must(t, b.HandRoute([]int{5202}))
	Must(t, b.ConfigureSignalPorts(server, []int{5202}))
	Must(t, b.ConfigureClientLimits(client, 2, 1))
	srv, err := b.StartTrafficServer(ctx, bin, server, 5201, true)
	Must(t, err)
	transfer := func() (nic2 uint64) {
		t.Helper()
		before := counters(t, b)
		_, err := b.Send(ctx, bin, client, srv.Addr, true, "-duration", "1s")
		Must(t, err)
		return delta(before, counters(t, b))[0][1][1]
	}

	for _, n := range b.Nodes {
		Must(t, ipBatch(ctx, n.NetNS, "rule del pref 1000"))
	}
	nic2 := transfer()
	drops := reversePathDrops(t, b, b.Node(1).NetNS)
	t.Logf("port rules only: node1 nic2 sent %d bytes, rp_filter drops on node1: %d", nic2, drops)
	if drops == 0 || nic2 > 100000 {
		t.Errorf("without the pod CIDR rule, expected rp_filter drops and an idle nic2; got %d drops, %d bytes", drops, nic2)
	}

	for _, n := range b.Nodes {
		Must(t, ipBatch(ctx, n.NetNS, fmt.Sprintf("rule add pref 1000 to %s lookup main", n.PodCIDR)))
	}
	nic2 = transfer()
	t.Logf("with the pod CIDR rule: node1 nic2 sent %d bytes", nic2)
	if nic2 < 1<<20 {
		t.Errorf("with the pod CIDR rule, the join should carry data on nic2; it sent %d bytes", nic2)
	}
}
