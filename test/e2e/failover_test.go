package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/observe"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// Failover: the tests below assert the failover targets (docs/design.md,
// "Targets") on one transfer per case (the framework's FailoverRow measures
// them); bench/failover repeats every case five times and writes the table
// of docs/benchmarks.md. One, not two: on a slower two-core machine (AMD
// EPYC, 2026-11-25) a row took about 150 s with two, and the e2e package
// ran past its 60 min timeout with 12 of 43 tests to go; the repeats that
// find a bad run in five are the benchmark's.
const failoverRuns = 1 // transfers per row; each row has a bed of its own

// failoverStallBound is what TestFailover/CarrierLossMidTransferStallsBriefly
// asserts on the longest stall with the agent: the target for carrier
// loss is 300 ms; twice that for a shared two-core machine.
// Measured: docs/testing.md, "Failover".
const failoverStallBound = 600 * time.Millisecond

// The carrier of one of two paths goes away for 3 s in the middle of a
// transfer and comes back: the stream arrives whole, nothing is reset, the
// connection goes on over the other path with a short stall, and the
// repaired path carries traffic again soon. Either end's NIC may fail: on
// the sender's node ("near") the agent there detours the subflow and the
// receiver's node follows it; on the receiver's node ("far") the roles
// swap. The near case is logged beside the kernel's own recovery (the
// hand-routed baseline: the kernel's path manager, no agent, no BPF),
// which is only checked for integrity: the negative control, the only one
// of the e2e tests; bench/failover measures the kernel alone beside the
// agent in every failover case.
//
// Bounds (docs/testing.md, "Failover"), asserted for the near case: the
// targets are a longest stall below 300 ms, at least 0.8 of the
// live path's capacity during the failure, the path back within 1 s; the
// stall bound here is 600 ms, for a shared two-core machine. The far case
// is measured and only checked for integrity and resets (see there).
func testCarrierLossMidTransferStallsBriefly(t *testing.T) {
	for _, c := range []struct {
		name string
		node int
	}{{"near", 1}, {"far", 2}} {
		t.Run("agent "+c.name, func(t *testing.T) {
			agents, figures := agentFailovers(t, 2, c.node, framework.CarrierLoss, framework.FailoverRule, 5600, failoverStallBound)
			runs := float64(len(figures)) // a transfer tried again counts
			counts := make([]map[string]float64, len(agents))
			for k, a := range agents {
				counts[k] = events(t, a, datapath.StatSubflowDetoured, datapath.StatSubflowHomed, datapath.StatSubflowFollowed)
				t.Logf("node %d datapath: %v", k+1, counts[k])
			}
			if c.node == 1 {
				// The figures above would often be met by the kernel
				// alone: these say the agent did it. Each failure
				// detoured the sender's subflow and brought it home (or
				// closed it and replaced it, when it was recovering
				// from losses); the receiver's node followed it away,
				// and back home either by following it again or, once
				// its own probes over the path came back, by going
				// home itself (a replaced subflow is a new one: there
				// is nothing to follow back, and a subflow closed as
				// the path went down may have sent nothing over the
				// detour to follow away either).
				rejoined := checkDetouredAndHomed(t, agents[0], int(runs))
				follow := counts[1]
				if follow["subflow_followed"]+rejoined < runs || follow["subflow_followed"]+follow["subflow_homed"]+rejoined < 2*runs {
					t.Errorf("node 2 followed %v moves and came home %v times (node 1 replaced %v subflows), want at least %v moves away and %v in all (away and back per failure)",
						follow["subflow_followed"], follow["subflow_homed"], rejoined, runs, 2*runs)
				}
			}
			// The failed node's agent saw every loss and says so.
			n, _ := scrape(t, agents[c.node-1]).Value("mptcp_agent_path_down_transitions_total", "path", framework.PathName(1))
			if n != runs {
				t.Errorf("node %d: mptcp_agent_path_down_transitions_total{path=%q} = %v, want %v", c.node, framework.PathName(1), n, runs)
			}
		})
	}
	// The one control row of the e2e tests; bench/failover runs the kernel
	// alone beside the agent in every case, five times each.
	t.Run("kernel only near", func(t *testing.T) {
		kernelOnlyFailovers(t, 2, 1, framework.CarrierLoss, 5702)
	})
}

