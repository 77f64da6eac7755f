package agent_test

import (
	"net/netip"
	"slices"
	"testing"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/routing"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// On a real node namespace of the test bed: paths resolve to the NICs by
// name, altname and pattern, each NIC's gateway is the fabric address (from
// the default route on nic1, from the subnet on nic2, which has none), and a
// pod is found from its address alone: its host-side veth and its named
// namespace.
func TestNodeLinksAndPodsAreFoundInARealNamespace(t *testing.T) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 1, NICs: 2, PodsPerNode: 2})
	node := bed.Node(1)
	if out, err := bed.Command(node.NetNS, "ip", "link", "property", "add", "dev", "nic2", "altname", "fabricb0").CombinedOutput(); err != nil {
		t.Fatalf("altname: %v: %s", err, out)
	}
	var links []agent.NodeLink
	located := map[string]agent.LocatedPod{}
	err := netnsutil.Do("/var/run/netns/"+node.NetNS, func() error {
		var err error
		if links, err = agent.Links(); err != nil {
			return err
		}
		for _, p := range node.Pods {
			loc, err := agent.LocatePod([]netip.Addr{p.Addr})
			if err != nil {
				return err
			}
			located[p.Name] = loc
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range node.Pods {
		want := agent.LocatedPod{HostInterface: p.HostIf, NetNS: "/var/run/netns/" + p.NetNS}
		if located[p.Name] != want {
			t.Errorf("pod %s located at %+v, want %+v", p.Name, located[p.Name], want)
		}
	}

	state := &mptcpv1alpha1.MPTCPNodeState{Spec: mptcpv1alpha1.MPTCPNodeStateSpec{Paths: []mptcpv1alpha1.NodePath{
		{Name: "a", Index: 1, Interface: mptcpv1alpha1.InterfaceSelector{Name: "nic1"}},
		{Name: "b", Index: 2, Interface: mptcpv1alpha1.InterfaceSelector{AltName: "fabricb0"}},
		{Name: "any", Index: 3, Interface: mptcpv1alpha1.InterfaceSelector{Pattern: "nic*"}},
	}}}
	state.Name = "n1"
	// An address beyond a NIC (a veth in the bed, with a peer namespace
	// of its own) is no pod.
	state.Spec.Rules = []mptcpv1alpha1.CompiledRule{{Name: "p-1", Policy: "p", Paths: []mptcpv1alpha1.RulePath{{Name: "a"}}}}
	state.Spec.Pods = []mptcpv1alpha1.NodePod{{Namespace: "apps", Name: "far", IPs: []string{node.NICs[0].Gateway.String()}, Rules: []string{"p-1"}}}
	var tr *agent.Translation
	if err := netnsutil.Do("/var/run/netns/"+node.NetNS, func() error {
		tr = agent.FromNodeState(agent.NodeDefaults("n1"), state, nil, links, agent.LocatePod, agent.Prior{})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := []agent.PlanPath{
		{Path: routing.Path{Name: "a", Index: 1, Interface: "nic1", Gateway: node.NICs[0].Gateway}},
		{Path: routing.Path{Name: "b", Index: 2, Interface: "nic2", Gateway: node.NICs[1].Gateway}},
	}
	if !slices.Equal(tr.Plan.Paths, want) {
		t.Errorf("paths %+v, want %+v", tr.Plan.Paths, want)
	}
	states := map[string]mptcpv1alpha1.PathState{}
	for _, p := range tr.Paths {
		states[p.Name] = p
	}
	for i, name := range []string{"a", "b"} {
		if p := states[name]; p.Link != mptcpv1alpha1.LinkUp || !slices.Equal(p.Addresses, []string{node.NICs[i].Addr.Addr().String()}) {
			t.Errorf("path %s: %+v", name, p)
		}
	}
	// The pod's problem, not the node's.
	if len(tr.Plan.Pods) != 0 || len(tr.Errors) != 0 || !slices.ContainsFunc(tr.PodProblems, func(p mptcpv1alpha1.PodProblem) bool {
		return p.Name == "far" && p.Reason == mptcpv1alpha1.PodAddressOnPath &&
			p.Message == "its address "+node.NICs[0].Gateway.String()+" leads out of path a (nic1), not to a local pod"
	}) {
		t.Errorf("pods %+v, errors %q, pod problems %+v", tr.Plan.Pods, tr.Errors, tr.PodProblems)
	}
	if states["any"].Link != mptcpv1alpha1.LinkAmbiguous {
		t.Errorf("pattern nic* over two NICs: %+v", states["any"])
	}
}
