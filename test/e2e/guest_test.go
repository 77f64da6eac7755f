package e2e

import (
	"path/filepath"
	"testing"
	"time"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/observe"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/guest"
)

// The guests of these tests are configured only as their tenants would
// configure them (docs/vms.md); the operator configures nothing in them.

// bootGuest boots a VM in pod, attached with binding (docs/testbed.md,
// "VM guests").
func bootGuest(t *testing.T, bed *testbed.Bed, pod *testbed.Pod, binding testbed.Binding) *testbed.Guest {
	t.Helper()
	return bed.BootGuestForTest(t, pod, binding, filepath.Join(binDir, "guest"))
}

// guestClient is the commonest tenant configuration of a guest that is a
// client: its path manager may open two subflows and join two addresses a
// server announces, nothing more. Its senders wait for one join.
func guestClient(t *testing.T, vm *testbed.Guest) {
	t.Helper()
	if err := vm.ConfigureMPTCP(background(t), guest.MPTCPConfig{Subflows: 2, AddAddrAccepted: 2}); err != nil {
		t.Fatal(err)
	}
	vm.AwaitJoins(1)
}

// guestRules gives node 1 (the guest's) rule guest mode, with what more
// one adds, and node 2 signal mode, announcing a port per extra path.
func guestRules(more func(*mptcpv1alpha1.CompiledRule)) func(*testbed.Node) mptcpv1alpha1.CompiledRule {
	return func(n *testbed.Node) mptcpv1alpha1.CompiledRule {
		if n.Index == 2 {
			return mptcpv1alpha1.CompiledRule{SubflowCreation: mptcpv1alpha1.SubflowCreationSignal, SignalPorts: signalPorts(len(n.NICs))}
		}
		r := mptcpv1alpha1.CompiledRule{SubflowCreation: mptcpv1alpha1.SubflowCreationGuest}
		if more != nil {
			more(&r)
		}
		return r
	}
}

// requireOneGuestBackupSubflow fails the test unless the guest's kernel
// has two established MPTCP subflows, exactly one of them held as backup
// because its peer asked (the B bit of a join's SYN-ACK, or MP_PRIO).
func requireOneGuestBackupSubflow(t *testing.T, vm *testbed.Guest) {
	t.Helper()
	sfs, err := vm.Subflows(background(t))
	if err != nil {
		t.Fatal(err)
	}
	backups := 0
	for _, sf := range sfs {
		if sf.Flags&mptcpnl.SubflowBackupRemote != 0 {
			backups++
		}
	}
	if len(sfs) != 2 || backups != 1 {
		t.Errorf("the guest's subflows are %+v, want two, one held as backup at the peer's request", sfs)
	}
}

// requireBackupCarriesLittle fails the test unless node 1's nic2 (the
// backup path) carried under 5 % of what its NICs sent between the
// counters before and after, and nic1 at least least bytes: a guest that
// sent nothing proves nothing.
func requireBackupCarriesLittle(t *testing.T, before, after []uint64, least float64) {
	t.Helper()
	active, spare := float64(after[0]-before[0]), float64(after[1]-before[1])
	t.Logf("node 1 sent %.1f MB on the active path, %.3f MB on the backup path", active/1e6, spare/1e6)
	if active < least {
		t.Fatalf("node 1 sent %.0f bytes on the active path, want at least %.0f: the guest sent nothing to share out", active, least)
	}
	if spare/(active+spare) >= 0.05 {
		t.Errorf("the backup path carried %.2f%% of the bytes, want under 5%%", 100*spare/(active+spare))
	}
}

// waitGuestSubflows waits (10 s at most) until the guest has n
// established MPTCP subflows.
func waitGuestSubflows(t *testing.T, vm *testbed.Guest, n int) {
	t.Helper()
	var sfs []mptcpnl.Subflow
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var err error
		if sfs, err = vm.Subflows(background(t)); err != nil {
			t.Fatal(err)
		}
		if len(sfs) >= n {
			return
		}
	}
	t.Fatalf("the guest has subflows %+v after 10 s, want %d", sfs, n)
}

