package e2e

import (
	"context"
	"fmt"
	"maps"
	"math"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/observe"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// declaredCaps runs an agent with exactly the capabilities it declares
// (docs/agent.md), as the test bed runs agents (docs/design.md, "Where it
// runs in tests").
var declaredCaps = framework.WithCapabilities(framework.AgentCapabilities...)

func scrape(t *testing.T, a *framework.Agent) framework.Scrape {
	t.Helper()
	s, err := a.Scrape()
	if err != nil {
		t.Fatalf("node %d: %v", a.Node.Index, err)
	}
	return s
}

func metric(t *testing.T, s framework.Scrape, name string, labels ...string) float64 {
	t.Helper()
	v, ok := s.Value(name, labels...)
	if !ok {
		t.Fatalf("no series %s%v", name, labels)
	}
	return v
}

func nicBytes(t *testing.T, bed *testbed.Bed, node *testbed.Node) (rx, tx []uint64) {
	t.Helper()
	for _, nic := range node.NICs {
		r, x, err := bed.NICCounters(node, nic.Index)
		if err != nil {
			t.Fatal(err)
		}
		rx, tx = append(rx, r), append(tx, x)
	}
	return rx, tx
}

// What Prometheus scrapes from the agent is what the NICs carried: over a
// transfer from node 1 to node 2 spread over both NICs, each path's tx bytes
// on node 1 and rx bytes on node 2 are within 5 % of the NIC's own counters.
// The scrape happens inside the node namespace, as Prometheus would reach
// an agent on host networking.
func testScrapedPathBytesMatchNICCounters(t *testing.T) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "100mbit"})
	agents, err := framework.StartAgents(background(t), bed, bins.Agent, mptcpv1alpha1.CompiledRule{}, declaredCaps)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range agents {
		for _, probe := range []string{"/healthz", "/readyz"} {
			if code, body, err := a.Get(probe); err != nil || code != http.StatusOK {
				t.Fatalf("node %d: %s answered %d %q (%v)", a.Node.Index, probe, code, body, err)
			}
		}
	}
	sender, receiver := agents[0], agents[1]
	before := []framework.Scrape{scrape(t, sender), scrape(t, receiver)}
	_, txBefore := nicBytes(t, bed, bed.Node(1))
	rxBefore, _ := nicBytes(t, bed, bed.Node(2))

	runFlows(t, bed, []flow{{client: bed.Pod(1, 1), server: bed.Pod(2, 1), port: 5201, conns: 1}}, 3*time.Second)

	after := []framework.Scrape{scrape(t, sender), scrape(t, receiver)}
	_, txAfter := nicBytes(t, bed, bed.Node(1))
	rxAfter, _ := nicBytes(t, bed, bed.Node(2))

	for k := 1; k <= 2; k++ {
		path := framework.PathName(k)
		for _, c := range []struct {
			node          int
			metric        string
			nicDelta      uint64
			before, after framework.Scrape
		}{
			{1, "mptcp_agent_path_tx_bytes_total", txAfter[k-1] - txBefore[k-1], before[0], after[0]},
			{2, "mptcp_agent_path_rx_bytes_total", rxAfter[k-1] - rxBefore[k-1], before[1], after[1]},
		} {
			scraped := metric(t, c.after, c.metric, "path", path) - metric(t, c.before, c.metric, "path", path)
			nic := float64(c.nicDelta)
			t.Logf("node %d %s: scraped %.0f bytes, nic%d counted %.0f (%+.2f %%)", c.node, c.metric, scraped, k, nic, 100*(scraped-nic)/nic)
			// 3 s at 100 Mbit/s is 37 MB; a path that carried under 5 MB
			// was not used, and agreement on it would prove nothing.
			if nic < 5e6 {
				t.Errorf("node %d nic%d carried only %.0f bytes: the transfer did not use both paths", c.node, k, nic)
			}
			if math.Abs(scraped-nic) > 0.05*nic {
				t.Errorf("node %d path %s: %s grew by %.0f, nic%d by %.0f: more than 5 %% apart", c.node, path, c.metric, scraped, k, nic)
			}
		}
		if n := metric(t, after[0], "mptcp_agent_subflows", "path", path, "role", "initiator"); n < 1 {
			t.Errorf("node 1: no subflow placed on %s in mptcp_agent_subflows", path)
		}
		if n := metric(t, after[1], "mptcp_agent_subflows", "path", path, "role", "responder"); n < 1 {
			t.Errorf("node 2: no subflow mirrored on %s in mptcp_agent_subflows", path)
		}
	}
	events := func(s framework.Scrape, stat datapath.Stat) float64 {
		return metric(t, s, "mptcp_agent_datapath_events_total", "event", observe.EventName(stat))
	}
	if n := events(after[0], datapath.StatSubflowPlaced) - events(before[0], datapath.StatSubflowPlaced); n < 2 {
		t.Errorf("node 1 placed %v subflows, want the connection's 2", n)
	}
	if n := events(after[1], datapath.StatSubflowMirrored) - events(before[1], datapath.StatSubflowMirrored); n < 2 {
		t.Errorf("node 2 mirrored %v subflows, want the connection's 2", n)
	}
	for i, s := range after {
		if n := metric(t, s, "mptcp_agent_reconcile_duration_seconds"); n < 1 {
			t.Errorf("node %d: %v reconciles observed", i+1, n)
		}
		if n := metric(t, s, "mptcp_agent_reconcile_errors_total"); n != 0 {
			t.Errorf("node %d: %v reconcile errors", i+1, n)
		}
		if n := metric(t, s, "mptcp_agent_endpoints"); n != 1 {
			t.Errorf("node %d: %v endpoints, want its one pod", i+1, n)
		}
	}
}

