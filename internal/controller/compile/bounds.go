package compile

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
)

// A pod's labels are its tenant's: whoever can edit the pod can make it match
// any podSelector. A namespace's labels are the admins'. So a policy that
// selects pods by namespace alone (no podSelector, or an empty one) and caps
// them (rateLimits, maxSubflows, blockedPaths) is a bound on the tenant, and a
// policy that selects through pod labels is the tenant's to take or leave:
// it may narrow, never escape, the namespace's caps (docs/api.md, "Caps that
// labels cannot lift").
//
// In a pod's chain (precedence order, first matching rule wins) a rule chosen
// through labels that comes before a namespace cap whose traffic overlaps
// its own would otherwise take that traffic out from under the cap. Each
// such rule is, in order:
//   - tightened, when its traffic is the same as that of the first cap it
//     overlaps (and the cap does not block every path it spreads over): it
//     keeps its place and its paths and takes the cap's limits
//     (each the lower of the two; a rate in another mode is replaced by the
//     cap's), so every connection the cap would have governed is governed by
//     rules with the cap's limits, and the pod's per-pod and per-path budgets
//     stay one each;
//   - otherwise moved after the last cap it overlaps, so each cap keeps all
//     the traffic it selects and the moved rule applies to the rest.
//
// Neither adds a rule: a tenant cannot grow a pod's chain by relabelling it.

// ReasonCappedByNamespace is the event reason on a pod whose label-chosen
// policy a namespace cap tightened or moved.
const ReasonCappedByNamespace = "CappedByNamespacePolicy"

// selectsByLabels reports whether a policy's choice of pods depends on pod
// labels.
func selectsByLabels(p *mptcpv1alpha1.MPTCPPolicy) bool {
	s := p.Spec.PodSelector
	return s != nil && (len(s.MatchLabels) > 0 || len(s.MatchExpressions) > 0)
}

// capsNamespace reports whether a policy bounds every pod of the namespaces it
// selects: it selects by namespace alone and sets a cap.
func capsNamespace(p *mptcpv1alpha1.MPTCPPolicy) bool {
	if selectsByLabels(p) {
		return false
	}
	s := &p.Spec
	return s.RateLimits != nil || s.MaxSubflows != 0 || len(s.BlockedPaths) > 0
}

// boundByNamespace applies the namespace caps of one pod's chain (rules in
// precedence order, compiled from policies) and returns the new chain, for
// each of its rules the namespace policy whose caps it took ("" when none:
// the rule is a variant of its policy, RuleName), and a notice per
// label-chosen rule it changed.
func boundByNamespace(pod *corev1.Pod, rules []mptcpv1alpha1.CompiledRule, policies []mptcpv1alpha1.MPTCPPolicy) ([]mptcpv1alpha1.CompiledRule, []string, []Refusal) {
	byName := make(map[string]*mptcpv1alpha1.MPTCPPolicy, len(policies))
	for i := range policies {
		byName[policies[i].Name] = &policies[i]
	}
	isCap := make([]bool, len(rules))
	anyCap := false
	for i := range rules {
		if p := byName[rules[i].Policy]; p != nil && capsNamespace(p) {
			isCap[i], anyCap = true, true
		}
	}
	cappedBy := make([]string, len(rules))
	if !anyCap {
		return rules, cappedBy, nil
	}
	// anchor[i] is the index after which rule i goes: itself, or the last
	// cap it overlaps.
	anchor := make([]int, len(rules))
	out := slices.Clone(rules)
	var notices []Refusal
	for i := range rules {
		anchor[i] = i
		p := byName[rules[i].Policy]
		if p == nil || !selectsByLabels(p) {
			continue
		}
		first, last := -1, -1
		for j := i + 1; j < len(rules); j++ {
			if isCap[j] && trafficOverlaps(rules[i].Traffic, rules[j].Traffic) {
				if first < 0 {
					first = j
				}
				last = j
			}
		}
		if first < 0 {
			continue
		}
		bound := &rules[first]
		// A rule left with no path to spread over would be a rule the
		// agent cannot enforce, which fails the whole node: moved instead.
		tightened := tighten(rules[i], bound, byName[bound.Policy])
		if sameTraffic(rules[i].Traffic, bound.Traffic) && (len(tightened.Paths) > 0 || len(rules[i].Paths) == 0) {
			out[i], cappedBy[i] = tightened, bound.Policy
			notices = append(notices, Refusal{Pod: pod, Policy: rules[i].Policy, Reason: ReasonCappedByNamespace,
				Message: "policy " + rules[i].Policy + " selects the pod through its labels; the caps of namespace policy " +
					bound.Policy + " (" + strings.Join(capNames(byName[bound.Policy]), ", ") + ") apply to its traffic"})
			continue
		}
		anchor[i] = last
		notices = append(notices, Refusal{Pod: pod, Policy: rules[i].Policy, Reason: ReasonCappedByNamespace,
			Message: "policy " + rules[i].Policy + " selects the pod through its labels and shares traffic with namespace policy " +
				rules[last].Policy + ", which caps it: " + rules[i].Policy + " applies after the namespace's caps, to traffic they do not select"})
	}
	order := make([]int, len(rules))
	for i := range order {
		order[i] = i
	}
	// By anchor, then a rule at its own place before the rules moved after
	// it, then by precedence.
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Or(cmp.Compare(anchor[a], anchor[b]), cmp.Compare(boolInt(anchor[a] != a), boolInt(anchor[b] != b)), cmp.Compare(a, b))
	})
	chain := make([]mptcpv1alpha1.CompiledRule, len(order))
	chainCappedBy := make([]string, len(order))
	for k, i := range order {
		chain[k], chainCappedBy[k] = out[i], cappedBy[i]
	}
	return chain, chainCappedBy, notices
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// capNames names what a policy caps, for messages.
func capNames(p *mptcpv1alpha1.MPTCPPolicy) []string {
	var out []string
	if p == nil {
		return out
	}
	if p.Spec.RateLimits != nil {
		out = append(out, "rateLimits")
	}
	if p.Spec.MaxSubflows != 0 {
		out = append(out, "maxSubflows")
	}
	if len(p.Spec.BlockedPaths) > 0 {
		out = append(out, "blockedPaths")
	}
	return out
}

