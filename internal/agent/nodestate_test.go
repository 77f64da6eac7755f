package agent

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/liveness"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/podnet"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/routing"
	"github.com/mptcp-operator/mptcp-operator/internal/controller/compile"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/internal/limits"
)

var testLinks = []NodeLink{
	{Name: "lo", Up: true},
	{Name: "nic1", AltNames: []string{"enp1s0"}, Up: true, Addresses: []netip.Prefix{netip.MustParsePrefix("10.101.1.2/24")}, Gateway: netip.MustParseAddr("10.101.1.1")},
	{Name: "nic2", AltNames: []string{"enp2s0"}, Up: true, Addresses: []netip.Prefix{netip.MustParsePrefix("10.102.1.2/24")}, Gateway: netip.MustParseAddr("10.102.1.1")},
	{Name: "nic3", Up: false, Gateway: netip.MustParseAddr("10.103.1.1")},
}

func locateAll(ips []netip.Addr) (LocatedPod, error) {
	if ips[0] == netip.MustParseAddr("10.244.1.99") {
		return LocatedPod{}, errors.New("no route")
	}
	return LocatedPod{HostInterface: "veth-" + ips[0].String(), NetNS: "/var/run/netns/" + ips[0].String()}, nil
}

// testPod is a pod of a test's node state and its rules, which nodeState
// lists once each in the spec, named as the controller names them.
type testPod struct {
	pod   mptcpv1alpha1.NodePod
	rules []mptcpv1alpha1.CompiledRule
}

func nodeState(paths []mptcpv1alpha1.NodePath, pods ...testPod) *mptcpv1alpha1.MPTCPNodeState {
	s := &mptcpv1alpha1.MPTCPNodeState{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", Generation: 3},
		Spec:       mptcpv1alpha1.MPTCPNodeStateSpec{PodCIDRs: []string{"10.244.1.0/24"}, Paths: paths},
	}
	for _, p := range pods {
		for _, r := range p.rules {
			r.Name = compile.RuleName(&r)
			p.pod.Rules = append(p.pod.Rules, r.Name)
			if s.Spec.Rule(r.Name) == nil {
				s.Spec.Rules = append(s.Spec.Rules, r)
			}
		}
		s.Spec.Pods = append(s.Spec.Pods, p.pod)
	}
	return s
}

func twoPaths() []mptcpv1alpha1.NodePath {
	return []mptcpv1alpha1.NodePath{
		{Name: "fabric-a", Index: 1, Interface: mptcpv1alpha1.InterfaceSelector{Name: "nic1"}},
		{Name: "fabric-b", Index: 2, Interface: mptcpv1alpha1.InterfaceSelector{AltName: "enp2s0"}},
	}
}

func podWith(name, ip string, rules ...mptcpv1alpha1.CompiledRule) testPod {
	p := mptcpv1alpha1.NodePod{Namespace: "apps", Name: name, UID: "uid-" + name}
	if ip != "" {
		p.IPs = []string{ip}
	}
	return testPod{pod: p, rules: rules}
}

// nameOf is the name the controller gives r.
func nameOf(r mptcpv1alpha1.CompiledRule) string { return compile.RuleName(&r) }

func spread(gen int64) mptcpv1alpha1.CompiledRule {
	return mptcpv1alpha1.CompiledRule{Policy: "spread", PolicyGeneration: gen, MaxSubflows: 2,
		SubflowCreation: mptcpv1alpha1.SubflowCreationUserspace,
		Paths:           []mptcpv1alpha1.RulePath{{Name: "fabric-a", Weight: 1}, {Name: "fabric-b", Weight: 1}}}
}

func TestNodeStateTranslatesToAnEnforceablePlan(t *testing.T) {
	base := NodeDefaults("ignored")
	base.PinDir, base.TableBase = "/sys/fs/bpf/test", 4000
	tr := FromNodeState(base, nodeState(twoPaths(),
		podWith("web", "10.244.1.10", spread(7)),
		podWith("pending", "", spread(7)),
	), nil, testLinks, locateAll, Prior{})
	if len(tr.Errors) != 0 {
		t.Fatalf("errors: %v", tr.Errors)
	}
	c := tr.Plan
	if s := c.Settings; s.Node != "n1" || s.PinDir != "/sys/fs/bpf/test" || s.TableBase != 4000 {
		t.Errorf("node-local settings not kept: %+v", s)
	}
	want := []PlanPath{
		{Path: routing.Path{Name: "fabric-a", Index: 1, Interface: "nic1", Gateway: netip.MustParseAddr("10.101.1.1")}},
		{Path: routing.Path{Name: "fabric-b", Index: 2, Interface: "nic2", Gateway: netip.MustParseAddr("10.102.1.1")}},
	}
	if !slices.Equal(c.Paths, want) {
		t.Errorf("paths %+v, want %+v", c.Paths, want)
	}
	// Path index is the API's, used as is.
	if len(c.Rules) != 1 || c.Rules[0].Name != nameOf(spread(7)) || !slices.Equal(c.Rules[0].Datapath.Paths, []uint32{1, 2}) ||
		c.Rules[0].Datapath.MaxSubflows != 2 || c.Rules[0].Subflows != podnet.Userspace || c.Rules[0].Joins != 1 {
		t.Errorf("rules %+v", c.Rules)
	}
	// The pod without an address waits; it is no error.
	if len(c.Pods) != 1 || c.Pods[0].HostInterface != "veth-10.244.1.10" || !slices.Equal(c.Pods[0].Rules, []string{nameOf(spread(7))}) {
		t.Errorf("pods %+v", c.Pods)
	}
	if ref := c.Pods[0].Ref; ref != (PodRef{Namespace: "apps", Name: "web", UID: "uid-web"}) {
		t.Errorf("pod ref %+v", ref)
	}
	if !slices.Equal(tr.Applied, []mptcpv1alpha1.AppliedPolicy{{Name: "spread", Generation: 7}}) {
		t.Errorf("applied %+v", tr.Applied)
	}
	if tr.Paths[0].Link != mptcpv1alpha1.LinkUp || tr.Paths[0].Interface != "nic1" || !slices.Equal(tr.Paths[0].Addresses, []string{"10.101.1.2"}) {
		t.Errorf("path state %+v", tr.Paths[0])
	}
}