// The agent can die at any moment (OOM kill, node pressure, a bug). With
// SIGKILL, nothing of its cleanup runs; the pinned datapath keeps steering
// alone, and the next agent adopts it. Checked: the connections of a running
// transfer see no reset and deliver every byte, both NICs keep carrying data
// while no agent runs, no subflow changes path (subflow tables before and
// after, and the captures), and a pod added to the configuration while the
// agent was down is steered once it is back.
func testAgentKilledMidTransferRestartsWithoutDisturbingConnections(t *testing.T) {
	testbed.RequireTools(t, testbed.CaptureTools...)
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 2, LinkRate: "100mbit"})
	ctx := background(t)
	// Node 1 first selects only pod 1; pod 2 joins while the agent is down.
	full := framework.AgentConfig(bed, bed.Node(1), mptcpv1alpha1.CompiledRule{})
	first := full.Copy()
	first.State.Spec.Pods = first.State.Spec.Pods[:1]
	a1, err := framework.StartAgent(ctx, bed, bins.Agent, bed.Node(1), first, declaredCaps)
	if err != nil {
		t.Fatal(err)
	}
	a2, err := framework.StartAgent(ctx, bed, bins.Agent, bed.Node(2), framework.AgentConfig(bed, bed.Node(2), mptcpv1alpha1.CompiledRule{}), declaredCaps)
	if err != nil {
		t.Fatal(err)
	}
	caps, err := bed.StartCaptures("tcp")
	if err != nil {
		t.Fatal(err)
	}

	const conns = 2
	old := startFlows(t, bed, []flow{{client: bed.Pod(1, 1), server: bed.Pod(2, 1), port: 5201, conns: conns}}, 7*time.Second)
	// Wait until every subflow of the transfer is placed: two per connection.
	waitPlaced(t, bed, a1, bed.Pod(1, 1), 2*conns)
	before := map[*framework.Agent][]datapath.Subflow{}
	for _, a := range []*framework.Agent{a1, a2} {
		if before[a], err = a.Subflows(); err != nil {
			t.Fatal(err)
		}
	}

	for _, a := range []*framework.Agent{a1, a2} {
		if err := a.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	if err := a1.WriteConfig(full); err != nil {
		t.Fatal(err)
	}
	// No agent runs on either node: both NICs of node 1 keep sending.
	_, tx0 := nicBytes(t, bed, bed.Node(1))
	time.Sleep(time.Second)
	_, tx1 := nicBytes(t, bed, bed.Node(1))
	for k := range tx0 {
		t.Logf("nic%d of node 1 sent %d bytes in the second without agents", k+1, tx1[k]-tx0[k])
		// 100 Mbit/s is 12.5 MB a second; shared by nothing else.
		if tx1[k]-tx0[k] < 2e6 {
			t.Errorf("nic%d of node 1 sent only %d bytes in the second without agents", k+1, tx1[k]-tx0[k])
		}
	}
	for _, a := range []*framework.Agent{a2, a1} {
		if err := a.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// The restarted agents adopted the tables: every subflow is where it was.
	for _, a := range []*framework.Agent{a1, a2} {
		requireSubflowsKept(t, a, before[a])
	}
	// The pod added while the agent was down is steered: its connection
	// gets a subflow per NIC (checked with the others below).
	fresh := runFlows(t, bed, []flow{{client: bed.Pod(1, 2), server: bed.Pod(2, 2), port: 5202, conns: 1}}, 2*time.Second)
	total := old() + fresh

	analysis, err := caps.Analyze()
	if err != nil {
		t.Fatal(err)
	}
	requireSpread(t, analysis, total, "across the restart")
	resets, err := framework.UnexpectedResets(t, caps.Files)
	if err != nil {
		t.Fatal(err)
	}
	if len(resets) != 0 {
		t.Errorf("%d resets in the captures:\n%s", len(resets), strings.Join(resets, "\n"))
	}
}

// A pod the configuration no longer selects (SIGHUP) leaves nothing behind:
// no endpoint, no program on its veth (pinned link, or any TCX program the
// kernel lists), no path manager, and its MPTCP settings are the
// kernel's again; the remaining pod is still steered. Then uninstall leaves
// no rule, table, pin or state.
func testPodRemovedFromConfigLeavesNothingBehind(t *testing.T) {
	testbed.RequireTools(t, testbed.CaptureTools...)
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 2, LinkRate: "100mbit"})
	ctx := background(t)
	agents, err := framework.StartAgents(ctx, bed, bins.Agent, mptcpv1alpha1.CompiledRule{}, declaredCaps)
	if err != nil {
		t.Fatal(err)
	}
	a := agents[0]
	kept, removed := bed.Pod(1, 1), bed.Pod(1, 2)
	connectFrom(t, bed, a, removed)
	s := scrape(t, a)
	if n := metric(t, s, "mptcp_agent_path_managers"); n != 2 {
		t.Fatalf("%v path managers before the change, want 2", n)
	}

	removeFromConfig(ctx, t, a, removed)

	assertPodReleased(t, bed, a, kept, removed, false)

	// The kept pod's connections are spread; the removed pod's have no
	// joins (nobody opens them any more, and nothing steers them).
	analysis, _ := captureFlows(t, bed, clientServerTraffic(bed))
	for _, c := range analysis.Connections {
		want := 2
		if c.Subflows[0].Src.Addr() == removed.Addr {
			want = 1
		}
		if len(c.Subflows) != want {
			t.Errorf("connection %08x from %v has %d subflows, want %d", c.Token, c.Subflows[0].Src, len(c.Subflows), want)
		}
		if want == 2 {
			if err := (&testbed.Analysis{Subflows: c.Subflows, Connections: []*testbed.Connection{c}}).CheckPlacement(1, 2); err != nil {
				t.Errorf("kept pod's connection:\n%v", err)
			}
		}
	}

	for _, a := range agents {
		if err := a.Uninstall(ctx); err != nil {
			t.Fatal(err)
		}
		assertNothingLeft(t, a)
	}
}

