package agent

import (
	"strings"
	"testing"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/routing"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
)

// Through an overlay's tunnel, or from behind a bridge, shape caps nothing
// and police of what pods send caps only their subflows: each rule whose caps so miss traffic is a
// problem of its own, naming the rule and the tunnel; rules whose caps hold
// there (police of what pods receive, per-connection police, window) and
// nodes without a tunnel have none.
func TestCapsThatMissAnOverlaysOrABridgesTrafficAreProblems(t *testing.T) {
	rate := func(c datapath.RateConfig) *datapath.RateConfig { return &c }
	rules := []PlanRule{
		{Name: "none"},
		{Name: "shape", Rate: rate(datapath.RateConfig{Mode: datapath.RateShape, PerPod: 1e8})},
		{Name: "police-out", Rate: rate(datapath.RateConfig{Mode: datapath.RatePolice, PerPod: 1e8, Directions: datapath.Egress})},
		{Name: "police-ns", Rate: rate(datapath.RateConfig{Mode: datapath.RatePolice, PerNamespace: 1e8,
			Directions: datapath.Egress | datapath.Ingress})},
		{Name: "police-path", Rate: rate(datapath.RateConfig{Mode: datapath.RatePolice, PerPath: map[uint32]uint64{1: 1e8},
			Directions: datapath.Egress})},
		{Name: "police-in", Rate: rate(datapath.RateConfig{Mode: datapath.RatePolice, PerPod: 1e8, Directions: datapath.Ingress})},
		{Name: "police-conn", Rate: rate(datapath.RateConfig{Mode: datapath.RatePolice, PerConnection: 1e8, Directions: datapath.Egress})},
		{Name: "window", Rate: rate(datapath.RateConfig{Mode: datapath.RateWindow, PerPod: 1e8, HeadersMayBeRewritten: true})},
	}
	if got := capsPastOverlay(rules, nil); len(got) != 0 {
		t.Errorf("a node without a tunnel has problems %v", got)
	}
	got := capsPastOverlay(rules, []routing.Tunnel{{Name: "flannel.1"}})
	requireCapsProblems(t, got, "flannel.1", "shape", "police-out", "police-ns", "police-path")

	// A pod behind a bridge: the same caps miss it, one problem per rule
	// naming the first such pod; a routed pod under them, none.
	pods := []PlanPod{
		{Name: "a.routed", HostInterface: "veth-routed", Rules: []string{"shape", "police-out", "window"}},
		{Name: "a.web", HostInterface: "veth-web", Rules: []string{"shape", "police-out", "police-in", "window"}},
	}
	bridged := func(hostIf string) bool { return hostIf == "veth-web" }
	if got := capsBehindBridge(rules, pods[:1], bridged); len(got) != 0 {
		t.Errorf("a routed pod has problems %v", Messages(got))
	}
	requireCapsProblems(t, capsBehindBridge(rules, pods, bridged), "1 pod(s) behind a bridge, a.web first", "shape", "police-out")
	// A pod whose rules cap nothing at the NIC is not looked up.
	looked := false
	lookup := func(string) bool { looked = true; return true }
	if got := capsBehindBridge(rules, []PlanPod{{Name: "a.free", HostInterface: "veth-free", Rules: []string{"police-in", "window"}}}, lookup); len(got) != 0 || looked {
		t.Errorf("a pod with no caps at the NIC: problems %v, looked up %v; want none, not looked up", Messages(got), looked)
	}
}

// requireCapsProblems fails t unless problems are CapsNotEnforced, one for
// each rule of rules in order, each message naming what.
func requireCapsProblems(t *testing.T, problems []Problem, what string, rules ...string) {
	t.Helper()
	if len(problems) != len(rules) {
		t.Fatalf("problems %v, want one for each of %v", Messages(problems), rules)
	}
	for i, p := range problems {
		if p.Reason != mptcpv1alpha1.ReasonCapsNotEnforced || !strings.HasPrefix(p.Message, "rule "+rules[i]+":") ||
			!strings.Contains(p.Message, what) {
			t.Errorf("problem %d: %s %q; want CapsNotEnforced for rule %s naming %q", i, p.Reason, p.Message, rules[i], what)
		}
	}
}
