package e2e

import (
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/observe"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// ssMPTCPFlags matches the subflow flags ss prints for an MPTCP subflow
// (iproute2: "tcp-ulp-mptcp flags:Jjecv ..."; B: the peer asked for backup,
// i.e. the kernel treats the subflow as backup for its own sending).
var ssMPTCPFlags = regexp.MustCompile(`tcp-ulp-mptcp flags:(\S+)`)

// A rule with fabric-b as a backup path, on both nodes: the client pod's
// join lands on fabric-b and, flagged by its node's agent on the way in, the
// pod's kernel holds that subflow as backup (ss shows B). While fabric-a is
// up the backup subflow carries under 5 % of what the pod sends; the
// connection stays MPTCP and every byte arrives.
func testBackupSubflowIsBackupInThePodAndCarriesAlmostNothing(t *testing.T) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "100mbit"})
	rule := mptcpv1alpha1.CompiledRule{Paths: framework.PathsNamed(framework.PathName(1)), BackupPaths: []string{framework.PathName(2)}, HeaderRewriting: true}
	agents, err := framework.StartAgents(background(t), bed, bins.Agent, rule, declaredCaps)
	if err != nil {
		t.Fatal(err)
	}
	ctx := background(t)
	client, server := bed.Pod(1, 1), bed.Pod(2, 1)
	const port = 5401
	srv, err := bed.StartTrafficServer(ctx, bins.Traffic, server, port, true)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Stop() }()
	w := bed.Watch(t, framework.DatapathEvidence(bed))
	defer w.Close()

	_, tx0 := nicBytes(t, bed, bed.Node(1))
	type result struct {
		sent []testbed.SenderReport
		err  error
	}
	done := make(chan result, 1)
	go func() {
		sent, err := bed.Send(ctx, bins.Traffic, client, netip.AddrPortFrom(server.Addr, port), true, "-conns", "1", "-duration", "6s")
		done <- result{sent, err}
	}()
	// Mid-transfer, the client pod's kernel: two subflows, the one on the
	// backup path flagged B.
	time.Sleep(3 * time.Second)
	requireOneBackupSubflow(t, bed, client)
	r := <-done
	_, tx1 := nicBytes(t, bed, bed.Node(1))
	finishTransfer(t, w, srv, r.sent, r.err)
	active, backup := float64(tx1[0]-tx0[0]), float64(tx1[1]-tx0[1])
	t.Logf("node 1 sent %.1f MB on the active path, %.3f MB on the backup path (%.2f%%)", active/1e6, backup/1e6, 100*backup/(active+backup))
	if backup/(active+backup) >= 0.05 {
		t.Errorf("the backup path carried %.2f%% of the bytes, want under 5%%", 100*backup/(active+backup))
	}
	var flagged float64
	s := scrape(t, agents[0])
	flagged, _ = s.Value("mptcp_agent_datapath_events_total", "event", observe.EventName(datapath.StatBackupFlagged))
	if flagged < 1 {
		t.Errorf("node 1's agent counted %v joins flagged backup, want at least 1", flagged)
	}
}

// requireOneBackupSubflow fails the test unless pod's kernel has two
// established MPTCP subflows, exactly one of them held as backup (B).
func requireOneBackupSubflow(t *testing.T, bed *testbed.Bed, pod *testbed.Pod) {
	t.Helper()
	out, err := bed.Command(pod.NetNS, "ss", "-tniH", "state", "established").CombinedOutput()
	if err != nil {
		t.Fatalf("ss in %s: %v: %s", pod.Name, err, out)
	}
	var flags []string
	backups := 0
	for _, m := range ssMPTCPFlags.FindAllStringSubmatch(string(out), -1) {
		flags = append(flags, m[1])
		if strings.Contains(m[1], "B") {
			backups++
		}
	}
	if len(flags) != 2 || backups != 1 {
		t.Errorf("%s's subflows have flags %v, want two subflows, one with B (backup):\n%s", pod.Name, flags, out)
	}
}