// A pod removed from the configuration while no agent runs is released by
// the next agent, which learns what its predecessor applied from
// status.json: no endpoint, no program on its veth, no path manager, the
// kernel's path manager back in the pod.
func testPodRemovedWhileTheAgentIsDownIsReleasedAfterRestart(t *testing.T) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 1, NICs: 2, PodsPerNode: 2})
	ctx := background(t)
	node := bed.Node(1)
	a, err := framework.StartAgent(ctx, bed, bins.Agent, node, framework.AgentConfig(bed, node, mptcpv1alpha1.CompiledRule{}), declaredCaps)
	if err != nil {
		t.Fatal(err)
	}
	removed := bed.Pod(1, 2)
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	cfg := a.Config.Copy()
	cfg.State.Spec.Pods = cfg.State.Spec.Pods[:1]
	if err := a.WriteConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}

	eps, err := a.Endpoints()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := eps[removed.Addr.String()]; ok || len(eps) != 1 {
		t.Errorf("endpoints after the restart: %v, want only pod 1's", eps)
	}
	progs, err := framework.TCXIngressPrograms(node, removed.HostIf)
	if err != nil {
		t.Fatal(err)
	}
	if len(progs) != 0 {
		t.Errorf("programs left on %s: %v", removed.HostIf, progs)
	}
	if n := metric(t, scrape(t, a), "mptcp_agent_path_managers"); n != 1 {
		t.Errorf("%v path managers, want pod 1's only", n)
	}
	out, err := bed.Command(removed.NetNS, "sysctl", "-n", "net.mptcp.path_manager").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "kernel" {
		t.Errorf("removed pod's path manager is %q (%v), want the kernel's back", out, err)
	}
}