// A NIC removed to be created again (a driver reset, a hot-unplug) leaves
// its path, which the last plan had in force, away from its link: down
// rather than gone. The rule keeps the path's place in its pods' joins, so
// their path managers and MPTCP limits stay as they are, and the path is
// listed away, with its index, for the agent to keep down. A path whose
// link was never found counts for nothing.
func TestAPathAwayFromItsLinkKeepsItsPlaceInTheJoins(t *testing.T) {
	withoutNIC1 := slices.DeleteFunc(slices.Clone(testLinks), func(l NodeLink) bool { return l.Name == "nic1" })
	for _, c := range []struct {
		name  string
		prior Prior
		away  bool
		joins int
	}{
		{"in force before", Prior{Paths: map[string]bool{"fabric-a": true, "fabric-b": true}}, true, 1},
		{"away before", Prior{Paths: map[string]bool{"fabric-a": true}}, true, 1},
		{"never found", Prior{Paths: map[string]bool{"fabric-b": true}}, false, 0},
		{"first plan", Prior{}, false, 0},
	} {
		tr := FromNodeState(NodeDefaults("n1"), nodeState(twoPaths(), podWith("web", "10.244.1.10", spread(7))), nil, withoutNIC1, locateAll, c.prior)
		if len(tr.Errors) != 0 {
			t.Fatalf("%s: errors: %v", c.name, tr.Errors)
		}
		if want := []AwaitingPath{{Name: "fabric-a", Index: 1, Away: c.away}}; !slices.Equal(tr.Plan.Awaiting, want) {
			t.Errorf("%s: paths awaiting a link %+v, want %+v", c.name, tr.Plan.Awaiting, want)
		}
		if len(tr.Plan.Rules) != 1 || !slices.Equal(tr.Plan.Rules[0].Datapath.Paths, []uint32{2}) || tr.Plan.Rules[0].Joins != c.joins {
			t.Errorf("%s: rules %+v, want one on path 2 whose pods open %d joins", c.name, tr.Plan.Rules, c.joins)
		}
	}
}

// A path stays away through every reconcile while its link is missing:
// the next plan's prior has it in force, as it has the paths with a link,
// and not a path whose link was never found.
func TestAPathStaysAwayFromPlanToPlan(t *testing.T) {
	plan := &Plan{Paths: []PlanPath{{Path: routing.Path{Name: "fabric-b"}}},
		Awaiting: []AwaitingPath{{Name: "fabric-a", Index: 1, Away: true}, {Name: "fabric-z", Index: 9}}}
	if got, want := pathsInForce(plan), map[string]bool{"fabric-a": true, "fabric-b": true}; !maps.Equal(got, want) {
		t.Errorf("paths in force %v, want %v", got, want)
	}
}

func TestNodeStateProblemsAreReportedPerPath(t *testing.T) {
	paths := append(twoPaths(),
		mptcpv1alpha1.NodePath{Name: "missing", Index: 3, Interface: mptcpv1alpha1.InterfaceSelector{Name: "eth9"}},
		mptcpv1alpha1.NodePath{Name: "ambiguous", Index: 4, Interface: mptcpv1alpha1.InterfaceSelector{Pattern: "nic*"}},
		mptcpv1alpha1.NodePath{Name: "down", Index: 5, Interface: mptcpv1alpha1.InterfaceSelector{Name: "nic3"}},
		mptcpv1alpha1.NodePath{Name: "far", Index: 40, Interface: mptcpv1alpha1.InterfaceSelector{Pattern: "enp1*"}},
		mptcpv1alpha1.NodePath{Name: "again-nic1", Index: 6, Interface: mptcpv1alpha1.InterfaceSelector{Pattern: "nic1"}},
	)
	tr := FromNodeState(NodeDefaults("n1"), nodeState(paths, podWith("lost", "10.244.1.99", spread(1))), nil, testLinks, locateAll, Prior{})
	states := map[string]mptcpv1alpha1.PathState{}
	for _, p := range tr.Paths {
		states[p.Name] = p
	}
	for name, want := range map[string]mptcpv1alpha1.LinkState{
		"fabric-a": mptcpv1alpha1.LinkUp, "missing": mptcpv1alpha1.LinkNotFound,
		"ambiguous": mptcpv1alpha1.LinkAmbiguous, "down": mptcpv1alpha1.LinkDown, "far": mptcpv1alpha1.LinkUp,
		"again-nic1": mptcpv1alpha1.LinkAmbiguous,
	} {
		if states[name].Link != want {
			t.Errorf("path %s: link %q, want %q (%s)", name, states[name].Link, want, states[name].Message)
		}
	}
	// A path the node cannot carry is left out and reported, and does not
	// keep the rest of the spec from being enforced.
	problems := strings.Join(Messages(tr.PathProblems), "\n")
	for _, p := range tr.PathProblems {
		if p.Reason != mptcpv1alpha1.ReasonInterfaceMissing {
			t.Errorf("path problem %q: reason %s, want InterfaceMissing", p.Message, p.Reason)
		}
	}
	for _, want := range []string{
		"path missing: no interface eth9 on this node",
		"path ambiguous: 3 interfaces match (nic1, nic2, nic3)",
		"path again-nic1: interface nic1 is also path fabric-a's",
	} {
		if !strings.Contains(problems, want) {
			t.Errorf("path problems do not say %q:\n%s", want, problems)
		}
	}
	// Paths without a single link wait for one: any link event then asks
	// for a reconcile (a NIC plugged in, or removed and created again).
	var awaiting []string
	for _, p := range tr.Plan.Awaiting {
		awaiting = append(awaiting, p.Name)
	}
	if want := []string{"missing", "ambiguous"}; !slices.Equal(awaiting, want) {
		t.Errorf("paths awaiting a link %v, want %v", awaiting, want)
	}
	errs := strings.Join(Messages(tr.Errors), "\n")
	for _, p := range tr.Errors {
		if p.Reason != mptcpv1alpha1.ReasonInvalidSpec {
			t.Errorf("error %q: reason %s, want InvalidSpec", p.Message, p.Reason)
		}
	}
	for _, want := range []string{
		"path far: index 40 is beyond the 15 paths",
	} {
		if !strings.Contains(errs, want) {
			t.Errorf("errors do not say %q:\n%s", want, errs)
		}
	}
	// A pod that cannot be found is its own problem, not the node's.
	if want := []mptcpv1alpha1.PodProblem{{Namespace: "apps", Name: "lost", Reason: mptcpv1alpha1.PodNotFound, Message: "no route"}}; !reflect.DeepEqual(tr.PodProblems, want) {
		t.Errorf("pod problems %+v, want %+v", tr.PodProblems, want)
	}
	if strings.Contains(errs, "path missing") || strings.Contains(errs, "path again-nic1") || strings.Contains(errs, "lost") {
		t.Errorf("path problems made errors of the whole spec:\n%s", errs)
	}
	for _, p := range tr.Plan.Paths {
		if p.Name != "fabric-a" && p.Name != "fabric-b" && p.Name != "down" {
			t.Errorf("path %s is in the configuration; only the paths the node carries belong there", p.Name)
		}
	}
}

