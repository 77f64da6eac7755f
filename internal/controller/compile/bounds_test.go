package compile

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
)

// boundsInput is one node with paths a, b, c, namespace t1 and pod t1/p
// carrying labels; policies are the case's.
func boundsInput(podLabels map[string]string, policies ...mptcpv1alpha1.MPTCPPolicy) Input {
	in := testInput()
	in.Policies = policies
	in.NamespaceLabels = map[string]map[string]string{"t1": {"tier": "gold"}}
	in.Pods = []corev1.Pod{{
		ObjectMeta: metav1.ObjectMeta{Namespace: "t1", Name: "p", UID: "uid-p", Labels: podLabels},
		Spec:       corev1.PodSpec{NodeName: "n1"},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: "10.1.1.9"}}},
	}}
	return in
}

// pol is a policy of the tier=gold namespaces; podLabels nil selects by
// namespace alone.
func pol(name string, prio int32, podLabels map[string]string, edit func(*mptcpv1alpha1.MPTCPPolicySpec), paths ...string) mptcpv1alpha1.MPTCPPolicy {
	p := mptcpv1alpha1.MPTCPPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1}, Spec: mptcpv1alpha1.MPTCPPolicySpec{
		Priority:          prio,
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "gold"}},
	}}
	if podLabels != nil {
		p.Spec.PodSelector = &metav1.LabelSelector{MatchLabels: podLabels}
	}
	for _, n := range paths {
		p.Spec.Spread.Paths = append(p.Spec.Spread.Paths, mptcpv1alpha1.WeightedPath{Name: n})
	}
	if edit != nil {
		edit(&p.Spec)
	}
	return p
}

func qty(s string) *resource.Quantity {
	q := resource.MustParse(s)
	return &q
}

func police(perPod string) func(*mptcpv1alpha1.MPTCPPolicySpec) {
	return func(s *mptcpv1alpha1.MPTCPPolicySpec) {
		s.RateLimits = &mptcpv1alpha1.RateLimits{Mode: mptcpv1alpha1.RateModePolice, PerPod: qty(perPod)}
	}
}

// describe renders a chain as "policy(paths|max=N|mode perConn/perPod|blocked:...)".
func describe(rules []mptcpv1alpha1.CompiledRule) string {
	var out []string
	for _, r := range rules {
		var paths []string
		for _, p := range r.Paths {
			paths = append(paths, p.Name)
		}
		s := r.Policy + "(" + strings.Join(paths, ",") + fmt.Sprintf("|max=%d", r.MaxSubflows)
		if rl := r.RateLimits; rl != nil {
			q := func(x *resource.Quantity) string {
				if x == nil {
					return "-"
				}
				return x.String()
			}
			s += fmt.Sprintf("|%s %s/%s", rl.Mode, q(rl.PerConnection), q(rl.PerPod))
			if rl.PerNamespace != nil {
				s += " ns=" + rl.PerNamespace.String()
			}
			for _, pp := range rl.PerPath {
				s += " " + pp.Path + "=" + pp.Rate.String()
			}
		}
		if len(r.BlockedPaths) > 0 {
			s += "|blocked:" + strings.Join(r.BlockedPaths, ",")
		}
		if r.HeaderRewriting {
			s += "|rewrite"
		}
		out = append(out, s+")")
	}
	return strings.Join(out, " ")
}

var fast = map[string]string{"class": "fast"}

