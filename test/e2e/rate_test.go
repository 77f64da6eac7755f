package e2e

import (
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// rateCap is what the rate tests cap a pod's connection to: a fifth of the
// bed's 200 Mbit/s links, so the links never limit and other helpers' load
// on the machine rarely does.
const rateCap = 40_000_000

// policeHi bounds the goodput police lets through, as a fraction of the
// cap: over any stretch of time a bucket passes its rate and at most one
// burst (1 MB) on top, which a sender that idled (a retransmission timeout)
// finds full; over the 6 s measured that is 0.033 of the cap. A bbr sender
// was measured at 1.004 and 1.015 of the cap.
const policeHi = 1.04

// windowCap is the window test's cap: a quarter of the two 200 Mbit/s
// links, and well above what the one-segment window floor alone lets
// through per ACK cycle (TestRate/WindowCapsWhatThePodReceives).
const windowCap = 100_000_000

// rateRound is one transfer from pod 1 on node 1 to pod 1 on node 2.
type rateRound struct {
	goodput float64 // server-side payload rate over the measured window, bit/s
	retrans float64 // the sender's TcpRetransSegs / TcpOutSegs over the transfer
	samples testbed.ServerReport
}

// stall is the round's longest stretch below 10 % of cap after the first
// second (docs/benchmarks.md, "Rate modes: longest stall").
func (r rateRound) stall(cap float64) time.Duration {
	return testbed.LongestStall(r.samples, cap/10, time.Second)
}

// senderCounters reads the sender pod's TCP segment counters (its own
// network namespace, so only this test's traffic).
func senderCounters(t *testing.T, bed *testbed.Bed, pod *testbed.Pod) (out, retrans float64) {
	t.Helper()
	return nstatValue(t, bed, pod.NetNS, "TcpOutSegs"), nstatValue(t, bed, pod.NetNS, "TcpRetransSegs")
}

// transfer sends from pod (1,1) to pod (2,1) for 8 s over one MPTCP
// connection, and measures the server's goodput over [1.5 s, 7.5 s]. cc is
// the sender's congestion control, "" for its namespace's default (which
// the bed's namespaces take from the machine: bbr here). The wires are
// captured while it runs; a failed transfer fails the test with that
// evidence (testbed.Watch) and is never tried again.
func transfer(t *testing.T, bed *testbed.Bed, port int, cc string) rateRound {
	t.Helper()
	return transferOver(t, bed, port, cc, true)
}

// transferOver is transfer over one MPTCP connection, or a plain TCP one.
func transferOver(t *testing.T, bed *testbed.Bed, port int, cc string, mptcp bool) rateRound {
	t.Helper()
	return transferFor(t, bed, port, cc, mptcp, 8*time.Second)
}

// transferFor is transferOver for d, the goodput measured from 1.5 s to
// 0.5 s before the end.
func transferFor(t *testing.T, bed *testbed.Bed, port int, cc string, mptcp bool, d time.Duration) rateRound {
	t.Helper()
	ctx := background(t)
	w := bed.Watch(t, framework.DatapathEvidence(bed))
	defer w.Close()
	client, server := bed.Pod(1, 1), bed.Pod(2, 1)
	srv, err := bed.StartTrafficServer(ctx, bins.Traffic, server, port, mptcp, "-warmup", "1500ms", "-window", (d - 2*time.Second).String(), "-sample", "50ms")
	if err != nil {
		t.Fatal(err)
	}
	out0, re0 := senderCounters(t, bed, client)
	args := []string{"-conns", "1", "-duration", d.String(), "-seed", strconv.Itoa(port)}
	if cc != "" {
		args = append(args, "-cc", cc)
	}
	sent, sendErr := bed.Send(ctx, bins.Traffic, client, netip.AddrPortFrom(server.Addr, uint16(port)), mptcp, args...)
	out1, re1 := senderCounters(t, bed, client)
	rep := finishTransferOver(t, w, srv, sent, sendErr, mptcp)[sent[0].Local]
	r := rateRound{goodput: rep.GoodputBps, samples: rep}
	if out1 > out0 {
		r.retrans = (re1 - re0) / (out1 - out0)
	}
	return r
}

// capHolds runs rounds transfers and checks the median goodput is within
// [lo, hi] of rateCap and the median retransmission ratio below maxRetrans.
func capHolds(t *testing.T, bed *testbed.Bed, rateCap, lo, hi, maxRetrans float64) {
	t.Helper()
	capHoldsOver(t, bed, 3, "", rateCap, lo, hi, maxRetrans)
}

// capHoldsOver is capHolds with the number of rounds (odd) and the
// sender's congestion control. It stops as soon as the verdict on the
// medians is known: once rounds/2+1 rounds are all within the bounds, the
// median of all the rounds is too, whatever the rest would measure (fewer
// than half can lie on either side of it), so they are not run. A round
// outside the bounds leaves every round to be run and the medians to
// decide.
func capHoldsOver(t *testing.T, bed *testbed.Bed, rounds int, cc string, rateCap, lo, hi, maxRetrans float64) {
	t.Helper()
	var goodput, retrans []float64
	inside := 0
	for i := 0; i < rounds && inside < rounds/2+1; i++ {
		r := transfer(t, bed, 5300+i, cc)
		t.Logf("round %d: goodput %.1f Mbit/s (%.3f of the cap), retransmitted %.2f%% of segments, longest stall %v", i+1, r.goodput/1e6, r.goodput/rateCap, 100*r.retrans, r.stall(rateCap))
		goodput, retrans = append(goodput, r.goodput), append(retrans, r.retrans)
		if r.goodput >= lo*rateCap && r.goodput <= hi*rateCap && r.retrans <= maxRetrans && inside == i {
			inside++
		}
	}
	slices.Sort(goodput)
	slices.Sort(retrans)
	g, re := goodput[len(goodput)/2], retrans[len(retrans)/2]
	if len(goodput) < rounds {
		t.Logf("the first %d of %d rounds are within the bounds: the median of %d is too", len(goodput), rounds, rounds)
	}
	t.Logf("medians: goodput %.1f Mbit/s = %.3f of the %.0f Mbit/s cap; retransmissions %.2f%%", g/1e6, g/rateCap, rateCap/1e6, 100*re)
	if g < lo*rateCap || g > hi*rateCap {
		t.Errorf("median goodput %.1f Mbit/s is %.3f of the cap, want %.2f..%.2f", g/1e6, g/rateCap, lo, hi)
	}
	if re > maxRetrans {
		t.Errorf("median retransmissions %.2f%% of segments, want at most %.1f%%", 100*re, 100*maxRetrans)
	}
}

func quantity(bps int64) *resource.Quantity { return resource.NewQuantity(bps, resource.DecimalSI) }

// rateBed brings up two nodes with two 200 Mbit/s NICs and one pod each,
// and agents whose rule for node is ruleFor(node index).
func rateBed(t *testing.T, ruleFor func(node int) mptcpv1alpha1.CompiledRule) (*testbed.Bed, []*framework.Agent) {
	t.Helper()
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "200mbit"})
	agents, err := framework.StartAgentsWith(background(t), bed, bins.Agent, func(n *testbed.Node) mptcpv1alpha1.CompiledRule { return ruleFor(n.Index) }, declaredCaps)
	if err != nil {
		t.Fatal(err)
	}
	return bed, agents
}

