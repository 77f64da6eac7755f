package e2e

import (
	"fmt"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/e2e/framework"
	"github.com/mptcp-operator/mptcp-operator/hack/testbed"
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
)

// failoverStallBound is what TestCarrierLossMidTransferStallsBriefly
// asserts on the longest stall with the agent. Generous on purpose: the
// issue's target for carrier loss is 300 ms, to be tightened once the agent
// re-steers; measured before it does (kernel's own recovery): see
// docs/testing.md, "Failover".
const failoverStallBound = 1500 * time.Millisecond

// failoverFigures is what one failover transfer measured.
type failoverFigures struct {
	before     float64       // goodput from 1 s to the failure, bit/s
	during     float64       // goodput while the carrier was away, bit/s
	after      float64       // goodput from 1 s after the repair to the end, bit/s
	stall      time.Duration // longest stretch below 10 % of before (whole 50 ms samples, from 1 s to 0.5 s before the end)
	stallAt    time.Duration // where it began, relative to the failure (negative: before it)
	pathBack   time.Duration // from the repair until node 1's nic1 sends 10 % of its link again; -1: never
	resets     []string      // RSTs in the captures
	rstCounted float64       // TcpOutRsts + MPTcpExtMPRstTx of both pods over the transfer
	retrans    float64       // the sender's TcpRetransSegs over the transfer
	reinjected float64       // the sender's MPTcpExtMPTCPRetrans (data sent again on another subflow)
	placement  string        // each subflow's kind and the NICs node 1 sent it on, from the captures
}

