package agent

import (
	"cmp"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/liveness"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/podnet"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/routing"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/internal/limits"
)

// NodeLink is what the agent knows of one of its node's interfaces when it
// resolves the paths of an MPTCPNodeState (see Links for how it is read).
type NodeLink struct {
	Name     string
	AltNames []string
	Up       bool
	// Addresses of the node on the link (no link-local ones).
	Addresses []netip.Prefix
	// Gateway is the next hop beyond the link; see Links for its source.
	Gateway netip.Addr
}

// LocatedPod is where a pod's address leads on this node: its host-side
// interface and its network namespace (see LocatePod).
type LocatedPod struct {
	HostInterface string
	NetNS         string
}

// Translation is an MPTCPNodeState turned into the Plan the node enforces,
// with what the agent found (or failed to find) for each path and pod.
// Errors (InvalidSpec) are the problems that keep the spec from being
// enforced as a whole (the node's own: its pod CIDRs, a path's index or next
// hop): with any, the caller keeps the last good plan in force. PathProblems
// (InterfaceMissing) are paths the node cannot carry (no interface, an
// ambiguous one, one another path has): each is left out and reported on its
// path, the rest is enforced.
// PodProblems are pods skipped for a problem of their own (their rules,
// their address, no room left for their rules), sorted by namespace and
// name: a tenant's pod never freezes the node's other pods.
type Translation struct {
	Plan         *Plan
	Paths        []mptcpv1alpha1.PathState
	Applied      []mptcpv1alpha1.AppliedPolicy
	Errors       []Problem
	PathProblems []Problem
	PodProblems  []mptcpv1alpha1.PodProblem
}

// Prior is what the node holds already that a translation must respect
// (Agent.Prior): the pods it enforces and the datapath rule ids taken
// before the plan gets its own. The zero Prior is a node that holds nothing.
type Prior struct {
	// Pods are the pods the last plan enforced: when the rule table is
	// full they keep their place, and a newcomer is what is skipped.
	Pods map[PodRef]bool
	// HeldRules are the rule names that hold an id now (the agent's
	// table, ruleids.go: the last plan's rules and retired ones live
	// connections still use). A name the new plan lacks keeps its id
	// through the reconcile, so it counts against the table as the plan's
	// own rules do.
	HeldRules []string
	// HeldIDs counts the ids live connections use that no name holds.
	HeldIDs int
	// Paths are the paths the last plan had in force, by name: those
	// with a link, and those away from theirs (AwaitingPath.Away).
	Paths map[string]bool
}

// FromNodeState translates state into the plan this node enforces, with
// settings (the node-local ones: pin and state directories, tables, mark
// mask, observe-only). peers are the cluster's MPTCPPeers (this node's own
// among them or not): while the node has pods, those that share a path
// with it are what its liveness probes and its detours per peer act on, at
// most limits.ProbedPeers (probedPeers). links are the node's interfaces;
// locate finds a pod by its addresses; prior is what the node holds
// already. Kube mode and
// file mode both come through here: it is the one place where the API's
// compiled types become the datapath's, and the one that decides which
// pods the rule table has room for (the agent's id assignment then never
// runs out: ruleIDs.assign).
func FromNodeState(settings Settings, state *mptcpv1alpha1.MPTCPNodeState, peers []mptcpv1alpha1.MPTCPPeer, links []NodeLink, locate func([]netip.Addr) (LocatedPod, error), prior Prior) *Translation {
	settings.Node = state.Name
	settings.setDefaults()
	plan := &Plan{Settings: settings}
	t := &Translation{Plan: plan}
	if state.Spec.Outdated() {
		// What its pods' rules were is not this release's to read; the
		// last good plan stays in force until the controller rewrites
		// the spec (within seconds of its upgrade).
		t.invalid("the spec is in an earlier release's format (rules inline in pods): waiting for the controller to rewrite it")
		return t
	}
	t.podCIDRs(state.Spec.PodCIDRs)
	resolved, away := t.resolvePaths(state.Spec.Paths, links, prior)
	if len(state.Spec.Pods) > 0 {
		// Peers only while the node has pods: a node without them sends
		// nothing a probe would protect.
		peers, plan.UnprobedPeers = probedPeers(state.Name, sharingPaths(peers, plan.Paths))
		plan.ProbedPeers = len(peers)
		plan.Liveness = livenessPaths(plan.Paths, peers, links)
		plan.PeerCIDRs = peerCIDRs(peers)
	}
	placed := &podPlacement{locate: locate, heldIDs: prior.HeldIDs, taken: map[string]bool{},
		used: map[string]bool{}, applied: map[string]int64{}}
	placed.rules, placed.ruleErrs = compileRules(state.Spec, resolved, away)
	for _, name := range prior.HeldRules {
		placed.taken[name] = true
	}
	for _, pod := range podsInPlacementOrder(state.Spec.Pods, prior) {
		t.placePod(pod, placed)
	}
	t.dropPodsSharingAHostInterface()
	// Reported and enforced in namespace/name order.
	slices.SortStableFunc(t.PodProblems, func(a, b mptcpv1alpha1.PodProblem) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	slices.SortStableFunc(plan.Pods, func(a, b PlanPod) int {
		return cmp.Or(strings.Compare(a.Ref.Namespace, b.Ref.Namespace), strings.Compare(a.Ref.Name, b.Ref.Name))
	})
	// Only the rules some configured pod uses reach the datapath.
	for _, name := range slices.Sorted(maps.Keys(placed.used)) {
		plan.Rules = append(plan.Rules, placed.rules[name])
	}
	for _, name := range slices.Sorted(maps.Keys(placed.applied)) {
		t.Applied = append(t.Applied, mptcpv1alpha1.AppliedPolicy{Name: name, Generation: placed.applied[name]})
	}
	return t
}

// invalid records a problem that keeps the spec from being enforced as a
// whole (Translation.Errors).
func (t *Translation) invalid(format string, args ...any) {
	t.Errors = append(t.Errors, Problem{mptcpv1alpha1.ReasonInvalidSpec, fmt.Sprintf(format, args...)})
}

// leaveOut records a path the node cannot carry: it is left out, the rest
// is enforced (Translation.PathProblems).
func (t *Translation) leaveOut(path, msg string) {
	t.PathProblems = append(t.PathProblems, Problem{mptcpv1alpha1.ReasonInterfaceMissing, fmt.Sprintf("path %s: %s", path, msg)})
}

// podCIDRs puts the node's pod CIDRs into the plan; one that is not a
// prefix is the spec's error.
func (t *Translation) podCIDRs(cidrs []string) {
	for _, s := range cidrs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			t.invalid("podCIDRs: %q is not a prefix", s)
			continue
		}
		t.Plan.PodCIDRs = append(t.Plan.PodCIDRs, p.Masked())
	}
}

