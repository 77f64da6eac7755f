package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// flow is one traffic client: a pod sending conns connections to a server.
type flow struct {
	client, server *testbed.Pod
	// guest, when set, sends in client's place: a VM in client's pod;
	// serverGuest serves in server's place.
	guest, serverGuest *testbed.Guest
	port               int
	conns              int
	cc                 string // the senders' congestion control; the namespace's when empty
	bytes              int64  // what each connection sends; for the transfer's duration when 0
	// rateMbit paces each connection's writes (0: as fast as it goes).
	rateMbit float64
}

// runFlows starts a server per flow, runs all clients at once for d,
// checks every stream arrived as it was sent, and returns the number of
// connections. Every wire is captured while it runs, and a failure keeps
// that evidence (testbed.Watch); nothing is tried again.
func runFlows(t *testing.T, bed *testbed.Bed, flows []flow, d time.Duration) int {
	t.Helper()
	return startFlows(t, bed, flows, d)()
}

// startFlows starts what runFlows runs and returns at once; the function it
// returns waits for the clients, checks the data and returns the number of
// connections.
func startFlows(t *testing.T, bed *testbed.Bed, flows []flow, d time.Duration) (wait func() int) {
	t.Helper()
	w := bed.Watch(t, framework.DatapathEvidence(bed))
	run := launchFlows(t, bed, flows, d)
	return func() int {
		t.Helper()
		n, err := run()
		if err != nil {
			w.Fail(err)
		}
		w.Close()
		return n
	}
}

// launchFlows starts a server per flow and the clients, and returns a
// function that waits for the clients, stops the servers and checks every
// stream: a traffic failure is a *testbed.TrafficError.
func launchFlows(t *testing.T, bed *testbed.Bed, flows []flow, d time.Duration) (wait func() (int, error)) {
	t.Helper()
	run := launchFlowsReporting(t, bed, flows, d)
	return func() (int, error) {
		reps, err := run()
		return len(reps.sent), err
	}
}

// trafficServer is the traffic tool's server in a pod or in a guest.
type trafficServer interface {
	Stop() error
	Reports() ([]testbed.ServerReport, error)
}

// flowReports are what the senders and servers of a transfer reported.
type flowReports struct {
	sent []testbed.SenderReport
	got  []testbed.ServerReport
}

// launchFlowsReporting is launchFlows returning the reports; extra flags
// go to the servers (e.g. "-sample", "50ms").
func launchFlowsReporting(t *testing.T, bed *testbed.Bed, flows []flow, d time.Duration, serverFlags ...string) (wait func() (flowReports, error)) {
	t.Helper()
	ctx := background(t)
	servers := make([]trafficServer, len(flows))
	for i, f := range flows {
		flags := append([]string{"-warmup", "0s", "-window", d.String()}, serverFlags...)
		var s trafficServer
		var err error
		if f.serverGuest != nil {
			s, err = f.serverGuest.StartTrafficServer(ctx, f.port, true, flags...)
		} else {
			s, err = bed.StartTrafficServer(ctx, bins.Traffic, f.server, f.port, true, flags...)
		}
		if err != nil {
			t.Fatal(err)
		}
		servers[i] = s
	}
	type result struct {
		sent []testbed.SenderReport
		err  error
	}
	results := make(chan result, len(flows))
	for _, f := range flows {
		go func() {
			// Each flow sends streams of its own (seeded by its port), so
			// that no two connections of a transfer carry the same bytes.
			args := []string{"-conns", fmt.Sprint(f.conns), "-duration", d.String(), "-seed", fmt.Sprint(f.port)}
			if f.bytes > 0 {
				args = append(args, "-bytes", fmt.Sprint(f.bytes))
			}
			if f.cc != "" {
				args = append(args, "-cc", f.cc)
			}
			if f.rateMbit > 0 {
				args = append(args, "-rate-mbit", fmt.Sprint(f.rateMbit))
			}
			to := netip.AddrPortFrom(f.server.Addr, uint16(f.port))
			var sent []testbed.SenderReport
			var err error
			if f.guest != nil {
				sent, err = f.guest.Send(ctx, to, true, args...)
			} else {
				sent, err = bed.Send(ctx, bins.Traffic, f.client, to, true, args...)
			}
			results <- result{sent, err}
		}()
	}
	return func() (flowReports, error) {
		var sent []testbed.SenderReport
		var failed []error
		for range flows {
			r := <-results
			sent = append(sent, r.sent...)
			if r.err != nil && len(r.sent) == 0 {
				// The sender printed nothing: no connection to classify.
				failed = append(failed, r.err)
			}
		}
		// Every sender has seen its server close each connection, and a
		// server reports a connection before it closes it: the reports
		// are complete. Stopping the servers reports any connection
		// still open as stopped.
		var got []testbed.ServerReport
		for _, s := range servers {
			if err := s.Stop(); err != nil {
				failed = append(failed, err)
			}
			reps, err := s.Reports()
			if err != nil {
				failed = append(failed, err)
			}
			got = append(got, reps...)
		}
		for _, r := range sent {
			if r.JoinWaitTimedOut {
				// Said, not failed: the transfer is still checked byte
				// for byte, and a changed stream then has this reason.
				t.Logf("connection %d from %s sent on with %d answered joins after the join wait timed out", r.Conn, r.Local, r.JoinsAwaited)
			}
		}
		if _, err := testbed.MatchReports(sent, got); err != nil {
			failed = append(failed, err)
		}
		return flowReports{sent: sent, got: got}, errors.Join(failed...)
	}
}