func stats(t *testing.T, a *framework.Agent) map[string]float64 {
	t.Helper()
	return events(t, a, datapath.StatRateDropConn, datapath.StatRateWndLowered, datapath.StatRateShaped)
}

// police on the sending pod's node caps what the pod sends, per connection
// (both subflows share the bucket), with the default bucket of 200 ms at the
// cap (1 MB). The sender's congestion control decides how close to the cap
// it gets, so each case pins it:
//
//   - cubic (Linux's default): 0.85..1.0 of the cap, retransmissions under
//     20 % of segments. Measured medians 0.945 (rounds 0.935..0.970), 14 %,
//     on an idle machine; 0.888..0.922 in eight runs on 2026-11-23 with
//     other suites running and every wire captured (testbed.Watch): the
//     sender's clock-driven bursts are what police answers, and a busy CPU
//     makes them burstier.
//   - bbr (this machine's default, which the bed's namespaces inherit):
//     0.75..1.0, under 50 %. BBR paces at the highest delivery rate it saw
//     (the bucket's bursts are at line rate) and treats loss as no signal,
//     so at this sub-millisecond RTT a subflow keeps overrunning the
//     bucket, loses most of a window, and sits out a retransmission
//     timeout (~205 ms), often both subflows at once. Measured medians
//     0.78..0.93, 34..41 % of segments retransmitted. The upper bound is
//     the point here: the cap holds against a sender that ignores loss.
//
// Three rounds each: cubic's rounds have stayed 0.03 or more above its
// lower bound, bbr's bounds are wide. The upper bound is what a bucket
// lets through in the measured window: the cap, and one burst on top
// (policeHi).
func testPoliceCapsWhatThePodSends(t *testing.T) {
	for _, c := range []struct {
		cc         string
		rounds     int
		lo         float64
		maxRetrans float64
	}{
		{cc: "cubic", rounds: 3, lo: 0.85, maxRetrans: 0.2},
		{cc: "bbr", rounds: 3, lo: 0.75, maxRetrans: 0.5},
	} {
		t.Run(c.cc, func(t *testing.T) {
			bed, agents := rateBed(t, func(node int) mptcpv1alpha1.CompiledRule {
				if node != 1 {
					return mptcpv1alpha1.CompiledRule{}
				}
				return mptcpv1alpha1.CompiledRule{RateLimits: &mptcpv1alpha1.CompiledRateLimits{Mode: mptcpv1alpha1.RateModePolice, PerConnection: quantity(rateCap), Direction: mptcpv1alpha1.RateEgress}}
			})
			capHoldsOver(t, bed, c.rounds, c.cc, rateCap, c.lo, policeHi, c.maxRetrans)
			if s := stats(t, agents[0]); s["rate_police_drop_connection"] == 0 {
				t.Errorf("no police drop counted on the sender's node: %v", s)
			}
		})
	}
}