// resolvePaths finds each path's interface among links and puts the paths
// the node can carry into the plan, reporting every path's state. resolved
// are the plan's paths by name; away are the paths without a link now that
// the last plan had in force (prior.Paths), which rules keep counting
// (RuleFromCompiled).
func (t *Translation) resolvePaths(paths []mptcpv1alpha1.NodePath, links []NodeLink, prior Prior) (resolved map[string]PlanPath, away map[string]bool) {
	resolved, away = map[string]PlanPath{}, map[string]bool{}
	owners := map[string]string{} // interface -> the path that has it
	// Lower indexes first: the older path keeps an interface two paths'
	// selectors find (the controller gives the lowest free index to the
	// oldest path).
	nodePaths := slices.Clone(paths)
	slices.SortStableFunc(nodePaths, func(a, b mptcpv1alpha1.NodePath) int { return int(a.Index) - int(b.Index) })
	for _, np := range nodePaths {
		ps := mptcpv1alpha1.PathState{Name: np.Name}
		link, linkState, msg := resolveInterface(np.Interface, links)
		ps.Link, ps.Message = linkState, msg
		if link != nil {
			ps.Interface = link.Name
			for _, a := range link.Addresses {
				if len(ps.Addresses) < 4 {
					ps.Addresses = append(ps.Addresses, a.Addr().String())
				}
			}
		}
		switch {
		case np.Index < 1 || !datapath.ValidPath(uint32(np.Index)):
			ps.Message = fmt.Sprintf("index %d is beyond the %d paths the datapath supports", np.Index, datapath.MaxPaths)
			t.invalid("path %s: %s", np.Name, ps.Message)
		case link == nil:
			t.leaveOut(np.Name, msg)
			wasInForce := prior.Paths[np.Name]
			t.Plan.Awaiting = append(t.Plan.Awaiting, AwaitingPath{Name: np.Name, Index: uint32(np.Index), Away: wasInForce})
			if wasInForce {
				away[np.Name] = true
			}
		case owners[link.Name] != "":
			ps.Link = mptcpv1alpha1.LinkAmbiguous
			ps.Message = fmt.Sprintf("interface %s is also path %s's: a NIC carries one path", link.Name, owners[link.Name])
			t.leaveOut(np.Name, ps.Message)
		case !link.Gateway.IsValid():
			ps.Message = fmt.Sprintf("no next hop found on %s: neither a default route through it nor an IPv4 subnet on it", link.Name)
			t.invalid("path %s: %s", np.Name, ps.Message)
		default:
			owners[link.Name] = np.Name
			p := PlanPath{Path: routing.Path{Name: np.Name, Index: uint32(np.Index), Interface: link.Name, Gateway: link.Gateway},
				Capacity: uint64(max(np.Capacity.Value(), 0)), SharedRiskGroup: np.SharedRiskGroup}
			t.Plan.Paths = append(t.Plan.Paths, p)
			resolved[np.Name] = p
		}
		t.Paths = append(t.Paths, ps)
	}
	slices.SortFunc(t.Paths, func(a, b mptcpv1alpha1.PathState) int { return strings.Compare(a.Name, b.Name) })
	return resolved, away
}

