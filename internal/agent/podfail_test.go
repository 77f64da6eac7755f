package agent

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
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
	err := inAgent(t, node, settings, func(a *Agent) error {
		tr := FromNodeState(settings, state, nil, links, locate, Prior{})
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

// TestAPodWhoseSocketsCannotBeListedIsNotTheNodesProblem: the sweeps list
// each pod's TCP sockets in its own namespace, which its tenant controls
// (and, with NET_ADMIN, can make fail). A pod whose namespace cannot be
// listed or entered is that pod's problem, not the node's: here tenant-b's
// released pod, whose namespace path no longer names a namespace (a
// regular file where it was). Its records wait for a listing that works;
// the node's reconciles do not fail, so the node stays Ready and its other
// pods, a new one included, are configured and gated: a listing error is
// no reason for the node's reconcile to fail (ApplyFailed), which would
// leave no pod of the node gated.
func TestAPodWhoseSocketsCannotBeListedIsNotTheNodesProblem(t *testing.T) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 1, NICs: 2, PodsPerNode: 3})
	node := bed.Node(1)
	web, churn, web2 := node.Pods[0], node.Pods[1], node.Pods[2]
	rule := mptcpv1alpha1.CompiledRule{Name: "r", Policy: "p", SpreadMode: mptcpv1alpha1.SpreadRoundRobin,
		SubflowCreation: mptcpv1alpha1.SubflowCreationUserspace, MaxSubflows: 2}
	pod := func(ns, name string, p *testbed.Pod) mptcpv1alpha1.NodePod {
		return mptcpv1alpha1.NodePod{Namespace: ns, Name: name, UID: "u-" + name, IPs: []string{p.Addr.String()}, Rules: []string{"r"}}
	}
	settings, state, links := bedNodeState(t, bed, node, rule, pod("tenant-a", "web", web), pod("tenant-b", "churn", churn))
	// churn's namespace is found at a path of the test's, which names it
	// until the test puts a regular file there.
	churnNS := filepath.Join(t.TempDir(), "churn-ns")
	if err := os.Symlink("/var/run/netns/"+churn.NetNS, churnNS); err != nil {
		t.Fatal(err)
	}
	locate := func(ips []netip.Addr) (LocatedPod, error) {
		for _, p := range []*testbed.Pod{web, web2} {
			if ips[0] == p.Addr {
				return LocatedPod{HostInterface: p.HostIf, NetNS: "/var/run/netns/" + p.NetNS}, nil
			}
		}
		if ips[0] == churn.Addr {
			return LocatedPod{HostInterface: churn.HostIf, NetNS: churnNS}, nil
		}
		return LocatedPod{}, fmt.Errorf("no pod at %v", ips)
	}
	err := inAgent(t, node, settings, func(a *Agent) error {
		reconcile := func(step string, pods ...mptcpv1alpha1.NodePod) *Plan {
			t.Helper()
			state.Spec.Pods = pods
			tr := FromNodeState(settings, state, nil, links, locate, Prior{})
			if len(tr.Errors) > 0 || len(tr.PodProblems) > 0 || len(tr.Plan.Pods) != len(pods) {
				t.Fatalf("%s: translation: %v, %+v, %d pods", step, tr.Errors, tr.PodProblems, len(tr.Plan.Pods))
			}
			failed, err := a.Reconcile(context.Background(), tr.Plan)
			if err != nil {
				t.Errorf("%s: the node's reconcile failed: %v", step, err)
			}
			if len(failed) > 0 {
				t.Errorf("%s: pods failed %+v, want none", step, failed)
			}
			return tr.Plan
		}
		reconcile("both pods selected", pod("tenant-a", "web", web), pod("tenant-b", "churn", churn))

		// churn is released; its namespace path now names no namespace.
		if err := os.Remove(churnNS); err != nil {
			return err
		}
		if err := os.WriteFile(churnNS, nil, 0o600); err != nil {
			return err
		}
		reconcile("churn released", pod("tenant-a", "web", web))
		reconcile("again", pod("tenant-a", "web", web))
		if _, kept := a.readReleased()[churn.Addr]; !kept {
			t.Errorf("churn's records were forgotten without a listing of its sockets")
		}
		if err := a.Sweep(); err != nil {
			t.Errorf("a sweep failed: %v", err)
		}

		// A new pod of tenant-a is configured meanwhile.
		plan := reconcile("a new pod", pod("tenant-a", "web", web), pod("tenant-a", "web2", web2))
		if len(plan.Pods) != 2 {
			t.Errorf("plan pods %+v, want web and web2", plan.Pods)
		}
		chains, err := a.dp.EndpointRules()
		if err != nil {
			return err
		}
		if len(chains[web.Addr]) != 1 || len(chains[web2.Addr]) != 1 || len(chains[churn.Addr]) != 0 {
			t.Errorf("selector chains %v: want web's and web2's", chains)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