// A bad configuration is reported, in status.json and in
// mptcp_agent_reconcile_errors_total, and changes nothing: the agent stays
// ready and the last good configuration keeps steering traffic.
func testBadConfigIsReportedAndTheLastGoodOneStaysEnforced(t *testing.T) {
	testbed.RequireTools(t, testbed.CaptureTools...)
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "100mbit"})
	ctx := background(t)
	agents, err := framework.StartAgents(ctx, bed, bins.Agent, mptcpv1alpha1.CompiledRule{}, declaredCaps)
	if err != nil {
		t.Fatal(err)
	}
	a := agents[0]
	good := a.Config
	// A path index the datapath has no room for is the node's problem (a
	// pod's problem, such as a rule naming a path the node lacks, skips
	// that pod only: TestAPodsProblemStaysThePods).
	farIndex := good.Copy()
	farIndex.State.Spec.Paths[1].Index = 40

	bad := map[string]struct {
		write   func() error // writes the bad file
		wantErr string       // in status.json's error
	}{
		"path index beyond the datapath's": {
			write:   func() error { return a.WriteConfig(farIndex) },
			wantErr: "index 40 is beyond the",
		},
		"not YAML": {
			write:   func() error { return os.WriteFile(a.StatePath, []byte("spec: {paths: [ {name: fabric-a"), 0o600) },
			wantErr: "yaml",
		},
	}
	reconciles := 1
	for name, tc := range bad {
		if err := tc.write(); err != nil {
			t.Fatal(err)
		}
		if err := a.Reload(); err != nil {
			t.Fatal(err)
		}
		reconciles++
		st, err := a.WaitReconciles(ctx, reconciles)
		if err == nil {
			t.Fatalf("%s: the agent accepted it", name)
		}
		if !strings.Contains(st.Error, tc.wantErr) {
			t.Errorf("%s: status error %q does not mention %q", name, st.Error, tc.wantErr)
		}
		if st.Applied == nil || len(st.Applied.Pods) != len(good.State.Spec.Pods) || st.Applied.Rules[0].Datapath.Paths[1] != 2 {
			t.Errorf("%s: status no longer shows the good configuration as applied: %+v", name, st.Applied)
		}
	}
	s := scrape(t, a)
	if n := metric(t, s, "mptcp_agent_reconcile_errors_total"); n != float64(len(bad)) {
		t.Errorf("mptcp_agent_reconcile_errors_total = %v, want %d", n, len(bad))
	}
	if code, _, err := a.Get("/readyz"); err != nil || code != http.StatusOK {
		t.Errorf("/readyz answered %d (%v) after bad configurations; the good one is still enforced", code, err)
	}

	analysis, conns := captureFlows(t, bed, []flow{{client: bed.Pod(1, 1), server: bed.Pod(2, 1), port: 5201, conns: 2}})
	requireSpread(t, analysis, conns, "after bad configurations")
}

// The agent runs with exactly the capabilities it declares, nothing more:
// the kernel's view of the running process says so, and it reconciles
// (ready) and uninstalls that way. The steering tests run it the same way.
func testAgentHoldsOnlyItsDeclaredCapabilities(t *testing.T) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1})
	ctx := background(t)
	agents, err := framework.StartAgents(ctx, bed, bins.Agent, mptcpv1alpha1.CompiledRule{}, declaredCaps)
	if err != nil {
		t.Fatal(err)
	}
	// CAP_NET_ADMIN 12, CAP_SYS_ADMIN 21, CAP_PERFMON 38, CAP_BPF 39.
	const want = 1<<12 | 1<<21 | 1<<38 | 1<<39
	for _, a := range agents {
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", a.Proc.PID))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(status), "\n") {
			var set string
			var mask uint64
			if _, err := fmt.Sscanf(line, "%s %x", &set, &mask); err != nil || !strings.HasPrefix(set, "Cap") {
				continue
			}
			if mask != want {
				t.Errorf("node %d: %s %016x, want %016x", a.Node.Index, set, mask, uint64(want))
			}
		}
		if code, body, err := a.Get("/readyz"); err != nil || code != http.StatusOK {
			t.Errorf("node %d: /readyz answered %d %q (%v)", a.Node.Index, code, body, err)
		}
	}
	for _, a := range agents {
		if err := a.Uninstall(ctx); err != nil {
			t.Fatal(err)
		}
		assertNothingLeft(t, a)
	}
}