// compileRules makes each of the spec's rules the datapath's once, under its
// name (pods refer to it); a rule that cannot be is in ruleErrs, and what it
// makes of its pods is theirs (podRulesProblem).
func compileRules(spec mptcpv1alpha1.MPTCPNodeStateSpec, resolved map[string]PlanPath, away map[string]bool) (rules map[string]PlanRule, ruleErrs map[string]error) {
	rules, ruleErrs = map[string]PlanRule{}, map[string]error{}
	known := map[string]bool{}
	for _, np := range spec.Paths {
		known[np.Name] = true
	}
	for _, cr := range spec.Rules {
		// The controller names only the node's paths in its rules; a
		// hand-written node state may not.
		if unknown := unknownPaths(cr, known); len(unknown) > 0 {
			ruleErrs[cr.Name] = fmt.Errorf("policy %s: rule %s names paths %v that are not the node state's", cr.Policy, cr.Name, unknown)
			continue
		}
		rule, err := RuleFromCompiled(cr, resolved, away)
		if err != nil {
			ruleErrs[cr.Name] = fmt.Errorf("policy %s: %w", cr.Policy, err)
			continue
		}
		rules[cr.Name] = rule
	}
	return rules, ruleErrs
}

// podPlacement is what placing the pods one after the other carries from
// each to the next.
type podPlacement struct {
	rules    map[string]PlanRule
	ruleErrs map[string]error
	locate   func([]netip.Addr) (LocatedPod, error)
	// heldIDs are the ids live connections use that no name holds
	// (Prior.HeldIDs).
	heldIDs int
	// taken are the names that hold an id once the plan is assigned:
	// those held now and the configured pods' (ruleIDs.assign).
	taken map[string]bool
	// used are the rules of the pods configured, and applied the highest
	// generation of each of their policies.
	used    map[string]bool
	applied map[string]int64
}

// podsInPlacementOrder are pods in the order they get room in the rule
// table: the pods the node enforces already first (the same UID), then
// namespace/name order, whatever the spec's. A full rule table leaves out a
// newcomer, never a running pod of a tenant whose namespace sorts later,
// and which newcomers does not depend on how the spec was written.
func podsInPlacementOrder(pods []mptcpv1alpha1.NodePod, prior Prior) []mptcpv1alpha1.NodePod {
	byName := func(a, b mptcpv1alpha1.NodePod) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	}
	enforced := func(p mptcpv1alpha1.NodePod) bool {
		return prior.Pods[PodRef{Namespace: p.Namespace, Name: p.Name, UID: p.UID}]
	}
	out := slices.Clone(pods)
	slices.SortStableFunc(out, func(a, b mptcpv1alpha1.NodePod) int {
		if ea, eb := enforced(a), enforced(b); ea != eb {
			if ea {
				return -1
			}
			return 1
		}
		return byName(a, b)
	})
	return out
}

// placePod puts pod into the plan, or skips it with its problem: a pod's
// problem is the pod's, and every other pod is enforced. A pod without rules
// or without an address yet is neither.
func (t *Translation) placePod(pod mptcpv1alpha1.NodePod, placed *podPlacement) {
	if len(pod.Rules) == 0 {
		return
	}
	skip := func(reason mptcpv1alpha1.PodProblemReason, format string, args ...any) {
		t.PodProblems = append(t.PodProblems, mptcpv1alpha1.PodProblem{Namespace: pod.Namespace, Name: pod.Name, Reason: reason,
			Message: fmt.Sprintf(format, args...)})
	}
	if reason, msg := podRulesProblem(pod, placed.rules, placed.ruleErrs); reason != "" {
		skip(reason, "%s", msg)
		return
	}
	ips, bad := podAddresses(pod.IPs)
	if len(bad) > 0 {
		skip(mptcpv1alpha1.PodInvalidAddress, "ips %s are not addresses", strings.Join(bad, ", "))
		return
	}
	if len(ips) == 0 {
		// Not a problem: the pod has no address yet; it is
		// configured once the controller copies one.
		return
	}
	// The datapath holds MaxNodeRules rules, and an id stays taken
	// while a live connection uses it: a pod that needs one more id
	// than is left is skipped, the pods before it keep theirs. The
	// message stays the same while the table is full, so that the
	// pod's gate and events do not change with every other pod.
	added := map[string]bool{}
	for _, name := range pod.Rules {
		if !placed.taken[name] {
			added[name] = true
		}
	}
	if len(placed.taken)+len(added)+placed.heldIDs > mptcpv1alpha1.MaxNodeRules {
		skip(mptcpv1alpha1.PodRuleTableFull, "the node's rule table (%d rules) is full: its other pods' rules, and retired rules that live connections still use, hold every id; the pod is configured once one is free",
			mptcpv1alpha1.MaxNodeRules)
		return
	}
	loc, err := placed.locate(ips)
	if err != nil {
		skip(mptcpv1alpha1.PodNotFound, "%v", err)
		return
	}
	// A veth NIC (the test bed's, a VM's) has a peer namespace too:
	// an address that leads out of a path is no local pod's.
	if i := slices.IndexFunc(t.Plan.Paths, func(p PlanPath) bool { return p.Interface == loc.HostInterface }); i >= 0 {
		skip(mptcpv1alpha1.PodAddressOnPath, "its address %s leads out of path %s (%s), not to a local pod", ips[0], t.Plan.Paths[i].Name, loc.HostInterface)
		return
	}
	t.Plan.Pods = append(t.Plan.Pods, PlanPod{Name: pod.Namespace + "." + pod.Name, Ref: PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
		NetNS: loc.NetNS, HostInterface: loc.HostInterface, IPs: ips, Rules: slices.Clone(pod.Rules),
		Transparent: Transparency(pod.Transparent)})
	for _, name := range pod.Rules {
		placed.used[name], placed.taken[name] = true, true
		r := placed.rules[name]
		placed.applied[r.Policy] = max(placed.applied[r.Policy], r.Generation)
	}
}