// capturedTransfer is how long captured transfers last: long enough for
// every subflow to carry data both ways, short enough to decode quickly.
const capturedTransfer = 2 * time.Second

// placementRateMbit paces each connection of captureFlows.
const placementRateMbit = 15

// captureFlows runs flows with captures on every wire and returns what
// tshark makes of them, with the number of connections. A traffic failure
// fails the test with the captures kept as evidence.
func captureFlows(t *testing.T, bed *testbed.Bed, flows []flow) (*testbed.Analysis, int) {
	t.Helper()
	// Paced below the links' rate, 15 Mbit/s a connection unless a flow
	// says otherwise: these transfers show where subflows go, and
	// saturated tail-drop links stall a connection now and then whoever
	// places it (docs/testing.md, "Stalls").
	flows = slices.Clone(flows)
	for i := range flows {
		if flows[i].rateMbit == 0 {
			flows[i].rateMbit = placementRateMbit
		}
	}
	w := bed.Watch(t, framework.DatapathEvidence(bed))
	conns, err := launchFlows(t, bed, flows, capturedTransfer)()
	if err != nil {
		w.Fail(err)
	}
	analysis := analyzeWatched(t, w)
	return analysis, conns
}

// crossTraffic is several concurrent connections in both directions between
// node 1 and node 2: two clients on node 1 to a server on node 2, and one
// client on node 2 to a server on node 1.
func crossTraffic(bed *testbed.Bed) []flow {
	return []flow{
		{client: bed.Pod(1, 1), server: bed.Pod(2, 1), port: 5201, conns: 2},
		{client: bed.Pod(1, 2), server: bed.Pod(2, 1), port: 5202, conns: 2},
		{client: bed.Pod(2, 2), server: bed.Pod(1, 1), port: 5203, conns: 1},
	}
}

// clientServerTraffic is several concurrent connections from the clients on
// node 1 to the servers on node 2.
func clientServerTraffic(bed *testbed.Bed) []flow {
	return []flow{
		{client: bed.Pod(1, 1), server: bed.Pod(2, 1), port: 5201, conns: 2},
		{client: bed.Pod(1, 2), server: bed.Pod(2, 2), port: 5202, conns: 2},
	}
}

// signalPorts are the ports servers announce for paths 2..k.
func signalPorts(k int) []int32 {
	var ports []int32
	for i := 2; i <= k; i++ {
		ports = append(ports, int32(6000+i))
	}
	return ports
}

func reversePathDrops(t *testing.T, bed *testbed.Bed, node *testbed.Node) int {
	t.Helper()
	return int(nstatValue(t, bed, node.NetNS, "TcpExtIPReversePathFilter"))
}