func (f failoverFigures) String() string {
	back := "not within the transfer"
	if f.pathBack >= 0 {
		back = f.pathBack.String()
	}
	return fmt.Sprintf("goodput before %.1f Mbit/s; longest stall %v (below %.1f Mbit/s, starting %v after the failure); "+
		"during the failure %.1f Mbit/s = %.2f of the live path's %.0f Mbit/s; after the repair %.1f Mbit/s; "+
		"nic1 of node 1 carrying traffic again %s after the repair; %d RSTs captured, %.0f counted; "+
		"sender retransmitted %.0f segments, reinjected %.0f; subflows (node 1 NICs) %s",
		f.before/1e6, f.stall, f.before/10/1e6, f.stallAt, f.during/1e6, f.during/failoverLinkBps, failoverLinkBps/1e6,
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
	var n float64
	for _, p := range []*testbed.Pod{bed.Pod(1, 1), bed.Pod(2, 1)} {
		n += nstatValue(t, bed, p.NetNS, "TcpOutRsts") + nstatValue(t, bed, p.NetNS, "MPTcpExtMPRstTx")
	}
	return n
}

// carrierLossTransfer runs one watched transfer of failoverLength with the
// carrier of node 1's nic1 away from failoverAt for failoverOutage, and
// measures it. The stream is verified byte by byte; a failed transfer
// fails the test with the evidence and is never tried again.
func carrierLossTransfer(t *testing.T, bed *testbed.Bed, port int) failoverFigures {
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
	rst0 := podResets(t, bed)
	re0, inj0 := nstatValue(t, bed, client.NetNS, "TcpRetransSegs"), nstatValue(t, bed, client.NetNS, "MPTcpExtMPTCPRetrans")

	type sendResult struct {
		sent []testbed.SenderReport
		err  error
	}
	done := make(chan sendResult, 1)
	start := time.Now()
	go func() {
		sent, err := bed.Send(ctx, bins.Traffic, client, netip.AddrPortFrom(server.Addr, uint16(port)), true,
			"-conns", "1", "-duration", failoverLength.String(), "-seed", strconv.Itoa(port))
		done <- sendResult{sent, err}
	}()
	time.Sleep(failoverAt)
	carrierErr := bed.SetCarrier(1, 1, false)
	down := time.Now()
	if carrierErr == nil {
		time.Sleep(failoverOutage)
		carrierErr = bed.SetCarrier(1, 1, true)
	}
	up := time.Now()
	res := <-done
	rows, sampleErr := sampler.Stop()
	if carrierErr != nil {
		_ = bed.SetCarrier(1, 1, true)
		t.Fatal(carrierErr)
	}
	if sampleErr != nil {
		t.Fatal(sampleErr)
	}
	rst1 := podResets(t, bed)
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

	f := failoverFigures{pathBack: -1, rstCounted: rst1 - rst0, retrans: re1 - re0, reinjected: inj1 - inj0}
	f.before = samplesRate(rep, time.Second, failAt)
	f.during = samplesRate(rep, failAt, repairAt)
	f.after = samplesRate(rep, repairAt+time.Second, failoverLength)
	// Stalls are looked for from 1 s after the first byte to 500 ms before
	// the sender's end: its last writes drain slowly and are no stall.
	trimmed := rep
	if n := int((failoverLength-500*time.Millisecond)/failoverSample) + 1; n < len(rep.Samples) {
		trimmed.Samples = rep.Samples[:n]
	}
	var stallStart time.Duration
	f.stall, stallStart = longestStallAt(trimmed, f.before/10, time.Second)
	f.stallAt = (stallStart - failAt).Round(time.Millisecond)
	if ls := testbed.LongestStall(trimmed, f.before/10, time.Second); ls != f.stall {
		t.Errorf("longest stall %v, testbed.LongestStall says %v", f.stall, ls)
	}

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
		if c.Node == 1 && c.NIC == 1 && f.pathBack >= 0 {
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
// repaired path carries traffic again. Logged beside the kernel's own
// recovery (the hand-routed baseline: the kernel's path manager, no agent,
// no BPF), which is only checked for integrity.
//
// Before the agent reacts to link events (issue 17) the stall bound is
// generous (failoverStallBound); the figures measured are in
// docs/testing.md.
func TestCarrierLossMidTransferStallsBriefly(t *testing.T) {
	const runs = 1 // transfers per row; each row has a bed of its own
	t.Run("agent", func(t *testing.T) {
		bed, _ := rateBed(t, func(int) mptcpv1alpha1.CompiledRule {
			return mptcpv1alpha1.CompiledRule{SubflowCreation: mptcpv1alpha1.SubflowCreationUserspace}
		})
		for i := range runs {
			f := carrierLossTransfer(t, bed, 5600+i)
			t.Logf("agent: %v", f)
			if f.stall > failoverStallBound {
				t.Errorf("longest stall %v, want at most %v", f.stall, failoverStallBound)
			}
			checkNoResets(t, f)
		}
	})
	// The negative control: the hand-routed baseline (docs/testbed.md), the
	// kernel alone with a subflow per NIC. The same bed with no agent and no
	// routes would have one subflow on nic1, which the failure simply cuts.
	t.Run("kernel only", func(t *testing.T) {
		bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "200mbit"})
		ports := []int{5702}
		testbed.Must(t, bed.HandRoute(ports))
		testbed.Must(t, bed.ConfigureSignalPorts(bed.Pod(2, 1), ports))
		testbed.Must(t, bed.ConfigureClientLimits(bed.Pod(1, 1), 2, 1))
		for i := range runs {
			f := carrierLossTransfer(t, bed, 5700+i)
			t.Logf("kernel only: %v", f)
			if len(f.resets) != 0 || f.rstCounted != 0 {
				t.Logf("kernel only: resets (not asserted):\n%s", strings.Join(f.resets, "\n"))
			}
		}
	})
}

func checkNoResets(t *testing.T, f failoverFigures) {
	t.Helper()
	if len(f.resets) != 0 {
		t.Errorf("%d resets in the captures:\n%s", len(f.resets), strings.Join(f.resets, "\n"))
	}
	if f.rstCounted != 0 {
		t.Errorf("the pods sent %.0f resets (TcpOutRsts + MPTcpExtMPRstTx)", f.rstCounted)
	}
}
