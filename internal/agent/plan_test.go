package agent

import (
	"fmt"
	"maps"
	"net/netip"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/routing"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/shaping"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
)

// A path's capacity bounds each class of the shaping on its NIC: the rule's
// per-path cap, though it asks for more, is at most the capacity, and so is
// the class a pod's traffic takes on its way to the shaping device and back.
// The pod's own class is on the device, for all its paths: the capacity of
// one does not bound it. (That the classes together stay within it is the
// shaping package's: TestShapingStaysWithinThePathsCapacity.)
func TestShapingPlanBoundsEveryClassByThePathsCapacity(t *testing.T) {
	paths := twoPaths()[:1]
	paths[0].Capacity = resource.MustParse("20M")
	perPod, perPath := resource.MustParse("150M"), resource.MustParse("100M")
	shaped := spread(1)
	shaped.Paths = shaped.Paths[:1]
	shaped.RateLimits = &mptcpv1alpha1.CompiledRateLimits{Mode: mptcpv1alpha1.RateModeShape, PerPod: &perPod,
		PerPath: []mptcpv1alpha1.CompiledPathRate{{Path: "fabric-a", Rate: perPath}}}
	tr := FromNodeState(NodeDefaults("n1"), nodeState(paths, podWith("web", "10.244.1.10", shaped)), nil, testLinks, locateAll, Prior{})
	if len(tr.Errors) != 0 {
		t.Fatal(tr.Errors)
	}
	nics, dev := planShaping(tr.Plan, map[string]uint32{nameOf(shaped): 3}, podIDsOf(t, tr.Plan), map[uint32]datapath.RateBudget{3: datapath.OwnBudget(3)}, nil)
	if len(nics) != 1 || nics[0].Interface != "nic1" || nics[0].Capacity != 20_000_000 || len(nics[0].Classes) != 1 || !nics[0].ViaDevice {
		t.Fatalf("plan %+v, want nic1 at 20 Mbit/s with a class for the rule's path cap, sending pods to the device", nics)
	}
	if c := nics[0].Classes[0]; c.Bps != 20_000_000 {
		t.Errorf("class %#x at %d bit/s, want the path's 20 Mbit/s capacity", c.Minor, c.Bps)
	}
	if len(dev.Classes) != 1 || dev.Classes[0].Bps != 150_000_000 || dev.Classes[0].Parent != 0 {
		t.Errorf("device classes %+v, want the pod's at 150 Mbit/s under the root", dev.Classes)
	}
}