// A long transfer with the product's defaults (the agent as the pods' path
// manager, its joins held, DSS checksums on, the pods' congestion control
// set to cubic: podMPTCP.congestionControl) over two paths of 200 Mbit/s,
// nothing failing, does not stop every so often, though the pods'
// namespaces inherit bbr from the machine and the sender names none. Left
// to the pods, BBR's PROBE_RTT, which DSS checksums make regular every
// 10 s, stops the connection for 150-250 ms each time (docs/testing.md,
// "Stalls"). A node whose default is cubic is the same transfer with
// nothing for the agent to change, so bbr is the one row. A stall
// here is at least 100 ms (two 50 ms samples) below a tenth of the
// connection's mean rate, after its first second; a periodic one shows at
// least twice in 25 s. One stall is tolerated: a loss recovered late on
// one subflow holds the whole connection's window for 150-200 ms, about
// once in 300 s of such transfers (docs/benchmarks.md, "Steady state:
// longest stall"; the kernel's scheduler, docs/testing.md, "Stalls"); two
// in one transfer would be a chance of under 1 % if they were that.
func testSteadyTransferHasNoPeriodicStall(t *testing.T) {
	// Bed namespaces take only what the machine allows them (reno and
	// the kernel's built-in default: bbr here), as a node's pods do.
	release, err := testbed.AllowCongestionControl(mptcpv1alpha1.DefaultCongestionControl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := release(); err != nil {
			t.Error(err)
		}
	})
	// The bed's node and pod namespaces start with bbr, as on a node whose
	// default it is.
	const inherited, length = "bbr", 25 * time.Second
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "200mbit"})
	for _, n := range bed.Nodes {
		testbed.Must(t, bed.Sysctl(n.NetNS, "net.ipv4.tcp_congestion_control", inherited))
		for _, p := range n.Pods {
			testbed.Must(t, bed.Sysctl(p.NetNS, "net.ipv4.tcp_congestion_control", inherited))
		}
	}
	rule := func(*testbed.Node) mptcpv1alpha1.CompiledRule {
		r := *userspace(0)
		r.CongestionControl = mptcpv1alpha1.DefaultCongestionControl // the policy's default, compiled
		return r
	}
	if _, err := framework.StartAgentsWith(background(t), bed, bins.Agent, rule, declaredCaps); err != nil {
		t.Fatal(err)
	}
	for _, n := range bed.Nodes {
		for _, p := range n.Pods {
			if got, err := netnsutil.ReadSysctl("/var/run/netns/"+p.NetNS, "net.ipv4.tcp_congestion_control"); err != nil || got != mptcpv1alpha1.DefaultCongestionControl {
				t.Fatalf("pod %s runs %q (%v), want the agent's %s", p.NetNS, got, err, mptcpv1alpha1.DefaultCongestionControl)
			}
		}
	}
	r := transferFor(t, bed, 5350, "", true, length)
	mean := float64(r.samples.Bytes) * 8 / r.samples.DurationSeconds
	stalls := testbed.Stalls(r.samples, mean/10, time.Second, 100*time.Millisecond)
	t.Logf("pods inherited %s; %v at %.1f Mbit/s: stalls of 100 ms or more %v", inherited, length, r.goodput/1e6, stalls)
	if len(stalls) > 1 {
		t.Errorf("%d stalls of 100 ms or more in %v (from the first byte: %v); want at most one, and none periodic", len(stalls), length, stalls)
	}
	if r.goodput < 0.9*2*200e6*0.94 {
		t.Errorf("goodput %.1f Mbit/s, want at least 0.9 of the two paths' payload rate", r.goodput/1e6)
	}
}