// Observe-only: the agents run, record and count, and change no packet.
// Traffic between pods on two nodes stays where the kernel routes it (every
// subflow on nic1 of both nodes, in both directions, from captures) while
// the subflow tables show what would have happened: node 1 placed the
// connections' subflows on both paths, node 2 mirrored their arrival on
// nic1. Switching observe-only off with SIGHUP spreads the next connections
// at once, over the same TCX links (same link IDs: nothing re-attached).
func testObserveOnlyRecordsWithoutSteeringUntilSwitchedOff(t *testing.T) {
	testbed.RequireTools(t, testbed.CaptureTools...)
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "100mbit"})
	ctx := background(t)
	var agents []*framework.Agent
	for _, n := range bed.Nodes {
		cfg := framework.AgentConfig(bed, n, mptcpv1alpha1.CompiledRule{})
		cfg.ObserveOnly = true
		a, err := framework.StartAgent(ctx, bed, bins.Agent, n, cfg, declaredCaps)
		if err != nil {
			t.Fatal(err)
		}
		agents = append(agents, a)
	}
	client, server := bed.Pod(1, 1), bed.Pod(2, 1)
	traffic := []flow{{client: client, server: server, port: 5201, conns: 2}}

	analysis, conns := captureFlows(t, bed, traffic)
	if len(analysis.Connections) != conns {
		t.Fatalf("captures show %d MPTCP connections, the client opened %d", len(analysis.Connections), conns)
	}
	subflows := 0
	for _, c := range analysis.Connections {
		if len(c.Subflows) != 2 {
			t.Errorf("connection %08x has %d subflows, want 2 (the agent still opens joins)", c.Token, len(c.Subflows))
		}
		subflows += len(c.Subflows)
	}
	for _, s := range analysis.Subflows {
		for _, node := range []int{1, 2} {
			if k, ok := s.PlacedOn(node); !ok || k != 1 {
				t.Errorf("observe-only: subflow %v left nic1 of node %d", s, node)
			}
		}
	}
	// What would have happened is recorded.
	initiated, err := agents[0].Subflows()
	if err != nil {
		t.Fatal(err)
	}
	initiated = slices.DeleteFunc(initiated, func(s datapath.Subflow) bool {
		return s.Local.Addr() != client.Addr || s.Role != datapath.RoleInitiator
	})
	wouldUse := map[uint32]int{}
	for _, s := range initiated {
		wouldUse[s.Path]++
	}
	if len(initiated) != subflows || wouldUse[1] != conns || wouldUse[2] != conns {
		t.Errorf("node 1 recorded %d placements (by path %v), want the %d subflows, one per connection on each path: %v", len(initiated), wouldUse, subflows, initiated)
	}
	mirrored, err := agents[1].Subflows()
	if err != nil {
		t.Fatal(err)
	}
	mirrored = slices.DeleteFunc(mirrored, func(s datapath.Subflow) bool { return s.Local.Addr() != server.Addr })
	for _, s := range mirrored {
		if s.Role != datapath.RoleResponder || s.Path != 1 {
			t.Errorf("node 2 recorded %v on path %d as role %d, want the arrival NIC nic1 (path 1), responder", s.Local, s.Path, s.Role)
		}
	}
	if len(mirrored) != subflows {
		t.Errorf("node 2 recorded %d subflows, want %d", len(mirrored), subflows)
	}
	events := func(s framework.Scrape, stat datapath.Stat) float64 {
		return metric(t, s, "mptcp_agent_datapath_events_total", "event", observe.EventName(stat))
	}
	for _, a := range agents {
		s := scrape(t, a)
		if v := metric(t, s, "mptcp_agent_observe_only"); v != 1 {
			t.Errorf("node %d: mptcp_agent_observe_only = %v, want 1", a.Node.Index, v)
		}
		if n := events(s, datapath.StatMarked); n != 0 {
			t.Errorf("node %d: %v packets marked in observe-only mode", a.Node.Index, n)
		}
		if n := events(s, datapath.StatObserved); n < 100 {
			t.Errorf("node %d: %v packets observed, want every packet of the transfer", a.Node.Index, n)
		}
	}

	// Off, with SIGHUP: the same links, and the next connections spread.
	links := map[string][]uint32{}
	linksOf := func(a *framework.Agent) map[string][]uint32 {
		out := map[string][]uint32{}
		ifaces := []string{}
		for _, nic := range a.Node.NICs {
			ifaces = append(ifaces, nic.Name)
		}
		for _, p := range a.Node.Pods {
			ifaces = append(ifaces, p.HostIf)
		}
		for _, ifname := range ifaces {
			ids, err := framework.TCXIngressLinks(a.Node, ifname)
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range ids {
				out[fmt.Sprintf("node%d/%s", a.Node.Index, ifname)] = append(out[fmt.Sprintf("node%d/%s", a.Node.Index, ifname)], uint32(id))
			}
		}
		return out
	}
	for _, a := range agents {
		maps.Copy(links, linksOf(a))
		if err := a.Reconfigure(ctx, func(cfg *framework.NodeConfig) { cfg.ObserveOnly = false }); err != nil {
			t.Fatal(err)
		}
	}
	after := map[string][]uint32{}
	for _, a := range agents {
		maps.Copy(after, linksOf(a))
	}
	if len(links) != 6 || !maps.EqualFunc(links, after, slices.Equal[[]uint32]) {
		t.Errorf("TCX links before switching observe-only off %v, after %v: want one per NIC and pod veth, unchanged", links, after)
	}

	traffic[0].port = 5202
	analysis, conns = captureFlows(t, bed, traffic)
	requireSpread(t, analysis, conns, "after observe-only was switched off")
	for _, a := range agents {
		s := scrape(t, a)
		if v := metric(t, s, "mptcp_agent_observe_only"); v != 0 {
			t.Errorf("node %d: mptcp_agent_observe_only = %v after the switch, want 0", a.Node.Index, v)
		}
		if n := events(s, datapath.StatMarked); n < 100 {
			t.Errorf("node %d: %v packets marked after the switch", a.Node.Index, n)
		}
	}
}