// The variants of one policy with the same caps (tenants' preferred paths)
// share one budget, a current one's id, retired variants included; a
// variant with caps of its own (a namespace's) keeps its pod budget and
// shares the policy's path budget; another policy keeps its own. Shaping makes one class per budget and path, and the pods' classes
// are their budgets'.
func TestVariantsOfAPolicyShareOneBudget(t *testing.T) {
	caps := datapath.RateConfig{Mode: datapath.RateShape, PerPod: 10_000_000, PerPath: map[uint32]uint64{1: 40_000_000}}
	tighter := caps
	tighter.PerPod = 5_000_000
	rule := func(name string, c datapath.RateConfig) PlanRule {
		return PlanRule{Name: name, Policy: policyOfRule(name), Rate: &c, Datapath: datapath.Rule{Paths: []uint32{1}}}
	}
	plan := &Plan{
		Paths: []PlanPath{{Path: routing.Path{Name: "fabric-a", Index: 1, Interface: "nic1"}}},
		Rules: []PlanRule{rule("spread", caps), rule("spread@aa", caps), rule("spread@cc", tighter), rule("other", caps)},
		Pods: []PlanPod{
			{Name: "t1.a", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.10")}, Rules: []string{"spread@aa"}},
			{Name: "t2.b", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.11")}, Rules: []string{"spread"}},
		},
	}
	ids := map[string]uint32{"spread": 7, "spread@aa": 5, "spread@cc": 6, "other": 2}
	// A retired variant of spread, with the same caps, still in use.
	retired := map[uint32]datapath.RateConfig{4: caps}
	names := map[uint32]string{7: "spread", 5: "spread@aa", 6: "spread@cc", 2: "other", 4: "spread@bb"}
	// The budget is a current rule's id: the retired one's may be freed
	// and given to another policy. Once chosen, it stays while it is one.
	budgets, byGroup := rateBudgets(plan, ids, names, retired, nil)
	// The variant with tighter caps has a pod budget of its own and
	// charges the policy's path buckets.
	want := map[uint32]datapath.RateBudget{7: {Pod: 5, Path: 5}, 5: {Pod: 5, Path: 5}, 4: {Pod: 5, Path: 5},
		6: {Pod: 6, Path: 5}, 2: {Pod: 2, Path: 2}}
	for id, b := range want {
		if budgets[id] != b {
			t.Errorf("rule %d (%s): budget %+v, want %+v (all: %v)", id, names[id], budgets[id], b, budgets)
		}
	}
	ids["spread@dd"], names[3] = 3, "spread@dd"
	plan.Rules = append(plan.Rules, rule("spread@dd", caps))
	if again, _ := rateBudgets(plan, ids, names, retired, byGroup); again[3] != (datapath.RateBudget{Pod: 5, Path: 5}) || again[7] != again[3] {
		t.Errorf("a new variant with a lower id moved the budget: %v, want it kept at 5", again)
	}
	delete(ids, "spread@dd")
	plan.Rules = plan.Rules[:len(plan.Rules)-1]

	nics, dev := planShaping(plan, ids, podIDsOf(t, plan), budgets, nil)
	if len(nics) != 1 {
		t.Fatalf("plan %+v, want one NIC", nics)
	}
	pathClasses := map[uint32]int{}
	podClasses := map[netip.Addr]uint32{}
	for _, c := range nics[0].Classes {
		for _, e := range c.Entries {
			pathClasses[e.Rule]++
		}
	}
	for _, c := range dev.Classes {
		for _, e := range c.Entries {
			podClasses[e.Pod] = e.Rule
		}
	}
	if len(pathClasses) != 3 || pathClasses[5] != 1 || pathClasses[6] != 1 || pathClasses[2] != 1 {
		t.Errorf("path classes by budget %v, want one each for budgets 5, 6 and 2", pathClasses)
	}
	for _, pod := range plan.Pods {
		if b := podClasses[pod.IPs[0]]; b != 5 {
			t.Errorf("pod %s's class is budget %d's, want 5", pod.Name, b)
		}
	}
}

// A pod's shape cap holds for all its paths together: one class on the
// shaping device, which every path's NIC sends the pod's packets through.
// A namespace's cap holds for all its pods together: their classes are
// children of the namespace's class, each assured an equal share of it and
// borrowing up to its own cap, so that together they never pass it. With
// several rules capping one namespace, the smallest cap holds, for police
// (one bucket per namespace, PodNamespace) as for shape.
func TestShapingPlanHoldsAPodAcrossItsPathsAndANamespaceAcrossItsPods(t *testing.T) {
	shape := datapath.RateConfig{Mode: datapath.RateShape, PerPod: 30_000_000, PerNamespace: 40_000_000}
	tighter := shape
	tighter.PerNamespace = 36_000_000
	police := datapath.RateConfig{Mode: datapath.RatePolice, PerNamespace: 50_000_000, Directions: datapath.Egress, BurstBytes: 1 << 20}
	policeTighter := police
	policeTighter.PerNamespace, policeTighter.BurstBytes = 20_000_000, 0
	rule := func(name string, c datapath.RateConfig) PlanRule {
		return PlanRule{Name: name, Policy: name, Rate: &c, Datapath: datapath.Rule{Paths: []uint32{1, 2}}}
	}
	pod := func(ns, name, ip string, rules ...string) PlanPod {
		return PlanPod{Name: ns + "." + name, Ref: PodRef{Namespace: ns, Name: name, UID: name}, IPs: []netip.Addr{netip.MustParseAddr(ip)}, Rules: rules}
	}
	plan := &Plan{
		Paths: []PlanPath{{Path: routing.Path{Name: "fabric-a", Index: 1, Interface: "nic1"}}, {Path: routing.Path{Name: "fabric-b", Index: 2, Interface: "nic2"}}},
		Rules: []PlanRule{rule("shape", shape), rule("tighter", tighter), rule("police", police), rule("police-tighter", policeTighter)},
		Pods: []PlanPod{
			pod("t1", "a", "10.244.1.10", "shape", "police"), pod("t1", "b", "10.244.1.11", "tighter", "police-tighter"),
			pod("t2", "c", "10.244.1.12", "shape", "police"),
		},
	}
	ids := map[string]uint32{"shape": 1, "tighter": 2, "police": 3, "police-tighter": 4}
	budgets := map[uint32]datapath.RateBudget{1: datapath.OwnBudget(1), 2: datapath.OwnBudget(2)}
	nsIDs := map[string]uint32{"t1": 0, "t2": 1}
	nics, dev := planShaping(plan, ids, podIDsOf(t, plan), budgets, nsIDs)
	for _, n := range nics {
		if !n.ViaDevice || len(n.Classes) != 0 {
			t.Errorf("NIC %s: %+v, want no class of its own and its pods sent to the device", n.Interface, n)
		}
	}
	byMinor := map[uint16]shapingClassView{}
	for _, c := range dev.Classes {
		paths := map[uint32]bool{}
		for _, e := range c.Entries {
			paths[e.Path] = true
		}
		byMinor[c.Minor] = shapingClassView{parent: c.Parent, bps: c.Bps, ceil: c.Ceil, paths: len(paths)}
	}
	const ns1, ns2 = 0x200, 0x201
	want := map[uint16]shapingClassView{
		ns1: {bps: 36_000_000}, ns2: {bps: 40_000_000},
		// t1's two pods: 36/2 assured each, up to their own 30 M.
		0x1000 + 0*8 + 0: {parent: ns1, bps: 18_000_000, ceil: 30_000_000, paths: 2},
		0x1000 + 1*8 + 0: {parent: ns1, bps: 18_000_000, ceil: 30_000_000, paths: 2},
		// t2's one pod: all of its namespace's 40 M assured, up to 30 M.
		0x1000 + 2*8 + 0: {parent: ns2, bps: 30_000_000, ceil: 30_000_000, paths: 2},
	}
	if !maps.Equal(byMinor, want) {
		t.Errorf("device classes %+v,\nwant %+v", byMinor, want)
	}
	got := map[netip.Addr]datapath.PodNamespace{}
	for _, p := range planPodNamespaces(plan, nsIDs) {
		got[p.Pod] = p
	}
	wantNS := map[netip.Addr]datapath.PodNamespace{
		netip.MustParseAddr("10.244.1.10"): {Pod: netip.MustParseAddr("10.244.1.10"), ID: 1, Bps: 20_000_000},
		netip.MustParseAddr("10.244.1.11"): {Pod: netip.MustParseAddr("10.244.1.11"), ID: 1, Bps: 20_000_000},
		netip.MustParseAddr("10.244.1.12"): {Pod: netip.MustParseAddr("10.244.1.12"), ID: 2, Bps: 50_000_000, BurstBytes: 1 << 20},
	}
	if !maps.Equal(got, wantNS) {
		t.Errorf("police namespaces %+v,\nwant %+v", got, wantNS)
	}
}

// A namespace's pods together are never assured more than its rate (HTB
// lets a class send its own rate whatever its parent has left): each pod's
// share is the rate over their number, however small, down to the least
// rate an HTB class takes. A namespace too small to give each of its pods
// that much, and a cap below it, are shaped at that least rate rather than
// left unshaped, and fail nothing: a tenant runs as many pods as it likes.
func TestShapingPlanNeverAssuresANamespacesPodsMoreThanItsRate(t *testing.T) {
	rule := func(name string, c datapath.RateConfig) PlanRule {
		return PlanRule{Name: name, Policy: name, Rate: &c, Datapath: datapath.Rule{Paths: []uint32{1}}}
	}
	plan := &Plan{
		Paths: []PlanPath{{Path: routing.Path{Name: "fabric-a", Index: 1, Interface: "nic1"}}},
		Rules: []PlanRule{
			rule("many", datapath.RateConfig{Mode: datapath.RateShape, PerNamespace: 100_000}),
			rule("tiny", datapath.RateConfig{Mode: datapath.RateShape, PerNamespace: 100}),
			rule("tiny-pod", datapath.RateConfig{Mode: datapath.RateShape, PerPod: 10}),
			rule("sliver", datapath.RateConfig{Mode: datapath.RateShape, PerNamespace: 10}),
		},
	}
	ips := netip.MustParseAddr("10.244.1.10")
	add := func(ns string, n int, rule string) {
		for i := range n {
			name := fmt.Sprintf("p%02d", i)
			plan.Pods = append(plan.Pods, PlanPod{Name: ns + "." + name, Ref: PodRef{Namespace: ns, Name: name, UID: ns + name},
				IPs: []netip.Addr{ips}, Rules: []string{rule}})
			ips = ips.Next()
		}
	}
	// 20 pods under 100 kbit/s: 5 kbit/s each. 3 pods under 100 bit/s:
	// 33 bit/s each, below HTB's least. Caps below it: a pod's, and a
	// namespace's with one pod.
	add("many", 20, "many")
	add("tiny", 3, "tiny")
	add("alone", 1, "tiny-pod")
	add("sliver", 1, "sliver")
	ids := map[string]uint32{"many": 1, "tiny": 2, "tiny-pod": 3, "sliver": 4}
	budgets := map[uint32]datapath.RateBudget{}
	for _, id := range ids {
		budgets[id] = datapath.OwnBudget(id)
	}
	nsIDs := map[string]uint32{"many": 0, "tiny": 1, "sliver": 2}
	_, dev := planShaping(plan, ids, podIDsOf(t, plan), budgets, nsIDs)
	parents := map[uint16]uint64{}
	assured := map[uint16]uint64{}
	var unparented []shaping.Class
	for _, c := range dev.Classes {
		switch {
		case c.Minor < shaping.MinorPod:
			parents[c.Minor] = c.Bps
		case c.Parent != 0:
			assured[c.Parent] += c.Bps
			if c.Bps > c.Ceil {
				t.Errorf("class %#x: assured %d bit/s above its ceiling %d", c.Minor, c.Bps, c.Ceil)
			}
		default:
			unparented = append(unparented, c)
		}
	}
	many, tiny, sliver := shaping.MinorNamespace+uint16(nsIDs["many"]), shaping.MinorNamespace+uint16(nsIDs["tiny"]), shaping.MinorNamespace+uint16(nsIDs["sliver"])
	if parents[many] != 100_000 || assured[many] != 100_000 {
		t.Errorf("namespace many: %d bit/s, its pods assured %d in all, want 100000 each way (5 kbit/s a pod)", parents[many], assured[many])
	}
	if parents[tiny] != 100 || assured[tiny] != 3*shaping.MinClassBps {
		t.Errorf("namespace tiny: %d bit/s, its pods assured %d in all, want 100 and HTB's least (%d) for each of its 3 pods",
			parents[tiny], assured[tiny], shaping.MinClassBps)
	}
	if parents[sliver] != shaping.MinClassBps || assured[sliver] != shaping.MinClassBps {
		t.Errorf("namespace sliver: %d bit/s, its pod assured %d, want HTB's least (%d) both", parents[sliver], assured[sliver], shaping.MinClassBps)
	}
	if len(unparented) != 1 || unparented[0].Bps != shaping.MinClassBps || unparented[0].Ceil != 0 {
		t.Errorf("classes under the root %+v, want the lone pod's at %d bit/s", unparented, shaping.MinClassBps)
	}
}

type shapingClassView struct {
	parent    uint16
	bps, ceil uint64
	paths     int
}

// nic_egress runs on the NICs of every rule that polices what its pods send
// per pod or per namespace, spread and backup paths alike, and nowhere else.
func TestPoliceHooksAreOnThePathsOfPerPodEgressCaps(t *testing.T) {
	paths := []PlanPath{
		{Path: routing.Path{Name: "fabric-a", Index: 1, Interface: "nic1"}},
		{Path: routing.Path{Name: "fabric-b", Index: 2, Interface: "nic2"}},
		{Path: routing.Path{Name: "lte", Index: 3, Interface: "nic3"}},
		{Path: routing.Path{Name: "other", Index: 4, Interface: "nic4"}},
		{Path: routing.Path{Name: "ns", Index: 5, Interface: "nic5"}},
		{Path: routing.Path{Name: "ns-backup", Index: 6, Interface: "nic6"}},
	}
	rule := func(name string, c datapath.RateConfig, paths ...uint32) PlanRule {
		return PlanRule{Name: name, Rate: &c, Datapath: datapath.Rule{Paths: paths[:len(paths)-1], Backup: paths[len(paths)-1:]}}
	}
	plan := &Plan{Paths: paths, Rules: []PlanRule{
		rule("capped", datapath.RateConfig{Mode: datapath.RatePolice, PerPod: 1e6, Directions: datapath.Egress | datapath.Ingress}, 1, 3),
		rule("ingress only", datapath.RateConfig{Mode: datapath.RatePolice, PerPod: 1e6, Directions: datapath.Ingress}, 2, 4),
		rule("per connection", datapath.RateConfig{Mode: datapath.RatePolice, PerConnection: 1e6, Directions: datapath.Egress}, 2, 4),
		rule("per namespace", datapath.RateConfig{Mode: datapath.RatePolice, PerNamespace: 1e6, Directions: datapath.Egress}, 5, 6),
	}}
	hooks := map[datapath.Attachment]bool{}
	policeHooks(plan, hooks)
	want := map[datapath.Attachment]bool{
		{Interface: "nic1", Hook: datapath.HookNICEgress}: true,
		{Interface: "nic3", Hook: datapath.HookNICEgress}: true,
		{Interface: "nic5", Hook: datapath.HookNICEgress}: true,
		{Interface: "nic6", Hook: datapath.HookNICEgress}: true,
	}
	if !maps.Equal(hooks, want) {
		t.Errorf("hooks %v, want %v", hooks, want)
	}
}

// podIDsOf gives plan's pods their ids as a new table does.
func podIDsOf(t *testing.T, plan *Plan) map[string]uint32 {
	t.Helper()
	var want []string
	for _, p := range plan.Pods {
		want = append(want, podKey(p))
	}
	ids, err := newPodIDs().assign(want, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}