// usablePaths are paths a node resolved, by name.
func usablePaths(names ...string) map[string]PlanPath {
	out := map[string]PlanPath{}
	for i, name := range names {
		out[name] = PlanPath{Path: routing.Path{Name: name, Index: uint32(i + 1), Interface: fmt.Sprintf("nic%d", i+1)}}
	}
	return out
}

func TestCompiledRuleMapping(t *testing.T) {
	usable := usablePaths("fabric-a", "fabric-b")
	signal := spread(1)
	signal.SubflowCreation, signal.SignalPorts = mptcpv1alpha1.SubflowCreationSignal, []int32{5201}
	r, err := RuleFromCompiled(signal, usable, nil)
	if err != nil || r.Subflows != podnet.Signal || !slices.Equal(r.SignalPorts, []uint16{5201}) {
		t.Errorf("signal rule %+v, %v", r, err)
	}
	guest := spread(1)
	guest.SubflowCreation = mptcpv1alpha1.SubflowCreationGuest
	if r, err := RuleFromCompiled(guest, usable, nil); err != nil || r.Subflows != podnet.None {
		t.Errorf("guest rule %+v, %v", r, err)
	}
	if _, err := RuleFromCompiled(spread(1), usablePaths("other"), nil); err == nil {
		t.Error("a rule with no usable path was accepted")
	}
	bad := spread(1)
	bad.SubflowCreation = "telepathy"
	if _, err := RuleFromCompiled(bad, usable, nil); err == nil || !strings.Contains(err.Error(), "telepathy") {
		t.Errorf("unknown subflowCreation: %v", err)
	}
	bad = spread(1)
	bad.SignalPorts = []int32{70000}
	if _, err := RuleFromCompiled(bad, usable, nil); err == nil {
		t.Error("port 70000 accepted")
	}
	// The join threshold reaches the path managers, in userspace mode
	// only; one beyond the API's bound is refused.
	threshold := spread(1)
	threshold.JoinAfterBytes = 64 << 10
	if r, err := RuleFromCompiled(threshold, usable, nil); err != nil || r.JoinAfterBytes != 64<<10 {
		t.Errorf("userspace rule with a threshold: %+v, %v", r.MPTCP, err)
	}
	threshold.SubflowCreation, threshold.SignalPorts = mptcpv1alpha1.SubflowCreationSignal, []int32{5201}
	if r, err := RuleFromCompiled(threshold, usable, nil); err != nil || r.JoinAfterBytes != 0 {
		t.Errorf("signal rule with a threshold: %+v, %v; want none (the kernel opens the joins)", r.MPTCP, err)
	}
	// The congestion control reaches the pods where the agent configures
	// them; a guest's stack keeps its own; a name no algorithm can have
	// (the kernel's TCP_CA_NAME_MAX, its characters) is refused.
	cc := spread(1)
	cc.CongestionControl = "cubic"
	if r, err := RuleFromCompiled(cc, usable, nil); err != nil || r.CongestionControl != "cubic" {
		t.Errorf("a rule with cubic: %+v, %v", r.MPTCP, err)
	}
	cc.SubflowCreation = mptcpv1alpha1.SubflowCreationGuest
	if r, err := RuleFromCompiled(cc, usable, nil); err != nil || r.CongestionControl != "" {
		t.Errorf("a guest rule with cubic: %+v, %v; want none set", r.MPTCP, err)
	}
	for _, name := range []string{"a_name_too_long1", "bbr/../x", "Cubic"} {
		cc = spread(1)
		cc.CongestionControl = name
		if _, err := RuleFromCompiled(cc, usable, nil); err == nil || !strings.Contains(err.Error(), "congestionControl") {
			t.Errorf("congestionControl %q: %v, want refused", name, err)
		}
	}
	bad = spread(1)
	bad.JoinAfterBytes = mptcpv1alpha1.MaxJoinAfterBytes + 1
	if _, err := RuleFromCompiled(bad, usable, nil); err == nil || !strings.Contains(err.Error(), "joinAfterBytes") {
		t.Errorf("a threshold beyond the bound: %v", err)
	}
}