func TestLabelsCannotLiftANamespaceCap(t *testing.T) {
	storage := func(s *mptcpv1alpha1.MPTCPPolicySpec) {
		s.Traffic = &mptcpv1alpha1.TrafficMatch{CIDRs: []string{"10.50.0.0/16"}}
	}
	cases := map[string]struct {
		labels   map[string]string           // the pod's labels
		policies []mptcpv1alpha1.MPTCPPolicy // the cluster's policies
		want     string                      // the pod's chain (describe)
		notices  []string                    // policies named in CappedByNamespacePolicy events
	}{
		"a pod without the label gets its namespace's cap": {
			policies: []mptcpv1alpha1.MPTCPPolicy{
				pol("cap", 0, nil, func(s *mptcpv1alpha1.MPTCPPolicySpec) { police("1G")(s); s.MaxSubflows = 2 }, "a"),
				pol("fast", 100, fast, nil, "b", "c"),
			},
			want: "cap(a|max=2|police -/1G)",
		},
		"relabelled into an uncapped policy on the same traffic: that policy's paths, the cap's limits": {
			labels: fast,
			policies: []mptcpv1alpha1.MPTCPPolicy{
				pol("cap", 0, nil, func(s *mptcpv1alpha1.MPTCPPolicySpec) { police("1G")(s); s.MaxSubflows = 2 }, "a"),
				pol("fast", 100, fast, func(s *mptcpv1alpha1.MPTCPPolicySpec) { s.MaxSubflows = 8 }, "b", "c"),
			},
			want:    "fast(b,c|max=2|police -/1G) cap(a|max=2|police -/1G)",
			notices: []string{"fast"},
		},
		"a label policy may narrow: the lower of each limit in the same mode": {
			labels: fast,
			policies: []mptcpv1alpha1.MPTCPPolicy{
				pol("cap", 0, nil, func(s *mptcpv1alpha1.MPTCPPolicySpec) {
					s.RateLimits = &mptcpv1alpha1.RateLimits{Mode: mptcpv1alpha1.RateModePolice, PerPod: qty("1G"),
						PerPath: []mptcpv1alpha1.PathRate{{Path: "b", Rate: resource.MustParse("300M")}}}
				}, "a"),
				pol("fast", 100, fast, func(s *mptcpv1alpha1.MPTCPPolicySpec) {
					s.RateLimits = &mptcpv1alpha1.RateLimits{Mode: mptcpv1alpha1.RateModePolice, PerConnection: qty("100M"), PerPod: qty("5G"),
						PerPath: []mptcpv1alpha1.PathRate{{Path: "b", Rate: resource.MustParse("200M")}, {Path: "c", Rate: resource.MustParse("2G")}}}
				}, "b", "c"),
			},
			want:    "fast(b,c|max=4|police 100M/1G b=200M c=2G) cap(a|max=4|police -/1G b=300M)",
			notices: []string{"fast"},
		},
		"a namespace's cap holds for a relabelled pod: the lower perNamespace": {
			labels: fast,
			policies: []mptcpv1alpha1.MPTCPPolicy{
				pol("cap", 0, nil, func(s *mptcpv1alpha1.MPTCPPolicySpec) {
					s.RateLimits = &mptcpv1alpha1.RateLimits{Mode: mptcpv1alpha1.RateModeShape, PerNamespace: qty("1G")}
				}, "a"),
				pol("fast", 100, fast, func(s *mptcpv1alpha1.MPTCPPolicySpec) {
					s.RateLimits = &mptcpv1alpha1.RateLimits{Mode: mptcpv1alpha1.RateModeShape, PerPod: qty("300M"), PerNamespace: qty("5G")}
				}, "b"),
			},
			want:    "fast(b|max=4|shape -/300M ns=1G) cap(a|max=4|shape -/- ns=1G)",
			notices: []string{"fast"},
		},
		"a namespace's cap reaches a relabelled pod whose policy has none": {
			labels: fast,
			policies: []mptcpv1alpha1.MPTCPPolicy{
				pol("cap", 0, nil, func(s *mptcpv1alpha1.MPTCPPolicySpec) {
					s.RateLimits = &mptcpv1alpha1.RateLimits{Mode: mptcpv1alpha1.RateModePolice, PerNamespace: qty("1G")}
				}, "a"),
				pol("fast", 100, fast, police("2G"), "b"),
			},
			want:    "fast(b|max=4|police -/2G ns=1G) cap(a|max=4|police -/- ns=1G)",
			notices: []string{"fast"},
		},
		"a rate in another mode gives way to the cap's": {
			labels: fast,
			policies: []mptcpv1alpha1.MPTCPPolicy{
				pol("cap", 0, nil, police("1G"), "a"),
				pol("fast", 100, fast, func(s *mptcpv1alpha1.MPTCPPolicySpec) {
					s.RateLimits = &mptcpv1alpha1.RateLimits{Mode: mptcpv1alpha1.RateModeShape, PerPod: qty("100M")}
				}, "b"),
			},
			want:    "fast(b|max=4|police -/1G) cap(a|max=4|police -/1G)",
			notices: []string{"fast"},
		},
		"a window cap brings the header rewriting its policy was allowed": {
			labels: fast,
			policies: []mptcpv1alpha1.MPTCPPolicy{
				pol("cap", 0, nil, func(s *mptcpv1alpha1.MPTCPPolicySpec) {
					s.HeaderRewriting = mptcpv1alpha1.Allowed
					s.RateLimits = &mptcpv1alpha1.RateLimits{Mode: mptcpv1alpha1.RateModeWindow, PerConnection: qty("50M")}
				}, "a"),
				pol("fast", 100, fast, nil, "b"),
			},
			want:    "fast(b|max=4|window 50M/-|rewrite) cap(a|max=4|window 50M/-|rewrite)",
			notices: []string{"fast"},
		},
		"a blocked path stays blocked": {
			labels: fast,
			policies: []mptcpv1alpha1.MPTCPPolicy{
				pol("cap", 0, nil, func(s *mptcpv1alpha1.MPTCPPolicySpec) { s.BlockedPaths = []string{"c"} }, "a"),
				pol("fast", 100, fast, nil, "b", "c"),
			},
			want:    "fast(b|max=4|blocked:c) cap(a|max=4|blocked:c)",
			notices: []string{"fast"},
		},
		"a cap that blocks every path of the label policy moves it instead of leaving it no path": {
			labels: fast,
			policies: []mptcpv1alpha1.MPTCPPolicy{
				pol("cap", 0, nil, func(s *mptcpv1alpha1.MPTCPPolicySpec) { s.BlockedPaths = []string{"c"} }, "a"),
				pol("fast", 100, fast, nil, "c"),
			},
			want:    "cap(a|max=4|blocked:c) fast(c|max=4)",
			notices: []string{"fast"},
		},
		"a default maxSubflows is no cap": {
			labels: fast,
			policies: []mptcpv1alpha1.MPTCPPolicy{
				pol("cap", 0, nil, police("1G"), "a"),
				pol("fast", 100, fast, func(s *mptcpv1alpha1.MPTCPPolicySpec) { s.MaxSubflows = 8 }, "b"),
			},
			want:    "fast(b|max=8|police -/1G) cap(a|max=4|police -/1G)",
			notices: []string{"fast"},
		},
		"a label policy on part of the cap's traffic goes after the cap": {
			labels: fast,
			policies: []mptcpv1alpha1.MPTCPPolicy{
				pol("cap", 0, nil, police("1G"), "a"),
				pol("fast", 100, fast, storage, "b"),
			},
			want:    "cap(a|max=4|police -/1G) fast(b|max=4)",
			notices: []string{"fast"},
		},
		"a cap on part of a label policy's traffic keeps it; the label policy goes after": {
			labels: fast,
			policies: []mptcpv1alpha1.MPTCPPolicy{
				pol("cap-storage", 0, nil, func(s *mptcpv1alpha1.MPTCPPolicySpec) { storage(s); police("1G")(s) }, "a"),
				pol("fast", 100, fast, nil, "b"),
			},
			want:    "cap-storage(a|max=4|police -/1G) fast(b|max=4)",
			notices: []string{"fast"},
		},
		"after the last of several caps it overlaps": {
			labels: fast,
			policies: []mptcpv1alpha1.MPTCPPolicy{
				pol("cap-storage", 5, nil, func(s *mptcpv1alpha1.MPTCPPolicySpec) { storage(s); police("1G")(s) }, "a"),
				pol("cap-all", 0, nil, police("5G"), "a"),
				pol("fast", 100, fast, nil, "b"),
				pol("other", 50, fast, func(s *mptcpv1alpha1.MPTCPPolicySpec) {
					s.Traffic = &mptcpv1alpha1.TrafficMatch{Family: mptcpv1alpha1.IPFamilyIPv6}
				}, "c"),
			},
			// other is IPv6 only and the caps are IPv4-free CIDRs or all:
			// cap-all covers IPv6 too, so other moves as well.
			want:    "cap-storage(a|max=4|police -/1G) cap-all(a|max=4|police -/5G) fast(b|max=4) other(c|max=4)",
			notices: []string{"fast", "other"},
		},
		"traffic the cap does not select is the label policy's": {
			labels: fast,
			policies: []mptcpv1alpha1.MPTCPPolicy{
				pol("cap", 0, nil, func(s *mptcpv1alpha1.MPTCPPolicySpec) {
					police("1G")(s)
					s.Traffic = &mptcpv1alpha1.TrafficMatch{Family: mptcpv1alpha1.IPFamilyIPv4}
				}, "a"),
				pol("fast", 100, fast, func(s *mptcpv1alpha1.MPTCPPolicySpec) {
					s.Traffic = &mptcpv1alpha1.TrafficMatch{Family: mptcpv1alpha1.IPFamilyIPv6}
				}, "b"),
			},
			want: "fast(b|max=4) cap(a|max=4|police -/1G)",
		},
		"between admins' namespace policies, priority decides": {
			labels: fast,
			policies: []mptcpv1alpha1.MPTCPPolicy{
				pol("cap", 0, nil, police("1G"), "a"),
				pol("storage", 100, nil, storage, "b"),
			},
			want: "storage(b|max=4) cap(a|max=4|police -/1G)",
		},
		"an empty podSelector selects by namespace alone": {
			labels: fast,
			policies: []mptcpv1alpha1.MPTCPPolicy{
				pol("cap", 0, nil, police("1G"), "a"),
				pol("wide", 100, map[string]string{}, nil, "b"),
			},
			want: "wide(b|max=4) cap(a|max=4|police -/1G)",
		},
		"no cap in the namespace, nothing changes": {
			labels: fast,
			policies: []mptcpv1alpha1.MPTCPPolicy{
				pol("base", 0, nil, nil, "a"),
				pol("fast", 100, fast, police("10G"), "b"),
			},
			want: "fast(b|max=4|police -/10G) base(a|max=4)",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			res := Node(boundsInput(tc.labels, tc.policies...))
			if len(res.Spec.Pods) != 1 {
				t.Fatalf("pods %+v", res.Spec.Pods)
			}
			if got := describe(chainOf(&res.Spec, 0)); got != tc.want {
				t.Errorf("chain\n got %s\nwant %s", got, tc.want)
			}
			var notices []string
			for _, r := range res.Refusals {
				if r.Reason == ReasonCappedByNamespace {
					notices = append(notices, r.Policy)
					if !strings.Contains(r.Message, r.Policy) {
						t.Errorf("notice %q does not name %s", r.Message, r.Policy)
					}
				}
			}
			if !slices.Equal(notices, tc.notices) {
				t.Errorf("notices on %v, want %v", notices, tc.notices)
			}
		})
	}
}

