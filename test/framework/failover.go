package framework

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// A failover transfer: one long MPTCP connection from pod (1,1)
// to pod (2,1) over a bed's 200 Mbit/s paths; mid-transfer nic1 of one
// node fails (a Failure) and is repaired.
const (
	FailoverLength  = 10 * time.Second // the transfer
	FailoverAt      = 3 * time.Second  // the carrier goes, after the sender started
	FailoverOutage  = 3 * time.Second  // and comes back after this
	FailoverSample  = 50 * time.Millisecond
	FailoverLinkBps = 200e6
)

// FailoverFigures is what one failover transfer measured.
type FailoverFigures struct {
	Live    float64       // the capacity of the paths left during the failure, bit/s
	Before  float64       // goodput from 1 s to the failure, bit/s
	During  float64       // goodput while the carrier was away, bit/s
	After   float64       // goodput from 1 s after the repair to the end, bit/s
	Stall   time.Duration // longest stretch below 10 % of before (whole 50 ms samples) from the failure to 0.5 s before the end
	StallAt time.Duration // where it began, relative to the failure
	// StallBefore: the longest stretch before the failure, from 1 s after
	// the first byte: the connection's own, no failover's.
	StallBefore time.Duration
	PathBack    time.Duration // from the repair until node 1's nic1 sends 10 % of its link again; -1: never
	Detected    time.Duration // from the failure until the first agent marked path 1 down (its log); -1: none did
	Resets      []string      // RSTs in the captures but the teardown's
	Teardown    []string      // RSTs in the captures after their sender's FIN (ClassifiedResets)
	RSTCounted  float64       // TcpOutRsts + MPTcpExtMPRstTx of both pods over the transfer
	CsumErrs    float64       // MPTcpExtDataCsumErr of both pods over the transfer
	Retrans     float64       // the sender's TcpRetransSegs over the transfer
	Reinjected  float64       // the sender's MPTcpExtMPTCPRetrans (data sent again on another subflow)
	Problems    []string      // what the row's Judge found wrong
	Evidence    string        // where the evidence of the problems is
	Retried     bool          // it missed only targets, or stalled, and the row's Retry or RetryStall lets it run again
	Stalled     bool          // it stalled and was not measured (RetryStall)
	Placement   string        // each subflow's kind and the NICs node 1 sent it on, from the captures
	// Reopened counts the subflows opened (their SYN captured) after the
	// failure: joins replacing subflows it closed. A subflow that detours
	// is kept, not reopened.
	Reopened int
}

