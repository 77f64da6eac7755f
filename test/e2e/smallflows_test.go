package e2e

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// A connection the pod opens waits for its joins until it has carried the
// rule's threshold (docs/subflows.md, "Small flows"): the captures show
// connections that end before it with their first subflow alone, and one
// that carries more with its join, opened no sooner than the link could
// carry the threshold. The threshold changed on the live rule (the node
// state the controller writes for a changed policy) reaches the next
// connections: the same flows then get their join at once.
func testShortConnectionsStayOnOnePathLongOnesGetJoinsAfterTheThreshold(t *testing.T) {
	// Connections of 1 MB under a threshold of 4 MiB, one of 8 MB past it.
	// Not smaller ones: the kernel takes a join only while both ends may
	// send, and an application that writes a few hundred KB and shuts
	// its side down at once can do so before a join opened at once is
	// asked for; 1 MB at 100 Mbit/s keeps the sender writing for 80 ms.
	const (
		rate      = 100e6 // bits per second of each link
		threshold = 4 << 20
		short     = 1_000_000 // bytes: under the threshold
		long      = 8_000_000
	)
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "100mbit"})
	ctx := background(t)
	agents, err := framework.StartAgents(ctx, bed, bins.Agent, mptcpv1alpha1.CompiledRule{
		SubflowCreation: mptcpv1alpha1.SubflowCreationUserspace, JoinAfterBytes: threshold})
	if err != nil {
		t.Fatal(err)
	}
	client, server := bed.Pod(1, 1), bed.Pod(2, 1)
	srv, err := bed.StartTrafficServer(ctx, bins.Traffic, server, 5201, true)
	if err != nil {
		t.Fatal(err)
	}
	w := bed.Watch(t, framework.DatapathEvidence(bed))
	to := netip.AddrPortFrom(server.Addr, 5201)
	send := func(seed, conns int, bytes int64) []testbed.SenderReport {
		sent, err := bed.Send(ctx, bins.Traffic, client, to, true,
			"-conns", fmt.Sprint(conns), "-serial", "-bytes", fmt.Sprint(bytes), "-seed", fmt.Sprint(seed))
		if err != nil {
			w.Fail(err)
		}
		return sent
	}
	shortBefore := send(1, 3, short)
	longBefore := send(2, 1, long)
	for _, a := range agents {
		if err := a.Reconfigure(ctx, func(c *framework.NodeConfig) {
			c.Rule().JoinAfterBytes = 0
			c.Rule().PolicyGeneration++
		}); err != nil {
			t.Fatal(err)
		}
	}
	shortAfter := send(3, 3, short)
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	got, err := srv.Reports()
	if err != nil {
		t.Fatal(err)
	}
	all := append(append(append([]testbed.SenderReport{}, shortBefore...), longBefore...), shortAfter...)
	w.Match(all, got)
	analysis := analyzeWatched(t, w)

	byClient := map[netip.AddrPort]*testbed.Connection{}
	for _, c := range analysis.Connections {
		byClient[c.Subflows[0].Src] = c
	}
	conn := func(r testbed.SenderReport) *testbed.Connection {
		c := byClient[netip.MustParseAddrPort(r.Local)]
		if c == nil {
			t.Fatalf("the captures show no MPTCP connection from %s", r.Local)
		}
		return c
	}
	for _, r := range shortBefore {
		if c := conn(r); len(c.Subflows) != 1 {
			t.Errorf("a connection of %d bytes under a threshold of %d has %d subflows, want its first alone: %v", short, threshold, len(c.Subflows), c.Subflows)
		}
	}
	c := conn(longBefore[0])
	if len(c.Subflows) != 2 {
		t.Fatalf("a connection of %d bytes has %d subflows, want 2 (its join once past the threshold): %v", long, len(c.Subflows), c.Subflows)
	}
	// The link carries the threshold, less what its token bucket lets
	// through at once, in no less than this: a join opened sooner was not
	// held back.
	earliest := time.Duration(float64(threshold-testbed.MinLinkBurst) * 8 / rate * float64(time.Second))
	if after := c.Subflows[1].Opened.Sub(c.Subflows[0].Opened); after < earliest {
		t.Errorf("the long connection's join was opened %v after its first SYN, before the %v its link needs to carry the threshold", after, earliest)
	} else {
		t.Logf("the long connection's join was opened %v after its first SYN (the threshold needs %v on the link)", after, earliest)
	}
	for _, r := range shortAfter {
		if c := conn(r); len(c.Subflows) != 2 {
			t.Errorf("after the threshold went to 0, a connection of %d bytes has %d subflows, want 2 (its join at once): %v", short, len(c.Subflows), c.Subflows)
		}
	}
}