// TestRelabellingNeverLiftsACapProperty draws random policy sets (traffic,
// caps, priorities, selection by namespace or labels) and random connections,
// and checks, as the datapath would apply the chain (first matching rule),
// that a pod carrying every label is held to what its namespace's policies
// alone give it: for each connection whose first namespace-only match is a
// cap, the labelled pod's match has limits no looser, and all connections of
// one cap land in one rule (so they share its per-pod and per-path budgets);
// and no rule loses every path (which would fail the node).
func TestRelabellingNeverLiftsACapProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(16, 6))
	cidrChoices := [][]string{nil, {"10.50.0.0/16"}, {"10.50.1.0/24"}, {"10.60.0.0/16", "10.50.0.0/16"}, {"fd00::/8"}}
	portChoices := [][]mptcpv1alpha1.PortRange{nil, {{Port: 80}}, {{Port: 8000, EndPort: 8100}}, {{Port: 80}, {Port: 443}}}
	familyChoices := []mptcpv1alpha1.IPFamily{"", mptcpv1alpha1.IPFamilyIPv4, mptcpv1alpha1.IPFamilyIPv6}
	remotes := []string{"10.50.1.7", "10.50.2.7", "10.60.0.1", "10.70.0.1", "fd00::7", "fd01::7"}
	rports := []int32{80, 443, 8050, 9000}
	for round := range 3000 {
		var policies []mptcpv1alpha1.MPTCPPolicy
		for i := range 2 + r.IntN(4) {
			var labels map[string]string
			if r.IntN(2) == 0 {
				labels = fast
			}
			spread := [][]string{{"a"}, {"b"}, {"a", "b"}, {"c"}}[r.IntN(4)]
			p := pol(fmt.Sprintf("p%d", i), int32(r.IntN(3)*10), labels, nil, spread...)
			fam := familyChoices[r.IntN(len(familyChoices))]
			cs := slices.Clone(cidrChoices[r.IntN(len(cidrChoices))])
			cs = slices.DeleteFunc(cs, func(c string) bool {
				pr := netip.MustParsePrefix(c)
				return (fam == mptcpv1alpha1.IPFamilyIPv4 && !pr.Addr().Is4()) || (fam == mptcpv1alpha1.IPFamilyIPv6 && pr.Addr().Is4())
			})
			if fam != "" || len(cs) > 0 || r.IntN(2) == 0 {
				p.Spec.Traffic = &mptcpv1alpha1.TrafficMatch{Family: fam, CIDRs: cs, Ports: portChoices[r.IntN(len(portChoices))]}
			}
			if r.IntN(2) == 0 {
				mode := []mptcpv1alpha1.RateMode{mptcpv1alpha1.RateModePolice, mptcpv1alpha1.RateModeShape}[r.IntN(2)]
				p.Spec.RateLimits = &mptcpv1alpha1.RateLimits{Mode: mode, PerPod: qty(fmt.Sprintf("%dM", 100*(1+r.IntN(5))))}
			}
			if r.IntN(3) == 0 {
				p.Spec.MaxSubflows = int32(1 + r.IntN(8))
			}
			if b := []string{"a", "b", "c"}[r.IntN(3)]; r.IntN(3) == 0 && !slices.Contains(spread, b) {
				p.Spec.BlockedPaths = []string{b} // the API refuses a path both spread and blocked
			}
			policies = append(policies, p)
		}
		labelled := Node(boundsInput(fast, policies...))
		bare := Node(boundsInput(nil, policies...))
		var lchain, nchain []mptcpv1alpha1.CompiledRule
		if len(labelled.Spec.Pods) == 1 {
			lchain = chainOf(&labelled.Spec, 0)
		}
		if len(bare.Spec.Pods) == 1 {
			nchain = chainOf(&bare.Spec, 0)
		}
		byName := map[string]*mptcpv1alpha1.MPTCPPolicy{}
		for i := range policies {
			byName[policies[i].Name] = &policies[i]
		}
		// Every rule keeps a path: a rule without one fails its node.
		for _, rule := range lchain {
			if len(rule.Paths) == 0 {
				t.Fatalf("round %d: rule %s lost every path\n labelled %s", round, rule.Policy, describe(lchain))
			}
		}
		ruleOfCap := map[int]int{} // namespace chain index -> labelled chain index
		for _, remote := range remotes {
			for _, port := range rports {
				addr := netip.MustParseAddr(remote)
				ni := firstMatch(nchain, addr, port)
				if ni < 0 || !capsNamespace(byName[nchain[ni].Policy]) {
					continue
				}
				bound, capPolicy := nchain[ni], byName[nchain[ni].Policy]
				li := firstMatch(lchain, addr, port)
				where := fmt.Sprintf("round %d, %s port %d\n labelled %s\n bare     %s", round, remote, port, describe(lchain), describe(nchain))
				if li < 0 {
					t.Fatalf("%s: no rule for the labelled pod, the cap %s had it", where, bound.Policy)
				}
				got := lchain[li]
				if prev, ok := ruleOfCap[ni]; ok && prev != li {
					t.Fatalf("%s: the traffic of cap %s is split between rules %d and %d: two budgets", where, bound.Policy, prev, li)
				}
				ruleOfCap[ni] = li
				if capPolicy.Spec.MaxSubflows != 0 && got.MaxSubflows > bound.MaxSubflows {
					t.Fatalf("%s: maxSubflows %d above the cap's %d", where, got.MaxSubflows, bound.MaxSubflows)
				}
				for _, b := range bound.BlockedPaths {
					if !slices.Contains(got.BlockedPaths, b) {
						t.Fatalf("%s: path %s not blocked", where, b)
					}
				}
				if brl := bound.RateLimits; brl != nil {
					grl := got.RateLimits
					if grl == nil || grl.Mode != brl.Mode || (brl.PerPod != nil && (grl.PerPod == nil || grl.PerPod.Cmp(*brl.PerPod) > 0)) {
						t.Fatalf("%s: rate limits %+v looser than the cap's %+v", where, grl, brl)
					}
				}
			}
		}
	}
}