// podAddresses parses a pod's addresses (IPv4-mapped ones unmapped); bad are
// those that are not addresses, quoted.
func podAddresses(ips []string) (addrs []netip.Addr, bad []string) {
	for _, s := range ips {
		a, err := netip.ParseAddr(s)
		if err != nil {
			bad = append(bad, strconv.Quote(s))
			continue
		}
		addrs = append(addrs, a.Unmap())
	}
	return addrs, bad
}

// dropPodsSharingAHostInterface skips the pods of the plan found at one host
// interface with another: an address claimed behind a bridge by a namespace
// that is not the pod's (a tenant with CAP_NET_ADMIN can put any address on
// its own interface). Neither is configured: the interface's programs would
// carry one pod's rules for the other's traffic.
func (t *Translation) dropPodsSharingAHostInterface() {
	byHost := map[string]int{}
	for _, p := range t.Plan.Pods {
		byHost[p.HostInterface]++
	}
	t.Plan.Pods = slices.DeleteFunc(t.Plan.Pods, func(p PlanPod) bool {
		if byHost[p.HostInterface] < 2 {
			return false
		}
		t.PodProblems = append(t.PodProblems, mptcpv1alpha1.PodProblem{Namespace: p.Ref.Namespace, Name: p.Ref.Name, Reason: mptcpv1alpha1.PodNotFound,
			Message: fmt.Sprintf("its address leads to %s, where %d pods are found: none of them is configured there", p.HostInterface, byHost[p.HostInterface])})
		return true
	})
}

// podRulesProblem is why pod's rules keep it from being configured: more
// than its selector chain holds, or one that cannot be enforced here. Empty
// when they are fine.
func podRulesProblem(pod mptcpv1alpha1.NodePod, rules map[string]PlanRule, ruleErrs map[string]error) (mptcpv1alpha1.PodProblemReason, string) {
	if len(pod.Rules) > datapath.MaxPodRules {
		return mptcpv1alpha1.PodTooManyRules, fmt.Sprintf("%d rules, a pod's selector chain holds %d: fewer policies must select it",
			len(pod.Rules), datapath.MaxPodRules)
	}
	for _, name := range pod.Rules {
		if err := ruleErrs[name]; err != nil {
			return mptcpv1alpha1.PodRuleUnusable, err.Error()
		}
		if _, ok := rules[name]; !ok {
			return mptcpv1alpha1.PodRuleMissing, fmt.Sprintf("no rule named %s in the spec", name)
		}
	}
	return "", ""
}