// A rule's paths that share a risk group reach the datapath as a group, in
// the rule's order; a path alone in its group within the rule shares
// nothing there.
func TestSharedRiskGroupsReachTheDatapathRule(t *testing.T) {
	usable := usablePaths("fabric-a", "fabric-b", "fabric-c", "fabric-d")
	for name, group := range map[string]string{"fabric-a": "tor-1", "fabric-c": "tor-1", "fabric-b": "tor-2", "fabric-d": "tor-3"} {
		p := usable[name]
		p.SharedRiskGroup = group
		usable[name] = p
	}
	cr := spread(1)
	cr.Paths = []mptcpv1alpha1.RulePath{{Name: "fabric-c", Weight: 1}, {Name: "fabric-b", Weight: 1}, {Name: "fabric-a", Weight: 1}, {Name: "fabric-d", Weight: 1}}
	r, err := RuleFromCompiled(cr, usable, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, a := usable["fabric-c"].Index, usable["fabric-a"].Index
	if want := [][]uint32{{c, a}}; !reflect.DeepEqual(r.Datapath.SharedRisk, want) {
		t.Errorf("shared-risk groups %v, want %v (fabric-c and fabric-a, in the rule's order)", r.Datapath.SharedRisk, want)
	}
}

func TestPolicyVariantsGetTheirOwnRules(t *testing.T) {
	reordered := spread(2)
	reordered.Paths = []mptcpv1alpha1.RulePath{{Name: "fabric-b", Weight: 1}, {Name: "fabric-a", Weight: 1}}
	reordered.PreferredPaths = []string{"fabric-b"} // a tenant's preference, as the controller applies it
	tr := FromNodeState(NodeDefaults("n1"), nodeState(twoPaths(),
		podWith("a", "10.244.1.10", spread(2)), podWith("b", "10.244.1.11", reordered), podWith("c", "10.244.1.12", spread(2)),
	), nil, testLinks, locateAll, Prior{})
	if len(tr.Errors) != 0 {
		t.Fatal(tr.Errors)
	}
	rules := map[string]string{}
	for _, p := range tr.Plan.Pods {
		rules[p.Name] = strings.Join(p.Rules, ",")
	}
	if rules["apps.a"] != nameOf(spread(2)) || rules["apps.c"] != nameOf(spread(2)) || rules["apps.b"] != nameOf(reordered) ||
		nameOf(spread(2)) == nameOf(reordered) || len(tr.Plan.Rules) != 2 {
		t.Errorf("pods' rules %v, rules %+v", rules, tr.Plan.Rules)
	}
}

// Every actor field of a compiled rule reaches the datapath's rule, by path
// index: selectors, spread mode and weights, backup and blocked paths,
// header rewriting and rate limits (a per-path cap bounded by the path's
// capacity); what a node lacks is left out.
func TestCompiledRuleActorsMapping(t *testing.T) {
	usable := usablePaths("fabric-a", "fabric-b", "lte", "fabric-c")
	b := usable["fabric-b"]
	b.Capacity = 150_000_000
	usable["fabric-b"] = b
	cr := spread(1)
	cr.BackupPaths = []string{"lte", "gone"}
	cr.BlockedPaths = []string{"fabric-c", "gone"}
	cr.SpreadMode = mptcpv1alpha1.SpreadWeighted
	cr.Paths = []mptcpv1alpha1.RulePath{{Name: "fabric-a", Weight: 3}, {Name: "fabric-b", Weight: 1}, {Name: "gone", Weight: 5}}
	cr.Traffic = &mptcpv1alpha1.TrafficMatch{CIDRs: []string{"10.244.0.0/16"}, Ports: []mptcpv1alpha1.PortRange{{Port: 5201}, {Port: 8000, EndPort: 8999}}, Family: mptcpv1alpha1.IPFamilyIPv4}
	cr.HeaderRewriting = true
	perConn, perPath := resource.MustParse("40M"), resource.MustParse("200M")
	cr.RateLimits = &mptcpv1alpha1.CompiledRateLimits{Mode: mptcpv1alpha1.RateModePolice, PerConnection: &perConn,
		PerPath: []mptcpv1alpha1.CompiledPathRate{{Path: "fabric-b", Rate: perPath}, {Path: "gone", Rate: perPath}}}
	r, err := RuleFromCompiled(cr, usable, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := r.Datapath
	if !slices.Equal(d.Blocked, []uint32{4}) {
		t.Errorf("blocked paths %v, want the one on this node, fabric-c (4)", d.Blocked)
	}
	if !slices.Equal(d.Backup, []uint32{3}) {
		t.Errorf("backup paths %v, want the one on this node, lte (3)", d.Backup)
	}
	if d.Spread != datapath.SpreadWeighted || !slices.Equal(d.Paths, []uint32{1, 2}) || !slices.Equal(d.Weights, []uint32{3, 1}) {
		t.Errorf("spread %v paths %v weights %v, want weighted fabric-a 3, fabric-b 1", d.Spread, d.Paths, d.Weights)
	}
	if !slices.Equal(d.CIDRs, []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}) || d.Family != datapath.FamilyIPv4 ||
		!slices.Equal(d.Ports, []datapath.PortRange{{First: 5201, Last: 5201}, {First: 8000, Last: 8999}}) {
		t.Errorf("selector %v %v %v", d.CIDRs, d.Ports, d.Family)
	}
	wantRate := &datapath.RateConfig{Mode: datapath.RatePolice, Directions: datapath.Egress | datapath.Ingress,
		PerConnection: 40_000_000, PerPath: map[uint32]uint64{2: 150_000_000}, HeadersMayBeRewritten: true}
	if !d.RewriteHeaders || !reflect.DeepEqual(r.Rate, wantRate) {
		t.Errorf("headerRewriting %v rate %+v, want %+v: the connection cap in both directions and fabric-b's path cap at its capacity only", d.RewriteHeaders, r.Rate, wantRate)
	}
	if r.Joins != 1 {
		t.Errorf("%d joins, want 1: maxSubflows 2 bounds two paths and a backup", r.Joins)
	}
	preferred := spread(1)
	preferred.SpreadMode = mptcpv1alpha1.SpreadPreferredFirst
	preferred.Traffic = &mptcpv1alpha1.TrafficMatch{Family: mptcpv1alpha1.IPFamilyAny}
	if r, err := RuleFromCompiled(preferred, usable, nil); err != nil || r.Datapath.Spread != datapath.SpreadPreferred ||
		r.Datapath.CIDRs != nil || r.Datapath.Ports != nil || r.Datapath.Family != 0 || r.Datapath.Weights != nil {
		t.Errorf("preferredFirst rule %+v, %v: want preferred, no selector, no weights", r, err)
	}
	bad := spread(1)
	bad.Traffic = &mptcpv1alpha1.TrafficMatch{CIDRs: []string{"10.0.0.1"}}
	if _, err := RuleFromCompiled(bad, usable, nil); err == nil || !strings.Contains(err.Error(), "10.0.0.1") {
		t.Errorf("a cidr without a length: %v", err)
	}
}

// A pod with two policies gets both rules, in the order of the node state.
func TestPodWithTwoPoliciesGetsBothRules(t *testing.T) {
	web := spread(3)
	web.Policy = "web"
	web.Traffic = &mptcpv1alpha1.TrafficMatch{Ports: []mptcpv1alpha1.PortRange{{Port: 443}}}
	tr := FromNodeState(NodeDefaults("n1"), nodeState(twoPaths(),
		podWith("a", "10.244.1.10", web, spread(2)), podWith("b", "10.244.1.11", web, spread(2))), nil, testLinks, locateAll, Prior{})
	if len(tr.Errors) != 0 {
		t.Fatal(tr.Errors)
	}
	for _, p := range tr.Plan.Pods {
		if !slices.Equal(p.Rules, []string{nameOf(web), nameOf(spread(2))}) {
			t.Errorf("pod %s has rules %v, want web's, then spread's", p.Name, p.Rules)
		}
	}
	// Alike rules (selectors included) are shared, not repeated per pod.
	if len(tr.Plan.Pods) != 2 || len(tr.Plan.Rules) != 2 {
		t.Errorf("%d pods, %d rules %+v: want 2 pods sharing 2 rules", len(tr.Plan.Pods), len(tr.Plan.Rules), tr.Plan.Rules)
	}
	if !slices.Equal(tr.Applied, []mptcpv1alpha1.AppliedPolicy{{Name: "spread", Generation: 2}, {Name: "web", Generation: 3}}) {
		t.Errorf("applied %+v", tr.Applied)
	}
}

// podIn is a pod of namespace ns.
func podIn(ns, name, ip string, rules ...mptcpv1alpha1.CompiledRule) testPod {
	p := podWith(name, ip, rules...)
	p.pod.Namespace = ns
	return p
}

// policyRule is spread(1) as policy name compiles it: a rule of its own.
func policyRule(name string) mptcpv1alpha1.CompiledRule {
	r := spread(1)
	r.Policy = name
	return r
}

// TestAPodsProblemStaysThePods gives a node, for each way a pod can be
// unenforceable, one such pod of namespace tenant-b next to a healthy pod of
// tenant-a: the healthy pod is enforced, the other is skipped and reported
// with its reason, and nothing is an error of the whole node (which would
// keep the last good plan for every tenant).
func TestAPodsProblemStaysThePods(t *testing.T) {
	healthy := podIn("tenant-a", "web", "10.244.1.10", spread(1))
	onPath := netip.MustParseAddr("10.244.1.98")
	locate := func(ips []netip.Addr) (LocatedPod, error) {
		if ips[0] == onPath {
			return LocatedPod{HostInterface: "nic1"}, nil
		}
		return locateAll(ips)
	}
	var nine []mptcpv1alpha1.CompiledRule
	for i := range datapath.MaxPodRules + 1 {
		nine = append(nine, policyRule(fmt.Sprintf("p%d", i)))
	}
	nowhere := spread(1)
	nowhere.Policy, nowhere.Paths = "nowhere", []mptcpv1alpha1.RulePath{{Name: "fabric-z", Weight: 1}}
	unresolved := spread(1)
	unresolved.Policy, unresolved.Paths = "unresolved", []mptcpv1alpha1.RulePath{{Name: "missing", Weight: 1}}
	badPort := spread(1)
	badPort.Policy, badPort.Traffic = "bad-port", &mptcpv1alpha1.TrafficMatch{Ports: []mptcpv1alpha1.PortRange{{Port: 70000}}}
	withMissing := append(twoPaths(), mptcpv1alpha1.NodePath{Name: "missing", Index: 3, Interface: mptcpv1alpha1.InterfaceSelector{Name: "eth9"}})

	for name, tc := range map[string]struct {
		paths  []mptcpv1alpha1.NodePath
		pod    testPod
		edit   func(*mptcpv1alpha1.MPTCPNodeState)
		reason mptcpv1alpha1.PodProblemReason
		says   string
	}{
		"more policies than a selector chain holds": {pod: podIn("tenant-b", "bad", "10.244.1.20", nine...),
			reason: mptcpv1alpha1.PodTooManyRules, says: "9 rules, a pod's selector chain holds 8"},
		"a rule naming paths no node has": {pod: podIn("tenant-b", "bad", "10.244.1.20", nowhere),
			reason: mptcpv1alpha1.PodRuleUnusable, says: "names paths [fabric-z] that are not the node state's"},
		"a rule none of whose paths this node carries": {paths: withMissing, pod: podIn("tenant-b", "bad", "10.244.1.20", unresolved),
			reason: mptcpv1alpha1.PodRuleUnusable, says: "none of its paths is usable on this node"},
		"a rule the datapath refuses": {pod: podIn("tenant-b", "bad", "10.244.1.20", badPort),
			reason: mptcpv1alpha1.PodRuleUnusable, says: "port range 70000-70000 is out of range"},
		"a rule the spec lacks": {pod: podIn("tenant-b", "bad", "10.244.1.20", spread(1)),
			edit: func(s *mptcpv1alpha1.MPTCPNodeState) {
				s.Spec.Pods[1].Rules = []string{"ghost"}
			},
			reason: mptcpv1alpha1.PodRuleMissing, says: "no rule named ghost"},
		"an ip that is no address": {pod: podIn("tenant-b", "bad", "not-an-ip", spread(1)),
			reason: mptcpv1alpha1.PodInvalidAddress, says: `ips "not-an-ip" are not addresses`},
		"a pod that cannot be located": {pod: podIn("tenant-b", "bad", "10.244.1.99", spread(1)),
			reason: mptcpv1alpha1.PodNotFound, says: "no route"},
		"an address leading out of a path's NIC": {pod: podIn("tenant-b", "bad", onPath.String(), spread(1)),
			reason: mptcpv1alpha1.PodAddressOnPath, says: "leads out of path fabric-a (nic1)"},
	} {
		t.Run(name, func(t *testing.T) {
			paths := tc.paths
			if paths == nil {
				paths = twoPaths()
			}
			state := nodeState(paths, healthy, tc.pod)
			if tc.edit != nil {
				tc.edit(state)
			}
			tr := FromNodeState(NodeDefaults("n1"), state, nil, testLinks, locate, Prior{})
			if len(tr.Errors) != 0 {
				t.Fatalf("a pod's problem became the node's: %v", tr.Errors)
			}
			if len(tr.Plan.Pods) != 1 || tr.Plan.Pods[0].Ref.Namespace != "tenant-a" || tr.Plan.Pods[0].Ref.Name != "web" {
				t.Fatalf("plan pods %+v, want tenant-a/web alone", tr.Plan.Pods)
			}
			if len(tr.Plan.Rules) != 1 || tr.Plan.Rules[0].Name != nameOf(spread(1)) {
				t.Errorf("plan rules %+v, want the healthy pod's only", tr.Plan.Rules)
			}
			if len(tr.PodProblems) != 1 {
				t.Fatalf("pod problems %+v, want one", tr.PodProblems)
			}
			p := tr.PodProblems[0]
			if p.Namespace != "tenant-b" || p.Name != "bad" || p.Reason != tc.reason || !strings.Contains(p.Message, tc.says) {
				t.Errorf("problem %+v, want tenant-b/bad %s saying %q", p, tc.reason, tc.says)
			}
		})
	}
}

// TestRulesBeyondTheTableSkipThePodsThatNeedThem fills the datapath's rule
// table: the pods whose rules do not fit are skipped, the same ones whatever
// the order of the spec (namespace/name order decides), and a pod that needs
// no new rule is still enforced.
func TestRulesBeyondTheTableSkipThePodsThatNeedThem(t *testing.T) {
	pods := []testPod{podIn("tenant-a", "web", "10.244.1.10", spread(1))}
	// tenant-a/web's rule and one per filler: exactly the table.
	for i := range mptcpv1alpha1.MaxNodeRules - 1 {
		pods = append(pods, podIn("tenant-b", fmt.Sprintf("fill-%03d", i), fmt.Sprintf("10.244.%d.%d", 2+i/200, 1+i%200), policyRule(fmt.Sprintf("p%03d", i))))
	}
	pods = append(pods,
		podIn("tenant-c", "late", "10.244.9.1", policyRule("one-too-many")),
		podIn("tenant-c", "shares", "10.244.9.2", spread(1)),
		podIn("tenant-d", "later", "10.244.9.3", policyRule("two-too-many"), spread(1)),
	)
	state := nodeState(twoPaths(), pods...)
	// The spec's order does not decide which pods are left out.
	slices.Reverse(state.Spec.Pods)
	tr := FromNodeState(NodeDefaults("n1"), state, nil, testLinks, locateAll, Prior{})
	if len(tr.Errors) != 0 {
		t.Fatalf("errors: %v", tr.Errors)
	}
	if n := len(tr.Plan.Rules); n != mptcpv1alpha1.MaxNodeRules {
		t.Errorf("%d rules in the plan, want the table's %d", n, mptcpv1alpha1.MaxNodeRules)
	}
	var skipped []string
	for _, p := range tr.PodProblems {
		if p.Reason != mptcpv1alpha1.PodRuleTableFull || !strings.Contains(p.Message, "the node's rule table (256 rules) is full") {
			t.Errorf("problem %+v", p)
		}
		// The same message for every such pod, whatever the counts:
		// a change of it re-patches the pod's gate and makes an event.
		if p.Message != tr.PodProblems[0].Message {
			t.Errorf("messages differ: %q and %q", p.Message, tr.PodProblems[0].Message)
		}
		skipped = append(skipped, p.Namespace+"/"+p.Name)
	}
	if want := []string{"tenant-c/late", "tenant-d/later"}; !slices.Equal(skipped, want) {
		t.Errorf("skipped %v, want %v", skipped, want)
	}
	enforced := map[string]bool{}
	for _, p := range tr.Plan.Pods {
		enforced[p.Ref.Namespace+"/"+p.Ref.Name] = true
	}
	if len(enforced) != mptcpv1alpha1.MaxNodeRules+1 || !enforced["tenant-a/web"] || !enforced["tenant-c/shares"] {
		t.Errorf("%d pods enforced (tenant-a/web %v, tenant-c/shares %v), want %d", len(enforced), enforced["tenant-a/web"], enforced["tenant-c/shares"], mptcpv1alpha1.MaxNodeRules+1)
	}
}

// A node state of an earlier release's format (decoded Outdated) is
// enforced in no part: the node reports it and its last good plan stays in
// force until the controller rewrites the spec.
func TestOutdatedNodeStateIsNotEnforced(t *testing.T) {
	state := nodeState(twoPaths(), podWith("web", "10.244.1.10", spread(1)))
	state.Spec.Pods[0].Rules = mptcpv1alpha1.RuleNames{mptcpv1alpha1.OutdatedRule}
	tr := FromNodeState(NodeDefaults("n1"), state, nil, testLinks, locateAll, Prior{})
	if len(tr.Errors) != 1 || !strings.Contains(tr.Errors[0].Message, "earlier release's format") {
		t.Errorf("errors %q, want the one saying the spec is of an earlier release", tr.Errors)
	}
	if len(tr.Plan.Paths) != 0 || len(tr.Plan.Pods) != 0 || len(tr.Plan.Rules) != 0 {
		t.Errorf("an outdated spec made a plan: %+v", tr.Plan)
	}
}

// TestRunningPodsKeepTheirPlaceInAFullRuleTable: the node's rule table is
// full with the rules of pods it enforces already, tenant-z's among them; a
// newcomer of tenant-a, whose namespace sorts first, needs a rule of its
// own. The newcomer is skipped (RuleTableFull), not tenant-z's running pod:
// a tenant cannot push other tenants' running pods out of the table by the
// name of its namespace. Without a prior (a node that enforces nothing) the
// namespace/name order decides.
func TestRunningPodsKeepTheirPlaceInAFullRuleTable(t *testing.T) {
	var pods []testPod
	for i := range mptcpv1alpha1.MaxNodeRules - 1 {
		pods = append(pods, podIn("tenant-m", fmt.Sprintf("fill-%03d", i), fmt.Sprintf("10.244.%d.%d", 2+i/200, 1+i%200), policyRule(fmt.Sprintf("p%03d", i))))
	}
	pods = append(pods, podIn("tenant-z", "running", "10.244.9.1", policyRule("z")))
	prior := Prior{Pods: map[PodRef]bool{}}
	for _, p := range pods {
		prior.Pods[PodRef{Namespace: p.pod.Namespace, Name: p.pod.Name, UID: p.pod.UID}] = true
	}
	pods = append(pods, podIn("tenant-a", "newcomer", "10.244.9.2", policyRule("a")))
	state := nodeState(twoPaths(), pods...)
	skipped := func(tr *Translation) []string {
		var out []string
		for _, p := range tr.PodProblems {
			if p.Reason != mptcpv1alpha1.PodRuleTableFull {
				t.Errorf("problem %+v", p)
			}
			out = append(out, p.Namespace+"/"+p.Name)
		}
		return out
	}
	tr := FromNodeState(NodeDefaults("n1"), state, nil, testLinks, locateAll, prior)
	if got := skipped(tr); !slices.Equal(got, []string{"tenant-a/newcomer"}) {
		t.Errorf("skipped %v, want the newcomer tenant-a/newcomer", got)
	}
	if n := len(tr.Plan.Pods); n != mptcpv1alpha1.MaxNodeRules || tr.Plan.Pods[0].Ref.Namespace != "tenant-m" {
		t.Errorf("%d pods enforced (first %+v), want the %d running ones in namespace/name order", n, tr.Plan.Pods[0].Ref, mptcpv1alpha1.MaxNodeRules)
	}
	// A new pod under a running pod's name (another UID) is a newcomer.
	replaced := state.DeepCopy()
	replaced.Spec.Pods[len(replaced.Spec.Pods)-2].UID = "uid-recreated"
	if got := skipped(FromNodeState(NodeDefaults("n1"), replaced, nil, testLinks, locateAll, prior)); !slices.Equal(got, []string{"tenant-z/running"}) {
		t.Errorf("skipped %v, want tenant-z/running recreated under a new UID (after the newcomer by name)", got)
	}
}

// Each path probes the peers that have an address on it, from the node's
// IPv4 address on the path's NIC; a path no peer shares, a peer address of
// another family, one that does not parse and one of the node's own are
// left out.
func TestLivenessProbesEachPathToThePeersOnIt(t *testing.T) {
	paths := []PlanPath{
		{Path: routing.Path{Name: "fabric-a", Index: 1, Interface: "nic1"}},
		{Path: routing.Path{Name: "fabric-b", Index: 2, Interface: "nic2"}},
		{Path: routing.Path{Name: "lonely", Index: 3, Interface: "nic3"}},
	}
	peers := []mptcpv1alpha1.MPTCPPeer{
		peer("n2", nil, mptcpv1alpha1.PeerPath{Name: "fabric-a", Addresses: []string{"2001:db8::2", "10.101.2.2"}},
			mptcpv1alpha1.PeerPath{Name: "fabric-b", Addresses: []string{"garbage"}}),
		peer("n3", nil, mptcpv1alpha1.PeerPath{Name: "fabric-a", Addresses: []string{"10.101.3.2"}},
			mptcpv1alpha1.PeerPath{Name: "fabric-b", Addresses: []string{"10.102.3.2"}}),
		// A peer that claims this node's own address is not probed
		// there: the probe would answer itself.
		peer("n4", nil, mptcpv1alpha1.PeerPath{Name: "fabric-b", Addresses: []string{"10.102.1.2"}}),
	}
	got := livenessPaths(paths, peers, testLinks)
	want := []liveness.Path{
		{Index: 1, Name: "fabric-a", Interface: "nic1", Local: netip.MustParseAddr("10.101.1.2"), Peers: []liveness.Peer{
			{Node: "n2", Addr: netip.MustParseAddr("10.101.2.2")}, {Node: "n3", Addr: netip.MustParseAddr("10.101.3.2")}}},
		{Index: 2, Name: "fabric-b", Interface: "nic2", Local: netip.MustParseAddr("10.102.1.2"), Peers: []liveness.Peer{
			{Node: "n3", Addr: netip.MustParseAddr("10.102.3.2")}}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("liveness paths\n got %+v\nwant %+v", got, want)
	}
	if got := livenessPaths(paths, nil, testLinks); got != nil {
		t.Fatalf("no peers: %+v, want no path probed", got)
	}
}

// peer is an MPTCPPeer as the controller writes it.
func peer(name string, podCIDRs []string, paths ...mptcpv1alpha1.PeerPath) mptcpv1alpha1.MPTCPPeer {
	return mptcpv1alpha1.MPTCPPeer{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: mptcpv1alpha1.MPTCPPeerSpec{PodCIDRs: podCIDRs, Paths: paths}}
}

// The peers' pod CIDRs reach the plan by peer, masked: a path down towards
// one peer alone carries nothing to them. One that does not parse is that
// peer's alone: it is left out, and the spec is enforced. The node's own
// MPTCPPeer is no peer of its own, nor is a node that shares no path with
// it; a node without pods has no peers at all.
func TestPeersPodCIDRsReachThePlan(t *testing.T) {
	state := nodeState(twoPaths(), podWith("web", "10.244.1.10", spread(7)))
	peers := []mptcpv1alpha1.MPTCPPeer{
		peer("n1", []string{"10.244.1.0/24"}, mptcpv1alpha1.PeerPath{Name: "fabric-a", Addresses: []string{"10.101.1.2"}}),
		peer("n2", []string{"10.244.2.7/24", "fd00:2::/64"}, mptcpv1alpha1.PeerPath{Name: "fabric-a", Addresses: []string{"10.101.2.2"}}),
		peer("n3", nil, mptcpv1alpha1.PeerPath{Name: "fabric-a", Addresses: []string{"10.101.3.2"}}),
		// On a fabric this node does not have: no peer of its.
		peer("n5", []string{"10.244.5.0/24"}, mptcpv1alpha1.PeerPath{Name: "elsewhere", Addresses: []string{"10.109.5.2"}}),
	}
	tr := FromNodeState(NodeDefaults("n1"), state, peers, testLinks, locateAll, Prior{})
	if tr.Plan.ProbedPeers != 2 || tr.Plan.UnprobedPeers != nil {
		t.Errorf("%d peers probed, %v left out; want n2 and n3, none left out", tr.Plan.ProbedPeers, tr.Plan.UnprobedPeers)
	}
	if len(tr.Errors) != 0 {
		t.Fatalf("errors: %v", tr.Errors)
	}
	want := map[string][]netip.Prefix{"n2": {netip.MustParsePrefix("10.244.2.0/24"), netip.MustParsePrefix("fd00:2::/64")}}
	if !reflect.DeepEqual(tr.Plan.PeerCIDRs, want) {
		t.Errorf("peer CIDRs %v, want %v", tr.Plan.PeerCIDRs, want)
	}
	var probed []string
	for _, lp := range tr.Plan.Liveness {
		for _, p := range lp.Peers {
			probed = append(probed, lp.Name+":"+p.Node)
		}
	}
	if !slices.Equal(probed, []string{"fabric-a:n2", "fabric-a:n3"}) {
		t.Errorf("probed %v, want n2 and n3 over fabric-a (not the node itself)", probed)
	}
	peers[2].Spec.PodCIDRs = []string{"10.244.3.0"}
	tr = FromNodeState(NodeDefaults("n1"), state, peers, testLinks, locateAll, Prior{})
	if len(tr.Errors) != 0 || !reflect.DeepEqual(tr.Plan.PeerCIDRs, want) {
		t.Errorf("a peer's CIDR that does not parse: errors %q, peer CIDRs %v; want none, and %v", tr.Errors, tr.Plan.PeerCIDRs, want)
	}
	state.Spec.Pods = nil
	tr = FromNodeState(NodeDefaults("n1"), state, peers, testLinks, locateAll, Prior{})
	if len(tr.Errors) != 0 || tr.Plan.PeerCIDRs != nil || tr.Plan.Liveness != nil {
		t.Errorf("no pods: errors %q, peer CIDRs %v, liveness %+v; want no peers", tr.Errors, tr.Plan.PeerCIDRs, tr.Plan.Liveness)
	}
}

// Beyond limits.ProbedPeers, a node probes a draw of its own and names the
// rest: the nodes of one cluster leave out different peers, so that every
// node is probed by about limits.ProbedPeers others (here, in a cluster of
// 1,300, by more than 900 each), and a node draws the same each time.
func TestPeersBeyondTheLimitAreLeftOutByEachNodesOwnDraw(t *testing.T) {
	const nodes = limits.ProbedPeers + 300
	var peers []mptcpv1alpha1.MPTCPPeer
	for i := range nodes {
		peers = append(peers, peer(fmt.Sprintf("node-%05d", i), nil))
	}
	probedBy := map[string]int{}
	for _, self := range peers {
		node := self.Name
		probed, left := probedPeers(node, peers)
		if len(probed) != limits.ProbedPeers || len(left) != nodes-1-limits.ProbedPeers {
			t.Fatalf("%s: %d probed, %d left out, want %d and %d", node, len(probed), len(left), limits.ProbedPeers, nodes-1-limits.ProbedPeers)
		}
		if !slices.IsSorted(left) || slices.Contains(left, node) {
			t.Fatalf("%s: left out %v..., want sorted names without the node itself", node, left[:3])
		}
		for _, p := range probed {
			if p.Name == node {
				t.Fatalf("%s probes itself", node)
			}
			probedBy[p.Name]++
		}
	}
	for _, p := range peers {
		if probedBy[p.Name] < 900 {
			t.Errorf("%s is probed by %d nodes, want about %d", p.Name, probedBy[p.Name], limits.ProbedPeers)
		}
	}
	first, _ := probedPeers("node-00000", peers)
	shuffled := slices.Clone(peers)
	slices.Reverse(shuffled)
	if again, _ := probedPeers("node-00000", shuffled); !reflect.DeepEqual(again, first) {
		t.Errorf("a second draw from the peers in another order differs")
	}
	if probed, left := probedPeers("node-00000", peers[:limits.ProbedPeers+1]); len(probed) != limits.ProbedPeers || left != nil {
		t.Errorf("%d peers besides the node: %d probed, %v left out, want all probed", limits.ProbedPeers, len(probed), left)
	}
}