// tighten returns r with the caps the bound's policy sets: the lower
// maxSubflows, the union of blocked paths (taken out of r's spread and backup
// paths), and rate limits no looser than the bound's. A default the policy
// did not write (maxSubflows 4) is no cap.
func tighten(r mptcpv1alpha1.CompiledRule, bound *mptcpv1alpha1.CompiledRule, policy *mptcpv1alpha1.MPTCPPolicy) mptcpv1alpha1.CompiledRule {
	r = *r.DeepCopy()
	if policy.Spec.MaxSubflows != 0 {
		r.MaxSubflows = min(r.MaxSubflows, bound.MaxSubflows)
	}
	for _, b := range bound.BlockedPaths {
		if !slices.Contains(r.BlockedPaths, b) {
			r.BlockedPaths = append(r.BlockedPaths, b)
		}
	}
	r.Paths = slices.DeleteFunc(r.Paths, func(p mptcpv1alpha1.RulePath) bool { return slices.Contains(r.BlockedPaths, p.Name) })
	r.BackupPaths = slices.DeleteFunc(r.BackupPaths, func(p string) bool { return slices.Contains(r.BlockedPaths, p) })
	if len(r.Paths) == 0 {
		r.Paths = nil
	}
	if len(r.BackupPaths) == 0 {
		r.BackupPaths = nil
	}
	r.RateLimits = tighterRates(r.RateLimits, bound.RateLimits)
	if r.RateLimits != nil && r.RateLimits.Mode == mptcpv1alpha1.RateModeWindow {
		// A window cap rewrites the pods' headers; the cap's policy could
		// only set it with the admin's opt-in for these pods.
		r.HeaderRewriting = true
	}
	return r
}

// tighterRates combines a label-chosen rule's rate limits with a namespace
// cap's. In the same mode each limit is the lower of the two (a limit only
// one sets is kept); in different modes the cap's limits replace the rule's:
// one rule enforces one mode, and the cap must hold.
func tighterRates(own, bound *mptcpv1alpha1.CompiledRateLimits) *mptcpv1alpha1.CompiledRateLimits {
	switch {
	case bound == nil:
		return own
	case own == nil || own.Mode != bound.Mode:
		return bound.DeepCopy()
	}
	out := own.DeepCopy()
	out.PerConnection = lowerQuantity(out.PerConnection, bound.PerConnection)
	out.PerPod = lowerQuantity(out.PerPod, bound.PerPod)
	out.PerNamespace = lowerQuantity(out.PerNamespace, bound.PerNamespace)
	for _, b := range bound.PerPath {
		i := slices.IndexFunc(out.PerPath, func(p mptcpv1alpha1.CompiledPathRate) bool { return p.Path == b.Path })
		if i < 0 {
			out.PerPath = append(out.PerPath, *b.DeepCopy())
			continue
		}
		if b.Rate.Cmp(out.PerPath[i].Rate) < 0 {
			out.PerPath[i].Rate = b.Rate.DeepCopy()
		}
	}
	slices.SortFunc(out.PerPath, func(a, b mptcpv1alpha1.CompiledPathRate) int { return cmp.Compare(a.Path, b.Path) })
	return out
}

