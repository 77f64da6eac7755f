package e2e

import (
	"path/filepath"
	"testing"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/guest"
)

// bootGuest boots a VM in pod, attached with binding (docs/testing.md,
// "VM guests").
func bootGuest(t *testing.T, bed *testbed.Bed, pod *testbed.Pod, binding testbed.Binding) *testbed.Guest {
	t.Helper()
	return bed.BootGuestForTest(t, pod, binding, filepath.Join(binDir, "guest"))
}

// A guest whose kernel the operator does not control, configured as a
// tenant most simply would (its path manager may open two subflows and
// accept two announced addresses, nothing more), is a client of a pod whose
// node announces a port per extra path (signal mode); node 1's policy is
// guest mode. The guest's subflows cross distinct NICs of both nodes, the
// same NIC both ways, and every stream arrives whole: with the guest on
// the pod's address (bridge binding) and behind the pod's address
// (masquerade binding).
func testGuestClientSubflowsSpreadOverDistinctNICs(t *testing.T) {
	for _, binding := range []testbed.Binding{testbed.BridgeBinding, testbed.MasqueradeBinding} {
		t.Run(string(binding), func(t *testing.T) {
			testbed.RequireTools(t, testbed.CaptureTools...)
			bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "100mbit"})
			vm := bootGuest(t, bed, bed.Pod(1, 1), binding)
			ruleFor := func(n *testbed.Node) mptcpv1alpha1.CompiledRule {
				if n.Index == 2 {
					return mptcpv1alpha1.CompiledRule{SubflowCreation: mptcpv1alpha1.SubflowCreationSignal, SignalPorts: signalPorts(2)}
				}
				return mptcpv1alpha1.CompiledRule{SubflowCreation: mptcpv1alpha1.SubflowCreationGuest}
			}
			if _, err := framework.StartAgentsWith(background(t), bed, bins.Agent, ruleFor, declaredCaps); err != nil {
				t.Fatal(err)
			}
			if err := vm.ConfigureMPTCP(background(t), guest.MPTCPConfig{Subflows: 2, AddAddrAccepted: 2}); err != nil {
				t.Fatal(err)
			}
			vm.AwaitJoins(1)
			flows := []flow{{client: bed.Pod(1, 1), guest: vm, server: bed.Pod(2, 1), port: 5201, conns: 2}}
			analysis, conns := captureFlows(t, bed, flows)
			if len(analysis.Connections) != conns {
				t.Fatalf("captures show %d MPTCP connections, the guest opened %d", len(analysis.Connections), conns)
			}
			for _, c := range analysis.Connections {
				if len(c.Subflows) != 2 {
					t.Errorf("connection %08x has %d subflows, want one per NIC (2): %v", c.Token, len(c.Subflows), c.Subflows)
				}
			}
			if err := analysis.CheckPlacement(1, 2); err != nil {
				t.Fatalf("placement:\n%v", err)
			}
			t.Logf("%d connections from the %s, each over both NICs", conns, vm)
		})
	}
}