// A gray failure: one of two paths drops everything (both ways, or only
// what node 1 sends), or 30 % of everything, for 3 s in the middle of a
// transfer while every carrier stays up, so that no link event tells
// anyone. The agents' liveness probes find it (a probe every 30 ms, down
// after 5 unanswered in a row, or 5 of the last 20): both nodes mark the path down, the
// subflow detours over the other path, and comes home once the probes
// come back. Whichever node's wire fails, near or far, the targets hold,
// because probes are round trips (the kernel alone beside them is
// bench/failover's). The 30 % row asks less than the target's 0.8 during
// the failure (partialLossInE2E).
func testGrayFailureMidTransferIsFoundByProbes(t *testing.T) {
	for _, c := range []struct {
		node  int
		fail  framework.Failure
		bound time.Duration
	}{
		{1, framework.TotalLoss, framework.GrayStallBound}, {2, framework.TotalLoss, framework.GrayStallBound},
		{1, framework.OneWayLoss, framework.GrayStallBound}, {1, partialLossInE2E, framework.GrayStallBound},
	} {
		node, fail := c.node, c.fail
		t.Run(fmt.Sprintf("agent, node %d's nic1, %s", node, fail.Name), func(t *testing.T) {
			grayFailovers(t, 2, node, fail, c.bound, 5800)
		})
	}
}

// grayFailovers runs the agent's row of a gray failure on a bed of nics
// paths (agentFailovers, from port on) and checks what the agents did: on
// both nodes the probes took path 1 down once per run (probes are round
// trips: both lose their peer on it, whichever end's wire failed), and the
// sender's subflow left the path in every run and came back. It left led
// by node 1, or following node 2 when node 2's probes found the failure
// first (a loss both ways that spares some probes: either node may be
// first); it came back home, or, when it was recovering from losses as the
// path went down, node 1's path manager closed it and a join replaced it
// on the path once it was back (docs/subflows.md, "Leaving a failed path").
func grayFailovers(t *testing.T, nics, node int, fail framework.Failure, bound time.Duration, port int) {
	agents, figures := agentFailovers(t, nics, node, fail, framework.FailoverRule, port, bound)
	runs := len(figures) // a transfer tried again counts
	for k, a := range agents {
		m := scrape(t, a)
		counts := events(t, a, datapath.StatSubflowDetoured, datapath.StatSubflowHomed, datapath.StatSubflowFollowed)
		downs, _ := m.Value("mptcp_agent_path_down_transitions_total", "path", framework.PathName(1))
		peerDowns, _ := m.Value("mptcp_agent_path_peer_down_transitions_total", "path", framework.PathName(1), "peer", framework.NodeName(agents[1-k].Node))
		t.Logf("node %d: datapath %v; path1 down %v times, its peer silent on it %v times", k+1, counts, downs, peerDowns)
		if downs != float64(runs) || peerDowns != float64(runs) {
			t.Errorf("node %d: path1 went down %v times and its peer was silent on it %v times, want %d each", k+1, downs, peerDowns, runs)
		}
	}
	left, _ := scrape(t, agents[0]).Value("mptcp_agent_path_manager_subflows_left_total")
	lead := events(t, agents[0], datapath.StatSubflowDetoured, datapath.StatSubflowFollowed, datapath.StatSubflowHomed)
	if lead["subflow_detoured"]+lead["subflow_followed"] < float64(runs) || lead["subflow_homed"]+left < float64(runs) {
		t.Errorf("node 1 (the sender's) detoured %v, followed %v, homed %v and closed %v subflows, want at least %d away and %d home or closed",
			lead["subflow_detoured"], lead["subflow_followed"], lead["subflow_homed"], left, runs, runs)
	}
	reopened := 0
	for _, f := range figures {
		reopened += f.Reopened
	}
	if float64(reopened) < left {
		t.Errorf("node 1 closed %v subflows on the failed path, and %d joins were opened after the failure, want one for each", left, reopened)
	}
	t.Logf("node 1 closed %v subflows recovering from losses on the failed path; %d subflows opened after the failures", left, reopened)
}