// A path that becomes a backup path while a connection runs on it: the
// agent's reload makes the rule say so, the next pure ACK into the pod
// carries an MP_PRIO, and the pod's kernel moves its sending off that
// subflow (ss shows B; under 5 % of what the pod sends after the change
// goes that way). The connection stays MPTCP and every byte arrives.
func testPathMadeBackupMidConnectionIsToldWithMPPrio(t *testing.T) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "100mbit"})
	agents, err := framework.StartAgents(background(t), bed, bins.Agent, mptcpv1alpha1.CompiledRule{HeaderRewriting: true}, declaredCaps)
	if err != nil {
		t.Fatal(err)
	}
	ctx := background(t)
	client, server := bed.Pod(1, 1), bed.Pod(2, 1)
	const port = 5402
	srv, err := bed.StartTrafficServer(ctx, bins.Traffic, server, port, true)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Stop() }()
	w := bed.Watch(t, framework.DatapathEvidence(bed))
	defer w.Close()
	type result struct {
		sent []testbed.SenderReport
		err  error
	}
	done := make(chan result, 1)
	go func() {
		sent, err := bed.Send(ctx, bins.Traffic, client, netip.AddrPortFrom(server.Addr, port), true, "-conns", "1", "-duration", "10s")
		done <- result{sent, err}
	}()
	// Both subflows placed (a loaded machine may take longer than usual
	// to open the join), then a second for the scheduler to use both.
	waitPlaced(t, bed, agents[0], client, 2)
	time.Sleep(time.Second)
	_, tx0 := nicBytes(t, bed, bed.Node(1))
	time.Sleep(time.Second)
	_, tx1 := nicBytes(t, bed, bed.Node(1))
	if d := tx1[1] - tx0[1]; d < 1e6 {
		sfs, _ := agents[0].Subflows()
		t.Fatalf("before the change fabric-b carried %d bytes in a second: the subflow is not spread, the test proves nothing (subflows: %+v)", d, sfs)
	}

	if err := agents[0].Reconfigure(ctx, func(cfg *framework.NodeConfig) {
		cfg.Rule().Paths, cfg.Rule().BackupPaths = framework.PathsNamed(framework.PathName(1)), []string{framework.PathName(2)}
	}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	_, tx2 := nicBytes(t, bed, bed.Node(1))
	time.Sleep(4 * time.Second)
	_, tx3 := nicBytes(t, bed, bed.Node(1))
	requireOneBackupSubflow(t, bed, client)
	active, backup := float64(tx3[0]-tx2[0]), float64(tx3[1]-tx2[1])
	t.Logf("after the change node 1 sent %.1f MB on fabric-a, %.3f MB on fabric-b (%.2f%%)", active/1e6, backup/1e6, 100*backup/(active+backup))
	if backup/(active+backup) >= 0.05 {
		t.Errorf("the path made backup carried %.2f%% of the bytes after the change, want under 5%%", 100*backup/(active+backup))
	}
	r := <-done
	finishTransfer(t, w, srv, r.sent, r.err)
	sent, _ := scrape(t, agents[0]).Value("mptcp_agent_datapath_events_total", "event", observe.EventName(datapath.StatBackupPrioSent))
	if sent < 1 {
		t.Errorf("node 1's agent counted %v MP_PRIO sent, want at least 1", sent)
	}
}

// nstatValue reads one of the kernel's counters in the network namespace ns.
func nstatValue(t *testing.T, bed *testbed.Bed, ns, name string) float64 {
	t.Helper()
	v, err := bed.KernelCounter(ns, name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// A connection that opens more joins than a rule allows (maxSubflows 2:
// the first subflow and one join): the server pod's kernel announces two
// extra ports and would accept both joins, the client's kernel joins both,
// and the node whose rule sets the maximum answers the second with a reset
// carrying MP_TCPRST: the server's node at its NIC (a peer's join), or the
// client's node at the client's veth (its own pod's join; its path manager
// would normally stay within the rule, here the test sets it). The server
// pod never sees that join, the client's kernel takes the reset (the join's
// attempt fails), the connection goes on with two subflows and every byte
// arrives.
func testJoinBeyondTheMaximumIsRefusedWithMPTCPRST(t *testing.T) {
	for _, c := range []struct {
		name      string
		maxOnNode int
	}{{"by the server's node at its NIC", 2}, {"by the client's node at its veth", 1}} {
		t.Run(c.name, func(t *testing.T) { joinRefusedBy(t, c.maxOnNode) })
	}
}

func joinRefusedBy(t *testing.T, maxOnNode int) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "100mbit"})
	client, server := bed.Pod(1, 1), bed.Pod(2, 1)
	// The pods' MPTCP settings are the kernel path manager's, set here;
	// the agents only steer and refuse.
	agents, err := framework.StartAgentsWith(background(t), bed, bins.Agent, func(n *testbed.Node) mptcpv1alpha1.CompiledRule {
		r := mptcpv1alpha1.CompiledRule{SubflowCreation: mptcpv1alpha1.SubflowCreationGuest}
		if n.Index == maxOnNode {
			r.MaxSubflows = 2
		}
		return r
	}, declaredCaps)
	if err != nil {
		t.Fatal(err)
	}
	if err := bed.ConfigureSignalPorts(server, []int{5311, 5312}); err != nil {
		t.Fatal(err)
	}
	if err := bed.ConfigureClientLimits(client, 2, 2); err != nil {
		t.Fatal(err)
	}
	// One of the two joins is refused: the sender waits for the other.
	bed.AwaitJoins(client, 1)
	joinsRx0 := nstatValue(t, bed, server.NetNS, "MPTcpExtMPJoinSynRx")
	// A reset in SYN-SENT ends the join's attempt (tcpAttemptFails): the
	// kernel accepted it. (MPTcpExtMPRstRx counts MP_TCPRST on
	// established subflows only.)
	fails0 := nstatValue(t, bed, client.NetNS, "TcpAttemptFails")

	ctx := background(t)
	const port = 5403
	srv, err := bed.StartTrafficServer(ctx, bins.Traffic, server, port, true)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Stop() }()
	w := bed.Watch(t, framework.DatapathEvidence(bed))
	defer w.Close()
	sent, err := bed.Send(ctx, bins.Traffic, client, netip.AddrPortFrom(server.Addr, port), true, "-conns", "1", "-duration", "4s")
	finishTransfer(t, w, srv, sent, err)
	if n := nstatValue(t, bed, server.NetNS, "MPTcpExtMPJoinSynRx") - joinsRx0; n != 1 {
		t.Errorf("the server pod received %v join SYNs, want 1: the second must be refused before it", n)
	}
	if n := nstatValue(t, bed, client.NetNS, "TcpAttemptFails") - fails0; n != 1 {
		t.Errorf("the client pod's kernel saw %v connection attempts fail, want the refused join's", n)
	}
	refused, _ := scrape(t, agents[maxOnNode-1]).Value("mptcp_agent_datapath_events_total", "event", observe.EventName(datapath.StatJoinRefused))
	if refused < 1 {
		t.Errorf("node %d's agent counted %v refused joins, want at least 1", maxOnNode, refused)
	}
}