// firstMatch is the datapath's selector chain in miniature: the index of the
// first rule whose traffic selects a connection to remote:port, or -1.
func firstMatch(rules []mptcpv1alpha1.CompiledRule, remote netip.Addr, port int32) int {
	for i, r := range rules {
		t := r.Traffic
		if t == nil {
			return i
		}
		switch family(t) {
		case mptcpv1alpha1.IPFamilyIPv4:
			if !remote.Is4() {
				continue
			}
		case mptcpv1alpha1.IPFamilyIPv6:
			if remote.Is4() {
				continue
			}
		}
		if len(t.CIDRs) > 0 && !slices.ContainsFunc(t.CIDRs, func(c string) bool { return netip.MustParsePrefix(c).Contains(remote) }) {
			continue
		}
		if len(t.Ports) > 0 && !slices.ContainsFunc(t.Ports, func(p mptcpv1alpha1.PortRange) bool { return port >= p.Port && port <= portEnd(p) }) {
			continue
		}
		return i
	}
	return -1
}

// chainOf is the rules of the spec's i-th pod, in its order.
func chainOf(spec *mptcpv1alpha1.MPTCPNodeStateSpec, i int) []mptcpv1alpha1.CompiledRule {
	var out []mptcpv1alpha1.CompiledRule
	for _, name := range spec.Pods[i].Rules {
		out = append(out, *spec.Rule(name))
	}
	return out
}