// The walking skeleton's promise: with nobody writing routes, every subflow
// of every connection between pods on two nodes crosses exactly one NIC of
// each node, the same NIC in both directions, and the subflows of one
// connection use distinct NICs. Checked from captures decoded by tshark.
func testSubflowsSpreadOverDistinctNICsInBothDirections(t *testing.T) {
	tests := map[string]struct {
		nics int                           // NICs per node (K)
		mode mptcpv1alpha1.SubflowCreation // who opens the joins
	}{
		// Joins from the same address to the same server port, told apart
		// only by kernel-chosen source ports: as a userspace path manager
		// or a VM guest opens them.
		"K=2, agent as userspace path manager": {nics: 2, mode: mptcpv1alpha1.SubflowCreationUserspace},
		"K=4, agent as userspace path manager": {nics: 4, mode: mptcpv1alpha1.SubflowCreationUserspace},
		// Joins to ports the servers announce, opened by the clients'
		// in-kernel path managers.
		"K=2, server-announced ports": {nics: 2, mode: mptcpv1alpha1.SubflowCreationSignal},
		"K=4, server-announced ports": {nics: 4, mode: mptcpv1alpha1.SubflowCreationSignal},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			testbed.RequireTools(t, testbed.CaptureTools...)
			bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: tc.nics, PodsPerNode: 2, LinkRate: "100mbit"})
			flows := crossTraffic(bed)
			ruleFor := func(*testbed.Node) mptcpv1alpha1.CompiledRule {
				return mptcpv1alpha1.CompiledRule{SubflowCreation: tc.mode}
			}
			if tc.mode == mptcpv1alpha1.SubflowCreationSignal {
				// Servers on node 2 announce; clients on node 1 join.
				flows = clientServerTraffic(bed)
				// The agents give the clients' kernels room for a
				// join per extra NIC; the senders wait for them.
				for _, p := range bed.Node(1).Pods {
					bed.AwaitJoins(p, tc.nics-1)
				}
				ruleFor = func(n *testbed.Node) mptcpv1alpha1.CompiledRule {
					if n.Index == 2 {
						return mptcpv1alpha1.CompiledRule{SubflowCreation: tc.mode, SignalPorts: signalPorts(tc.nics)}
					}
					return mptcpv1alpha1.CompiledRule{SubflowCreation: tc.mode}
				}
			}
			// The agents hold only the capabilities they declare.
			agents, err := framework.StartAgentsWith(background(t), bed, bins.Agent, ruleFor, declaredCaps)
			if err != nil {
				t.Fatal(err)
			}

			analysis, conns := captureFlows(t, bed, flows)

			if len(analysis.Connections) != conns {
				t.Fatalf("captures show %d MPTCP connections, the clients opened %d", len(analysis.Connections), conns)
			}
			for _, c := range analysis.Connections {
				if len(c.Subflows) != tc.nics {
					t.Errorf("connection %08x has %d subflows, want one per NIC (%d): %v", c.Token, len(c.Subflows), tc.nics, c.Subflows)
				}
				if c.Subflows[0].Kind != testbed.KindMPCapable {
					t.Errorf("connection %08x: first subflow %v is not the MP_CAPABLE one", c.Token, c.Subflows[0])
				}
				first := c.Subflows[0]
				for _, s := range c.Subflows[1:] {
					if s.Kind != testbed.KindMPJoin {
						t.Errorf("connection %08x: subflow %v is not a join", c.Token, s)
					}
					if tc.mode == mptcpv1alpha1.SubflowCreationUserspace && (s.Src.Addr() != first.Src.Addr() || s.Dst != first.Dst) {
						t.Errorf("connection %08x: join %v does not go from the initial subflow's address to its server port %v", c.Token, s, first.Dst)
					}
				}
			}
			if err := analysis.CheckPlacement(1, 2); err != nil {
				t.Fatalf("placement:\n%v", err)
			}

			// The datapath knew every join's token before the join arrived.
			for _, a := range agents {
				stats, err := a.DatapathStats()
				if err != nil {
					t.Fatal(err)
				}
				if stats[datapath.StatJoinTokenUnknown] != 0 {
					t.Errorf("node %d: %d joins with a token the datapath did not know yet", a.Node.Index, stats[datapath.StatJoinTokenUnknown])
				}
			}
			for _, n := range bed.Nodes {
				if drops := reversePathDrops(t, bed, n); drops != 0 {
					t.Errorf("node %d: strict rp_filter dropped %d packets", n.Index, drops)
				}
			}
		})
	}
}

// Without the agent and its state, the same traffic with the same subflows
// is no longer spread: the steering is the agent's doing.
func testWithoutTheAgentSubflowsAreNotSpread(t *testing.T) {
	testbed.RequireTools(t, testbed.CaptureTools...)
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 2, LinkRate: "100mbit"})
	agents, err := framework.StartAgents(background(t), bed, bins.Agent, mptcpv1alpha1.CompiledRule{}, declaredCaps)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range agents {
		if err := a.Uninstall(context.Background()); err != nil {
			t.Fatal(err)
		}
		assertNothingLeft(t, a)
	}
	// Subflows still exist, opened by the kernel's path managers: servers
	// announce a port, clients join it. Only the agent's steering is gone.
	for _, p := range bed.Node(2).Pods {
		if err := bed.ConfigureSignalPorts(p, []int{6002}); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range bed.Node(1).Pods {
		if err := bed.ConfigureClientLimits(p, 1, 1); err != nil {
			t.Fatal(err)
		}
	}
	analysis, _ := captureFlows(t, bed, clientServerTraffic(bed))
	joins := 0
	for _, c := range analysis.Connections {
		joins += len(c.Subflows) - 1
	}
	if joins == 0 {
		t.Fatal("no joins at all: the check below would prove nothing")
	}
	if err := analysis.CheckPlacement(1, 2); err == nil {
		t.Fatal("subflows are spread over distinct NICs without the agent; the steering test could not fail")
	}
	for _, s := range analysis.Subflows {
		if k, ok := s.PlacedOn(1); !ok || k != 1 {
			t.Errorf("without the agent, subflow %v should use nic1 only", s)
		}
	}
}

// assertNothingLeft checks that uninstall removed the agent's rules, tables,
// pins and state.
func assertNothingLeft(t *testing.T, a *framework.Agent) {
	t.Helper()
	if err := a.Leftovers(); err != nil {
		t.Error(err)
	}
}
