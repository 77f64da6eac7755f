package e2e

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/e2e/framework"
	"github.com/mptcp-operator/mptcp-operator/hack/testbed"
	"github.com/mptcp-operator/mptcp-operator/internal/agent"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/observe"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
)

// Failover (issue 17): one long MPTCP connection from pod (1,1) to pod
// (2,1) over two 200 Mbit/s paths; mid-transfer the carrier of node 1's
// nic1 goes away (bed.SetCarrier: the wire's end is down, the NIC stays up
// with NO-CARRIER) and comes back.
const (
	failoverLength  = 10 * time.Second // the transfer
	failoverAt      = 3 * time.Second  // the carrier goes, after the sender started
	failoverOutage  = 3 * time.Second  // and comes back after this
	failoverSample  = 50 * time.Millisecond
	failoverLinkBps = 200e6
	failoverRuns    = 3 // transfers per row; each row has a bed of its own
)

// failoverStallBound is what TestCarrierLossMidTransferStallsBriefly
// asserts on the longest stall with the agent: the target for
// carrier loss is 300 ms; twice that for a shared two-core machine.
// Measured: docs/testing.md, "Failover".
const failoverStallBound = 600 * time.Millisecond

// failoverFigures is what one failover transfer measured.
type failoverFigures struct {
	live    float64       // the capacity of the paths left during the failure, bit/s
	before  float64       // goodput from 1 s to the failure, bit/s
	during  float64       // goodput while the carrier was away, bit/s
	after   float64       // goodput from 1 s after the repair to the end, bit/s
	stall   time.Duration // longest stretch below 10 % of before (whole 50 ms samples) from the failure to 0.5 s before the end
	stallAt time.Duration // where it began, relative to the failure
	// stallBefore: the longest stretch before the failure, from 1 s after
	// the first byte: the connection's own, no failover's.
	stallBefore time.Duration
	pathBack    time.Duration // from the repair until node 1's nic1 sends 10 % of its link again; -1: never
	resets      []string      // RSTs in the captures
	rstCounted  float64       // TcpOutRsts + MPTcpExtMPRstTx of both pods over the transfer
	csumErrs    float64       // MPTcpExtDataCsumErr of both pods over the transfer
	retrans     float64       // the sender's TcpRetransSegs over the transfer
	reinjected  float64       // the sender's MPTcpExtMPTCPRetrans (data sent again on another subflow)
	placement   string        // each subflow's kind and the NICs node 1 sent it on, from the captures
}

func (f failoverFigures) String() string {
	back := "not within the transfer"
	if f.pathBack >= 0 {
		back = f.pathBack.String()
	}
	return fmt.Sprintf("goodput before %.1f Mbit/s; longest stall %v (below %.1f Mbit/s, starting %v after the failure; before it %v); "+
		"during the failure %.1f Mbit/s = %.2f of the live paths' %.0f Mbit/s; after the repair %.1f Mbit/s; "+
		"nic1 of node 1 carrying traffic again %s after the repair; %d RSTs captured, %.0f counted; "+
		"sender retransmitted %.0f segments, reinjected %.0f; subflows (node 1 NICs) %s",
		f.before/1e6, f.stall, f.before/10/1e6, f.stallAt, f.stallBefore, f.during/1e6, f.during/f.live, f.live/1e6,
		f.after/1e6, back, len(f.resets), f.rstCounted, f.retrans, f.reinjected, f.placement)
}