func (f FailoverFigures) String() string {
	back := "not within the transfer"
	if f.PathBack >= 0 {
		back = f.PathBack.String()
	}
	return fmt.Sprintf("goodput before %.1f Mbit/s; longest stall %v (below %.1f Mbit/s, starting %v after the failure; before it %v); "+
		"during the failure %.1f Mbit/s = %.2f of the live paths' %.0f Mbit/s; after the repair %.1f Mbit/s; "+
		"path 1 down in an agent %v after the failure; nic1 of node 1 carrying traffic again %s after the repair; %d RSTs captured, %.0f counted; "+
		"sender retransmitted %.0f segments, reinjected %.0f; subflows (node 1 NICs) %s, %d opened after the failure",
		f.Before/1e6, f.Stall, f.Before/10/1e6, f.StallAt, f.StallBefore, f.During/1e6, f.During/f.Live, f.Live/1e6,
		f.After/1e6, f.Detected, back, len(f.Resets), f.RSTCounted, f.Retrans, f.Reinjected, f.Placement, f.Reopened)
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
func podResets(t testing.TB, bed *testbed.Bed) float64 {
	return podCounter(t, bed, "TcpOutRsts") + podCounter(t, bed, "MPTcpExtMPRstTx")
}

// podCounter sums a kernel counter of the two pods.
func podCounter(t testing.TB, bed *testbed.Bed, name string) float64 {
	var n float64
	for _, p := range []*testbed.Pod{bed.Pod(1, 1), bed.Pod(2, 1)} {
		n += KernelCounter(t, bed, p.NetNS, name)
	}
	return n
}

// A Failure is a way for nic1 of a node to fail, and its repair.
type Failure struct {
	Name           string
	Inject, Repair func(bed *testbed.Bed, node int) error
	// MinDuring is the share of the live path's capacity a transfer
	// must keep during the failure; 0 means the target's 0.8
	// (docs/design.md, "Targets").
	MinDuring float64
	// RemovesWireEnd: the failure deletes the wire's node-side end, and
	// the capture on it with it.
	RemovesWireEnd bool
}

var (
	// CarrierLoss: the wire's end goes down, the NIC has no carrier.
	CarrierLoss = Failure{"carrier loss",
		func(b *testbed.Bed, n int) error { return b.SetCarrier(n, 1, false) },
		func(b *testbed.Bed, n int) error { return b.SetCarrier(n, 1, true) }, 0, false}
	// TotalLoss: a gray failure; the wire drops everything both ways
	// while every carrier stays up.
	TotalLoss = Failure{"100 % loss both ways, carrier up",
		func(b *testbed.Bed, n int) error { return b.SetLoss(n, 1, 100) },
		func(b *testbed.Bed, n int) error { return b.SetLoss(n, 1, 0) }, 0, false}
	// OneWayLoss: the wire drops everything the node sends over it and
	// delivers what it receives.
	OneWayLoss = Failure{"100 % loss of what the node sends, carrier up",
		func(b *testbed.Bed, n int) error { return b.SetOneWayLoss(n, 1, 100, testbed.Out) },
		func(b *testbed.Bed, n int) error { return b.SetLoss(n, 1, 0) }, 0, false}
	// PartialLoss: the wire drops 30 % of what it carries, both ways, at
	// random; most probes still come back. The probes need 450 ms
	// (median) to tell such a path from a healthy one (docs/agent.md,
	// "Liveness"); by then the subflow on it is recovering from losses,
	// and the path manager closes it so that its data goes again at once
	// over the live paths (docs/subflows.md, "Leaving a failed path").
	PartialLoss = Failure{"30 % loss both ways, carrier up",
		func(b *testbed.Bed, n int) error { return b.SetLoss(n, 1, 30) },
		func(b *testbed.Bed, n int) error { return b.SetLoss(n, 1, 0) }, 0, false}
	// NICRemoved: the NIC is deleted (unplugged, its driver unbound),
	// and comes back as a new link with its address and, for nic1, the
	// node's default route (bed.RestoreNIC); the agent must attach its
	// program to it and write its routes again.
	NICRemoved = Failure{"NIC removed",
		func(b *testbed.Bed, n int) error { return b.RemoveNIC(n, 1) },
		func(b *testbed.Bed, n int) error { return b.RestoreNIC(n, 1) }, 0, true}
)

// FailoverRow is one row of a failover test: a bed, nic1 of one of its
// nodes failing, and how each transfer is judged.
type FailoverRow struct {
	Bed     *testbed.Bed
	Node    int
	Fail    Failure
	Traffic string // the traffic binary
	// Judge says what is wrong with a transfer's figures; nil: nothing
	// is (the kernel's control). A transfer it finds wrong keeps its
	// evidence (captures, sockets, counters, the datapaths and the agents'
	// logs) and fails the test, unless MeasureOnly (a benchmark's row,
	// which counts the problems instead, and keeps evidence only for the
	// agents' rows: the kernel alone misses often, and what it does is
	// not ours to explain).
	Judge func(FailoverFigures) []string
	// Retry, when set, names why a transfer whose only problems are the
	// targets it missed may run once more (Transfer returns its figures
	// with Retried; the caller runs the next with Retry unset). Resets,
	// and a changed or broken stream, are never tried again.
	Retry string
	// RetryStall, when set, names why a transfer that stalled (what
	// arrived is what was sent, nothing broke) may run once more, its
	// evidence kept (FinishTransferOrRetryStall); the caller runs the next
	// with it unset, as for Retry.
	RetryStall  string
	MeasureOnly bool
	Agents      []*Agent // nil for the kernel's control
	SenderArgs  []string
}

// Transfer runs one watched transfer of FailoverLength from port with the
// row's NIC failed from FailoverAt for FailoverOutage, and measures it. The
// stream is verified byte by byte; a changed or broken stream fails the
// test with the evidence and is never tried again.
func (row FailoverRow) Transfer(t testing.TB, port int) FailoverFigures {
	t.Helper()
	bed, node, fail := row.Bed, row.Node, row.Fail
	ctx := t.Context()
	w := bed.Watch(t, DatapathEvidence(bed), agentLogs(row.Agents))
	defer w.Close()
	client, server := bed.Pod(1, 1), bed.Pod(2, 1)
	srv, err := bed.StartTrafficServer(ctx, row.Traffic, server, port, true, "-warmup", "1s", "-window", "8s", "-sample", FailoverSample.String())
	if err != nil {
		t.Fatal(err)
	}
	sampler, err := bed.StartSampler(FailoverSample)
	if err != nil {
		t.Fatal(err)
	}
	rst0, csum0 := podResets(t, bed), podCounter(t, bed, "MPTcpExtDataCsumErr")
	re0, inj0 := KernelCounter(t, bed, client.NetNS, "TcpRetransSegs"), KernelCounter(t, bed, client.NetNS, "MPTcpExtMPTCPRetrans")

	start := time.Now()
	done := SendInBackground(ctx, bed, row.Traffic, client, server, port, FailoverLength, row.SenderArgs...)
	time.Sleep(FailoverAt)
	failErr := fail.Inject(bed, node)
	down := time.Now()
	if failErr == nil {
		time.Sleep(FailoverOutage)
		failErr = fail.Repair(bed, node)
	}
	up := time.Now()
	res := <-done
	rows, sampleErr := sampler.Stop()
	if failErr != nil {
		_ = fail.Repair(bed, node)
		t.Fatal(failErr)
	}
	if sampleErr != nil {
		t.Fatal(sampleErr)
	}
	rst1, csum1 := podResets(t, bed), podCounter(t, bed, "MPTcpExtDataCsumErr")
	re1, inj1 := KernelCounter(t, bed, client.NetNS, "TcpRetransSegs"), KernelCounter(t, bed, client.NetNS, "MPTcpExtMPTCPRetrans")
	reports, finished := FinishTransferOrRetryStall(t, w, srv, res.Sent, res.Err, true, row.RetryStall)
	if !finished {
		return FailoverFigures{Retried: true, Stalled: true}
	}
	rep := reports[res.Sent[0].Local]
	transferred := time.Now()

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

	f := FailoverFigures{Live: float64(bed.Config.NICs-1) * FailoverLinkBps, PathBack: -1, RSTCounted: rst1 - rst0, CsumErrs: csum1 - csum0, Retrans: re1 - re0, Reinjected: inj1 - inj0}
	f.Before = samplesRate(rep, time.Second, failAt)
	f.During = samplesRate(rep, failAt, repairAt)
	f.After = samplesRate(rep, repairAt+time.Second, FailoverLength)
	// Stalls are looked for from 1 s after the first byte to 500 ms before
	// the sender's end: its last writes drain slowly and are no stall.
	trimmed := rep
	if n := int((FailoverLength-500*time.Millisecond)/FailoverSample) + 1; n < len(rep.Samples) {
		trimmed.Samples = rep.Samples[:n]
	}
	overall, _ := longestStallAt(trimmed, f.Before/10, time.Second)
	if ls := testbed.LongestStall(trimmed, f.Before/10, time.Second); ls != overall {
		t.Errorf("longest stall %v, testbed.LongestStall says %v", overall, ls)
	}
	// The failure's stall, from the sample the failure fell in; before it,
	// a stall is the connection's own, not the failover's.
	var stallStart time.Duration
	f.Stall, stallStart = longestStallAt(trimmed, f.Before/10, max(time.Second, failAt-FailoverSample))
	f.StallAt = (stallStart - failAt).Round(time.Millisecond)
	early := trimmed
	if n := int(failAt/FailoverSample) + 1; n < len(early.Samples) {
		early.Samples = early.Samples[:n]
	}
	f.StallBefore, _ = longestStallAt(early, f.Before/10, time.Second)

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
			if dt > 0 && float64(r.RxBytes-prev.RxBytes)*8/dt >= FailoverLinkBps/10 {
				f.PathBack = r.Time.Sub(up).Round(time.Millisecond)
				break
			}
		}
		prev = r
	}

	// Resets and the FINs before them are control segments: one cheap
	// pass over each whole capture cuts those out, and tshark reads only
	// them (Analyze cuts its own); the whole captures stay the evidence.
	files, err := w.Captures()
	if err != nil {
		t.Logf("captures: %v", err)
	}
	control, err := testbed.ControlSegments(files)
	if err != nil {
		t.Fatalf("cutting the captures down to their control segments: %v", err)
	}
	// Two tshark passes, side by side: the machine is the test's alone.
	var (
		a          *testbed.Analysis
		analyzeErr error
		analyzed   = make(chan struct{})
	)
	go func() {
		defer close(analyzed)
		a, analyzeErr = testbed.Analyze(files)
	}()
	if _, f.Teardown, f.Resets, err = classifyResets(testbed.ControlFiles(control)); err != nil {
		t.Errorf("reading the captures for resets and FINs: %v", err)
	}
	<-analyzed
	if err := analyzeErr; err != nil {
		t.Errorf("analyzing the captures: %v", err)
	} else {
		var p []string
		for _, c := range a.Connections {
			for _, sf := range c.Subflows {
				p = append(p, fmt.Sprintf("%s %v", sf.Kind, sf.NICs(1, testbed.Out)))
				if sf.Opened.After(down) {
					f.Reopened++
				}
			}
		}
		f.Placement = strings.Join(p, ", ")
	}
	// The capture on the failed wire's end went on after the repair (else
	// it would miss resets there).
	for _, c := range control {
		if c.Node == node && c.NIC == 1 && f.PathBack >= 0 && !fail.RemovesWireEnd && !c.Last.After(up) {
			t.Errorf("the capture of node %d's nic1 holds no packet after the repair (its last of %d at %v, the repair at %v): "+
				"dumpcap did not survive the failure", node, c.Packets, c.Last.Format(time.RFC3339Nano), up.Format(time.RFC3339Nano))
		}
	}
	f.Detected = detected(row.Agents, down)
	t.Logf("phases: transfer %v (the sender started to the stream checked), capture analysis %v",
		transferred.Sub(start).Round(time.Millisecond), time.Since(transferred).Round(time.Millisecond))
	if row.Judge != nil {
		if f.Problems = row.Judge(f); len(f.Problems) > 0 {
			missed := fmt.Errorf("%s on node %d's nic1: %s\n%v", fail.Name, node, strings.Join(f.Problems, "\n"), f)
			if row.Retry != "" && len(ResetProblems(t, f)) == 0 {
				f.Retried = true
				f.Evidence = w.RetryMiss(missed, row.Retry)
				return f
			}
			if row.Agents != nil || !row.MeasureOnly {
				f.Evidence = w.Keep(missed)
			}
			for _, p := range f.Problems {
				if row.MeasureOnly {
					t.Log(p)
				} else {
					t.Error(p)
				}
			}
			if f.Evidence != "" {
				t.Logf("evidence of the transfer from port %d: %s", port, f.Evidence)
			}
		}
	}
	return f
}

