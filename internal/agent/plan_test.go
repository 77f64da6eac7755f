package agent

import (
	"maps"
	"net/netip"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/routing"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
)

// A path's capacity bounds each class of the shaping on its NIC: the rule's
// per-path cap and every pod's cap, though both ask for more, are at most
// the capacity. (That the classes together stay within it is the shaping
// package's: TestShapingStaysWithinThePathsCapacity.)
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
	nics := planShaping(tr.Plan, map[string]uint32{nameOf(shaped): 3}, podIDsOf(t, tr.Plan), map[uint32]datapath.RateBudget{3: datapath.OwnBudget(3)})
	if len(nics) != 1 || nics[0].Interface != "nic1" || nics[0].Capacity != 20_000_000 || len(nics[0].Classes) != 2 {
		t.Fatalf("plan %+v, want nic1 at 20 Mbit/s with a class for the rule's path cap and one for the pod", nics)
	}
	for _, c := range nics[0].Classes {
		if c.Bps != 20_000_000 {
			t.Errorf("class %#x at %d bit/s, want the path's 20 Mbit/s capacity", c.Minor, c.Bps)
		}
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

	nics := planShaping(plan, ids, podIDsOf(t, plan), budgets)
	if len(nics) != 1 {
		t.Fatalf("plan %+v, want one NIC", nics)
	}
	pathClasses := map[uint32]int{}
	podClasses := map[netip.Addr]uint32{}
	for _, c := range nics[0].Classes {
		if c.Entry.Pod.IsValid() {
			podClasses[c.Entry.Pod] = c.Entry.Rule
		} else {
			pathClasses[c.Entry.Rule]++
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

// nic_egress runs on the NICs of every rule that polices what its pods send
// per pod, spread and backup paths alike, and nowhere else.
func TestPoliceHooksAreOnThePathsOfPerPodEgressCaps(t *testing.T) {
	paths := []PlanPath{
		{Path: routing.Path{Name: "fabric-a", Index: 1, Interface: "nic1"}},
		{Path: routing.Path{Name: "fabric-b", Index: 2, Interface: "nic2"}},
		{Path: routing.Path{Name: "lte", Index: 3, Interface: "nic3"}},
		{Path: routing.Path{Name: "other", Index: 4, Interface: "nic4"}},
	}
	rule := func(name string, c datapath.RateConfig, paths ...uint32) PlanRule {
		return PlanRule{Name: name, Rate: &c, Datapath: datapath.Rule{Paths: paths[:len(paths)-1], Backup: paths[len(paths)-1:]}}
	}
	plan := &Plan{Paths: paths, Rules: []PlanRule{
		rule("capped", datapath.RateConfig{Mode: datapath.RatePolice, PerPod: 1e6, Directions: datapath.Egress | datapath.Ingress}, 1, 3),
		rule("ingress only", datapath.RateConfig{Mode: datapath.RatePolice, PerPod: 1e6, Directions: datapath.Ingress}, 2, 4),
		rule("per connection", datapath.RateConfig{Mode: datapath.RatePolice, PerConnection: 1e6, Directions: datapath.Egress}, 2, 4),
	}}
	hooks := map[datapath.Attachment]bool{}
	policeHooks(plan, hooks)
	want := map[datapath.Attachment]bool{
		{Interface: "nic1", Hook: datapath.HookNICEgress}: true,
		{Interface: "nic3", Hook: datapath.HookNICEgress}: true,
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