// analyzeWatched stops w's captures, analyzes them and closes w.
func analyzeWatched(t *testing.T, w *testbed.Watch) *testbed.Analysis {
	t.Helper()
	files, err := w.Captures()
	if err != nil {
		t.Fatal(err)
	}
	analysis, err := testbed.Analyze(files)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	return analysis
}

// requireSpread fails the test unless the captures show conns MPTCP
// connections of one subflow per NIC each (the test bed gives every node two),
// every subflow on one NIC of each node in both directions and the subflows of
// a connection on distinct NICs.
func requireSpread(t *testing.T, analysis *testbed.Analysis, conns int, when string) {
	t.Helper()
	const nics = 2
	if len(analysis.Connections) != conns {
		t.Fatalf("%s: captures show %d MPTCP connections, the clients opened %d", when, len(analysis.Connections), conns)
	}
	for _, c := range analysis.Connections {
		if len(c.Subflows) != nics {
			t.Errorf("%s: connection %08x has %d subflows, want one per NIC (%d): %v", when, c.Token, len(c.Subflows), nics, c.Subflows)
		}
	}
	if err := analysis.CheckPlacement(1, 2); err != nil {
		t.Fatalf("%s: placement:\n%v", when, err)
	}
}

// assertPodReleased checks that agent a released pod removed and kept pod
// kept, its node's only other pod: no endpoint, no subflow or connection of
// its closed connections, no program on its veth (pinned link, or any TCX
// program the kernel lists), no path manager, and the kernel's path manager
// back in the pod. A deleted pod (its sandbox gone) has no veth left to
// hold a program, and no namespace of its own to set anything in.
func assertPodReleased(t *testing.T, bed *testbed.Bed, a *framework.Agent, kept, removed *testbed.Pod, deleted bool) {
	t.Helper()
	eps, err := a.Endpoints()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := eps[removed.Addr.String()]; ok {
		t.Errorf("endpoint of the removed pod %s is still in the map: %v", removed, eps)
	}
	if _, ok := eps[kept.Addr.String()]; !ok {
		t.Errorf("endpoint of the kept pod %s is gone: %v", kept, eps)
	}
	atts, err := a.Attachments()
	if err != nil {
		t.Fatal(err)
	}
	for _, att := range atts {
		if att.Interface == removed.HostIf {
			t.Errorf("link left on the removed pod's veth: %v", att)
		}
	}
	// The kernel's list of TCX programs on each veth, pinned or not; the
	// kept pod's shows what a leftover would look like.
	for _, c := range []struct {
		pod  *testbed.Pod
		want bool
	}{{kept, true}, {removed, false}} {
		progs, err := framework.TCXIngressPrograms(a.Node, c.pod.HostIf)
		if deleted && c.pod == removed {
			if err == nil {
				t.Errorf("the deleted pod's veth %s is still there (TCX programs: %v)", c.pod.HostIf, progs)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if got := slices.Contains(progs, "pod_egress"); got != c.want {
			t.Errorf("%s: pod_egress attached to %s is %v, want %v (TCX programs: %v)", c.pod, c.pod.HostIf, got, c.want, progs)
		}
	}
	// Nothing the datapath learnt of the removed pod's (closed)
	// connections stays behind.
	sfs, err := a.Subflows()
	if err != nil {
		t.Fatal(err)
	}
	for _, sf := range sfs {
		if sf.Local.Addr() == removed.Addr {
			t.Errorf("subflow of the removed pod left in the table: %+v", sf)
		}
	}
	conns, err := a.Connections()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range conns {
		if c.Local == removed.Addr {
			t.Errorf("connection of the removed pod left in the table: %+v", c)
		}
	}
	s := scrape(t, a)
	if n := metric(t, s, "mptcp_agent_path_managers"); n != 1 {
		t.Errorf("%v path managers after the change, want 1", n)
	}
	if n := metric(t, s, "mptcp_agent_endpoints"); n != 1 {
		t.Errorf("%v endpoints after the change, want 1", n)
	}
	if deleted {
		return
	}
	out, err := bed.Command(removed.NetNS, "sysctl", "-n", "net.mptcp.path_manager").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "kernel" {
		t.Errorf("removed pod's path manager is %q (%v), want the kernel's back", out, err)
	}
}

// A pod released on its own node while its peer stays selected, under
// traffic: the peer's node goes on sending the subflows over the NICs it
// placed them on for as long as they live, and the released pod's node
// still accepts them (strict rp_filter drops nothing) while it sends by
// plain routing. The streams arrive whole, nothing is reset, the released
// pod's open subflows stay in the table; once the connections end, a
// reconcile forgets them.
func testPodReleasedWhileItsPeerStaysSelectedKeepsItsConnections(t *testing.T) {
	testbed.RequireTools(t, testbed.CaptureTools...)
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 2, LinkRate: "100mbit"})
	ctx := background(t)
	agents, err := framework.StartAgents(ctx, bed, bins.Agent, mptcpv1alpha1.CompiledRule{}, declaredCaps)
	if err != nil {
		t.Fatal(err)
	}
	a, client, server := agents[0], bed.Pod(1, 1), bed.Pod(2, 1)
	node1 := bed.Node(1)
	drops0 := nstatValue(t, bed, node1.NetNS, "TcpExtIPReversePathFilter")
	caps, err := bed.StartCaptures("tcp")
	if err != nil {
		t.Fatal(err)
	}
	// Long enough for a release that a busy machine slows to seconds (3.9 s
	// seen with other suites running) to leave a stretch to watch.
	const transfer, captured = 10 * time.Second, 8500 * time.Millisecond
	start := time.Now()
	wait := startFlows(t, bed, []flow{{client: client, server: server, port: 5211, conns: 2}}, transfer)
	waitPlaced(t, bed, a, client, 4) // two connections of two subflows, one per NIC
	before, err := a.Subflows()
	if err != nil {
		t.Fatal(err)
	}

	removeFromConfig(ctx, t, a, client)
	eps, err := a.Endpoints()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := eps[client.Addr.String()]; ok || len(eps) != 1 {
		t.Fatalf("node 1 endpoints after the release: %v, want the other pod's only", eps)
	}
	// Every subflow is open: the release keeps all their records.
	requireSubflowsKept(t, a, slices.DeleteFunc(before, func(s datapath.Subflow) bool { return s.Local.Addr() != client.Addr }))
	if time.Since(start) > captured-time.Second {
		t.Fatalf("the release took until %v into the transfer: too little of it is left to watch", time.Since(start))
	}

	time.Sleep(time.Until(start.Add(captured)))
	files, err := caps.Stop()
	if err != nil {
		t.Fatal(err)
	}
	wait() // every stream arrived with its hash
	if d := nstatValue(t, bed, node1.NetNS, "TcpExtIPReversePathFilter") - drops0; d != 0 {
		t.Errorf("node 1: strict rp_filter dropped %v packets of the released pod's subflows", d)
	}
	resets, err := framework.UnexpectedResets(t, files)
	if err != nil {
		t.Fatal(err)
	}
	if len(resets) != 0 {
		t.Errorf("%d resets in the captures:\n%s", len(resets), strings.Join(resets, "\n"))
	}

	// The connections are over: a reconcile (here a reload; otherwise the
	// next periodic sweep) forgets their subflows.
	for reconciles, deadline := 3, time.Now().Add(10*time.Second); ; reconciles++ {
		if err := a.Reload(); err != nil {
			t.Fatal(err)
		}
		if _, err := a.WaitReconciles(ctx, reconciles); err != nil {
			t.Fatal(err)
		}
		sfs, err := a.Subflows()
		if err != nil {
			t.Fatal(err)
		}
		left := slices.DeleteFunc(sfs, func(s datapath.Subflow) bool { return s.Local.Addr() != client.Addr })
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("subflows of the released pod still in the table after its connections ended: %+v", left)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// removeFromConfig drops pod from file-mode agent a's configuration and
// waits for the reload's reconcile.
func removeFromConfig(ctx context.Context, t *testing.T, a *framework.Agent, pod *testbed.Pod) {
	t.Helper()
	if err := a.Reconfigure(ctx, func(cfg *framework.NodeConfig) {
		cfg.State.Spec.Pods = slices.DeleteFunc(cfg.State.Spec.Pods, func(p mptcpv1alpha1.NodePod) bool { return p.Name == pod.Name })
	}); err != nil {
		t.Fatal(err)
	}
}

// connectFrom runs a short transfer from pod to a server on node 2 and
// waits until agent a holds the pod's subflows and connection, so that a
// test of what the pod's removal leaves behind has something to look for.
func connectFrom(t *testing.T, bed *testbed.Bed, a *framework.Agent, pod *testbed.Pod) {
	t.Helper()
	runFlows(t, bed, []flow{{client: pod, server: bed.Pod(2, 1), port: 5209, conns: 1}}, time.Second)
	sfs, err := a.Subflows()
	if err != nil {
		t.Fatal(err)
	}
	conns, err := a.Connections()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(sfs, func(s datapath.Subflow) bool { return s.Local.Addr() == pod.Addr }) ||
		!slices.ContainsFunc(conns, func(c datapath.Connection) bool { return c.Local == pod.Addr }) {
		t.Fatalf("after a transfer from %s: no subflow or connection of it in the tables (%d subflows, %d connections)", pod, len(sfs), len(conns))
	}
}

// waitPlaced waits until agent a's subflow table holds want subflows of
// client, and none of client's joins is held any more: the agent's path
// manager opens joins as backup subflows and makes them active 20 ms after
// they are established (docs/subflows.md, "Held joins"), and a test that
// stops or kills the agent must not do it before, or the join stays backup
// until an agent runs again.
func waitPlaced(t *testing.T, bed *testbed.Bed, a *framework.Agent, client *testbed.Pod, want int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		sfs, err := a.Subflows()
		if err != nil {
			t.Fatal(err)
		}
		placed := slices.DeleteFunc(sfs, func(s datapath.Subflow) bool { return s.Local.Addr() != client.Addr })
		held := heldJoins(t, bed, client)
		if len(placed) == want && len(held) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %d placed %d subflows of %v, want %d: %v; held joins: %q", a.Node.Index, len(placed), client.Addr, want, placed, held)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// heldJoins are the ss lines of pod's established subflows that it opened
// with an MP_JOIN and holds as backup (ss's MPTCP flags j and b).
func heldJoins(t *testing.T, bed *testbed.Bed, pod *testbed.Pod) []string {
	t.Helper()
	out, err := bed.Command(pod.NetNS, "ss", "-tniH", "state", "established").CombinedOutput()
	if err != nil {
		t.Fatalf("ss in pod %s: %v: %s", pod.Name, err, out)
	}
	// ss prints each socket's addresses on a line of their own and its
	// details, MPTCP flags among them, on the indented line after.
	var held []string
	var socket string
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(line, "\t") {
			socket = strings.Join(strings.Fields(line), " ")
			continue
		}
		for _, f := range strings.Fields(line) {
			if flags, ok := strings.CutPrefix(f, "flags:"); ok && strings.Contains(flags, "j") && strings.Contains(flags, "b") {
				held = append(held, socket+" "+f)
			}
		}
	}
	return held
}

// requireSubflowsKept checks that every subflow of before is still in agent
// a's table, on the same path with the same role.
func requireSubflowsKept(t *testing.T, a *framework.Agent, before []datapath.Subflow) {
	t.Helper()
	after, err := a.Subflows()
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range before {
		i := slices.IndexFunc(after, func(s datapath.Subflow) bool { return s.Local == b.Local && s.Remote == b.Remote })
		switch {
		case i < 0:
			t.Errorf("node %d: subflow %v->%v is gone from the table", a.Node.Index, b.Local, b.Remote)
		case after[i].Path != b.Path || after[i].Role != b.Role:
			t.Errorf("node %d: subflow %v->%v moved from path %d (role %d) to path %d (role %d)", a.Node.Index, b.Local, b.Remote, b.Path, b.Role, after[i].Path, after[i].Role)
		}
	}
}