// agentLogs is a testbed.Collector that copies each agent's log into the
// evidence.
func agentLogs(agents []*Agent) testbed.Collector {
	return func(dir string) error {
		var errs []error
		for _, a := range agents {
			b, err := os.ReadFile(a.Proc.Stderr)
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, fmt.Sprintf("node%d-agent.log", a.Node.Index)), b, 0o644)
			}
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	}
}

// GrayStallBound is what TestFailover/GrayFailureMidTransferIsFoundByProbes asserts
// on the longest stall: the target is 1 s for every failure; the
// probes take 150 ms to find it (5 intervals of 30 ms).
const GrayStallBound = time.Second

// TargetProblems holds one transfer against the failover targets
// (docs/design.md, "Targets"): the longest stall from the failure on within
// bound (and any before it within 1 s), at least the failure's minDuring
// (0.8) of the live paths' capacity during the failure, the failed path
// carrying traffic again within 1 s of the repair.
func TargetProblems(f FailoverFigures, fail Failure, bound time.Duration) []string {
	var problems []string
	if f.Stall > bound {
		problems = append(problems, fmt.Sprintf("longest stall %v, want at most %v", f.Stall, bound))
	}
	// Not the failover's, but a stall all the same: the bound of every
	// failure.
	if f.StallBefore > GrayStallBound {
		problems = append(problems, fmt.Sprintf("a stall of %v before the failure, want at most %v", f.StallBefore, GrayStallBound))
	}
	minDuring := fail.MinDuring
	if minDuring == 0 {
		minDuring = 0.8
	}
	if r := f.During / f.Live; r < minDuring {
		problems = append(problems, fmt.Sprintf("during the failure %.2f of the live paths' capacity, want at least %.2f", r, minDuring))
	}
	if f.PathBack < 0 || f.PathBack > time.Second {
		problems = append(problems, fmt.Sprintf("the repaired path carried traffic again after %v, want within 1 s", f.PathBack))
	}
	return problems
}