// police on the receiving pod's node caps what the pod receives (pod_ingress,
// after the link: here packets arrive one segment each, not in GSO batches).
// A cubic sender on the other node: measured median 0.928 of the cap (rounds
// 0.900..0.955), 14 % of segments retransmitted, on an idle machine; median
// 0.899 (rounds 0.889..0.945) in a fresh-clone CI run of the whole suite on
// a slower machine (2026-11-25). Bounds 0.85..1.0 and 20 %, as for the
// sender's side: the same bucket answers the same bursts. Five rounds: a
// fresh-clone CI run of the whole suite (2026-11-27), the rate tests alone
// on the machine as make test runs them, measured rounds 0.815, 0.840 and
// 0.945, two of three below the bound, where the run before had
// 0.946..0.959: this VM has slow spells of its own, and a median of five
// asks three slow rounds in one case to fail it.
func testPoliceCapsWhatThePodReceives(t *testing.T) {
	bed, agents := rateBed(t, func(node int) mptcpv1alpha1.CompiledRule {
		if node != 2 {
			return mptcpv1alpha1.CompiledRule{}
		}
		return mptcpv1alpha1.CompiledRule{RateLimits: &mptcpv1alpha1.CompiledRateLimits{Mode: mptcpv1alpha1.RateModePolice, PerConnection: quantity(rateCap), Direction: mptcpv1alpha1.RateIngress}}
	})
	capHoldsOver(t, bed, 5, "cubic", rateCap, 0.85, policeHi, 0.2)
	if s := stats(t, agents[1]); s["rate_police_drop_connection"] == 0 {
		t.Errorf("no police drop counted on the receiver's node: %v", s)
	}
}