// samplesRate is the goodput of samples (bytes per interval) over [from, to)
// after the first byte, in bit/s.
func samplesRate(r testbed.ServerReport, from, to time.Duration) float64 {
	interval := time.Duration(r.SampleSeconds * float64(time.Second))
	var bytes int64
	var n int
	for i, b := range r.Samples[:max(len(r.Samples)-1, 0)] { // the last interval is partial
		if at := time.Duration(i) * interval; at >= from && at+interval <= to {
			bytes += b
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return float64(bytes) * 8 / (float64(n) * r.SampleSeconds)
}

// longestStallAt is testbed.LongestStall with where the stall began (after
// the first byte).
func longestStallAt(r testbed.ServerReport, threshold float64, skip time.Duration) (longest, at time.Duration) {
	interval := time.Duration(r.SampleSeconds * float64(time.Second))
	limit := threshold / 8 * r.SampleSeconds
	run := 0
	for i, n := range r.Samples[:max(len(r.Samples)-1, 0)] {
		if time.Duration(i)*interval < skip {
			continue
		}
		if float64(n) >= limit {
			run = 0
			continue
		}
		run++
		if d := time.Duration(run) * interval; d > longest {
			longest, at = d, time.Duration(i-run+1)*interval
		}
	}
	return longest, at
}

// podResets counts the RSTs the two pods sent (plain and MP_TCPRST).
func podResets(t *testing.T, bed *testbed.Bed) float64 {
	return podCounter(t, bed, "TcpOutRsts") + podCounter(t, bed, "MPTcpExtMPRstTx")
}

// podCounter sums a kernel counter of the two pods.
func podCounter(t *testing.T, bed *testbed.Bed, name string) float64 {
	var n float64
	for _, p := range []*testbed.Pod{bed.Pod(1, 1), bed.Pod(2, 1)} {
		n += nstatValue(t, bed, p.NetNS, name)
	}
	return n
}

// failure is a way for nic1 of a node to fail, and its repair.
type failure struct {
	name           string
	inject, repair func(bed *testbed.Bed, node int) error
	// minDuring is the share of the live path's capacity a transfer
	// must keep during the failure; 0 means the 0.8.
	minDuring float64
	// removesWireEnd: the failure deletes the wire's node-side end, and
	// the capture on it with it.
	removesWireEnd bool
}

var (
	// carrierLoss: the wire's end goes down, the NIC has no carrier.
	carrierLoss = failure{"carrier loss",
		func(b *testbed.Bed, n int) error { return b.SetCarrier(n, 1, false) },
		func(b *testbed.Bed, n int) error { return b.SetCarrier(n, 1, true) }, 0, false}
	// totalLoss: a gray failure; the wire drops everything both ways
	// while every carrier stays up.
	totalLoss = failure{"100 % loss both ways, carrier up",
		func(b *testbed.Bed, n int) error { return b.SetLoss(n, 1, 100) },
		func(b *testbed.Bed, n int) error { return b.SetLoss(n, 1, 0) }, 0, false}
	// oneWayLoss: the wire drops everything the node sends over it and
	// delivers what it receives.
	oneWayLoss = failure{"100 % loss of what the node sends, carrier up",
		func(b *testbed.Bed, n int) error { return b.SetOneWayLoss(n, 1, 100, testbed.Out) },
		func(b *testbed.Bed, n int) error { return b.SetLoss(n, 1, 0) }, 0, false}
	// partialLoss: the wire drops 30 % of what it carries, both ways, at
	// random; most probes still come back.
	//
	// The 0.8 of the live path during the failure is not met
	// here: the probes need 450 ms (median) to tell such a path from a
	// healthy one (docs/agent.md, "Liveness"), and the connection stalls
	// meanwhile, as it does for longer with the kernel alone (1.15 and
	// 1.35 s; 0.34 to 0.56 of the live path). 0.6 is what a stall within
	// the 1 s bound leaves of a 3 s failure, with margin.
	partialLoss = failure{"30 % loss both ways, carrier up",
		func(b *testbed.Bed, n int) error { return b.SetLoss(n, 1, 30) },
		func(b *testbed.Bed, n int) error { return b.SetLoss(n, 1, 0) }, 0.6, false}
	// nicRemoved: the NIC is deleted (unplugged, its driver unbound),
	// and comes back as a new link with its address and, for nic1, the
	// node's default route (bed.RestoreNIC); the agent must attach its
	// program to it and write its routes again.
	nicRemoved = failure{"NIC removed",
		func(b *testbed.Bed, n int) error { return b.RemoveNIC(n, 1) },
		func(b *testbed.Bed, n int) error { return b.RestoreNIC(n, 1) }, 0, true}
)

// failoverTransfer runs one watched transfer of failoverLength with nic1
// of node failed from failoverAt for failoverOutage, and measures it. The
// stream is verified byte by byte; a failed transfer fails the test with
// the evidence and is never tried again.
func failoverTransfer(t *testing.T, bed *testbed.Bed, port, node int, fail failure, senderArgs ...string) failoverFigures {
	t.Helper()
	ctx := background(t)
	w := bed.Watch(t, datapathEvidence(bed))
	defer w.Close()
	client, server := bed.Pod(1, 1), bed.Pod(2, 1)
	srv, err := bed.StartTrafficServer(ctx, bins.Traffic, server, port, true, "-warmup", "1s", "-window", "8s", "-sample", failoverSample.String())
	if err != nil {
		t.Fatal(err)
	}
	sampler, err := bed.StartSampler(failoverSample)
	if err != nil {
		t.Fatal(err)
	}
	rst0, csum0 := podResets(t, bed), podCounter(t, bed, "MPTcpExtDataCsumErr")
	re0, inj0 := nstatValue(t, bed, client.NetNS, "TcpRetransSegs"), nstatValue(t, bed, client.NetNS, "MPTcpExtMPTCPRetrans")

	start := time.Now()
	done := sendInBackground(ctx, bed, client, server, port, failoverLength, senderArgs...)
	time.Sleep(failoverAt)
	failErr := fail.inject(bed, node)
	down := time.Now()
	if failErr == nil {
		time.Sleep(failoverOutage)
		failErr = fail.repair(bed, node)
	}
	up := time.Now()
	res := <-done
	rows, sampleErr := sampler.Stop()
	if failErr != nil {
		_ = fail.repair(bed, node)
		t.Fatal(failErr)
	}
	if sampleErr != nil {
		t.Fatal(sampleErr)
	}
	rst1, csum1 := podResets(t, bed), podCounter(t, bed, "MPTcpExtDataCsumErr")
	re1, inj1 := nstatValue(t, bed, client.NetNS, "TcpRetransSegs"), nstatValue(t, bed, client.NetNS, "MPTcpExtMPTCPRetrans")
	rep := finishTransfer(t, w, srv, res.sent, res.err)[res.sent[0].Local]

	// The first byte, from the counters: the first sample after the sender
	// started at which node 1 had sent 64 kB more over its NICs.
	first := start
	var base, tx uint64
	var at time.Time
	for _, r := range rows {
		if r.Node != 1 {
			continue
		}
		if !r.Time.Equal(at) {
			if !at.IsZero() && at.After(start) {
				if base == 0 {
					base = tx
				} else if tx-base > 64<<10 {
					first = at
					break
				}
			}
			at, tx = r.Time, 0
		}
		tx += r.TxBytes
	}
	failAt, repairAt := down.Sub(first), up.Sub(first)

	f := failoverFigures{live: float64(bed.Config.NICs-1) * failoverLinkBps, pathBack: -1, rstCounted: rst1 - rst0, csumErrs: csum1 - csum0, retrans: re1 - re0, reinjected: inj1 - inj0}
	f.before = samplesRate(rep, time.Second, failAt)
	f.during = samplesRate(rep, failAt, repairAt)
	f.after = samplesRate(rep, repairAt+time.Second, failoverLength)
	// Stalls are looked for from 1 s after the first byte to 500 ms before
	// the sender's end: its last writes drain slowly and are no stall.
	trimmed := rep
	if n := int((failoverLength-500*time.Millisecond)/failoverSample) + 1; n < len(rep.Samples) {
		trimmed.Samples = rep.Samples[:n]
	}
	overall, _ := longestStallAt(trimmed, f.before/10, time.Second)
	if ls := testbed.LongestStall(trimmed, f.before/10, time.Second); ls != overall {
		t.Errorf("longest stall %v, testbed.LongestStall says %v", overall, ls)
	}
	// The failure's stall, from the sample the failure fell in; before it,
	// a stall is the connection's own, not the failover's.
	var stallStart time.Duration
	f.stall, stallStart = longestStallAt(trimmed, f.before/10, max(time.Second, failAt-failoverSample))
	f.stallAt = (stallStart - failAt).Round(time.Millisecond)
	early := trimmed
	if n := int(failAt/failoverSample) + 1; n < len(early.Samples) {
		early.Samples = early.Samples[:n]
	}
	f.stallBefore, _ = longestStallAt(early, f.before/10, time.Second)

	// When node 1's nic1 carries traffic again: the first interval after the
	// repair in which 10 % of the link's rate arrived at node 2's nic1 (the
	// far end of path 1): what arrives, not what node 1 says it sent.
	var prev *testbed.Sample
	for i := range rows {
		r := &rows[i]
		if r.Node != 2 || r.NIC != 1 {
			continue
		}
		if prev != nil && r.Time.After(up) {
			dt := r.Time.Sub(prev.Time).Seconds()
			if dt > 0 && float64(r.RxBytes-prev.RxBytes)*8/dt >= failoverLinkBps/10 {
				f.pathBack = r.Time.Sub(up).Round(time.Millisecond)
				break
			}
		}
		prev = r
	}

	files, err := w.Captures()
	if err != nil {
		t.Logf("captures: %v", err)
	}
	if f.resets, err = framework.Resets(files); err != nil {
		t.Errorf("reading the captures for resets: %v", err)
	}
	if a, err := testbed.Analyze(files); err != nil {
		t.Errorf("analyzing the captures: %v", err)
	} else {
		var p []string
		for _, c := range a.Connections {
			for _, sf := range c.Subflows {
				p = append(p, fmt.Sprintf("%s %v", sf.Kind, sf.NICs(1, testbed.Out)))
			}
		}
		f.placement = strings.Join(p, ", ")
	}
	// The capture on the failed wire's end went on after the repair (else
	// it would miss resets there).
	for _, c := range files {
		if c.Node == node && c.NIC == 1 && f.pathBack >= 0 && !fail.removesWireEnd {
			out, err := exec.Command("tshark", "-r", c.Path, "-Y", fmt.Sprintf("frame.time_epoch > %d.%09d", up.Unix(), up.Nanosecond()), "-T", "fields", "-e", "frame.number").Output()
			if n := strings.Count(string(out), "\n"); err != nil || n == 0 {
				t.Errorf("the capture of node 1's nic1 holds no packet after the repair (%d, %v): dumpcap did not survive the carrier loss", n, err)
			}
		}
	}
	return f
}

// The carrier of one of two paths goes away for 3 s in the middle of a
// transfer and comes back: the stream arrives whole, nothing is reset, the
// connection goes on over the other path with a short stall, and the
// repaired path carries traffic again soon. Either end's NIC may fail: on
// the sender's node ("near") the agent there detours the subflow and the
// receiver's node follows it; on the receiver's node ("far") the roles
// swap. Logged beside the kernel's own recovery (the hand-routed baseline:
// the kernel's path manager, no agent, no BPF), which is only checked for
// integrity: the negative control.
//
// Bounds (docs/testing.md, "Failover"), asserted for the near case: the
// issue's targets are a longest stall below 300 ms, at least 0.8 of the
// live path's capacity during the failure, the path back within 1 s; the
// stall bound here is 600 ms, for a shared two-core machine. The far case
// is measured and only checked for integrity and resets (see there).
func TestCarrierLossMidTransferStallsBriefly(t *testing.T) {
	const runs = failoverRuns
	for _, c := range []struct {
		name string
		node int
	}{{"near", 1}, {"far", 2}} {
		t.Run("agent "+c.name, func(t *testing.T) {
			agents := agentFailovers(t, 2, c.node, carrierLoss, 5600, failoverStallBound)
			counts := make([]map[string]float64, len(agents))
			for k, a := range agents {
				counts[k] = events(t, a, datapath.StatSubflowDetoured, datapath.StatSubflowHomed, datapath.StatSubflowFollowed)
				t.Logf("node %d datapath: %v", k+1, counts[k])
			}
			if c.node == 1 {
				// The figures above would often be met by the kernel
				// alone: these say the agent did it. Each failure
				// detoured the sender's subflow and brought it home;
				// the receiver's node followed it away, and back home
				// either by following it again or, once its own probes
				// over the path came back, by going home itself.
				lead, follow := counts[0], counts[1]
				if lead["subflow_detoured"] != runs || lead["subflow_homed"] != runs {
					t.Errorf("node 1 detoured %v and homed %v subflows, want %d each", lead["subflow_detoured"], lead["subflow_homed"], runs)
				}
				if follow["subflow_followed"] < runs || follow["subflow_followed"]+follow["subflow_homed"] < 2*runs {
					t.Errorf("node 2 followed %v moves and came home %v times, want at least %d moves away and %d in all (away and back per failure)",
						follow["subflow_followed"], follow["subflow_homed"], runs, 2*runs)
				}
			}
			// The failed node's agent saw every loss and says so.
			n, _ := scrape(t, agents[c.node-1]).Value("mptcp_agent_path_down_transitions_total", "path", framework.PathName(1))
			if n != runs {
				t.Errorf("node %d: mptcp_agent_path_down_transitions_total{path=%q} = %v, want %d", c.node, framework.PathName(1), n, runs)
			}
		})
		t.Run("kernel only "+c.name, func(t *testing.T) {
			kernelOnlyFailovers(t, 2, c.node, carrierLoss, 5702)
		})
	}
}

// A gray failure: one of two paths drops everything (both ways, or only
// what node 1 sends), or 30 % of everything, for 3 s in the middle of a
// transfer while every carrier stays up, so that no link event tells
// anyone. The agents' liveness probes find it (a probe every 30 ms, down
// after 5 unanswered in a row, or 5 of the last 20): both nodes mark the path down, the
// subflow detours over the other path, and comes home once the probes
// come back. Whichever node's wire fails, near or far, the targets hold,
// because probes are round trips; beside them the kernel alone (the
// hand-routed baseline), checked only for integrity.
func TestGrayFailureMidTransferIsFoundByProbes(t *testing.T) {
	const runs = failoverRuns
	for _, c := range []struct {
		node int
		fail failure
	}{{1, totalLoss}, {2, totalLoss}, {1, oneWayLoss}, {1, partialLoss}} {
		node, fail := c.node, c.fail
		t.Run(fmt.Sprintf("agent, node %d's nic1, %s", node, fail.name), func(t *testing.T) {
			agents := agentFailovers(t, 2, node, fail, 5800, grayStallBound)
			for k, a := range agents {
				m := scrape(t, a)
				counts := events(t, a, datapath.StatSubflowDetoured, datapath.StatSubflowHomed, datapath.StatSubflowFollowed)
				downs, _ := m.Value("mptcp_agent_path_down_transitions_total", "path", framework.PathName(1))
				peerDowns, _ := m.Value("mptcp_agent_path_peer_down_transitions_total", "path", framework.PathName(1), "peer", framework.NodeName(agents[1-k].Node))
				t.Logf("node %d: datapath %v; path1 down %v times, its peer silent on it %v times", k+1, counts, downs, peerDowns)
				// Probes are round trips: both nodes lose their peer
				// on the failed path, whichever end's wire failed.
				if downs != runs || peerDowns != runs {
					t.Errorf("node %d: path1 went down %v times and its peer was silent on it %v times, want %d each", k+1, downs, peerDowns, runs)
				}
			}
			// The sender's subflow left the path in every run and came
			// back: led by node 1, or following node 2 when node 2's
			// probes found the failure first (a loss both ways that
			// spares some probes: either node may be first).
			if lead := events(t, agents[0], datapath.StatSubflowDetoured, datapath.StatSubflowFollowed, datapath.StatSubflowHomed); lead["subflow_detoured"]+lead["subflow_followed"] < runs || lead["subflow_homed"] < runs {
				t.Errorf("node 1 (the sender's) detoured %v, followed %v and homed %v subflows, want at least %d away and %d home",
					lead["subflow_detoured"], lead["subflow_followed"], lead["subflow_homed"], runs, runs)
			}
		})
	}
	t.Run("kernel only, node 1's nic1", func(t *testing.T) {
		kernelOnlyFailovers(t, 2, 1, totalLoss, 5902)
	})
	t.Run("kernel only, node 1's nic1, 30 % loss", func(t *testing.T) {
		kernelOnlyFailovers(t, 2, 1, partialLoss, 5922)
	})
}

// Three paths: the carrier of one of them goes away mid-transfer and comes
// back, on the sender's node; the connection goes on over the other two.
// The same targets as with two paths, against the two live paths'
// capacity, beside the kernel alone (hand-routed over three NICs).
func TestCarrierLossOnOneOfThreePaths(t *testing.T) {
	t.Run("agent", func(t *testing.T) {
		agents := agentFailovers(t, 3, 1, carrierLoss, 6200, failoverStallBound)
		checkDetouredAndHomed(t, agents[0], failoverRuns)
	})
	t.Run("kernel only", func(t *testing.T) {
		kernelOnlyFailovers(t, 3, 1, carrierLoss, 6302)
	})
}

// A NIC of the sender's node is deleted in the middle of a transfer and
// comes back 3 s later as a new link (bed.RemoveNIC, RestoreNIC): the
// agent's link events mark the path down at once, the subflow detours,
// and once the NIC is back the reconcile that its creation asks for
// attaches the datapath to the new link and writes its routes, and the
// subflow comes home. Targets as for the carrier, with the 1 s stall bound
// of every failure but carrier loss. Beside it the kernel alone, checked
// only for integrity (its route over nic1 is the main table's default,
// which RestoreNIC writes again, as the host's configuration would).
func TestNICRemovedMidTransferIsReattached(t *testing.T) {
	const runs = failoverRuns
	t.Run("agent", func(t *testing.T) {
		agents := agentFailovers(t, 2, 1, nicRemoved, 6000, grayStallBound)
		checkDetouredAndHomed(t, agents[0], runs)
		n, _ := scrape(t, agents[0]).Value("mptcp_agent_path_down_transitions_total", "path", framework.PathName(1))
		if n != runs {
			t.Errorf("node 1: mptcp_agent_path_down_transitions_total{path=%q} = %v, want %d", framework.PathName(1), n, runs)
		}
	})
	t.Run("kernel only", func(t *testing.T) {
		kernelOnlyFailovers(t, 2, 1, nicRemoved, 6102)
	})
}

// agentFailovers runs the agent's row of a failover test on a bed of its
// own, with nics NICs per node and a file-mode agent per node: userspace
// subflows; flap damping off (the runs fail one NIC three times within a
// minute, which damping would answer by holding it down: its own tests are
// in internal/agent/linkwatch); liveness on, every peer Up on every path
// before the first failure. Then failoverRuns watched transfers from port
// on, nic1 of node failing in each, each checked for resets and against
// the targets with bound on the stall. It returns the agents, for the
// row's own checks; a failed row logs the agents' last lines.
func agentFailovers(t *testing.T, nics, node int, fail failure, port int, bound time.Duration) []*framework.Agent {
	t.Helper()
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: nics, PodsPerNode: 1, LinkRate: "200mbit"})
	agents, err := framework.StartAgentsWith(background(t), bed, bins.Agent, func(*testbed.Node) mptcpv1alpha1.CompiledRule {
		return mptcpv1alpha1.CompiledRule{SubflowCreation: mptcpv1alpha1.SubflowCreationUserspace}
	}, declaredCaps, framework.WithFlapDamping(agent.FlapDamping{Transitions: -1}), framework.WithLiveness())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			logAgentTails(t, agents, 60)
		}
	})
	for k, a := range agents {
		for path := 1; path <= nics; path++ {
			waitForMetric(t, a, "mptcp_agent_path_peer_up", 1, 10*time.Second, "path", framework.PathName(path), "peer", framework.NodeName(bed.Nodes[1-k]))
		}
	}
	var all []failoverFigures
	for i := range failoverRuns {
		f := failoverTransfer(t, bed, port+i, node, fail)
		t.Logf("agent, %d NICs, node %d's nic1, %s: %v", nics, node, fail.name, f)
		all = append(all, f)
		checkNoResets(t, f)
		checkFailoverTargets(t, f, fail, bound)
	}
	t.Logf("agent, %d NICs, node %d's nic1, %s, %d runs: %s", nics, node, fail.name, failoverRuns, summarizeFailover(all))
	return agents
}

