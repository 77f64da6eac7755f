package e2e

import (
	"flag"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/e2e/framework"
	"github.com/mptcp-operator/mptcp-operator/hack/testbed"
	"github.com/mptcp-operator/mptcp-operator/internal/agent"
)

// integrityRounds is how many transfers each scenario of
// TestStreamsArriveWhole runs: one under `make test`, more under
// `make repro-integrity` (go test -run TestStreamsArriveWhole
// -integrity.rounds=N ./e2e/).
var integrityRounds = flag.Int("integrity.rounds", 1, "transfers per scenario of TestStreamsArriveWhole")

// integrityScenario is one configuration of the reproducer.
type integrityScenario struct {
	name string
	// setup prepares the bed (no agent when it returns no rule).
	setup func(t *testing.T, bed *testbed.Bed)
	// rule, when set, starts an agent per node with the rule of that node.
	rule func(node int) *agent.Rule
	// rate is the cap the scenario puts on the connection, for the stall
	// threshold (10 % of it); 0 means the links' capacity.
	rate float64
	cc   string
}

// integrityLinkRate and integrityQueue make every link a bottleneck with
// tail drops: a 200 Mbit/s link whose queue holds 1 ms (25 kB) drops
// whatever a sender bursts beyond it.
const (
	integrityLinkRate = "200mbit"
	integrityQueue    = time.Millisecond
	integrityTransfer = 4 * time.Second
	integritySample   = 50 * time.Millisecond
)

func integrityScenarios() []integrityScenario {
	handRouted := func(t *testing.T, bed *testbed.Bed) {
		ports := []int{6002}
		testbed.Must(t, bed.HandRoute(ports))
		testbed.Must(t, bed.ConfigureSignalPorts(bed.Pod(2, 1), ports))
		testbed.Must(t, bed.ConfigureClientLimits(bed.Pod(1, 1), 2, 1))
	}
	on := func(node int, r agent.Rule) func(int) *agent.Rule {
		return func(n int) *agent.Rule {
			if n == node {
				return &r
			}
			return &agent.Rule{}
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
		{name: "agent spread", rule: on(1, agent.Rule{})},
		{name: "agent police egress", rate: rateCap, cc: "cubic",
			rule: on(1, agent.Rule{Rate: &agent.RateLimits{Mode: "police", PerConnection: quantity(rateCap), Direction: "egress"}})},
		{name: "agent police ingress", rate: rateCap, cc: "cubic",
			rule: on(2, agent.Rule{Rate: &agent.RateLimits{Mode: "police", PerConnection: quantity(rateCap), Direction: "ingress"}})},
		{name: "agent shape", rate: rateCap, rule: on(1, agent.Rule{Rate: &agent.RateLimits{Mode: "shape", PerPath: []agent.PathRate{
			{Path: framework.PathName(1), Rate: *quantity(rateCap / 2)}, {Path: framework.PathName(2), Rate: *quantity(rateCap / 2)}}}})},
		{name: "agent window", rate: windowCap,
			rule: on(2, agent.Rule{HeaderRewriting: true, Rate: &agent.RateLimits{Mode: "window", PerConnection: quantity(windowCap)}})},
		{name: "agent backup path", rule: func(int) *agent.Rule {
			return &agent.Rule{Paths: []string{framework.PathName(1)}, BackupPaths: []string{framework.PathName(2)}, HeaderRewriting: true}
		}},
	}
}

// The data-integrity reproducer (issue 13; docs/testing.md, "Data
// integrity"). One MPTCP connection at a time from pod (1,1) to pod (2,1)
// over two paths whose links drop what their 1 ms queues cannot hold,
// with both cores of the machine kept busy, first with no agent and no BPF
// at all, then with each of the agent's actors. Every stream is compared
// byte by byte with what was sent; a changed byte fails the scenario, as
// does a stall (the sender's write deadline passing), each with its
// evidence kept. The longest stretch below 10 % of the expected rate is
// reported per scenario.
func TestStreamsArriveWhole(t *testing.T) {
	var summary []string
	for _, sc := range integrityScenarios() {
		t.Run(sc.name, func(t *testing.T) {
			s := runIntegrityScenario(t, sc, *integrityRounds)
			summary = append(summary, fmt.Sprintf("%-40s rounds %d changed %d stalled %d longest stall %v (median %v)",
				sc.name, s.rounds, s.changed, s.stalled, s.longest, s.medianStall))
		})
	}
	t.Logf("summary:\n%s", strings.Join(summary, "\n"))
}

type integrityResult struct {
	rounds, changed, stalled int
	longest, medianStall     time.Duration
}

func runIntegrityScenario(t *testing.T, sc integrityScenario, rounds int) integrityResult {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: integrityLinkRate, LinkQueue: integrityQueue})
	if sc.setup != nil {
		sc.setup(t, bed)
	}
	if sc.rule != nil {
		if _, err := framework.StartAgentsWith(background(t), bed, bins.Agent, func(n *testbed.Node) agent.Rule { return *sc.rule(n.Index) }, declaredCaps); err != nil {
			t.Fatal(err)
		}
	}
	stopLoad, err := bed.StartCPULoad(2)
	if err != nil {
		t.Fatal(err)
	}
	defer stopLoad()
	expected := sc.rate
	if expected == 0 {
		rate, _ := testbed.ParseRate(integrityLinkRate)
		expected = 2 * rate * 0.95 // two paths, less the headers
	}
	res := integrityResult{rounds: rounds}
	var stalls []time.Duration
	for round := 1; round <= rounds; round++ {
		rep, kind, evidence := integrityRound(t, bed, 5500+round, sc.cc)
		switch kind {
		case testbed.StreamChanged:
			res.changed++
			t.Errorf("round %d: A STREAM ARRIVED CHANGED; evidence: %s", round, evidence)
		case testbed.StreamStalled, testbed.StreamBroken:
			res.stalled++
			t.Errorf("round %d: the transfer %s; evidence: %s", round, kind, evidence)
		}
		if rep != nil {
			// The first second is the connection's start (slow start,
			// the joins); stalls count after it.
			stall := testbed.LongestStall(*rep, expected/10, time.Second)
			stalls = append(stalls, stall)
			t.Logf("round %d: %.1f Mbit/s, longest stall below %.1f Mbit/s: %v", round, rep.GoodputBps/1e6, expected/10/1e6, stall)
		}
	}
	if len(stalls) > 0 {
		slices.Sort(stalls)
		res.longest, res.medianStall = stalls[len(stalls)-1], stalls[len(stalls)/2]
	}
	return res
}