// unknownPaths are the paths cr names that known lacks.
func unknownPaths(cr mptcpv1alpha1.CompiledRule, known map[string]bool) []string {
	var out []string
	check := func(name string) {
		if !known[name] && !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	for _, p := range cr.Paths {
		check(p.Name)
	}
	for _, name := range append(slices.Clone(cr.BackupPaths), cr.BlockedPaths...) {
		check(name)
	}
	if cr.RateLimits != nil {
		for _, pr := range cr.RateLimits.PerPath {
			check(pr.Path)
		}
	}
	return out
}

// sharedRisk groups a rule's paths (indexes, in the rule's order) by their
// shared-risk group, in the datapath's order: groups by their first path,
// each group's paths in the rule's order. A group of one path shares
// nothing within the rule and is left out.
func sharedRisk(indexes []uint32, paths map[string]PlanPath) [][]uint32 {
	groupOf := map[uint32]string{}
	for _, p := range paths {
		groupOf[p.Index] = p.SharedRiskGroup
	}
	var order []string
	members := map[string][]uint32{}
	for _, i := range indexes {
		g := groupOf[i]
		if g == "" {
			continue
		}
		if members[g] == nil {
			order = append(order, g)
		}
		members[g] = append(members[g], i)
	}
	var out [][]uint32
	for _, g := range order {
		if len(members[g]) > 1 {
			out = append(out, members[g])
		}
	}
	return out
}

// RuleFromCompiled is the one place where a compiled rule becomes the
// datapath's: its paths by index (a rule path the controller left out never
// reaches here; one the agent could not resolve is dropped, and reported as
// the path's own problem), its selector, its actors' data, its caps (a
// per-path cap bounded by the path's capacity) and its pods' MPTCP set-up.
// A path of away (in force, its link gone) is down, not gone: it counts in
// the joins the rule's pods open, so that their path managers and MPTCP
// limits stay as they are while a NIC is away.
// Everything is checked by the datapath's own validation.
func RuleFromCompiled(cr mptcpv1alpha1.CompiledRule, paths map[string]PlanPath, away map[string]bool) (PlanRule, error) {
	r := PlanRule{Name: cr.Name, Policy: cr.Policy, Generation: cr.PolicyGeneration}
	d := &r.Datapath
	d.RewriteHeaders = cr.HeaderRewriting
	d.MaxSubflows = uint32(max(cr.MaxSubflows, 0))
	spread, err := spreadFromCompiled(cr.SpreadMode)
	if err != nil {
		return r, err
	}
	d.Spread = spread
	if err := pathsFromCompiled(d, cr, paths); err != nil {
		return r, err
	}
	if err := selectorFromCompiled(d, cr.Traffic); err != nil {
		return r, err
	}
	if err := d.Validate(); err != nil {
		return r, err
	}
	if rl := cr.RateLimits; rl != nil {
		c, err := rateFromCompiled(rl, cr.HeaderRewriting, paths)
		if err != nil {
			return r, fmt.Errorf("rateLimits: %w", err)
		}
		r.Rate = c
	}
	return r, mptcpFromCompiled(&r, cr, away)
}

// spreadFromCompiled is the datapath's spread mode for a compiled rule's;
// unset is round robin.
func spreadFromCompiled(mode mptcpv1alpha1.SpreadMode) (datapath.SpreadMode, error) {
	switch mode {
	case mptcpv1alpha1.SpreadRoundRobin, "":
		return datapath.SpreadRoundRobin, nil
	case mptcpv1alpha1.SpreadWeighted:
		return datapath.SpreadWeighted, nil
	case mptcpv1alpha1.SpreadPreferredFirst:
		return datapath.SpreadPreferred, nil
	}
	return 0, fmt.Errorf("spreadMode %q is not one this agent knows", mode)
}

// pathsFromCompiled sets d's active, preferred, backup, blocked and
// shared-risk paths by index from the compiled rule's path names, dropping
// the names paths does not resolve; a rule with no active path left fails.
func pathsFromCompiled(d *datapath.Rule, cr mptcpv1alpha1.CompiledRule, paths map[string]PlanPath) error {
	var names []string
	for _, p := range cr.Paths {
		path, ok := paths[p.Name]
		if !ok {
			continue
		}
		names = append(names, p.Name)
		d.Paths = append(d.Paths, path.Index)
		if d.Spread == datapath.SpreadWeighted {
			d.Weights = append(d.Weights, uint32(max(p.Weight, 1)))
		}
	}
	if len(d.Paths) == 0 {
		return errors.New("none of its paths is usable on this node")
	}
	// The preferred paths lead the list (the controller put them there).
	for d.Preferred < len(names) && slices.Contains(cr.PreferredPaths, names[d.Preferred]) {
		d.Preferred++
	}
	for _, name := range cr.BackupPaths {
		if p, ok := paths[name]; ok {
			d.Backup = append(d.Backup, p.Index)
		}
	}
	for _, name := range cr.BlockedPaths {
		if p, ok := paths[name]; ok {
			d.Blocked = append(d.Blocked, p.Index)
		}
	}
	d.SharedRisk = sharedRisk(append(slices.Clone(d.Paths), d.Backup...), paths)
	return nil
}

// mptcpFromCompiled sets r's pods' MPTCP set-up (who opens the subflows,
// how many joins, checksums, congestion control, join threshold, signal
// ports) from the compiled rule, r's datapath paths already set.
func mptcpFromCompiled(r *PlanRule, cr mptcpv1alpha1.CompiledRule, away map[string]bool) error {
	switch cr.SubflowCreation {
	case mptcpv1alpha1.SubflowCreationUserspace, "":
		r.Subflows = podnet.Userspace
	case mptcpv1alpha1.SubflowCreationSignal:
		r.Subflows = podnet.Signal
	case mptcpv1alpha1.SubflowCreationGuest:
		// The guest's own stack opens its subflows: the agent leaves
		// the pod's MPTCP settings alone.
		r.Subflows = podnet.None
	default:
		return fmt.Errorf("subflowCreation %q is not one this agent knows", cr.SubflowCreation)
	}
	r.Joins = subflowsFor(&r.Datapath, cr, away) - 1
	r.DataChecksums = cr.DataChecksums
	if cc := cr.CongestionControl; len(cc) > mptcpv1alpha1.MaxCongestionControlName || strings.Trim(cc, "abcdefghijklmnopqrstuvwxyz0123456789_") != "" {
		return fmt.Errorf("congestionControl %q is not a congestion control's name", cc)
	}
	if r.Subflows != podnet.None {
		r.CongestionControl = cr.CongestionControl
	}
	if cr.JoinAfterBytes < 0 || cr.JoinAfterBytes > mptcpv1alpha1.MaxJoinAfterBytes {
		return fmt.Errorf("joinAfterBytes %d is out of range [0, %d]", cr.JoinAfterBytes, mptcpv1alpha1.MaxJoinAfterBytes)
	}
	if r.Subflows == podnet.Userspace {
		r.JoinAfterBytes = uint64(cr.JoinAfterBytes)
	}
	for _, p := range cr.SignalPorts {
		if p < 1 || p > 65535 {
			return fmt.Errorf("signal port %d is out of range", p)
		}
		r.SignalPorts = append(r.SignalPorts, uint16(p))
	}
	if r.Subflows == podnet.Signal && len(r.SignalPorts) != 0 && len(r.SignalPorts) < r.Joins {
		return fmt.Errorf("signalPorts: %d ports announce too few paths: a server needs %d, one per extra subflow", len(r.SignalPorts), r.Joins)
	}
	return nil
}

// subflowsFor is how many subflows a pod of the rule opens: one per usable
// active and backup path, plus one per path that is away (so that a NIC
// going away changes no pod's MPTCP limits), at most the rule's
// maxSubflows.
func subflowsFor(d *datapath.Rule, cr mptcpv1alpha1.CompiledRule, away map[string]bool) int {
	n := len(d.Paths) + len(d.Backup)
	for _, p := range cr.Paths {
		if away[p.Name] {
			n++
		}
	}
	for _, name := range cr.BackupPaths {
		if away[name] {
			n++
		}
	}
	if d.MaxSubflows > 0 && int(d.MaxSubflows) < n {
		n = int(d.MaxSubflows)
	}
	return n
}

// selectorFromCompiled sets d's selector from a compiled traffic selector;
// unset or Any selects everything.
func selectorFromCompiled(d *datapath.Rule, ct *mptcpv1alpha1.TrafficMatch) error {
	if ct == nil {
		return nil
	}
	for _, s := range ct.CIDRs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return fmt.Errorf("traffic: cidr %q is not a prefix", s)
		}
		d.CIDRs = append(d.CIDRs, p.Masked())
	}
	for _, pr := range ct.Ports {
		last := pr.EndPort
		if last == 0 {
			last = pr.Port
		}
		if pr.Port < 1 || pr.Port > 65535 || last < pr.Port || last > 65535 {
			return fmt.Errorf("traffic: port range %d-%d is out of range", pr.Port, last)
		}
		d.Ports = append(d.Ports, datapath.PortRange{First: uint16(pr.Port), Last: uint16(last)})
	}
	switch ct.Family {
	case mptcpv1alpha1.IPFamilyIPv4:
		d.Family = datapath.FamilyIPv4
	case mptcpv1alpha1.IPFamilyIPv6:
		d.Family = datapath.FamilyIPv6
	case mptcpv1alpha1.IPFamilyAny, "":
	default:
		return fmt.Errorf("traffic: family %q is not IPv4, IPv6 or Any", ct.Family)
	}
	return nil
}

