package e2e

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/observe"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// A peer's join that reaches the node by an interface no path names (here a
// link straight between the two nodes, as a management network or an
// overlay's tunnel is) is refused with MP_TCPRST all the same, where a path's
// NIC would have let it in: the server's node holds maxSubflows 2 (the first
// subflow and one join), and the client's node, which runs no agent, sends
// the join to one of the two ports the server pod announces over the side
// link, the other join and everything else over the fabrics. Whatever order
// the joins come in, the server pod receives only the one that came by a
// path, the client's kernel takes the reset of the other (its attempt
// fails), and the transfer completes with every byte.
func testJoinByAnInterfaceOfNoPathIsRefused(t *testing.T) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "100mbit"})
	client, server := bed.Pod(1, 1), bed.Pod(2, 1)
	const sidePort = 5312
	side, err := bed.AddSideLink(1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := bed.RouteTCPPortOver(side, sidePort); err != nil {
		t.Fatal(err)
	}
	// The route the client's node takes for the join: the side link.
	out, err := bed.Command(side.A.NetNS, "ip", "route", "get", server.Addr.String(), "from", client.Addr.String(), "iif", client.HostIf,
		"ipproto", "tcp", "dport", strconv.Itoa(sidePort)).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "dev "+side.AIf) {
		t.Fatalf("node 1's route for the join to port %d: %s (%v), want dev %s", sidePort, out, err, side.AIf)
	}
	ctx := background(t)
	rule := mptcpv1alpha1.CompiledRule{SubflowCreation: mptcpv1alpha1.SubflowCreationGuest, MaxSubflows: 2}
	agent, err := framework.StartAgent(ctx, bed, bins.Agent, server.Node, framework.AgentConfig(bed, server.Node, rule), declaredCaps)
	if err != nil {
		t.Fatal(err)
	}
	if err := bed.ConfigureSignalPorts(server, []int{5311, sidePort}); err != nil {
		t.Fatal(err)
	}
	if err := bed.ConfigureClientLimits(client, 2, 2); err != nil {
		t.Fatal(err)
	}
	bed.AwaitJoins(client, 1)
	joinsRx0 := nstatValue(t, bed, server.NetNS, "MPTcpExtMPJoinSynRx")
	fails0 := nstatValue(t, bed, client.NetNS, "TcpAttemptFails")
	sideRx0, err := bed.SideLinkRxPackets(side)
	if err != nil {
		t.Fatal(err)
	}

	const port = 5404
	srv, err := bed.StartTrafficServer(ctx, bins.Traffic, server, port, true)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Stop() }()
	w := bed.Watch(t, framework.DatapathEvidence(bed))
	defer w.Close()
	sent, err := bed.Send(ctx, bins.Traffic, client, netip.AddrPortFrom(server.Addr, port), true, "-conns", "1", "-duration", "3s")
	finishTransfer(t, w, srv, sent, err)
	if n, err := bed.SideLinkRxPackets(side); err != nil || n == sideRx0 {
		t.Errorf("node 2 received %d packets on the side link (%v), want the join", n-sideRx0, err)
	}
	if n := nstatValue(t, bed, server.NetNS, "MPTcpExtMPJoinSynRx") - joinsRx0; n != 1 {
		t.Errorf("the server pod received %v join SYNs, want 1: the join by the side link must be refused before it", n)
	}
	if n := nstatValue(t, bed, client.NetNS, "TcpAttemptFails") - fails0; n != 1 {
		t.Errorf("the client pod's kernel saw %v connection attempts fail, want the refused join's", n)
	}
	if refused, _ := scrape(t, agent).Value("mptcp_agent_datapath_events_total", "event", observe.EventName(datapath.StatJoinRefused)); refused < 1 {
		t.Errorf("the server node's agent counted %v refused joins, want at least 1", refused)
	}
}