// Three paths: the carrier of one of them goes away mid-transfer and comes
// back, on the sender's node; the connection goes on over the other two.
// The same targets as with two paths, against the two live paths'
// capacity.
func testCarrierLossOnOneOfThreePaths(t *testing.T) {
	agents, _ := agentFailovers(t, 3, 1, framework.CarrierLoss, framework.FailoverRule, 6200, failoverStallBound)
	checkDetouredAndHomed(t, agents[0], failoverRuns)
}

// Three paths, gray failures of one of them on the sender's node (all lost
// both ways, 30 % lost both ways): the targets and checks of two paths,
// against the two live paths' capacity. One-way loss and a removed NIC,
// which two paths already prove here, run on three paths in the benchmark
// only, beside the kernel alone (docs/benchmarks.md, "Failover").
func testGrayFailuresOnOneOfThreePaths(t *testing.T) {
	for i, fail := range []framework.Failure{onThreePathsInE2E(framework.TotalLoss), partialLossInE2E} {
		t.Run(fail.Name, func(t *testing.T) {
			grayFailovers(t, 3, 1, fail, framework.GrayStallBound, 6500+20*i)
		})
	}
}

// A NIC of the sender's node is deleted in the middle of a transfer and
// comes back 3 s later as a new link (bed.RemoveNIC, RestoreNIC): the
// agent's link events mark the path down at once, the subflow detours,
// and once the NIC is back the reconcile that its creation asks for
// attaches the datapath to the new link and writes its routes, and the
// subflow comes home. Targets as for the carrier, with the 1 s stall bound
// of every failure but carrier loss. (bench/failover runs the kernel
// alone beside it: its route over nic1 is the main table's default, which
// RestoreNIC writes again, as the host's configuration would.)
func testNICRemovedMidTransferIsReattached(t *testing.T) {
	agents, figures := agentFailovers(t, 2, 1, framework.NICRemoved, framework.FailoverRule, 6000, framework.GrayStallBound)
	runs := float64(len(figures)) // a transfer tried again counts
	checkDetouredAndHomed(t, agents[0], failoverRuns)
	n, _ := scrape(t, agents[0]).Value("mptcp_agent_path_down_transitions_total", "path", framework.PathName(1))
	if n != runs {
		t.Errorf("node 1: mptcp_agent_path_down_transitions_total{path=%q} = %v, want %v", framework.PathName(1), n, runs)
	}
}

// A policy with one active path and one backup path: the connection runs
// on fabric-a, its join on fabric-b held as backup by the pod (B). The
// carrier of node 1's nic1 goes away mid-transfer: the subflow on fabric-a
// detours over the backup path's NIC (a detour takes the first path of the
// subflow's rule that is up, active ones first, then backup ones), so the
// backup path carries the connection while the active one is away; the pod
// needs no MP_PRIO, since the subflow it sends on is not a backup one. On
// the repair the subflow comes home and the backup path is idle again.
// Targets as for the carrier, against the backup path's capacity; before
// the failure and after the repair the connection gets one path's worth
// (the backup path carries nothing to speak of).
func testActivePathLostMidTransferGoesOnOverTheBackupPath(t *testing.T) {
	rule := framework.FailoverRule
	rule.Paths = framework.PathsNamed(framework.PathName(1))
	rule.BackupPaths = []string{framework.PathName(2)}
	rule.HeaderRewriting = true
	agents, figures := agentFailovers(t, 2, 1, framework.CarrierLoss, rule, 6400, failoverStallBound)
	checkDetouredAndHomed(t, agents[0], failoverRuns)
	for i, f := range figures {
		if f.Before > 1.2*framework.FailoverLinkBps || f.After > 1.2*framework.FailoverLinkBps {
			t.Errorf("run %d: goodput %.1f Mbit/s before the failure and %.1f after the repair, want one path's worth (the backup path idle)",
				i+1, f.Before/1e6, f.After/1e6)
		}
	}
}