// checkDetouredAndHomed asserts that a's node moved a subflow off the
// failed path and brought it home at least runs times each.
func checkDetouredAndHomed(t *testing.T, a *framework.Agent, runs int) {
	t.Helper()
	c := events(t, a, datapath.StatSubflowDetoured, datapath.StatSubflowHomed)
	t.Logf("node %d datapath: %v", a.Node.Index, c)
	if c["subflow_detoured"] < float64(runs) || c["subflow_homed"] < float64(runs) {
		t.Errorf("node %d detoured %v and homed %v subflows, want at least %d each", a.Node.Index, c["subflow_detoured"], c["subflow_homed"], runs)
	}
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

// kernelOnlyFailovers is the negative control beside the agent's rows: runs
// transfers on a bed of its own with nics NICs per node, hand-routed (the
// kernel's path manager, a subflow per NIC, no agent, no BPF), with nic1 of
// node failing in each, from port+8 on (port and the ones after it are the
// server's signalled ones). Only integrity is
// asserted; resets are logged. The sender waits up to 30 s for progress
// (not 5 s): the kernel alone stalls longer than that under 30 % loss, and
// that stall is what the control is there to show.
func kernelOnlyFailovers(t *testing.T, nics, node int, fail failure, port int) {
	const runs = failoverRuns
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: nics, PodsPerNode: 1, LinkRate: "200mbit"})
	var ports []int // one signalled port per NIC beyond the first
	for k := range nics - 1 {
		ports = append(ports, port+k)
	}
	testbed.Must(t, bed.HandRoute(ports))
	testbed.Must(t, bed.ConfigureSignalPorts(bed.Pod(2, 1), ports))
	testbed.Must(t, bed.ConfigureClientLimits(bed.Pod(1, 1), nics, nics-1))
	var all []failoverFigures
	for i := range runs {
		f := failoverTransfer(t, bed, port+8+i, node, fail, "-stall", "30s")
		t.Logf("kernel only, node %d's nic1, %s: %v", node, fail.name, f)
		all = append(all, f)
		if len(f.resets) != 0 || f.rstCounted != 0 {
			t.Logf("kernel only: resets (not asserted):\n%s", strings.Join(f.resets, "\n"))
		}
	}
	t.Logf("kernel only, node %d's nic1, %s, %d runs: %s", node, fail.name, runs, summarizeFailover(all))
}

