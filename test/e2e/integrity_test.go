package e2e

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// integrityRounds is how many transfers each scenario of
// TestIntegrity/StreamsArriveWhole and TestIntegrity/KernelChangesStreams runs: one under
// `make test`, more under `make repro-integrity`.
var integrityRounds = flag.Int("integrity.rounds", 1, "transfers per scenario of TestIntegrity/StreamsArriveWhole and TestIntegrity/KernelChangesStreams")

// integrityPayload captures every byte of every packet instead of headers,
// so that a changed stream's evidence tells on which wire the bytes were
// still right (make repro-integrity); it costs the machine much more.
var integrityPayload = flag.Bool("integrity.payload", false, "capture whole packets in TestIntegrity/StreamsArriveWhole and TestIntegrity/KernelChangesStreams")

// integrityLoad keeps both cores busy in the reproducer's four-path
// scenarios too, which otherwise run on a machine busy only with their own
// captures: the kernel's changed streams are much rarer on an idle machine
// (docs/testing.md, "What the defaults catch").
var integrityLoad = flag.Bool("integrity.load", false, "keep both cores busy in every scenario of TestIntegrity/KernelChangesStreams")

// integrityScenario is one configuration of the reproducer.
type integrityScenario struct {
	name string
	// bed is the topology; the default (zero) is 2 nodes of 2 NICs and one
	// pod each, on 200 Mbit/s links whose queues hold 1 ms: every link a
	// bottleneck that tail-drops whatever a sender bursts beyond 25 kB.
	bed testbed.Config
	// flows is the traffic of a round; one connection from pod (1,1) to
	// pod (2,1) when nil.
	flows func(bed *testbed.Bed) []flow
	// quiet leaves the machine's cores alone; otherwise two busy loops
	// keep both saturated.
	quiet bool
	// transfer is a round's length (4 s when 0).
	transfer time.Duration
	// setup prepares the bed (no agent when it returns no rule).
	setup func(t *testing.T, bed *testbed.Bed)
	// rule, when set, starts an agent per node with the rule of that node.
	rule func(node int) *mptcpv1alpha1.CompiledRule
	// noChecksums turns the rules' DSS checksums off (the product's
	// default is on).
	noChecksums bool
	// activeJoins has the agent open joins active, not held as backup
	// for its join holdoff (the defence against the kernel's changes).
	activeJoins bool
	// rate is the cap the scenario puts on a connection, for the stall
	// threshold (10 % of it); 0 means the links' capacity.
	rate float64
	cc   string
}

// userspace is every node's pods steered, the agent opening their joins.
func userspace(int) *mptcpv1alpha1.CompiledRule {
	return &mptcpv1alpha1.CompiledRule{SubflowCreation: mptcpv1alpha1.SubflowCreationUserspace}
}

const integritySample = 50 * time.Millisecond

// defaultIntegrityBed is the bed of a scenario that names none.
var defaultIntegrityBed = testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "200mbit", LinkQueue: time.Millisecond}