// Signal mode: the server's kernel announces a port for the second path
// and the client's kernel joins it; no path manager of the agent runs in
// the pods, so nothing closes or opens a subflow when path 1 of the
// sender's node drops everything. The datapath's detour alone carries the
// subflow on it through the failure and brings it home after the repair:
// the same targets as the userspace rows, and no subflow opened after the
// failure (docs/subflows.md, "Signal mode and closed joins").
func testSignalModeSubflowsRideTheDetourThroughAGrayFailure(t *testing.T) {
	const signalPort = 6911 // not among the transfers' ports
	row := framework.AgentFailoverRowWith(t, bins, 2, 1, framework.TotalLoss, func(n *testbed.Node) mptcpv1alpha1.CompiledRule {
		if n.Index == 2 {
			return mptcpv1alpha1.CompiledRule{SubflowCreation: mptcpv1alpha1.SubflowCreationSignal, SignalPorts: []int32{signalPort}}
		}
		return mptcpv1alpha1.CompiledRule{SubflowCreation: mptcpv1alpha1.SubflowCreationSignal}
	}, declaredCaps)
	// The sender writes once its kernel has joined the announced port.
	row.Bed.AwaitJoins(row.Bed.Pod(1, 1), 1)
	agents, figures := agentFailoversIn(t, row, 6900, framework.GrayStallBound)
	checkDetouredAndHomed(t, agents[0], failoverRuns)
	for i, f := range figures {
		if f.Reopened != 0 {
			t.Errorf("run %d: %d subflows opened after the failure, want none (signal mode keeps its subflows)", i+1, f.Reopened)
		}
	}
}

// partialLossInE2E is what the 30 % rows of the gray failure tests assert:
// the stall target (1 s) and at least 0.6 of the live paths during the
// failure, where the target is 0.8. Detection takes 150 to 500 ms, in
// which the lossy subflow drags the connection; the benchmark
// (docs/benchmarks.md, "Failover") measured 0.82 to 0.90 in ten runs, two
// and three paths, since the path manager closes the subflows recovering on the path
// (docs/subflows.md, "Leaving a failed path"; before, a CI run stalled
// 1.45 s). The margin is for a shared two-core machine; the benchmark
// counts every run below the target's 0.8.
var partialLossInE2E = framework.Failure{Name: framework.PartialLoss.Name, Inject: framework.PartialLoss.Inject, Repair: framework.PartialLoss.Repair, MinDuring: 0.6}

// onThreePathsInE2E is fail as the three-path gray rows assert it: at least
// 0.7 of the live paths during the failure, where the target is 0.8. On
// three paths the bed's two cores set the pace before the failure (a
// fresh-clone CI run carried 394 and 425 of the three links' 600 Mbit/s),
// so the two live paths' 400 Mbit/s is a rate the machine barely reaches,
// and single runs measured 0.76 to 0.79 in CI runs of the whole suite; the
// benchmark (docs/benchmarks.md, "Failover") measures the target itself.
func onThreePathsInE2E(fail framework.Failure) framework.Failure {
	fail.MinDuring = 0.7
	return fail
}

// failoverRetry is why an agent's failover transfer that arrived whole,
// without resets, but missed a target (the stall, the goodput during the
// failure, the path back) runs once more. Single runs of the whole suite
// on this two-core machine measured, in the rows whose benchmark figures
// are 0.83 to 0.95 of the live paths over five runs a case, 0.69 to 0.79
// in about one row in five runs (2026-11-26: two and three paths, gray
// failures and carrier loss; once a 2.2 s stall): the targets are the
// benchmark's to count (docs/benchmarks.md, "Failover"); here a second
// miss in a row fails.
const failoverRetry = "failover: a single run's stall and goodput during the failure vary on a shared two-core machine"

// agentFailovers runs the agent's row of a failover test
// (framework.AgentFailoverRow): failoverRuns watched transfers from port
// on, nic1 of node failing in each, each checked for resets and against
// the targets with bound on the stall (a transfer that missed only
// targets runs once more: failoverRetry). It returns the
// agents and the figures of every transfer, for the row's own checks; a
// failed row logs the agents' last lines.
func agentFailovers(t *testing.T, nics, node int, fail framework.Failure, rule mptcpv1alpha1.CompiledRule, port int, bound time.Duration) ([]*framework.Agent, []framework.FailoverFigures) {
	t.Helper()
	return agentFailoversIn(t, framework.AgentFailoverRow(t, bins, nics, node, fail, rule, declaredCaps), port, bound)
}