// ReceiveStallRetry is why a failover transfer that stalled, every byte
// that arrived the sender's and nothing reset, may run once more: the
// receiving kernel's MPTCP receive queue filled with data past a hole
// that a lossy subflow left, it then dropped the hole's own data as out of
// its window, and the sender filled the hole one MPTCP retransmission
// (about 32 KB) per timeout (docs/testing.md, "Stalls": the receiver's
// counters show zero windows and data out of window). The failover rows
// saturate their links to measure goodput, which is what makes the holes;
// what the agent does is measured by the run that does not stall, and a
// second stall in a row fails.
const ReceiveStallRetry = "failover: the receiving kernel's MPTCP receive queue filled past a hole and the transfer stalled"

// SummarizeFailover gives min/median/max of the figures that decide.
func SummarizeFailover(fs []FailoverFigures) string {
	fs = slices.DeleteFunc(slices.Clone(fs), func(f FailoverFigures) bool { return f.Stalled })
	if len(fs) == 0 {
		return "no run measured"
	}
	mmm := func(get func(FailoverFigures) float64, unit string) string {
		v := make([]float64, len(fs))
		for i, f := range fs {
			v[i] = get(f)
		}
		slices.Sort(v)
		return fmt.Sprintf("%.2f/%.2f/%.2f%s", v[0], v[len(v)/2], v[len(v)-1], unit)
	}
	return "min/median/max: longest stall " + mmm(func(f FailoverFigures) float64 { return f.Stall.Seconds() }, " s") +
		", during the failure " + mmm(func(f FailoverFigures) float64 { return f.During / f.Live }, " of the live paths") +
		", path back " + mmm(func(f FailoverFigures) float64 {
		if f.PathBack < 0 {
			return math.Inf(1)
		}
		return f.PathBack.Seconds()
	}, " s")
}