func integrityScenarios() []integrityScenario {
	handRouted := func(t *testing.T, bed *testbed.Bed) {
		ports := []int{6002}
		testbed.Must(t, bed.HandRoute(ports))
		testbed.Must(t, bed.ConfigureSignalPorts(bed.Pod(2, 1), ports))
		testbed.Must(t, bed.ConfigureClientLimits(bed.Pod(1, 1), 2, 1))
	}
	on := func(node int, r mptcpv1alpha1.CompiledRule) func(int) *mptcpv1alpha1.CompiledRule {
		return func(n int) *mptcpv1alpha1.CompiledRule {
			if n == node {
				return &r
			}
			return &mptcpv1alpha1.CompiledRule{}
		}
	}
	return []integrityScenario{
		{name: "kernel only, hand-routed", setup: handRouted},
		{name: "kernel only, 1% loss on every link", setup: func(t *testing.T, bed *testbed.Bed) {
			handRouted(t, bed)
			for k := 1; k <= 2; k++ {
				testbed.Must(t, bed.SetLoss(1, k, 1))
			}
		}},
		{name: "agent spread", rule: on(1, mptcpv1alpha1.CompiledRule{})},
		{name: "agent police egress", rate: rateCap, cc: "cubic",
			rule: on(1, mptcpv1alpha1.CompiledRule{RateLimits: &mptcpv1alpha1.CompiledRateLimits{Mode: mptcpv1alpha1.RateModePolice, PerConnection: quantity(rateCap), Direction: mptcpv1alpha1.RateEgress}})},
		{name: "agent police ingress", rate: rateCap, cc: "cubic",
			rule: on(2, mptcpv1alpha1.CompiledRule{RateLimits: &mptcpv1alpha1.CompiledRateLimits{Mode: mptcpv1alpha1.RateModePolice, PerConnection: quantity(rateCap), Direction: mptcpv1alpha1.RateIngress}})},
		{name: "agent shape", rate: rateCap, rule: on(1, mptcpv1alpha1.CompiledRule{RateLimits: &mptcpv1alpha1.CompiledRateLimits{Mode: mptcpv1alpha1.RateModeShape, PerPath: []mptcpv1alpha1.CompiledPathRate{
			{Path: framework.PathName(1), Rate: *quantity(rateCap / 2)}, {Path: framework.PathName(2), Rate: *quantity(rateCap / 2)}}}})},
		{name: "agent window", rate: windowCap,
			rule: on(2, mptcpv1alpha1.CompiledRule{HeaderRewriting: true, RateLimits: &mptcpv1alpha1.CompiledRateLimits{Mode: mptcpv1alpha1.RateModeWindow, PerConnection: quantity(windowCap)}})},
		{name: "agent backup path", rule: func(int) *mptcpv1alpha1.CompiledRule {
			return &mptcpv1alpha1.CompiledRule{Paths: framework.PathsNamed(framework.PathName(1)), BackupPaths: []string{framework.PathName(2)}, HeaderRewriting: true}
		}},
		// The conditions under which this kernel changes streams
		// (TestIntegrity/KernelChangesStreams), with the product's defaults: DSS
		// checksums on.
		{name: "agent userspace PM, 4 paths, cross traffic, copying wires", bed: fourPaths, quiet: true, transfer: capturedTransfer, flows: crossTraffic,
			setup: copyingWires, rule: userspace},
	}
}

// kernelBugScenarios are where Linux 6.18 delivers changed streams, with
// no DSS checksums (docs/testing.md, "Data integrity"): four paths of
// 100 Mbit/s, two pods per node, several connections at once whose
// subflows deliver out of order at their start, the machine busy with the
// captures. Wires that copy what crosses them, as physical links do, make
// it more frequent.
func kernelBugScenarios() []integrityScenario {
	return []integrityScenario{
		{name: "kernel only, 4 paths, 4 connections", bed: fourPaths, quiet: true, transfer: capturedTransfer, flows: clientServerTraffic,
			setup: kernelFourPaths(false, false)},
		{name: "kernel only, 4 paths, 4 connections, copying wires", bed: fourPaths, quiet: true, transfer: capturedTransfer, flows: clientServerTraffic,
			setup: kernelFourPaths(true, false)},
		{name: "kernel only, 4 paths, 4 connections, copying wires, DSS checksums", bed: fourPaths, quiet: true, transfer: capturedTransfer, flows: clientServerTraffic,
			setup: kernelFourPaths(true, true)},
		{name: "agent userspace PM, 4 paths, cross traffic, no checksums", bed: fourPaths, quiet: true, transfer: capturedTransfer, flows: crossTraffic,
			rule: userspace, noChecksums: true},
		{name: "agent userspace PM, 4 paths, cross traffic, copying wires, no checksums", bed: fourPaths, quiet: true, transfer: capturedTransfer, flows: crossTraffic,
			setup: copyingWires, rule: userspace, noChecksums: true},
		{name: "agent userspace PM, 4 paths, cross traffic, copying wires, no checksums, joins not held", bed: fourPaths, quiet: true, transfer: capturedTransfer, flows: crossTraffic,
			setup: copyingWires, rule: userspace, noChecksums: true, activeJoins: true},
		{name: "agent userspace PM, 4 paths, cross traffic, copying wires, joins not held, DSS checksums", bed: fourPaths, quiet: true, transfer: capturedTransfer, flows: crossTraffic,
			setup: copyingWires, rule: userspace, activeJoins: true},
	}
}

