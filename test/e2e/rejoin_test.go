package e2e

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/observe"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// A connection whose join its kernel closes mid-transfer (killed here with
// ss -K; a reset by the peer or a DSS checksum failure closes it the same
// way) is back on both paths at once: the client pod's path manager hears
// the close, the datapath gives the join's path back to the connection,
// and the join the path manager opens to replace it is placed on that
// path, which carries the transfer again. Both nodes give the closed
// subflow's path back, and the connection stays within the rule's maximum
// of two subflows; the stream arrives whole.
func testAClosedJoinIsReplacedOnThePathItLeft(t *testing.T) {
	const (
		port     = 5610
		length   = 6 * time.Second
		killAt   = 2 * time.Second
		interval = 100 * time.Millisecond
	)
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "100mbit"})
	ctx := background(t)
	// At most two subflows: without the closed join's count given back
	// on both nodes, the join that replaces it would be refused.
	agents, err := framework.StartAgents(ctx, bed, bins.Agent, mptcpv1alpha1.CompiledRule{MaxSubflows: 2}, declaredCaps)
	if err != nil {
		t.Fatal(err)
	}
	client, server := bed.Pod(1, 1), bed.Pod(2, 1)
	remote := netip.AddrPortFrom(server.Addr, port)
	w := bed.Watch(t, framework.DatapathEvidence(bed))
	defer w.Close()
	srv, err := bed.StartTrafficServer(ctx, bins.Traffic, server, port, true, "-warmup", "1s", "-window", "4s")
	if err != nil {
		t.Fatal(err)
	}
	sampler, err := bed.StartSampler(interval)
	if err != nil {
		t.Fatal(err)
	}
	done := sendInBackground(ctx, bed, client, server, port, length)
	time.Sleep(killAt)

	// The join node 1 placed, and the path it is on.
	joins := func() []datapath.Subflow {
		sfs, err := agents[0].Subflows()
		if err != nil {
			t.Fatal(err)
		}
		var out []datapath.Subflow
		for _, sf := range sfs {
			if sf.Role == datapath.RoleInitiator && sf.Token != 0 && sf.Remote == remote {
				out = append(out, sf)
			}
		}
		return out
	}
	before := joins()
	if len(before) != 1 {
		t.Fatalf("node 1 placed %d joins of the connection, want 1: %+v", len(before), before)
	}
	closedJoin := before[0]
	if out, err := bed.Command(client.NetNS, "ss", "-K", "-t", "state", "established",
		fmt.Sprintf("( sport = :%d and dport = :%d )", closedJoin.Local.Port(), port)).CombinedOutput(); err != nil {
		t.Fatalf("ss -K: %v: %s", err, out)
	}
	killed := time.Now()
	var replacement datapath.Subflow
	for deadline := killed.Add(2 * time.Second); time.Now().Before(deadline) && replacement.Local.Port() == 0; time.Sleep(10 * time.Millisecond) {
		for _, sf := range joins() {
			if sf.Local != closedJoin.Local {
				replacement = sf
			}
		}
	}
	replacedAfter := time.Since(killed)
	res := <-done
	rows, sampleErr := sampler.Stop()
	finishTransfer(t, w, srv, res.Sent, res.Err)
	if sampleErr != nil {
		t.Fatal(sampleErr)
	}
	if replacement.Local.Port() == 0 {
		t.Fatalf("no join replaced the closed one (%v on path %d) within 2 s; joins now %+v", closedJoin.Local, closedJoin.Path, joins())
	}
	t.Logf("join %v on path %d closed; replaced by %v on path %d within %v", closedJoin.Local, closedJoin.Path,
		replacement.Local, replacement.Path, replacedAfter.Round(10*time.Millisecond))
	if replacement.Path != closedJoin.Path {
		t.Errorf("the replacing join was placed on path %d, want the path the closed one left, %d", replacement.Path, closedJoin.Path)
	}
	// What node 1 sent over the closed join's NIC from half a second
	// after the replacement to the end of the transfer.
	from, to := killed.Add(replacedAfter+500*time.Millisecond), killed.Add(length-killAt-500*time.Millisecond)
	if rate := nicTxRate(rows, 1, int(closedJoin.Path), from, to); rate < 30e6 {
		t.Errorf("node 1 sent %.1f Mbit/s over nic%d after the replacement, want the path carrying the transfer again (>= 30)", rate/1e6, closedJoin.Path)
	}

	if conns, err := agents[0].Connections(); err != nil || len(conns) != 1 || conns[0].Joins != 1 || conns[0].UsedPaths != 0b110 {
		t.Errorf("node 1's connections %+v (%v), want one with one join and both paths held", conns, err)
	}
	// Node 1 has one pod.
	// One, or two when node 2 had not heard the close yet and refused
	// the first replacement (the path manager then tries again).
	if n, _ := scrape(t, agents[0]).Value("mptcp_agent_path_manager_joins_replaced_total"); n < 1 || n > 2 {
		t.Errorf("node 1 counted %v joins opened to replace the closed one, want 1 or 2", n)
	}
	// The first join and its replacement were each held as backup for
	// the agent's join holdoff, then made active (docs/subflows.md, "Held
	// joins").
	if n, _ := scrape(t, agents[0]).Value("mptcp_agent_path_manager_joins_released_total"); n != 2 {
		t.Errorf("node 1 made %v held joins active, want 2 (the first join and its replacement)", n)
	}
	for i, a := range agents {
		if n, _ := scrape(t, a).Value("mptcp_agent_datapath_events_total", "event", observe.EventName(datapath.StatSubflowClosed)); n < 1 {
			t.Errorf("node %d gave %v closed subflows' paths back, want at least the killed join", i+1, n)
		}
	}
}

// nicTxRate is what node sent over nic<k> between from and to, in bit/s,
// from a sampler's rows.
func nicTxRate(rows []testbed.Sample, node, k int, from, to time.Time) float64 {
	var first, last *testbed.Sample
	for i := range rows {
		r := &rows[i]
		if r.Node != node || r.NIC != k || r.Time.Before(from) || r.Time.After(to) {
			continue
		}
		if first == nil {
			first = r
		}
		last = r
	}
	if first == nil || last == first {
		return 0
	}
	return float64(last.TxBytes-first.TxBytes) * 8 / last.Time.Sub(first.Time).Seconds()
}