// waitForMetric waits until a's series name{labels} has value want.
func waitForMetric(t *testing.T, a *framework.Agent, name string, want float64, within time.Duration, labels ...string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		v, ok := scrape(t, a).Value(name, labels...)
		if ok && v == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %d: %s%v = %v (present %v), want %v within %v", a.Node.Index, name, labels, v, ok, want, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// grayStallBound is what TestGrayFailureMidTransferIsFoundByProbes asserts
// on the longest stall: the target is 1 s for every failure; the
// probes take 150 ms to find it (5 intervals of 30 ms).
const grayStallBound = time.Second

// checkFailoverTargets asserts the targets on one transfer: the
// longest stall from the failure on within bound (and any before it within
// 1 s), at least the failure's minDuring (0.8) of the live paths' capacity
// during the failure, the failed path carrying traffic again within 1 s of
// the repair.
func checkFailoverTargets(t *testing.T, f failoverFigures, fail failure, bound time.Duration) {
	t.Helper()
	if f.stall > bound {
		t.Errorf("longest stall %v, want at most %v", f.stall, bound)
	}
	// Not the failover's, but a stall all the same (issue 13): the
	// bound of every failure.
	if f.stallBefore > grayStallBound {
		t.Errorf("a stall of %v before the failure, want at most %v", f.stallBefore, grayStallBound)
	}
	minDuring := fail.minDuring
	if minDuring == 0 {
		minDuring = 0.8
	}
	if r := f.during / f.live; r < minDuring {
		t.Errorf("during the failure %.2f of the live paths' capacity, want at least %.2f", r, minDuring)
	}
	if f.pathBack < 0 || f.pathBack > time.Second {
		t.Errorf("the repaired path carried traffic again after %v, want within 1 s", f.pathBack)
	}
}

// summarizeFailover gives min/median/max of the figures that decide.
func summarizeFailover(fs []failoverFigures) string {
	mmm := func(get func(failoverFigures) float64, unit string) string {
		v := make([]float64, len(fs))
		for i, f := range fs {
			v[i] = get(f)
		}
		slices.Sort(v)
		return fmt.Sprintf("%.2f/%.2f/%.2f%s", v[0], v[len(v)/2], v[len(v)-1], unit)
	}
	return "min/median/max: longest stall " + mmm(func(f failoverFigures) float64 { return f.stall.Seconds() }, " s") +
		", during the failure " + mmm(func(f failoverFigures) float64 { return f.during / f.live }, " of the live paths") +
		", path back " + mmm(func(f failoverFigures) float64 {
		if f.pathBack < 0 {
			return math.Inf(1)
		}
		return f.pathBack.Seconds()
	}, " s")
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

// checkNoResets fails the test for any reset but one kind, which it names
// and counts: a subflow reset by its receiver with MP_FAIL and MP_TCPRST
// "middlebox interference" after a DSS checksum error. That is the defence
// against Linux 6.18's misplaced data at connection start
// (docs/testing.md, "Data integrity"), on by default in selected pods: the
// data goes again over another subflow and the stream arrives whole (the
// transfer checks it), but the connection goes on with one subflow fewer.
func checkNoResets(t *testing.T, f failoverFigures) {
	t.Helper()
	checksum := 0
	for _, r := range f.resets {
		if strings.Contains(r, " 6,8 0x06") {
			checksum++
		}
	}
	if checksum > 0 && checksum == len(f.resets) && f.csumErrs > 0 {
		t.Logf("known: %d subflow resets by DSS checksums (%.0f checksum errors counted): the kernel's misplaced data caught; "+
			"the connection went on with one subflow fewer:\n%s", checksum, f.csumErrs, strings.Join(f.resets, "\n"))
		return
	}
	if len(f.resets) != 0 {
		t.Errorf("%d resets in the captures:\n%s", len(f.resets), strings.Join(f.resets, "\n"))
	}
	if f.rstCounted != 0 {
		t.Errorf("the pods sent %.0f resets (TcpOutRsts + MPTcpExtMPRstTx)", f.rstCounted)
	}
}