// rateFromCompiled is the rate actor's caps of a compiled rule, in bits per
// second: a cap on a path this node lacks has nothing to cap here and is
// dropped (nil when no cap is left), one above its path's capacity caps at
// the capacity.
func rateFromCompiled(rl *mptcpv1alpha1.CompiledRateLimits, rewriting bool, paths map[string]PlanPath) (*datapath.RateConfig, error) {
	c := datapath.RateConfig{PerConnection: bps(rl.PerConnection), PerPod: bps(rl.PerPod), PerNamespace: bps(rl.PerNamespace),
		HeadersMayBeRewritten: rewriting}
	switch rl.Mode {
	case mptcpv1alpha1.RateModeWindow:
		c.Mode = datapath.RateWindow
	case mptcpv1alpha1.RateModePolice:
		c.Mode = datapath.RatePolice
	case mptcpv1alpha1.RateModeShape:
		c.Mode = datapath.RateShape
	default:
		return nil, fmt.Errorf("mode %q is not one of window, police, shape", rl.Mode)
	}
	switch rl.Direction {
	case "", mptcpv1alpha1.RateBoth:
		if c.Mode == datapath.RatePolice {
			c.Directions = datapath.Egress | datapath.Ingress
		}
	case mptcpv1alpha1.RateEgress:
		c.Directions = datapath.Egress
	case mptcpv1alpha1.RateIngress:
		c.Directions = datapath.Ingress
	default:
		return nil, fmt.Errorf("direction %q is not one of egress, ingress, both", rl.Direction)
	}
	if c.Mode != datapath.RatePolice && rl.Direction != "" {
		return nil, fmt.Errorf("direction: only police takes one (%s acts in one direction)", rl.Mode)
	}
	if rl.Burst != nil {
		c.BurstBytes = uint64(max(rl.Burst.Value(), 0))
	}
	for _, pr := range rl.PerPath {
		p, ok := paths[pr.Path]
		if !ok {
			continue
		}
		if pr.Rate.Sign() <= 0 {
			return nil, fmt.Errorf("perPath %s: rate must be positive, got %s", pr.Path, pr.Rate.String())
		}
		if c.PerPath == nil {
			c.PerPath = map[uint32]uint64{}
		}
		if _, dup := c.PerPath[p.Index]; dup {
			return nil, fmt.Errorf("perPath: path %s appears twice", pr.Path)
		}
		c.PerPath[p.Index] = capped(uint64(pr.Rate.Value()), p.Capacity)
	}
	for _, q := range []*resource.Quantity{rl.PerConnection, rl.PerPod, rl.PerNamespace} {
		if q != nil && q.Sign() <= 0 {
			return nil, fmt.Errorf("rates must be positive, got %s", q.String())
		}
	}
	if c.PerConnection == 0 && c.PerPod == 0 && c.PerNamespace == 0 && len(c.PerPath) == 0 {
		// Every cap was on paths this node lacks.
		return nil, nil
	}
	return &c, c.Validate()
}