// A guest that is a client of a pod whose node announces a port per extra
// path (signal mode), node 1's policy in guest mode: the guest's subflows
// cross distinct NICs of both nodes, the same NIC both ways, and every
// stream arrives whole, with the guest on the pod's address (bridge
// binding) and behind it (masquerade binding).
func testGuestClientSubflowsSpreadOverDistinctNICs(t *testing.T) {
	for _, binding := range []testbed.Binding{testbed.BridgeBinding, testbed.MasqueradeBinding} {
		t.Run(string(binding), func(t *testing.T) {
			testbed.RequireTools(t, testbed.CaptureTools...)
			bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "100mbit"})
			vm := bootGuest(t, bed, bed.Pod(1, 1), binding)
			if _, err := framework.StartAgentsWith(background(t), bed, bins.Agent, guestRules(nil), declaredCaps); err != nil {
				t.Fatal(err)
			}
			guestClient(t, vm)
			analysis, conns := captureFlows(t, bed, []flow{{client: bed.Pod(1, 1), guest: vm, server: bed.Pod(2, 1), port: 5201, conns: 2}})
			requireSpread(t, analysis, conns, "captured")
		})
	}
}

// A guest that is a server and configured nothing (the kernel's default
// limits accept two joins), its node's policy in guest mode; a pod on node
// 2 is its client with the agent as its path manager: the connection's
// subflows cross distinct NICs, with both bindings. And VM to VM: a guest
// on each node, the server announcing a port on its address (`ip mptcp
// endpoint add ADDR port P signal`, possible with the bridge binding,
// where the guest owns the pod's address), both nodes in guest mode.
func testGuestServerSubflowsSpreadOverDistinctNICs(t *testing.T) {
	for _, binding := range []testbed.Binding{testbed.BridgeBinding, testbed.MasqueradeBinding} {
		t.Run("pod to guest, "+string(binding), func(t *testing.T) {
			testbed.RequireTools(t, testbed.CaptureTools...)
			bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "100mbit"})
			vm := bootGuest(t, bed, bed.Pod(1, 1), binding)
			rules := func(n *testbed.Node) mptcpv1alpha1.CompiledRule {
				if n.Index == 2 {
					return mptcpv1alpha1.CompiledRule{SubflowCreation: mptcpv1alpha1.SubflowCreationUserspace}
				}
				return mptcpv1alpha1.CompiledRule{SubflowCreation: mptcpv1alpha1.SubflowCreationGuest}
			}
			if _, err := framework.StartAgentsWith(background(t), bed, bins.Agent, rules, declaredCaps); err != nil {
				t.Fatal(err)
			}
			bed.AwaitJoins(bed.Pod(2, 1), 1)
			analysis, conns := captureFlows(t, bed, []flow{{client: bed.Pod(2, 1), server: bed.Pod(1, 1), serverGuest: vm, port: 5201, conns: 2}})
			requireSpread(t, analysis, conns, "captured")
		})
	}
	t.Run("guest to guest, bridge", func(t *testing.T) {
		testbed.RequireTools(t, testbed.CaptureTools...)
		bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "100mbit"})
		client := bootGuest(t, bed, bed.Pod(1, 1), testbed.BridgeBinding)
		server := bootGuest(t, bed, bed.Pod(2, 1), testbed.BridgeBinding)
		guestMode := func(*testbed.Node) mptcpv1alpha1.CompiledRule {
			return mptcpv1alpha1.CompiledRule{SubflowCreation: mptcpv1alpha1.SubflowCreationGuest}
		}
		if _, err := framework.StartAgentsWith(background(t), bed, bins.Agent, guestMode, declaredCaps); err != nil {
			t.Fatal(err)
		}
		if err := server.ConfigureMPTCP(background(t), guest.MPTCPConfig{Subflows: 2, Endpoints: []guest.Endpoint{
			{Addr: server.Addr, Port: 6002, Flags: []string{"signal"}},
		}}); err != nil {
			t.Fatal(err)
		}
		guestClient(t, client)
		analysis, conns := captureFlows(t, bed, []flow{{client: bed.Pod(1, 1), guest: client, server: bed.Pod(2, 1), serverGuest: server, port: 5201, conns: 2}})
		requireSpread(t, analysis, conns, "captured")
	})
}