func lowerQuantity(a, b *resource.Quantity) *resource.Quantity {
	switch {
	case b == nil:
		return a
	case a == nil || b.Cmp(*a) < 0:
		q := b.DeepCopy()
		return &q
	}
	return a
}

// trafficOverlaps reports whether some connection could match both
// selectors: families compatible, remote networks intersecting and port
// ranges intersecting (an absent list matches everything). A CIDR that does
// not parse (the API server validates them) is taken to overlap, so a cap is
// never skipped on a doubt.
func trafficOverlaps(a, b *mptcpv1alpha1.TrafficMatch) bool {
	fa, fb := family(a), family(b)
	if fa != mptcpv1alpha1.IPFamilyAny && fb != mptcpv1alpha1.IPFamilyAny && fa != fb {
		return false
	}
	ca, cb := cidrs(a), cidrs(b)
	if len(ca) > 0 && len(cb) > 0 && !slices.ContainsFunc(ca, func(x string) bool {
		return slices.ContainsFunc(cb, func(y string) bool { return prefixesOverlap(x, y) })
	}) {
		return false
	}
	pa, pb := ports(a), ports(b)
	if len(pa) > 0 && len(pb) > 0 && !slices.ContainsFunc(pa, func(x mptcpv1alpha1.PortRange) bool {
		return slices.ContainsFunc(pb, func(y mptcpv1alpha1.PortRange) bool {
			return x.Port <= portEnd(y) && y.Port <= portEnd(x)
		})
	}) {
		return false
	}
	return true
}

// sameTraffic reports whether two selectors are written alike: the same
// family and the same sets of networks and port ranges. Selectors that
// select the same connections in different words compare unequal, which only
// means the rule is moved rather than tightened.
func sameTraffic(a, b *mptcpv1alpha1.TrafficMatch) bool {
	if family(a) != family(b) {
		return false
	}
	na, nb := normalCIDRs(cidrs(a)), normalCIDRs(cidrs(b))
	pa, pb := normalPorts(ports(a)), normalPorts(ports(b))
	return slices.Equal(na, nb) && slices.Equal(pa, pb)
}

func family(t *mptcpv1alpha1.TrafficMatch) mptcpv1alpha1.IPFamily {
	if t == nil || t.Family == "" {
		return mptcpv1alpha1.IPFamilyAny
	}
	return t.Family
}

func cidrs(t *mptcpv1alpha1.TrafficMatch) []string {
	if t == nil {
		return nil
	}
	return t.CIDRs
}

func ports(t *mptcpv1alpha1.TrafficMatch) []mptcpv1alpha1.PortRange {
	if t == nil {
		return nil
	}
	return t.Ports
}

func portEnd(p mptcpv1alpha1.PortRange) int32 { return max(p.Port, p.EndPort) }

func prefixesOverlap(a, b string) bool {
	pa, erra := netip.ParsePrefix(a)
	pb, errb := netip.ParsePrefix(b)
	if erra != nil || errb != nil {
		return true
	}
	return pa.Overlaps(pb)
}

func normalCIDRs(in []string) []string {
	out := make([]string, 0, len(in))
	for _, c := range in {
		if p, err := netip.ParsePrefix(c); err == nil {
			c = p.Masked().String()
		}
		out = append(out, c)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func normalPorts(in []mptcpv1alpha1.PortRange) []mptcpv1alpha1.PortRange {
	out := make([]mptcpv1alpha1.PortRange, 0, len(in))
	for _, p := range in {
		out = append(out, mptcpv1alpha1.PortRange{Port: p.Port, EndPort: portEnd(p)})
	}
	slices.SortFunc(out, func(a, b mptcpv1alpha1.PortRange) int {
		return cmp.Or(cmp.Compare(a.Port, b.Port), cmp.Compare(a.EndPort, b.EndPort))
	})
	return slices.Compact(out)
}
