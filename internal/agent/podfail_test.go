package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"testing"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// TestAPodThatCannotBeConfiguredIsSkippedNotTheNode: a pod whose network
// namespace vanishes between the translation (locate) and the reconcile
// (churn a tenant controls) is that pod's problem: Reconcile returns it as
// ConfigureFailed, leaves it out of the plan, and configures the node's
// other pod, with no error for the node. Before, the whole reconcile failed
// (ApplyFailed) and no pod of the node was gated.
func TestAPodThatCannotBeConfiguredIsSkippedNotTheNode(t *testing.T) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 1, NICs: 2, PodsPerNode: 2})
	node := bed.Node(1)
	good, gone := node.Pods[0], node.Pods[1]
	settings, state, links := bedNodeState(t, bed, node, mptcpv1alpha1.CompiledRule{Name: "r", Policy: "p", SpreadMode: mptcpv1alpha1.SpreadRoundRobin,
		SubflowCreation: mptcpv1alpha1.SubflowCreationUserspace, MaxSubflows: 2},
		mptcpv1alpha1.NodePod{Namespace: "tenant-a", Name: "web", UID: "u-web", IPs: []string{good.Addr.String()}, Rules: []string{"r"}},
		mptcpv1alpha1.NodePod{Namespace: "tenant-b", Name: "churn", UID: "u-churn", IPs: []string{gone.Addr.String()}, Rules: []string{"r"}})
	locate := func(ips []netip.Addr) (LocatedPod, error) {
		if ips[0] == good.Addr {
			return LocatedPod{HostInterface: good.HostIf, NetNS: "/var/run/netns/" + good.NetNS}, nil
		}
		if ips[0] == gone.Addr {
			// Found, then gone before the agent configures it.
			return LocatedPod{HostInterface: gone.HostIf, NetNS: "/var/run/netns/vanished-" + gone.NetNS}, nil
		}
		return LocatedPod{}, fmt.Errorf("no pod at %v", ips)
	}
	err := netnsutil.Do("/var/run/netns/"+node.NetNS, func() error {
		a, err := New(settings, slog.New(slog.DiscardHandler))
		if err != nil {
			return err
		}
		defer func() {
			if err := a.Uninstall(); err != nil {
				t.Errorf("uninstall: %v", err)
			}
		}()
		tr := FromNodeState(settings, state, links, locate, Prior{})
		if len(tr.Errors) > 0 || len(tr.PodProblems) > 0 || len(tr.Plan.Pods) != 2 {
			t.Fatalf("translation: %v, %+v, %d pods", tr.Errors, tr.PodProblems, len(tr.Plan.Pods))
		}
		failed, err := a.Reconcile(context.Background(), tr.Plan)
		if err != nil {
			t.Errorf("the node's reconcile failed: %v", err)
		}
		if len(failed) != 1 || failed[0].Namespace != "tenant-b" || failed[0].Name != "churn" || failed[0].Reason != mptcpv1alpha1.PodConfigureFailed {
			t.Errorf("failed pods %+v, want tenant-b/churn ConfigureFailed", failed)
		}
		if len(tr.Plan.Pods) != 1 || tr.Plan.Pods[0].Ref.Name != "web" {
			t.Errorf("plan pods after the reconcile %+v, want tenant-a/web only", tr.Plan.Pods)
		}
		chains, err := a.dp.EndpointRules()
		if err != nil {
			return err
		}
		if len(chains[good.Addr]) != 1 || len(chains[gone.Addr]) != 0 {
			t.Errorf("selector chains %v: want tenant-a/web's only", chains)
		}
		if n := a.pms.Len(); n != 1 {
			t.Errorf("%d path managers, want tenant-a/web's", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