// shape on the sending pod's node: HTB classes of 20 Mbit/s on each of the
// two NICs (perPath) hold the pod's two-subflow connection to 40 Mbit/s.
// Rounds measured 0.873..0.953 of the cap with 0.00..0.17 % retransmitted
// (the low ones in CI, with the machine busy; headers and MPTCP options
// leave at most ~0.94 of the wire for payload). Three rounds, bound
// 0.85..1.0: the upper bound is the cap, the lower one says shaping does
// not waste the path.
func testShapeCapsWhatThePodSends(t *testing.T) {
	bed, agents := rateBed(t, func(node int) mptcpv1alpha1.CompiledRule {
		if node != 1 {
			return mptcpv1alpha1.CompiledRule{}
		}
		return mptcpv1alpha1.CompiledRule{RateLimits: &mptcpv1alpha1.CompiledRateLimits{Mode: mptcpv1alpha1.RateModeShape, PerPath: []mptcpv1alpha1.CompiledPathRate{
			{Path: framework.PathName(1), Rate: *quantity(rateCap / 2)}, {Path: framework.PathName(2), Rate: *quantity(rateCap / 2)}}}}
	})
	capHoldsOver(t, bed, 3, "", rateCap, 0.85, 1.0, 0.01)
	if s := stats(t, agents[0]); s["rate_shape_classified"] == 0 {
		t.Errorf("no packet classified for shaping on the sender's node: %v", s)
	}
	// The agent's qdiscs go with the rule, and nothing else is touched.
	cfg := agents[0].Config
	shaped := cfg.Rule().RateLimits
	cfg.Rule().RateLimits = nil
	if err := agents[0].WriteConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if err := agents[0].Proc.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if _, err := agents[0].WaitReconciles(background(t), 2); err != nil {
		t.Fatal(err)
	}
	node := bed.Node(1)
	rootQdisc := func(nic string) string {
		out, err := bed.Command(node.NetNS, "tc", "qdisc", "show", "dev", nic, "root").Output()
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	for _, nic := range node.NICs {
		if q := rootQdisc(nic.Name); strings.Contains(q, "htb") {
			t.Errorf("%s still has an HTB root after the rule stopped shaping: %s", nic.Name, q)
		}
	}

	// A root qdisc someone else put on a NIC (an HTB too, told apart by its
	// handle) is left alone: the agent reports it and shapes the other
	// NIC; uninstall removes only its own.
	nic1, nic2 := node.NIC(1).Name, node.NIC(2).Name
	if out, err := bed.Command(node.NetNS, "tc", "qdisc", "replace", "dev", nic2, "root", "handle", "1:", "htb").CombinedOutput(); err != nil {
		t.Fatalf("adding a foreign qdisc: %v: %s", err, out)
	}
	cfg.Rule().RateLimits = shaped
	if err := agents[0].WriteConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if err := agents[0].Proc.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if _, err := agents[0].WaitReconciles(background(t), 3); err == nil || !strings.Contains(err.Error(), "did not create") {
		t.Errorf("reconcile with a foreign root qdisc on %s: error %v, want one naming it", nic2, err)
	}
	if q := rootQdisc(nic1); !strings.Contains(q, "htb 6d70:") {
		t.Errorf("%s: root %q, want the agent's HTB", nic1, q)
	}
	if q := rootQdisc(nic2); !strings.Contains(q, "htb 1:") {
		t.Errorf("%s: root %q, want the foreign HTB untouched", nic2, q)
	}
	if err := agents[0].Uninstall(background(t)); err != nil {
		t.Fatal(err)
	}
	if q := rootQdisc(nic1); strings.Contains(q, "htb") {
		t.Errorf("%s: root %q after uninstall, want the kernel's default", nic1, q)
	}
	if q := rootQdisc(nic2); !strings.Contains(q, "htb 1:") {
		t.Errorf("%s: root %q after uninstall, want the foreign HTB untouched", nic2, q)
	}
}

// window on the receiving pod's node lowers the window of the receiver's
// ACKs: the sender, on another node, sends at the cap. The tolerance is
// 0.9..1.1: the window never goes below one segment (a zero window stops
// the ACK clock and the peer waits for its persist timer, which held a
// connection to 2.6 Mbit/s), and that segment lets the peer past the paced
// edge once per ACK cycle (measured 1.015, 1.026, 1.093 of a 100 Mbit/s
// cap; at 40 Mbit/s, where a segment per 0.2 ms RTT is itself 58 Mbit/s,
// 0.99..1.34).
func testWindowCapsWhatThePodReceives(t *testing.T) {
	bed, agents := rateBed(t, func(node int) mptcpv1alpha1.CompiledRule {
		if node != 2 {
			return mptcpv1alpha1.CompiledRule{}
		}
		return mptcpv1alpha1.CompiledRule{HeaderRewriting: true, RateLimits: &mptcpv1alpha1.CompiledRateLimits{Mode: mptcpv1alpha1.RateModeWindow, PerConnection: quantity(windowCap)}}
	})
	capHolds(t, bed, windowCap, 0.9, 1.1, 0.01)
	if s := stats(t, agents[1]); s["rate_window_lowered"] == 0 {
		t.Errorf("no window lowered on the receiver's node: %v", s)
	}
}

// A pod's per-pod cap holds for what it sends, and for what it receives,
// whatever the protocol: plain TCP and UDP beside MPTCP are policed where
// they leave the path's NIC (nic_egress) or enter the pod (pod_ingress, by
// the NIC they arrived on), since no subflow entry names them. Before, only
// MPTCP connections were capped and a tenant escaped its cap by not
// speaking MPTCP (measured: 191 and 196 Mbit/s against a 40 Mbit/s cap).
//
//   - plain TCP, cubic sender: goodput within 0.5..1.0 of the cap (its
//     upper bound is what police guarantees; how close it gets is the
//     sender's, as for MPTCP);
//   - UDP sent as fast as the sender can (at least twice the cap, checked):
//     what arrives over [0.5 s, 3 s] within 0.5..1.1 of the cap.
func testPerPodPoliceCapsEveryProtocol(t *testing.T) {
	for _, c := range []struct {
		name string
		node int // the node whose pod's cap holds: 1 sends, 2 receives
		dir  mptcpv1alpha1.RateDirection
	}{
		{"sent", 1, mptcpv1alpha1.RateEgress},
		{"received", 2, mptcpv1alpha1.RateIngress},
	} {
		t.Run(c.name, func(t *testing.T) {
			podCapHoldsForEveryProtocol(t, c.node, c.dir)
		})
	}
}

func podCapHoldsForEveryProtocol(t *testing.T, capped int, dir mptcpv1alpha1.RateDirection) {
	bed, agents := rateBed(t, func(node int) mptcpv1alpha1.CompiledRule {
		if node != capped {
			return mptcpv1alpha1.CompiledRule{}
		}
		return mptcpv1alpha1.CompiledRule{RateLimits: &mptcpv1alpha1.CompiledRateLimits{Mode: mptcpv1alpha1.RateModePolice, PerPod: quantity(rateCap), Direction: dir}}
	})
	r := transferOver(t, bed, 5400, "cubic", false)
	t.Logf("plain TCP: goodput %.1f Mbit/s (%.3f of the cap)", r.goodput/1e6, r.goodput/rateCap)
	if r.goodput < 0.5*rateCap || r.goodput > rateCap {
		t.Errorf("plain TCP goodput %.1f Mbit/s is %.3f of the %.0f Mbit/s pod cap, want 0.5..1.0", r.goodput/1e6, r.goodput/rateCap, rateCap/1e6)
	}

	sent, received := udpBlast(t, bed.Pod(1, 1), bed.Pod(2, 1), 5401, 3*time.Second, 500*time.Millisecond)
	t.Logf("UDP: sent %.1f Mbit/s, received %.1f Mbit/s after the first 0.5 s (%.3f of the cap)", sent/1e6, received/1e6, received/rateCap)
	if sent < 2*rateCap {
		t.Fatalf("the UDP sender reached only %.1f Mbit/s: too slow to test a %.0f Mbit/s cap", sent/1e6, rateCap/1e6)
	}
	if received < 0.5*rateCap || received > 1.1*rateCap {
		t.Errorf("UDP arrived at %.1f Mbit/s, %.3f of the %.0f Mbit/s pod cap, want 0.5..1.1", received/1e6, received/rateCap, rateCap/1e6)
	}
	if s := events(t, agents[capped-1], datapath.StatRateDropPod); s["rate_police_drop_pod"] == 0 {
		t.Errorf("no pod police drop counted on node %d: %v", capped, s)
	}
}

// udpBlast sends 1400-byte UDP datagrams from pod from to pod to's port as
// fast as it can for d, and returns the rate it sent at and the rate that
// arrived after skip, both in bit/s.
func udpBlast(t *testing.T, from, to *testbed.Pod, port int, d, skip time.Duration) (sent, received float64) {
	t.Helper()
	dst := netip.AddrPortFrom(to.Addr, uint16(port))
	var in, out *net.UDPConn
	if err := netnsutil.Do("/var/run/netns/"+to.NetNS, func() (err error) {
		in, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(dst))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if err := netnsutil.Do("/var/run/netns/"+from.NetNS, func() (err error) {
		out, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(dst))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	start := time.Now()
	var got atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			_ = in.SetReadDeadline(time.Now().Add(time.Second))
			n, err := in.Read(buf)
			if err != nil {
				return
			}
			if time.Since(start) >= skip {
				got.Add(int64(n))
			}
		}
	}()
	payload := make([]byte, 1400)
	var wrote int64
	for time.Since(start) < d {
		// A full socket buffer or a queue drop is the sender's
		// problem, not the test's: it keeps sending.
		if n, err := out.Write(payload); err == nil {
			wrote += int64(n)
		}
	}
	elapsed := time.Since(start)
	time.Sleep(200 * time.Millisecond) // what is in flight arrives
	arrived := got.Load()
	in.Close()
	<-done
	return float64(wrote) * 8 / elapsed.Seconds(), float64(arrived) * 8 / (elapsed - skip).Seconds()
}

// guestRateCap is what TestRate/PoliceCapsWhatAGuestSends caps a guest's
// connection to: under half of what a guest under TCG sends at all (about
// 45 Mbit/s: the traffic tool generates and hashes every byte, emulated),
// so the cap, not the guest's CPU, sets the pace.
const guestRateCap = 20_000_000

// police on a VM pod's node caps what its guest sends, whichever stack
// and congestion control the guest runs (its own kernel's: Debian 6.1,
// cubic): per connection, both subflows in one bucket. Three rounds (two
// when both are within the bounds), the median within 0.75..policeHi of
// the cap: the upper bound is the point, the lower one says the guest is
// not starved by it. Measured 0.906, 0.957 and 0.968 of the cap on an idle
// machine (2026-11-26).
func testPoliceCapsWhatAGuestSends(t *testing.T) {
	bed, agents := rateBed(t, func(node int) mptcpv1alpha1.CompiledRule {
		if node == 2 {
			return mptcpv1alpha1.CompiledRule{SubflowCreation: mptcpv1alpha1.SubflowCreationSignal, SignalPorts: signalPorts(2)}
		}
		return mptcpv1alpha1.CompiledRule{SubflowCreation: mptcpv1alpha1.SubflowCreationGuest,
			RateLimits: &mptcpv1alpha1.CompiledRateLimits{Mode: mptcpv1alpha1.RateModePolice, PerConnection: quantity(guestRateCap), Direction: mptcpv1alpha1.RateEgress}}
	})
	vm := bootGuest(t, bed, bed.Pod(1, 1), testbed.BridgeBinding)
	guestClient(t, vm)
	ctx := background(t)
	const rounds = 3
	var goodput []float64
	within := func(g float64) bool { return g >= 0.75*guestRateCap && g <= policeHi*guestRateCap }
	// As capHoldsOver: once the first rounds/2+1 are within the bounds,
	// so is the median of all.
	for i, inside := 0, 0; i < rounds && inside < rounds/2+1; i++ {
		port := 5320 + i
		w := bed.Watch(t, framework.DatapathEvidence(bed))
		srv, err := bed.StartTrafficServer(ctx, bins.Traffic, bed.Pod(2, 1), port, true, "-warmup", "1500ms", "-window", "6s", "-sample", "50ms")
		if err != nil {
			t.Fatal(err)
		}
		sent, sendErr := vm.Send(ctx, netip.AddrPortFrom(bed.Pod(2, 1).Addr, uint16(port)), true, "-conns", "1", "-duration", "8s", "-seed", strconv.Itoa(port))
		rep := finishTransferOver(t, w, srv, sent, sendErr, true)[sent[0].Local]
		w.Close()
		t.Logf("round %d: goodput %.1f Mbit/s (%.3f of the cap)", i+1, rep.GoodputBps/1e6, rep.GoodputBps/guestRateCap)
		goodput = append(goodput, rep.GoodputBps)
		if within(rep.GoodputBps) && inside == i {
			inside++
		}
	}
	slices.Sort(goodput)
	if g := goodput[len(goodput)/2]; !within(g) {
		t.Errorf("median goodput %.1f Mbit/s is %.3f of the cap, want 0.75..%.2f", g/1e6, g/guestRateCap, policeHi)
	}
	if s := stats(t, agents[0]); s["rate_police_drop_connection"] == 0 {
		t.Errorf("no police drop counted on the guest's node: %v", s)
	}
}