// A backup path reaches the guest's own stack: node 1's policy makes path
// 2 a backup path, the agent sets the B bit of the join's SYN-ACK into the
// pod, and the guest's kernel holds that subflow as backup (its flags say
// the peer asked for it) and sends almost nothing on it.
func testGuestHoldsTheJoinOnABackupPathAsBackup(t *testing.T) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "100mbit"})
	vm := bootGuest(t, bed, bed.Pod(1, 1), testbed.BridgeBinding)
	backup := guestRules(func(r *mptcpv1alpha1.CompiledRule) {
		r.Paths, r.BackupPaths, r.HeaderRewriting = framework.PathsNamed(framework.PathName(1)), []string{framework.PathName(2)}, true
	})
	agents, err := framework.StartAgentsWith(background(t), bed, bins.Agent, backup, declaredCaps)
	if err != nil {
		t.Fatal(err)
	}
	guestClient(t, vm)
	_, tx0 := nicBytes(t, bed, bed.Node(1))
	wait := startFlows(t, bed, []flow{{client: bed.Pod(1, 1), guest: vm, server: bed.Pod(2, 1), port: 5201, conns: 1}}, 6*time.Second)
	waitGuestSubflows(t, vm, 2)
	requireOneGuestBackupSubflow(t, vm)
	wait()
	_, tx1 := nicBytes(t, bed, bed.Node(1))
	requireBackupCarriesLittle(t, tx0, tx1, 1e6)
	if n, _ := scrape(t, agents[0]).Value("mptcp_agent_datapath_events_total", "event", observe.EventName(datapath.StatBackupFlagged)); n < 1 {
		t.Errorf("node 1's agent counted %v joins flagged backup, want at least 1", n)
	}
}

// A guest's join beyond its policy's maxSubflows is refused with an
// MP_TCPRST at the pod's veth: the guest's kernel sees the attempt fail,
// the server never sees the join, and the stream arrives whole over the
// subflows allowed.
func testGuestJoinBeyondTheMaximumIsRefusedWithMPTCPRST(t *testing.T) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 3, PodsPerNode: 1, LinkRate: "100mbit"})
	vm := bootGuest(t, bed, bed.Pod(1, 1), testbed.BridgeBinding)
	agents, err := framework.StartAgentsWith(background(t), bed, bins.Agent, guestRules(func(r *mptcpv1alpha1.CompiledRule) { r.MaxSubflows = 2 }), declaredCaps)
	if err != nil {
		t.Fatal(err)
	}
	// The server's node announces two ports; the guest joins both and
	// one join is refused: its sender waits for the other.
	guestClient(t, vm)
	ctx := background(t)
	counter := func(name string) float64 {
		v, err := vm.Counter(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	server := bed.Pod(2, 1)
	joinsRx0, fails0 := nstatValue(t, bed, server.NetNS, "MPTcpExtMPJoinSynRx"), counter("TcpAttemptFails")
	runFlows(t, bed, []flow{{client: bed.Pod(1, 1), guest: vm, server: server, port: 5201, conns: 1}}, 3*time.Second)
	if n := nstatValue(t, bed, server.NetNS, "MPTcpExtMPJoinSynRx") - joinsRx0; n != 1 {
		t.Errorf("the server pod received %v join SYNs, want 1: the second must be refused before it", n)
	}
	if n := counter("TcpAttemptFails") - fails0; n != 1 {
		t.Errorf("the guest's kernel saw %v connection attempts fail, want the refused join's", n)
	}
	if n, _ := scrape(t, agents[0]).Value("mptcp_agent_datapath_events_total", "event", observe.EventName(datapath.StatJoinRefused)); n < 1 {
		t.Errorf("node 1's agent counted %v refused joins, want at least 1", n)
	}
}

// A guest's connection goes on through a failed path under it, the
// carrier lost (link events) or every packet lost with the carrier up (a
// gray failure, found by the agents' probes: every 100 ms, down after 5
// unanswered, slow enough for tests side by side): node 1's agent detours
// the guest's subflow off the path and brings it home when the path is
// back, the guest's kernel none the wiser, and the stream arrives whole.
// Links of 5 Mbit/s, which the guest fills, so that both of its subflows
// carry data when the path fails.
func testGuestConnectionGoesOnThroughAFailedPath(t *testing.T) {
	for _, c := range []struct {
		name        string
		fail, heal  func(*testbed.Bed) error
		agentOption []framework.AgentOption
	}{
		{"carrier lost", func(b *testbed.Bed) error { return b.SetCarrier(1, 1, false) }, func(b *testbed.Bed) error { return b.SetCarrier(1, 1, true) }, nil},
		{"every packet lost", func(b *testbed.Bed) error { return b.SetLoss(1, 1, 100) }, func(b *testbed.Bed) error { return b.SetLoss(1, 1, 0) },
			[]framework.AgentOption{framework.WithLivenessEvery(100*time.Millisecond, 5)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "5mbit"})
			vm := bootGuest(t, bed, bed.Pod(1, 1), testbed.BridgeBinding)
			agents, err := framework.StartAgentsWith(background(t), bed, bins.Agent, guestRules(nil), append(c.agentOption, declaredCaps)...)
			if err != nil {
				t.Fatal(err)
			}
			guestClient(t, vm)
			wait := startFlows(t, bed, []flow{{client: bed.Pod(1, 1), guest: vm, server: bed.Pod(2, 1), port: 5201, conns: 1}}, 9*time.Second)
			waitGuestSubflows(t, vm, 2)
			time.Sleep(time.Second)
			testbed.Must(t, c.fail(bed))
			time.Sleep(3 * time.Second)
			testbed.Must(t, c.heal(bed))
			wait()
			counts := events(t, agents[0], datapath.StatSubflowDetoured, datapath.StatSubflowHomed)
			t.Logf("node 1 datapath: %v", counts)
			if counts["subflow_detoured"] < 1 || counts["subflow_homed"] < 1 {
				t.Errorf("node 1 detoured %v subflows and brought %v home, want the guest's subflow on nic1 away and back", counts["subflow_detoured"], counts["subflow_homed"])
			}
		})
	}
}