// ResetProblems finds any reset but one kind, which it logs and counts: a subflow reset by its receiver with MP_FAIL and MP_TCPRST
// "middlebox interference" after a DSS checksum error. That is the defence
// against Linux 6.18's misplaced data at connection start
// (docs/testing.md, "Data integrity"), on by default in selected pods: the
// data goes again over another subflow and the stream arrives whole (the
// transfer checks it), but the connection goes on with one subflow fewer.
func ResetProblems(t testing.TB, f FailoverFigures) []string {
	t.Helper()
	checksum := 0
	for _, r := range f.Resets {
		if strings.Contains(r, " 6,8 0x06") {
			checksum++
		}
	}
	if checksum > 0 && checksum == len(f.Resets) && f.CsumErrs > 0 {
		t.Logf("known: %d subflow resets by DSS checksums (%.0f checksum errors counted): the kernel's misplaced data caught; "+
			"the connection went on with one subflow fewer:\n%s", checksum, f.CsumErrs, strings.Join(f.Resets, "\n"))
		return nil
	}
	var problems []string
	if len(f.Resets) != 0 {
		problems = append(problems, fmt.Sprintf("%d resets in the captures:\n%s", len(f.Resets), strings.Join(f.Resets, "\n")))
	}
	if len(f.Teardown) > 0 {
		// The pods' counters cannot tell these apart: with no other reset
		// captured, what they counted is the teardown's.
		t.Logf("known: %d resets at the connection's teardown, after their sender's FIN (ClassifiedResets: a subflow still "+
			"retransmitting data the connection already had); the pods counted %.0f:\n%s", len(f.Teardown), f.RSTCounted, strings.Join(f.Teardown, "\n"))
	}
	if f.RSTCounted != 0 && (len(f.Teardown) == 0 || len(f.Resets) > 0) {
		problems = append(problems, fmt.Sprintf("the pods sent %.0f resets (TcpOutRsts + MPTcpExtMPRstTx)", f.RSTCounted))
	}
	return problems
}