// agentFailoversIn is agentFailovers on a row already set up.
func agentFailoversIn(t *testing.T, row framework.FailoverRow, port int, bound time.Duration) ([]*framework.Agent, []framework.FailoverFigures) {
	t.Helper()
	nics, node, fail := row.Bed.Config.NICs, row.Node, row.Fail
	t.Cleanup(func() {
		if t.Failed() {
			logAgentTails(t, row.Agents, 60)
		}
	})
	row.Judge = func(f framework.FailoverFigures) []string {
		return append(framework.ResetProblems(t, f), framework.TargetProblems(f, fail, bound)...)
	}
	row.Retry, row.RetryStall = failoverRetry, framework.ReceiveStallRetry
	var all []framework.FailoverFigures
	for i := range failoverRuns {
		f := row.Transfer(t, port+i)
		if f.Retried {
			t.Logf("agent, %d NICs, node %d's nic1, %s, tried again: %v", nics, node, fail.Name, f)
			all = append(all, f)
			again := row
			again.Retry, again.RetryStall = "", ""
			f = again.Transfer(t, port+i+10)
		}
		t.Logf("agent, %d NICs, node %d's nic1, %s: %v", nics, node, fail.Name, f)
		all = append(all, f)
	}
	t.Logf("agent, %d NICs, node %d's nic1, %s, %d runs: %s", nics, node, fail.Name, failoverRuns, framework.SummarizeFailover(all))
	return row.Agents, all
}

// checkDetouredAndHomed asserts that a's node moved a subflow off the
// failed path and brought it home at least runs times each, and returns
// how many subflows came home as replacements.
func checkDetouredAndHomed(t *testing.T, a *framework.Agent, runs int) (rejoined float64) {
	t.Helper()
	c := events(t, a, datapath.StatSubflowDetoured, datapath.StatSubflowHomed)
	// A subflow that was recovering from losses when its path went down
	// is closed by the pod's path manager instead, or by the pod's kernel,
	// and a join replaces it: it comes home that way (docs/subflows.md).
	m := scrape(t, a)
	left, _ := m.Value("mptcp_agent_path_manager_subflows_left_total")
	replaced, _ := m.Value("mptcp_agent_path_manager_joins_replaced_total")
	t.Logf("node %d datapath: %v; subflows the path manager closed for a path down: %v, joins that replaced closed subflows: %v",
		a.Node.Index, c, left, replaced)
	rejoined = max(left, replaced)
	if c["subflow_detoured"] < float64(runs) || c["subflow_homed"]+rejoined < float64(runs) {
		t.Errorf("node %d detoured %v and homed %v subflows (%v closed, %v replaced), want at least %d each",
			a.Node.Index, c["subflow_detoured"], c["subflow_homed"], left, replaced, runs)
	}
	return rejoined
}

// logAgentTails logs the last lines of each agent's log and its status's
// error: what a failed failover test leaves to read.
func logAgentTails(t *testing.T, agents []*framework.Agent, lines int) {
	for _, a := range agents {
		b, err := os.ReadFile(a.Proc.Stderr)
		if err != nil {
			t.Logf("node %d agent log: %v", a.Node.Index, err)
			continue
		}
		all := strings.Split(strings.TrimSpace(string(b)), "\n")
		st, _ := a.Status()
		t.Logf("node %d agent: %d reconciles, error %q; its last %d log lines:\n%s", a.Node.Index, st.Reconciles, st.Error,
			min(lines, len(all)), strings.Join(all[max(0, len(all)-lines):], "\n"))
	}
}