// A path made backup while a guest's connection runs on it: the agent's
// MP_PRIO reaches the guest's kernel, which then holds that subflow as
// backup and all but stops sending on it. Links of 5 Mbit/s, which even
// a guest under software emulation on a busy machine fills, so that its
// scheduler sends on both subflows before the change.
func testGuestIsToldOfAPathMadeBackupWithMPPrio(t *testing.T) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "5mbit"})
	vm := bootGuest(t, bed, bed.Pod(1, 1), testbed.BridgeBinding)
	agents, err := framework.StartAgentsWith(background(t), bed, bins.Agent, guestRules(func(r *mptcpv1alpha1.CompiledRule) { r.HeaderRewriting = true }), declaredCaps)
	if err != nil {
		t.Fatal(err)
	}
	guestClient(t, vm)
	ctx := background(t)
	wait := startFlows(t, bed, []flow{{client: bed.Pod(1, 1), guest: vm, server: bed.Pod(2, 1), port: 5201, conns: 1}}, 10*time.Second)
	// Both subflows up (a guest under software emulation on a busy
	// machine may take seconds), then a second for its scheduler.
	waitGuestSubflows(t, vm, 2)
	time.Sleep(time.Second)
	_, tx0 := nicBytes(t, bed, bed.Node(1))
	time.Sleep(time.Second)
	_, tx1 := nicBytes(t, bed, bed.Node(1))
	// A guest under software emulation on a busy machine may send little:
	// what counts is that both paths carry its traffic.
	if a, b := float64(tx1[0]-tx0[0]), float64(tx1[1]-tx0[1]); a+b < 200e3 || b < 0.2*(a+b) {
		t.Fatalf("before the change nic2 carried %.0f of %.0f bytes in a second: the guest's join is not spread, the test proves nothing", b, a+b)
	}
	if err := agents[0].Reconfigure(ctx, func(cfg *framework.NodeConfig) {
		cfg.Rule().Paths, cfg.Rule().BackupPaths = framework.PathsNamed(framework.PathName(1)), []string{framework.PathName(2)}
	}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	_, tx2 := nicBytes(t, bed, bed.Node(1))
	time.Sleep(3 * time.Second)
	_, tx3 := nicBytes(t, bed, bed.Node(1))
	requireOneGuestBackupSubflow(t, vm)
	wait()
	requireBackupCarriesLittle(t, tx2, tx3, 500e3)
	if n, _ := scrape(t, agents[0]).Value("mptcp_agent_datapath_events_total", "event", observe.EventName(datapath.StatBackupPrioSent)); n < 1 {
		t.Errorf("node 1's agent counted %v MP_PRIO sent, want at least 1", n)
	}
}