func copyingWires(t *testing.T, bed *testbed.Bed) { testbed.Must(t, bed.CopyOnWires()) }

// kernelFourPaths hand-routes a port per extra path of a fourPaths bed and
// has node 2's pods announce them and node 1's accept them (the kernel's
// own path manager opens the joins); copy makes every wire copy what
// crosses it; checksums turns DSS checksums on in every pod.
func kernelFourPaths(copy, checksums bool) func(t *testing.T, bed *testbed.Bed) {
	return func(t *testing.T, bed *testbed.Bed) {
		ports := []int{40002, 40003, 40004}
		testbed.Must(t, bed.HandRoute(ports))
		for j := 1; j <= 2; j++ {
			testbed.Must(t, bed.ConfigureSignalPorts(bed.Pod(2, j), ports))
			testbed.Must(t, bed.ConfigureClientLimits(bed.Pod(1, j), 3, 3))
			// The defect needs data on joins as they come up.
			bed.AwaitJoins(bed.Pod(1, j), 0)
		}
		if copy {
			copyingWires(t, bed)
		}
		if checksums {
			for _, n := range bed.Nodes {
				for _, p := range n.Pods {
					testbed.Must(t, bed.Sysctl(p.NetNS, "net.mptcp.checksum_enabled", "1"))
				}
			}
		}
	}
}

// fourPaths is the bed of the spread test's K=4 case.
var fourPaths = testbed.Config{Nodes: 2, NICs: 4, PodsPerNode: 2, LinkRate: "100mbit"}

// The data-integrity test (docs/testing.md, "Data integrity"):
// MPTCP transfers through every stage the bed and the product add: over
// two paths whose links drop what their 1 ms queues cannot hold, with both
// cores of the machine kept busy, first with no agent and no BPF at all,
// then with each of the agent's actors; and over four paths with the
// agent as the pods' path manager, where this kernel changes streams
// unless DSS checksums, on by default, catch it. Every stream is compared
// byte by byte with what was sent; a changed byte fails the scenario, as
// does a stall (a write that makes no progress for 5 s), each with its
// evidence kept. The longest stretch below 10 % of the expected rate is
// reported per scenario, and connections that fell back to TCP are
// counted (a caught change on a connection with one subflow does that).
func testStreamsArriveWhole(t *testing.T) {
	runIntegrity(t, integrityScenarios(), true)
}

// The kernel's changed streams, counted (`make repro-integrity`): the
// scenarios of kernelBugScenarios, whose transfers this kernel changes now
// and then, with and without the agent. What is asserted: with DSS
// checksums, nothing changes. The rest is measured and reported.
func testKernelChangesStreams(t *testing.T) {
	if *integrityRounds < 10 {
		t.Skipf("counts the kernel's changed streams over -integrity.rounds >= 10 (make repro-integrity); with %d a count means nothing", *integrityRounds)
	}
	runIntegrity(t, kernelBugScenarios(), false)
}

// runIntegrity runs scenarios and logs a summary; wholeOnly fails a
// scenario on any changed stream, otherwise only scenarios with checksums
// on fail on one.
func runIntegrity(t *testing.T, scenarios []integrityScenario, wholeOnly bool) {
	var summary []string
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			mustBeWhole := wholeOnly || strings.Contains(sc.name, "DSS checksums")
			s := runIntegrityScenario(t, sc, *integrityRounds, mustBeWhole)
			summary = append(summary, fmt.Sprintf("%-75s rounds %d changed %d stalled %d fell back %d longest stall %v (median %v)",
				sc.name, s.rounds, s.changed, s.stalled, s.fellBack, s.longest, s.medianStall))
		})
	}
	t.Logf("summary:\n%s", strings.Join(summary, "\n"))
}

type integrityResult struct {
	rounds, changed, stalled, fellBack int
	longest, medianStall               time.Duration
}