// kernelOnlyFailovers is the negative control beside the agent's rows
// (framework.KernelFailoverRow): failoverRuns transfers from port+8 on
// (port and the ones after it are the server's signalled ones), nic1 of
// node failing in each. Only integrity is asserted; resets are logged.
func kernelOnlyFailovers(t *testing.T, nics, node int, fail framework.Failure, port int) {
	row := framework.KernelFailoverRow(t, bins, nics, node, fail, port)
	var all []framework.FailoverFigures
	for i := range failoverRuns {
		f := row.Transfer(t, port+8+i)
		t.Logf("kernel only, node %d's nic1, %s: %v", node, fail.Name, f)
		all = append(all, f)
		if len(f.Resets) != 0 || f.RSTCounted != 0 {
			t.Logf("kernel only: resets (not asserted):\n%s", strings.Join(f.Resets, "\n"))
		}
	}
	t.Logf("kernel only, node %d's nic1, %s, %d runs: %s", node, fail.Name, failoverRuns, framework.SummarizeFailover(all))
}

// events reads the agent's datapath counters named by stats.
func events(t *testing.T, a *framework.Agent, stats ...datapath.Stat) map[string]float64 {
	t.Helper()
	s := scrape(t, a)
	out := map[string]float64{}
	for _, st := range stats {
		out[observe.EventName(st)], _ = s.Value("mptcp_agent_datapath_events_total", "event", observe.EventName(st))
	}
	return out
}

// One peer Down on a path while another answers over it (a path that fails
// towards one destination, or a peer that forges its answers): node 1's
// probes find node 2 Down on path 1 and node 3 Up, so path 1 stays up on
// node 1, and node 1's datapath itself sends the subflow to node 2 round it
// (it leads the detour rather than waiting to follow node 2's), while
// traffic to node 3 keeps the path. Functional: no rate or stall is
// judged, so it runs beside other tests, its probes slow enough (100 ms,
// Down after 5) not to be starved; the stream is checked byte by byte.
func testTrafficToAPeerDownOnAPathGoesRoundItWhileOtherPeersKeepIt(t *testing.T) {
	rule := func(*testbed.Node) mptcpv1alpha1.CompiledRule { return framework.FailoverRule }
	row := framework.AgentFailoverRowOn(t, bins, 3, 2, 2, framework.TotalLoss, rule, declaredCaps, framework.WithLivenessEvery(100*time.Millisecond, 5))
	t.Cleanup(func() {
		if t.Failed() {
			logAgentTails(t, row.Agents, 60)
		}
	})
	row.Judge = func(f framework.FailoverFigures) []string { return framework.ResetProblems(t, f) }
	f := row.Transfer(t, 6300)
	t.Logf("node 2's nic1 failed: %v", f)

	n1, n2, n3 := framework.NodeName(row.Bed.Node(1)), framework.NodeName(row.Bed.Node(2)), framework.NodeName(row.Bed.Node(3))
	m := scrape(t, row.Agents[0])
	pathDowns, _ := m.Value("mptcp_agent_path_down_transitions_total", "path", framework.PathName(1))
	toFailed, _ := m.Value("mptcp_agent_path_peer_down_transitions_total", "path", framework.PathName(1), "peer", n2)
	toOther, _ := m.Value("mptcp_agent_path_peer_down_transitions_total", "path", framework.PathName(1), "peer", n3)
	if toFailed < 1 || toOther != 0 || pathDowns != 0 {
		t.Errorf("%s: on path1, %s went Down %v times and %s %v times, the path %v times; want %s at least once, %s and the path never",
			n1, n2, toFailed, n3, toOther, pathDowns, n2, n3)
	}
	c := events(t, row.Agents[0], datapath.StatSubflowDetoured, datapath.StatSubflowHomed, datapath.StatSubflowFollowed)
	t.Logf("%s's datapath: %v", n1, c)
	if c["subflow_detoured"] < 1 || c["subflow_homed"] < 1 {
		t.Errorf("%s detoured %v and homed %v subflows, want its subflow to %s led round path1 and back at least once",
			n1, c["subflow_detoured"], c["subflow_homed"], n2)
	}
	// The failure is node 2's: node 3 keeps the path too.
	if d, _ := scrape(t, row.Agents[2]).Value("mptcp_agent_path_down_transitions_total", "path", framework.PathName(1)); d != 0 {
		t.Errorf("%s: path1 went down %v times, want never (only %s failed on it)", framework.NodeName(row.Bed.Node(3)), d, n2)
	}
}