// KernelCounter reads the kernel counter name (nstat's name) in namespace
// ns, failing the test if it cannot.
func KernelCounter(t testing.TB, bed *testbed.Bed, ns, name string) float64 {
	t.Helper()
	v, err := bed.KernelCounter(ns, name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// FailoverRule is the rule of a failover case's agents: every path
// active, the agent as the pods' path manager (userspace subflows).
var FailoverRule = mptcpv1alpha1.CompiledRule{SubflowCreation: mptcpv1alpha1.SubflowCreationUserspace}

// AgentFailoverRow sets up the agent's row of a failover case on a bed of
// its own with nics NICs per node and a file-mode agent per node running
// rule with capabilities caps; flap damping off (a row fails one NIC
// several times within a minute, which damping would answer by holding it
// down: its own tests are in internal/agent/linkwatch); liveness on, and
// every peer Up on every path before it returns.
func AgentFailoverRow(t testing.TB, bins Binaries, nics, node int, fail Failure, rule mptcpv1alpha1.CompiledRule, caps AgentOption) FailoverRow {
	t.Helper()
	return AgentFailoverRowWith(t, bins, nics, node, fail, func(*testbed.Node) mptcpv1alpha1.CompiledRule { return rule }, caps)
}

// AgentFailoverRowWith is AgentFailoverRow with a rule per node (signal
// mode: the server's node announces, the client's joins).
func AgentFailoverRowWith(t testing.TB, bins Binaries, nics, node int, fail Failure, ruleFor func(*testbed.Node) mptcpv1alpha1.CompiledRule, caps AgentOption) FailoverRow {
	t.Helper()
	return AgentFailoverRowOn(t, bins, 2, nics, node, fail, ruleFor, caps, WithLiveness())
}

// AgentFailoverRowOn is AgentFailoverRowWith on a bed of nodes nodes,
// liveness as the last option sets it (WithLiveness, WithLivenessEvery):
// the transfers still go from pod (1,1) to pod (2,1).
func AgentFailoverRowOn(t testing.TB, bins Binaries, nodes, nics, node int, fail Failure, ruleFor func(*testbed.Node) mptcpv1alpha1.CompiledRule, caps, liveness AgentOption) FailoverRow {
	t.Helper()
	bed := testbed.NewForTest(t, testbed.Config{Nodes: nodes, NICs: nics, PodsPerNode: 1, LinkRate: "200mbit"})
	start := time.Now()
	defer func() { t.Logf("phases: agents up and every peer Up in %v", time.Since(start).Round(time.Millisecond)) }()
	agents, err := StartAgentsWith(t.Context(), bed, bins.Agent, ruleFor, caps, WithFlapDamping(agent.FlapDamping{Transitions: -1}), liveness)
	if err != nil {
		t.Fatal(err)
	}
	for k, a := range agents {
		for _, peer := range bed.Nodes {
			if peer == bed.Nodes[k] {
				continue
			}
			for path := 1; path <= nics; path++ {
				if err := a.WaitForMetric("mptcp_agent_path_peer_up", 1, 10*time.Second, "path", PathName(path), "peer", NodeName(peer)); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	return FailoverRow{Bed: bed, Node: node, Fail: fail, Traffic: bins.Traffic, Agents: agents}
}

// KernelFailoverRow sets up the negative control beside an agent's row: a
// bed of its own with nics NICs per node, hand-routed (the kernel's path
// manager, a subflow per NIC, no agent, no BPF), the server signalling
// ports from port on (one per NIC beyond the first; transfers must use
// others). Its sender waits up to 30 s for progress (not 5 s): the kernel
// alone stalls longer than that under 30 % loss, and that stall is what
// the control is there to show.
func KernelFailoverRow(t testing.TB, bins Binaries, nics, node int, fail Failure, port int) FailoverRow {
	t.Helper()
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: nics, PodsPerNode: 1, LinkRate: "200mbit"})
	var ports []int
	for k := range nics - 1 {
		ports = append(ports, port+k)
	}
	testbed.Must(t, bed.HandRoute(ports))
	testbed.Must(t, bed.ConfigureSignalPorts(bed.Pod(2, 1), ports))
	testbed.Must(t, bed.ConfigureClientLimits(bed.Pod(1, 1), nics, nics-1))
	return FailoverRow{Bed: bed, Node: node, Fail: fail, Traffic: bins.Traffic, SenderArgs: []string{"-stall", "30s"}}
}

// detected is how long after since the first of agents logged path 1 down:
// its link (carrier, removal) or a peer on it (liveness); -1 if none did.
func detected(agents []*Agent, since time.Time) time.Duration {
	first := time.Time{}
	for _, a := range agents {
		b, err := os.ReadFile(a.Proc.Stderr)
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			var rec struct {
				Time  time.Time `json:"time"`
				Msg   string    `json:"msg"`
				Paths []uint32  `json:"paths"` // indices

				Down bool   `json:"down"`
				Path string `json:"path"`
				To   string `json:"to"`
			}
			if json.Unmarshal([]byte(line), &rec) != nil || rec.Time.Before(since) {
				continue
			}
			linkDown := rec.Msg == "path link changed" && rec.Down && slices.Contains(rec.Paths, 1)
			peerDown := rec.Msg == "liveness: peer changed" && rec.Path == PathName(1) && rec.To == "Down"
			if (linkDown || peerDown) && (first.IsZero() || rec.Time.Before(first)) {
				first = rec.Time
				break
			}
		}
	}
	if first.IsZero() {
		return -1
	}
	return first.Sub(since).Round(time.Millisecond)
}