func runIntegrityScenario(t *testing.T, sc integrityScenario, rounds int, mustBeWhole bool) integrityResult {
	cfg := sc.bed
	if cfg.Nodes == 0 {
		cfg = defaultIntegrityBed
	}
	bed := testbed.NewForTest(t, cfg)
	if sc.setup != nil {
		sc.setup(t, bed)
	}
	if sc.rule != nil {
		opts := []framework.AgentOption{declaredCaps}
		if sc.noChecksums {
			opts = append(opts, framework.WithoutDataChecksums())
		}
		if sc.activeJoins {
			opts = append(opts, framework.WithJoinHoldoff(0))
		}
		if _, err := framework.StartAgentsWith(background(t), bed, bins.Agent, func(n *testbed.Node) mptcpv1alpha1.CompiledRule { return *sc.rule(n.Index) }, opts...); err != nil {
			t.Fatal(err)
		}
	}
	if !sc.quiet || *integrityLoad {
		stopLoad, err := bed.StartCPULoad(2)
		if err != nil {
			t.Fatal(err)
		}
		defer stopLoad()
	}
	expected := sc.rate
	if expected == 0 {
		rate, _ := testbed.ParseRate(cfg.LinkRate)
		expected = float64(cfg.NICs) * rate * 0.95 // every path, less the headers
	}
	flows := []flow{{client: bed.Pod(1, 1), server: bed.Pod(2, 1), port: 5500, conns: 1}}
	if sc.flows != nil {
		flows = sc.flows(bed)
	}
	conns := 0
	for _, f := range flows {
		conns += f.conns
	}
	// Connections that share the paths share the rate.
	expected /= float64(conns)
	transfer := cmp.Or(sc.transfer, 4*time.Second)
	res := integrityResult{rounds: rounds}
	var stalls []time.Duration
	for round := 1; round <= rounds; round++ {
		reps, kind, evidence := integrityRound(t, bed, flows, transfer, sc.cc)
		switch kind {
		case testbed.StreamChanged:
			res.changed++
			if mustBeWhole {
				t.Errorf("round %d: A STREAM ARRIVED CHANGED; evidence: %s", round, evidence)
			} else {
				t.Logf("round %d: the kernel changed a stream; evidence: %s", round, evidence)
			}
		case testbed.StreamStalled, testbed.StreamBroken:
			res.stalled++
			t.Errorf("round %d: the transfer %s; evidence: %s", round, kind, evidence)
		}
		for _, rep := range reps {
			if !rep.MPTCP {
				res.fellBack++
				t.Logf("round %d: the connection from %s fell back to TCP", round, rep.Remote)
			}
			// The first second is the connection's start (slow start,
			// the joins); stalls count after it.
			stall := testbed.LongestStall(rep, expected/10, time.Second)
			stalls = append(stalls, stall)
			t.Logf("round %d: %s %.1f Mbit/s, longest stall below %.1f Mbit/s: %v", round, rep.Remote, rep.GoodputBps/1e6, expected/10/1e6, stall)
		}
	}
	if len(stalls) > 0 {
		slices.Sort(stalls)
		res.longest, res.medianStall = stalls[len(stalls)-1], stalls[len(stalls)/2]
	}
	return res
}

// integrityRound runs one watched transfer of flows and returns the
// servers' reports, and how it failed, with where the evidence is, if it
// did. Every flow's port moves on each round, so that no report is taken
// for another round's.
func integrityRound(t *testing.T, bed *testbed.Bed, flows []flow, d time.Duration, cc string) ([]testbed.ServerReport, testbed.FailureKind, string) {
	t.Helper()
	w := bed.Watch(t, framework.DatapathEvidence(bed))
	if *integrityPayload {
		w.Close()
		w = bed.WatchPayload(t, framework.DatapathEvidence(bed))
	}
	defer w.Close()
	if cc != "" {
		for i := range flows {
			flows[i].cc = cc
		}
	}
	reps, err := launchFlowsReporting(t, bed, flows, d, "-sample", integritySample.String())()
	for i := range flows {
		flows[i].port += 100
	}
	if err == nil {
		return reps.got, "", ""
	}
	kind := testbed.StreamBroken
	if te := (*testbed.TrafficError)(nil); errors.As(err, &te) {
		switch {
		case te.Changed():
			kind = testbed.StreamChanged
		case te.OnlyStalled():
			kind = testbed.StreamStalled
		}
	}
	return reps.got, kind, w.Keep(err)
}