// integrityRound runs one watched transfer and returns the server's report
// of it (nil if there is none), and how it failed, with where the evidence
// is, if it did.
func integrityRound(t *testing.T, bed *testbed.Bed, port int, cc string) (*testbed.ServerReport, testbed.FailureKind, string) {
	t.Helper()
	ctx := background(t)
	w := bed.Watch(t, datapathEvidence(bed))
	defer w.Close()
	client, server := bed.Pod(1, 1), bed.Pod(2, 1)
	srv, err := bed.StartTrafficServer(ctx, bins.Traffic, server, port, true, "-warmup", "1s", "-window", (integrityTransfer - 1500*time.Millisecond).String(), "-sample", integritySample.String())
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"-conns", "1", "-duration", integrityTransfer.String(), "-seed", fmt.Sprint(port)}
	if cc != "" {
		args = append(args, "-cc", cc)
	}
	sent, sendErr := bed.Send(ctx, bins.Traffic, client, netip.AddrPortFrom(server.Addr, uint16(port)), true, args...)
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	got, err := srv.Reports()
	if err != nil {
		t.Fatal(err)
	}
	var rep *testbed.ServerReport
	if len(got) == 1 {
		rep = &got[0]
	}
	if len(sent) == 0 {
		return rep, testbed.StreamBroken, w.Keep(fmt.Errorf("the sender reported nothing: %w", sendErr))
	}
	if _, err := testbed.MatchReports(sent, got); err != nil {
		te := err.(*testbed.TrafficError)
		kind := testbed.StreamBroken
		switch {
		case te.Changed():
			kind = testbed.StreamChanged
		case te.OnlyStalled():
			kind = testbed.StreamStalled
		}
		return rep, kind, w.Keep(err)
	}
	if rep != nil && !rep.MPTCP {
		t.Errorf("the connection fell back to TCP: %+v", rep)
	}
	return rep, "", ""
}