// capped is rate bounded by a path's capacity (0: unbounded).
func capped(rate, capacity uint64) uint64 {
	if capacity > 0 {
		return min(rate, capacity)
	}
	return rate
}

func bps(q *resource.Quantity) uint64 {
	if q == nil || q.Sign() <= 0 {
		return 0
	}
	return uint64(q.Value())
}

// resolveInterface finds the one link sel names: by exact name, by alternative
// name, or by a shell pattern over names and alternative names.
func resolveInterface(sel mptcpv1alpha1.InterfaceSelector, links []NodeLink) (*NodeLink, mptcpv1alpha1.LinkState, string) {
	var match func(NodeLink) bool
	var what string
	switch {
	case sel.Name != "":
		what = "interface " + sel.Name
		match = func(l NodeLink) bool { return l.Name == sel.Name }
	case sel.AltName != "":
		what = "interface with altname " + sel.AltName
		match = func(l NodeLink) bool { return slices.Contains(l.AltNames, sel.AltName) }
	case sel.Pattern != "":
		if _, err := filepath.Match(sel.Pattern, ""); err != nil {
			return nil, mptcpv1alpha1.LinkNotFound, fmt.Sprintf("pattern %q is malformed", sel.Pattern)
		}
		what = "interface matching " + sel.Pattern
		match = func(l NodeLink) bool {
			if ok, _ := filepath.Match(sel.Pattern, l.Name); ok {
				return true
			}
			return slices.ContainsFunc(l.AltNames, func(a string) bool { ok, _ := filepath.Match(sel.Pattern, a); return ok })
		}
	default:
		return nil, mptcpv1alpha1.LinkNotFound, "the path names no interface"
	}
	var found []NodeLink
	for _, l := range links {
		if match(l) {
			found = append(found, l)
		}
	}
	switch len(found) {
	case 0:
		return nil, mptcpv1alpha1.LinkNotFound, fmt.Sprintf("no %s on this node", what)
	case 1:
		l := found[0]
		if !l.Up {
			return &l, mptcpv1alpha1.LinkDown, ""
		}
		return &l, mptcpv1alpha1.LinkUp, ""
	default:
		names := make([]string, len(found))
		for i, l := range found {
			names[i] = l.Name
		}
		return nil, mptcpv1alpha1.LinkAmbiguous, fmt.Sprintf("%d interfaces match (%s): name exactly one", len(found), strings.Join(names, ", "))
	}
}