// A label-chosen policy a namespace cap tightens for the pods of one
// namespace and not for those of another is two rules on a node that has
// both: each has a name of its own (a variant of the policy), so neither
// pod takes the other's limits.
func TestACappedVariantIsARuleOfItsOwn(t *testing.T) {
	web := map[string]string{"app": "web"}
	anyNamespace := func(s *mptcpv1alpha1.MPTCPPolicySpec) { s.NamespaceSelector = &metav1.LabelSelector{} }
	in := boundsInput(web,
		pol("fast", 10, web, anyNamespace, "a", "b"),
		pol("gold-cap", 0, nil, police("10M"), "a", "b"))
	in.NamespaceLabels["t2"] = map[string]string{"tier": "silver"}
	other := *in.Pods[0].DeepCopy()
	other.Namespace, other.Name, other.UID = "t2", "q", "uid-q"
	other.Status.PodIPs = []corev1.PodIP{{IP: "10.1.1.10"}}
	in.Pods = append(in.Pods, other)
	spec := Node(in).Spec
	chains := map[string][]string{}
	for _, p := range spec.Pods {
		chains[p.Namespace] = p.Rules
	}
	capped, free := chains["t1"], chains["t2"]
	if len(capped) != 2 || len(free) != 1 || free[0] != "fast" || !strings.HasPrefix(capped[0], "fast@") {
		t.Fatalf("chains: gold %v, silver %v; want fast's variant and the cap for gold, fast itself for silver", capped, free)
	}
	if r := spec.Rule(capped[0]); r == nil || r.RateLimits == nil || r.RateLimits.PerPod.Cmp(*qty("10M")) != 0 {
		t.Errorf("gold's fast rule %+v, want the cap's 10M per pod", r)
	}
	if r := spec.Rule("fast"); r == nil || r.RateLimits != nil {
		t.Errorf("silver's fast rule %+v, want no cap", r)
	}
}