// PathIndex is the index of the plan's path named name, if the plan
// carries it.
func (t *Translation) PathIndex(name string) (uint32, bool) {
	for _, p := range t.Plan.Paths {
		if p.Name == name {
			return p.Index, true
		}
	}
	return 0, false
}

// sharingPaths are the peers with an address on one of paths: the others
// share no path with the node, and no probe of its could reach them.
func sharingPaths(peers []mptcpv1alpha1.MPTCPPeer, paths []PlanPath) []mptcpv1alpha1.MPTCPPeer {
	mine := map[string]bool{}
	for _, p := range paths {
		mine[p.Name] = true
	}
	return slices.DeleteFunc(slices.Clone(peers), func(peer mptcpv1alpha1.MPTCPPeer) bool {
		return !slices.ContainsFunc(peer.Spec.Paths, func(pp mptcpv1alpha1.PeerPath) bool { return mine[pp.Name] && len(pp.Addresses) > 0 })
	})
}

// probedPeers are the peers other than node that its liveness probes, and
// the names of those it leaves out, sorted: at most limits.ProbedPeers,
// which the datapath's liveness filter and paths down per peer are sized
// for. Which are left out is this node's own draw (a hash of the two
// nodes' names), not the same for every node: in a cluster larger than the
// limit every node is still probed by about limits.ProbedPeers others, and
// each node says in its status how many it leaves out.
func probedPeers(node string, peers []mptcpv1alpha1.MPTCPPeer) ([]mptcpv1alpha1.MPTCPPeer, []string) {
	others := make([]mptcpv1alpha1.MPTCPPeer, 0, len(peers))
	for _, p := range peers {
		if p.Name != node {
			others = append(others, p)
		}
	}
	if len(others) <= limits.ProbedPeers {
		return others, nil
	}
	rank := make(map[string]uint64, len(others))
	for _, p := range others {
		h := fnv.New64a()
		h.Write([]byte(node))
		h.Write([]byte{0})
		h.Write([]byte(p.Name))
		rank[p.Name] = mix(h.Sum64())
	}
	slices.SortFunc(others, func(a, b mptcpv1alpha1.MPTCPPeer) int {
		return cmp.Or(cmp.Compare(rank[a.Name], rank[b.Name]), strings.Compare(a.Name, b.Name))
	})
	var left []string
	for _, p := range others[limits.ProbedPeers:] {
		left = append(left, p.Name)
	}
	slices.Sort(left)
	return others[:limits.ProbedPeers], left
}

// mix is splitmix64's finalizer: FNV alone ranks names that differ in
// their last characters too much alike.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// peerCIDRs are the peers' pod CIDRs by name. One that does not parse (the
// controller passes on only those that do) is left out: that peer is then
// reached as a peer without CIDRs is, and nothing else changes.
func peerCIDRs(peers []mptcpv1alpha1.MPTCPPeer) map[string][]netip.Prefix {
	var out map[string][]netip.Prefix
	for _, peer := range peers {
		for _, s := range peer.Spec.PodCIDRs {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				continue
			}
			if out == nil {
				out = map[string][]netip.Prefix{}
			}
			out[peer.Name] = append(out[peer.Name], p.Masked())
		}
	}
	return out
}

// livenessPaths are the paths to probe and the peers to probe over each.
// A path is probed from the node's first IPv4 address on its NIC (its
// first IPv6 one when it has no IPv4), to each peer's first address of
// that family on the path; an address that is one of this node's own is
// no peer's (its probes would come back from this node itself). A path
// with no peer is not probed (no probes into the void).
func livenessPaths(paths []PlanPath, peers []mptcpv1alpha1.MPTCPPeer, links []NodeLink) []liveness.Path {
	own := map[netip.Addr]bool{}
	for _, l := range links {
		for _, a := range l.Addresses {
			own[a.Addr().Unmap()] = true
		}
	}
	var out []liveness.Path
	for _, p := range paths {
		lp := liveness.Path{Index: p.Index, Name: p.Name, Interface: p.Interface}
		for _, l := range links {
			if l.Name != p.Interface {
				continue
			}
			for _, a := range l.Addresses {
				if ip := a.Addr().Unmap(); !lp.Local.IsValid() || (ip.Is4() && !lp.Local.Is4()) {
					lp.Local = ip
				}
			}
		}
		if !lp.Local.IsValid() {
			continue
		}
		for _, peer := range peers {
			for _, pp := range peer.Spec.Paths {
				if pp.Name != p.Name {
					continue
				}
				for _, r := range pp.Addresses {
					to, err := netip.ParseAddr(r)
					if to = to.Unmap(); err == nil && to.Is4() == lp.Local.Is4() && !own[to] {
						lp.Peers = append(lp.Peers, liveness.Peer{Node: peer.Name, Addr: to})
						break
					}
				}
			}
		}
		if len(lp.Peers) > 0 {
			out = append(out, lp)
		}
	}
	return out
}
