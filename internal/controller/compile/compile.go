// Package compile turns the cluster's paths, policies, namespaces and one
// node's pods into that node's MPTCPNodeState spec. It is pure: the same
// inputs give a byte-identical spec, whatever the order the inputs come in,
// so the controller can compare before it writes and write nothing when
// nothing changed.
package compile

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/transparent"
)

// Input is everything one node's spec depends on.
type Input struct {
	// Node is the node compiled for.
	Node *corev1.Node
	// Paths and Policies are all of the cluster's.
	Paths    []mptcpv1alpha1.MPTCPPath
	Policies []mptcpv1alpha1.MPTCPPolicy
	// NamespaceLabels maps each namespace of Pods to its labels.
	NamespaceLabels map[string]map[string]string
	// Pods are the pods bound to Node.
	Pods []corev1.Pod
	// NodeStates are node states whose claims decide which of Node's
	// addresses are its own (owners): Node's own and those that claim an
	// address Node's claims. Any other node state changes nothing.
	NodeStates []mptcpv1alpha1.MPTCPNodeState
}

// Refusal is something about a pod that did not go as its tenant asked (a
// preference not honoured, a policy chosen through its labels held to its
// namespace's caps), to be reported as a Warning event on the pod.
type Refusal struct {
	Pod    *corev1.Pod
	Policy string
	// Reason is a CamelCase event reason.
	Reason string
	// Message explains the refusal to the tenant.
	Message string
}

// Refusal reasons.
const (
	ReasonPreferencesForbidden = "PreferredPathsForbidden"
	ReasonPreferencesOutside   = "PreferredPathsOutsidePolicy"
	ReasonPreferencesInvalid   = "PreferredPathsInvalid"
	// ReasonTooManyPolicies: more policies select the pod than its
	// selector chain in the datapath holds; those of lowest precedence
	// are not applied to it.
	ReasonTooManyPolicies = "TooManyPolicies"
	// ReasonVMGuestMode: the pod runs a KubeVirt VM, whose own kernel
	// opens its subflows, and its policy's subflowCreation is not guest:
	// guest applies to it instead.
	ReasonVMGuestMode = "VMGuestMode"
	// ReasonTransparentNotApplied: the pod's policy sets
	// podMPTCP.transparent, which the webhook applies at a pod's creation,
	// and this pod does not carry it.
	ReasonTransparentNotApplied = "TransparentNotApplied"
)

// LabelVirtLauncher is the label KubeVirt gives the pod a VM runs in
// (kubevirt.io: virt-launcher).
const (
	LabelVirtLauncher      = "kubevirt.io"
	LabelVirtLauncherValue = "virt-launcher"
)

// RunsVM says whether pod is a KubeVirt virt-launcher pod. Anyone who may
// label a pod may make it one: the pod then loses what the agent would do
// inside it (be its path manager, set its endpoints and checksums), which
// concerns that pod alone.
func RunsVM(pod *corev1.Pod) bool { return pod.Labels[LabelVirtLauncher] == LabelVirtLauncherValue }

// guestForVM makes rule, compiled for a pod that runs a VM, guest mode
// and says so, when its policy asked for another mode: inside a VM the
// agent can be no path manager and the pod's own namespace runs no
// MPTCP socket to configure.
func guestForVM(pod *corev1.Pod, rule *mptcpv1alpha1.CompiledRule) *Refusal {
	if rule.SubflowCreation == mptcpv1alpha1.SubflowCreationGuest {
		return nil
	}
	was := rule.SubflowCreation
	rule.SubflowCreation, rule.SignalPorts, rule.JoinAfterBytes = mptcpv1alpha1.SubflowCreationGuest, nil, 0
	rule.CongestionControl = "" // the VM's kernel's own
	return &Refusal{Pod: pod, Policy: rule.Policy, Reason: ReasonVMGuestMode, Message: fmt.Sprintf(
		"the pod runs a VM (%s: %s): policy %s's subflowCreation %s cannot act inside it, so guest applies: the VM's own kernel opens its subflows "+
			"and the host places them on distinct paths (docs/vms.md)", LabelVirtLauncher, LabelVirtLauncherValue, rule.Policy, was)}
}

// Result is a node's compiled spec and what it could not honour.
type Result struct {
	Spec mptcpv1alpha1.MPTCPNodeStateSpec
	// Refusals, sorted by pod then policy.
	Refusals []Refusal
	// MissingPaths maps a policy to the paths it names that this node does
	// not have (not selected, or not yet indexed), sorted.
	MissingPaths map[string][]string
}

// Node compiles one node's spec.
func Node(in Input) Result {
	res := Result{MissingPaths: map[string][]string{}}
	if in.Node == nil {
		return res
	}
	res.Spec.PodCIDRs = slices.Clone(in.Node.Spec.PodCIDRs)
	if len(res.Spec.PodCIDRs) == 0 && in.Node.Spec.PodCIDR != "" {
		res.Spec.PodCIDRs = []string{in.Node.Spec.PodCIDR}
	}

	nodePaths, byName := resolvePaths(in.Node, in.Paths)
	res.Spec.Paths = nodePaths
	giveAddresses(in.Node.Name, res.Spec.Paths, in.NodeStates)

	policies := activePolicies(in.Policies)
	rulesByName := map[string]mptcpv1alpha1.CompiledRule{}
	pods := slices.Clone(in.Pods)
	slices.SortFunc(pods, func(a, b corev1.Pod) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	for i := range pods {
		pod := &pods[i]
		if !podEligible(pod, in.Node.Name) {
			continue
		}
		nsLabels := labels.Set(in.NamespaceLabels[pod.Namespace])
		rules, vmNotices := res.podRules(pod, policies, nsLabels, byName)
		if len(rules) == 0 {
			continue
		}
		// Namespace caps first (they may move a rule down the chain),
		// then the chain's bound: what is cut is the lowest precedence.
		rules, cappedBy, notices := boundByNamespace(pod, rules, policies)
		res.Refusals = append(res.Refusals, notices...)
		rules = res.boundPolicies(pod, rules)
		names := make([]string, len(rules))
		for j := range rules {
			notice, forVM := vmNotices[rules[j].Policy]
			if forVM {
				res.Refusals = append(res.Refusals, notice)
			}
			rules[j].Name = variantName(&rules[j], cappedBy[j], forVM)
			rulesByName[rules[j].Name] = rules[j]
			names[j] = rules[j].Name
		}
		podTransparency, missed := transparency(pod, transparentPolicy(pod, policies, nsLabels))
		if missed != nil {
			res.Refusals = append(res.Refusals, *missed)
		}
		res.Spec.Pods = append(res.Spec.Pods, mptcpv1alpha1.NodePod{
			Namespace:   pod.Namespace,
			Name:        pod.Name,
			UID:         string(pod.UID),
			IPs:         podIPs(pod),
			Rules:       names,
			Transparent: podTransparency,
		})
	}
	for _, name := range slices.Sorted(maps.Keys(rulesByName)) {
		res.Spec.Rules = append(res.Spec.Rules, rulesByName[name])
	}
	return res
}

// podRules compiles the rules of the policies that select pod, in order,
// noting paths they name that the node lacks and refused preferences in
// res. vmNotices are the policies whose mode guestForVM changed for a pod
// that runs a VM, with the event that says so: given for the rules the pod
// keeps, once they are bounded.
func (res *Result) podRules(pod *corev1.Pod, policies []mptcpv1alpha1.MPTCPPolicy, nsLabels labels.Set,
	byName map[string]*mptcpv1alpha1.MPTCPPath) (rules []mptcpv1alpha1.CompiledRule, vmNotices map[string]Refusal) {
	vmNotices = map[string]Refusal{}
	for j := range policies {
		pol := &policies[j]
		if !selects(pol, nsLabels, pod) {
			continue
		}
		rule, missing := compileRule(pol, byName)
		if len(missing) > 0 {
			res.MissingPaths[pol.Name] = mergeSorted(res.MissingPaths[pol.Name], missing)
		}
		if r := applyPreferences(pod, pol, &rule); r != nil {
			res.Refusals = append(res.Refusals, *r)
		}
		if RunsVM(pod) {
			if r := guestForVM(pod, &rule); r != nil {
				vmNotices[pol.Name] = *r
			}
		}
		rules = append(rules, rule)
	}
	return rules, vmNotices
}

// boundPolicies keeps the pod's first MaxPodPolicies rules and refuses
// the rest (the lowest precedence) in res.
func (res *Result) boundPolicies(pod *corev1.Pod, rules []mptcpv1alpha1.CompiledRule) []mptcpv1alpha1.CompiledRule {
	n := len(rules)
	if n <= mptcpv1alpha1.MaxPodPolicies {
		return rules
	}
	var left []string
	for _, r := range rules[mptcpv1alpha1.MaxPodPolicies:] {
		left = append(left, r.Policy)
	}
	res.Refusals = append(res.Refusals, Refusal{Pod: pod, Policy: left[0], Reason: ReasonTooManyPolicies,
		Message: fmt.Sprintf("%d policies select the pod, a pod takes at most %d: %s (lowest precedence) not applied to it",
			n, mptcpv1alpha1.MaxPodPolicies, strings.Join(left, ", "))})
	return rules[:mptcpv1alpha1.MaxPodPolicies]
}

// peerAddress parses one of a peer's addresses as its agent reported it
// and accepts only a unicast address a node can have on a fabric: no
// loopback, multicast, link-local or unspecified address, no zone.
func peerAddress(s string) (netip.Addr, bool) {
	ip, err := netip.ParseAddr(s)
	if err != nil || ip.Zone() != "" {
		return netip.Addr{}, false
	}
	ip = ip.Unmap()
	return ip, ip.IsGlobalUnicast()
}

// maxPathAddresses bounds a node's addresses on one path, as the API does
// (PathState.Addresses, NodePath.Addresses, PeerPath.Addresses).
const maxPathAddresses = 4

// claims are the addresses each node state reports on each path of its
// spec (status.paths), at most maxPathAddresses per path, those that are a
// fabric's unicast addresses (peerAddress). A path state under a name its
// spec does not have is no claim: the agent writes its status alone, so a
// path state of no path, or beyond the paths the node has, would be a
// claim no one else can check.
func claims(st *mptcpv1alpha1.MPTCPNodeState) map[string][]netip.Addr {
	onSpec := map[string]bool{}
	for _, p := range st.Spec.Paths {
		onSpec[p.Name] = true
	}
	out := map[string][]netip.Addr{}
	for _, ps := range st.Status.Paths {
		if !onSpec[ps.Name] {
			continue
		}
		onSpec[ps.Name] = false // once, as a map list has it
		var addrs []netip.Addr
		for _, a := range ps.Addresses {
			if ip, ok := peerAddress(a); ok && !slices.Contains(addrs, ip) && len(addrs) < maxPathAddresses {
				addrs = append(addrs, ip)
			}
		}
		out[ps.Name] = addrs
	}
	return out
}

// owners says which node has each address that node states claim. One
// claimant has it. An address two or more nodes claim stays with the one
// whose spec has it already (NodePath.Addresses, which only the controller
// writes and which says whom it gave the address to before): a node that
// claims another's address later never takes it, after a restart of the
// controller as before. Where no claimant's spec has it (no node reported
// it before) or several do (two reports raced), the node of the older node
// state has it, by creationTimestamp and then name, which no agent writes.
func owners(states []mptcpv1alpha1.MPTCPNodeState) map[netip.Addr]string {
	type claimant struct {
		state *mptcpv1alpha1.MPTCPNodeState
		given bool
	}
	better := func(a, b claimant) bool {
		if a.given != b.given {
			return a.given
		}
		if c := a.state.CreationTimestamp.Compare(b.state.CreationTimestamp.Time); c != 0 {
			return c < 0
		}
		return a.state.Name < b.state.Name
	}
	best := map[netip.Addr]claimant{}
	for i := range states {
		st := &states[i]
		given := map[netip.Addr]bool{}
		for _, p := range st.Spec.Paths {
			for _, a := range p.Addresses {
				if ip, ok := peerAddress(a); ok {
					given[ip] = true
				}
			}
		}
		for _, addrs := range claims(st) {
			for _, ip := range addrs {
				c := claimant{state: st, given: given[ip]}
				if cur, ok := best[ip]; !ok || better(c, cur) {
					best[ip] = c
				}
			}
		}
	}
	out := make(map[netip.Addr]string, len(best))
	for ip, c := range best {
		out[ip] = c.state.Name
	}
	return out
}

// giveAddresses sets on paths, node's spec paths as compiled now, the
// addresses node has (owners), its claims counting on the paths its spec
// has now. states is not modified.
func giveAddresses(node string, paths []mptcpv1alpha1.NodePath, states []mptcpv1alpha1.MPTCPNodeState) {
	i := slices.IndexFunc(states, func(s mptcpv1alpha1.MPTCPNodeState) bool { return s.Name == node })
	if i < 0 {
		return
	}
	// The addresses given before stay given while owners decides.
	before := map[string][]string{}
	for _, p := range states[i].Spec.Paths {
		before[p.Name] = p.Addresses
	}
	states = slices.Clone(states)
	mine := &states[i] // a shallow copy: only its Spec.Paths is replaced
	mine.Spec.Paths = slices.Clone(paths)
	for j := range mine.Spec.Paths {
		mine.Spec.Paths[j].Addresses = before[mine.Spec.Paths[j].Name]
	}
	own := owners(states)
	claimed := claims(mine)
	for j := range paths {
		paths[j].Addresses = nil
		for _, ip := range claimed[paths[j].Name] {
			if own[ip] == node {
				paths[j].Addresses = append(paths[j].Addresses, ip.String())
			}
		}
	}
}

// PeerSpecs are the MPTCPPeer specs of the nodes of states, by node name:
// one for each node state with pods under a policy, with its addresses on
// each path of its spec as its agent reported them (status.paths) and as
// owners gives them to it (a fabric's unicast addresses, and none that
// another node has), and its pod CIDRs that overlap no other node's
// (peerPodCIDRs). A node with no such address on any path has none: no
// peer could probe it. states must be all of the cluster's.
func PeerSpecs(states []mptcpv1alpha1.MPTCPNodeState) map[string]mptcpv1alpha1.MPTCPPeerSpec {
	own := owners(states)
	cidrs := peerPodCIDRs(states)
	out := map[string]mptcpv1alpha1.MPTCPPeerSpec{}
	for i := range states {
		st := &states[i]
		if len(st.Spec.Pods) == 0 || st.Spec.Outdated() {
			continue
		}
		var spec mptcpv1alpha1.MPTCPPeerSpec
		for name, claimed := range claims(st) {
			var addrs []string
			for _, ip := range claimed {
				if own[ip] == st.Name {
					addrs = append(addrs, ip.String())
				}
			}
			if len(addrs) > 0 {
				spec.Paths = append(spec.Paths, mptcpv1alpha1.PeerPath{Name: name, Addresses: addrs})
			}
		}
		if len(spec.Paths) == 0 {
			continue
		}
		slices.SortFunc(spec.Paths, func(a, b mptcpv1alpha1.PeerPath) int { return cmp.Compare(a.Name, b.Name) })
		for _, p := range cidrs[st.Name] {
			spec.PodCIDRs = append(spec.PodCIDRs, p.String())
		}
		out[st.Name] = spec
	}
	return out
}

// ClaimedAddresses are the addresses st's agent reports on its paths
// (status.paths) and those its spec gives it, as owners reads them: what
// another node's claims can contend with. For an index: a node state
// whose claims change changes the addresses of exactly the nodes that
// claim one of these, before or after.
func ClaimedAddresses(st *mptcpv1alpha1.MPTCPNodeState) []string {
	seen := map[netip.Addr]bool{}
	var out []string
	add := func(s string) {
		if ip, ok := peerAddress(s); ok && !seen[ip] {
			seen[ip] = true
			out = append(out, ip.String())
		}
	}
	for _, ps := range st.Status.Paths {
		for _, a := range ps.Addresses {
			add(a)
		}
	}
	for _, p := range st.Spec.Paths {
		for _, a := range p.Addresses {
			add(a)
		}
	}
	return out
}

// RuleName is a compiled rule's identity on its node: its policy's name,
// and for a variant (a tenant's preference applied to some pods, or a
// namespace's caps, variantName) "@" and a hash of what makes it one, a
// character no policy name has. All pods a policy selects alike share the
// rule, and the rule keeps its name when the policy changes: the agent
// rewrites it in place, so the policy's live connections follow the change
// (its caps, a path made backup) and never take another policy's rule. A
// changed preference is another variant: the pod's new connections take
// it, its live ones keep the old one until they end.
func RuleName(r *mptcpv1alpha1.CompiledRule) string { return variantName(r, "", false) }

// variantName is the name of r as compiled for some pods: with the caps of
// namespace policy cappedBy ("" for none, boundByNamespace) applied, its
// preferred paths, and made guest mode for a VM (guestForVM).
func variantName(r *mptcpv1alpha1.CompiledRule, cappedBy string, forVM bool) string {
	var variant []string
	if forVM {
		variant = append(variant, "vm")
	}
	if len(r.PreferredPaths) > 0 {
		variant = append(variant, "preferred="+strings.Join(r.PreferredPaths, ","))
	}
	if cappedBy != "" {
		variant = append(variant, "cappedBy="+cappedBy)
	}
	if len(variant) == 0 {
		return r.Policy
	}
	sum := sha256.Sum256([]byte(strings.Join(variant, ";")))
	return r.Policy + "@" + hex.EncodeToString(sum[:5])
}

// resolvePaths returns the paths that select node and have an index, sorted
// by name. A path without an index yet is left out rather than given a mark
// that might change; so is a path that names an interface an older path of
// the node names (InterfaceConflicts), which the path's status reports.
// It also returns those paths' objects by name, which compiling a rule reads
// (their default role and weight).
func resolvePaths(node *corev1.Node, paths []mptcpv1alpha1.MPTCPPath) ([]mptcpv1alpha1.NodePath, map[string]*mptcpv1alpha1.MPTCPPath) {
	var out []mptcpv1alpha1.NodePath
	byName := map[string]*mptcpv1alpha1.MPTCPPath{}
	conflicts := InterfaceConflicts(node, paths)
	for i := range paths {
		p := &paths[i]
		if !pathOnNode(p, node) || conflicts[p.Name] != "" {
			continue
		}
		byName[p.Name] = p
		out = append(out, mptcpv1alpha1.NodePath{
			Name:      p.Name,
			Index:     p.Status.Index,
			Interface: p.Spec.Interface,
			Capacity:  p.Spec.Capacity.DeepCopy(),
			// Its group goes with the path: the agent tells each
			// rule which of its paths share one.
			SharedRiskGroup: p.Spec.SharedRiskGroup,
		})
	}
	slices.SortFunc(out, func(a, b mptcpv1alpha1.NodePath) int { return cmp.Compare(a.Name, b.Name) })
	return out, byName
}

// pathOnNode: p is in node's state unless another path takes its
// interface there.
func pathOnNode(p *mptcpv1alpha1.MPTCPPath, node *corev1.Node) bool {
	return p.DeletionTimestamp == nil && p.Status.Index >= 1 && PathSelectsNode(p, node)
}

// InterfaceConflicts finds the paths of node that name an interface another
// path of the node names too, by the same name or the same altName: two
// paths cannot share a NIC (each NIC marks its arrivals with one path). The
// older path (created first, then by name) keeps the interface; each other
// is mapped to the path that keeps it, and is left out of the node's state.
// Patterns are matched by the agent against the node's links, which the
// controller does not see: an agent reports a pattern that matches a taken
// interface on the path's state.
func InterfaceConflicts(node *corev1.Node, paths []mptcpv1alpha1.MPTCPPath) map[string]string {
	on := make([]*mptcpv1alpha1.MPTCPPath, 0, len(paths))
	for i := range paths {
		if pathOnNode(&paths[i], node) {
			on = append(on, &paths[i])
		}
	}
	slices.SortFunc(on, func(a, b *mptcpv1alpha1.MPTCPPath) int {
		return cmp.Or(a.CreationTimestamp.Compare(b.CreationTimestamp.Time), cmp.Compare(a.Name, b.Name))
	})
	out := map[string]string{}
	owner := map[string]string{} // "name:nic1" or "altName:lte0" -> path
	for _, p := range on {
		var key string
		switch ifc := p.Spec.Interface; {
		case ifc.Name != "":
			key = "name:" + ifc.Name
		case ifc.AltName != "":
			key = "altName:" + ifc.AltName
		default:
			continue
		}
		if first, taken := owner[key]; taken {
			out[p.Name] = first
			continue
		}
		owner[key] = p.Name
	}
	return out
}

// PathSelectsNode reports whether a path's nodeSelector selects node. An
// invalid selector selects nothing: the API server validated it, so this only
// guards against a selector this code cannot parse.
func PathSelectsNode(p *mptcpv1alpha1.MPTCPPath, node *corev1.Node) bool {
	if p.Spec.NodeSelector == nil {
		return true
	}
	sel, err := metav1.LabelSelectorAsSelector(p.Spec.NodeSelector)
	if err != nil {
		return false
	}
	return sel.Matches(labels.Set(node.Labels))
}

// activePolicies drops policies being deleted and orders the rest by
// precedence: higher priority first, then name, so overlaps resolve the same
// way on every node and in every run.
func activePolicies(in []mptcpv1alpha1.MPTCPPolicy) []mptcpv1alpha1.MPTCPPolicy {
	out := make([]mptcpv1alpha1.MPTCPPolicy, 0, len(in))
	for _, p := range in {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b mptcpv1alpha1.MPTCPPolicy) int {
		return cmp.Or(cmp.Compare(b.Spec.Priority, a.Spec.Priority), cmp.Compare(a.Name, b.Name))
	})
	return out
}

// TransparentPolicy is the policy that decides pod's podMPTCP.transparent
// (in a namespace labelled nsLabels): the first of policies, in order of
// precedence and leaving out those being deleted, that selects it and sets
// it; nil if none does. Node and the pod webhook decide by it.
func TransparentPolicy(policies []mptcpv1alpha1.MPTCPPolicy, nsLabels map[string]string, pod *corev1.Pod) *mptcpv1alpha1.MPTCPPolicy {
	return transparentPolicy(pod, activePolicies(policies), labels.Set(nsLabels))
}

// transparentPolicy is TransparentPolicy over active policies, in order.
func transparentPolicy(pod *corev1.Pod, policies []mptcpv1alpha1.MPTCPPolicy, nsLabels labels.Set) *mptcpv1alpha1.MPTCPPolicy {
	for i := range policies {
		if policies[i].Spec.PodMPTCP.Transparent != "" && selects(&policies[i], nsLabels, pod) {
			return &policies[i]
		}
	}
	return nil
}

// transparency is the node pod's transparent under the deciding policy:
// kernel when it says so; inject when it says inject and the pod carries
// the webhook's mark. A pod that opts out (its mptcp.io/transparent
// annotation, which it may set at any time) has none, nor has a VM's pod:
// its guest's sockets are not the pod's, and the CEL rules keep
// transparent from guest mode. missed is the refusal to report when the
// pod lacks what the policy gives pods at their creation (inject or off,
// the webhook's): created before the policy said so, while the webhook was
// down, in a namespace the webhook does not see, or left as it was by it.
func transparency(pod *corev1.Pod, deciding *mptcpv1alpha1.MPTCPPolicy) (_ mptcpv1alpha1.PodTransparency, missed *Refusal) {
	if deciding == nil || RunsVM(pod) || pod.Annotations[transparent.AnnotationMode] == transparent.OptOut {
		return "", nil
	}
	switch mode := deciding.Spec.PodMPTCP.Transparent; {
	case mode == mptcpv1alpha1.TransparentKernel:
		return mptcpv1alpha1.PodTransparencyKernel, nil
	case pod.Annotations[transparent.AnnotationMode] != string(mode):
		return "", &Refusal{Pod: pod, Policy: deciding.Name, Reason: ReasonTransparentNotApplied, Message: fmt.Sprintf(
			"policy %s's podMPTCP.transparent %s is applied to pods as they are created, and was not to this one: it was created "+
				"before the policy said so, while the webhook was unavailable, in a namespace the webhook does not see "+
				"(by default those labelled mptcp.io/transparent=enabled), or the webhook left it as it was (the API server "+
				"warned its creator why); create the pod again to apply it (docs/transparent.md)", deciding.Name, mode)}
	case mode == mptcpv1alpha1.TransparentInject:
		return mptcpv1alpha1.PodTransparencyInject, nil
	}
	return "", nil
}

// podEligible: only pods bound to this node whose traffic the agent can
// steer. Host-network pods share the node's namespace, finished pods have no
// traffic left.
func podEligible(pod *corev1.Pod, node string) bool {
	if pod.Spec.NodeName != node || pod.Spec.HostNetwork {
		return false
	}
	return pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
}

func selects(pol *mptcpv1alpha1.MPTCPPolicy, nsLabels labels.Set, pod *corev1.Pod) bool {
	// A policy without a namespaceSelector selects nothing: the schema
	// requires one, so covering every namespace is always a written choice.
	if pol.Spec.NamespaceSelector == nil {
		return false
	}
	nsSel, err := metav1.LabelSelectorAsSelector(pol.Spec.NamespaceSelector)
	if err != nil || !nsSel.Matches(nsLabels) {
		return false
	}
	if pol.Spec.PodSelector == nil {
		return true
	}
	podSel, err := metav1.LabelSelectorAsSelector(pol.Spec.PodSelector)
	return err == nil && podSel.Matches(labels.Set(pod.Labels))
}

// compileRule copies a policy's actions, keeping only paths this node has,
// and returns the names it had to leave out. A spread path takes its
// weight and role from the policy, else from the path (spec.weight,
// spec.defaultRole); one whose role is backup joins the rule's backup paths
// after the policy's own, where the policy allows header rewriting (backup
// flags subflows with MP_JOIN's B bit and MP_PRIO), and stays active where
// it does not.
func compileRule(pol *mptcpv1alpha1.MPTCPPolicy, nodePaths map[string]*mptcpv1alpha1.MPTCPPath) (mptcpv1alpha1.CompiledRule, []string) {
	s := &pol.Spec
	var missing []string
	keep := func(name string) bool {
		if _, ok := nodePaths[name]; ok {
			return true
		}
		missing = append(missing, name)
		return false
	}

	rule := mptcpv1alpha1.CompiledRule{
		Policy:           pol.Name,
		PolicyGeneration: pol.Generation,
		Priority:         s.Priority,
		SpreadMode:       cmp.Or(s.Spread.Mode, mptcpv1alpha1.SpreadWeighted),
		MaxSubflows:      cmp.Or(s.MaxSubflows, 4),
		SubflowCreation:  cmp.Or(s.PodMPTCP.SubflowCreation, mptcpv1alpha1.SubflowCreationUserspace),
		SignalPorts:      slices.Clone(s.PodMPTCP.SignalPorts),
		DataChecksums:    s.PodMPTCP.DataChecksums == nil || *s.PodMPTCP.DataChecksums,
		// An object stored before the field existed has no default
		// applied: it gets the one the schema would have given.
		CongestionControl: cmp.Or(s.PodMPTCP.CongestionControl, mptcpv1alpha1.DefaultCongestionControl),
		HeaderRewriting:   s.HeaderRewriting == mptcpv1alpha1.Allowed,
	}
	rule.Traffic = s.Traffic.DeepCopy()
	rule.JoinAfterBytes = joinAfterBytes(&s.PodMPTCP, rule.SubflowCreation)
	if rule.SubflowCreation == mptcpv1alpha1.SubflowCreationGuest {
		rule.CongestionControl = "" // the guest's stack decides
	}
	var backupByRole []string
	for _, wp := range s.Spread.Paths {
		if !keep(wp.Name) {
			continue
		}
		path := &nodePaths[wp.Name].Spec
		if cmp.Or(wp.Role, path.DefaultRole) == mptcpv1alpha1.PathRoleBackup && rule.HeaderRewriting {
			backupByRole = append(backupByRole, wp.Name)
			continue
		}
		w := cmp.Or(wp.Weight, path.Weight, 1)
		rule.Paths = append(rule.Paths, mptcpv1alpha1.RulePath{Name: wp.Name, Weight: w})
	}
	for _, name := range s.BackupPaths {
		if keep(name) {
			rule.BackupPaths = append(rule.BackupPaths, name)
		}
	}
	if len(rule.Paths) == 0 {
		// Backup to nothing: every path of the policy is backup by
		// default, so none is; they carry the traffic as active paths.
		for _, name := range backupByRole {
			rule.Paths = append(rule.Paths, mptcpv1alpha1.RulePath{Name: name, Weight: cmp.Or(weightOf(s, name), nodePaths[name].Spec.Weight, 1)})
		}
		backupByRole = nil
	}
	rule.BackupPaths = append(rule.BackupPaths, backupByRole...)
	// A blocked path the node does not have needs no blocking there, and is
	// not reported missing: the admin never asked for it to carry traffic.
	for _, name := range s.BlockedPaths {
		if _, ok := nodePaths[name]; ok {
			rule.BlockedPaths = append(rule.BlockedPaths, name)
		}
	}
	rule.RateLimits = compileRateLimits(s.RateLimits, nodePaths)
	slices.Sort(missing)
	return rule, slices.Compact(missing)
}

// compileRateLimits copies a policy's rate limits (nil: none), the per-path
// ones only for paths this node has.
func compileRateLimits(rl *mptcpv1alpha1.RateLimits, nodePaths map[string]*mptcpv1alpha1.MPTCPPath) *mptcpv1alpha1.CompiledRateLimits {
	if rl == nil {
		return nil
	}
	c := &mptcpv1alpha1.CompiledRateLimits{Mode: rl.Mode, Direction: rl.Direction, Burst: copyQuantity(rl.Burst),
		PerConnection: copyQuantity(rl.PerConnection), PerPod: copyQuantity(rl.PerPod), PerNamespace: copyQuantity(rl.PerNamespace)}
	for _, pr := range rl.PerPath {
		if _, ok := nodePaths[pr.Path]; ok {
			c.PerPath = append(c.PerPath, mptcpv1alpha1.CompiledPathRate{Path: pr.Path, Rate: pr.Rate.DeepCopy()})
		}
	}
	return c
}

// copyQuantity is a deep copy of q, nil for nil.
func copyQuantity(q *resource.Quantity) *resource.Quantity {
	if q == nil {
		return nil
	}
	v := q.DeepCopy()
	return &v
}

// joinAfterBytes is the join threshold of a rule in mode: the policy's, or
// the default where it sets none; 0 where the agent opens no joins.
func joinAfterBytes(p *mptcpv1alpha1.PodMPTCP, mode mptcpv1alpha1.SubflowCreation) int64 {
	if mode != mptcpv1alpha1.SubflowCreationUserspace {
		return 0
	}
	if p.JoinAfterBytes == nil {
		return mptcpv1alpha1.DefaultJoinAfterBytes
	}
	return p.JoinAfterBytes.Value()
}

// weightOf is the weight policy s gives path name, 0 when none.
func weightOf(s *mptcpv1alpha1.MPTCPPolicySpec, name string) int32 {
	for _, wp := range s.Spread.Paths {
		if wp.Name == name {
			return wp.Weight
		}
	}
	return 0
}

// applyPreferences honours the pod's mptcp.io/preferred-paths annotation in
// rule, or says why not. A preference can only reorder the policy's own
// spread paths: it cannot add a path, raise a rate, or name anything outside
// the pod itself, so a tenant narrows choices and never widens them.
func applyPreferences(pod *corev1.Pod, pol *mptcpv1alpha1.MPTCPPolicy, rule *mptcpv1alpha1.CompiledRule) *Refusal {
	value, ok := pod.Annotations[mptcpv1alpha1.AnnotationPreferredPaths]
	if !ok {
		return nil
	}
	refuse := func(reason, msg string) *Refusal {
		return &Refusal{Pod: pod, Policy: pol.Name, Reason: reason, Message: msg}
	}
	if pol.Spec.TenantPreferences != mptcpv1alpha1.Allowed {
		return refuse(ReasonPreferencesForbidden,
			"policy "+pol.Name+" does not allow tenant path preferences; annotation "+
				mptcpv1alpha1.AnnotationPreferredPaths+" ignored")
	}
	names, problem := ParsePreferredPaths(value)
	if problem != "" {
		return refuse(ReasonPreferencesInvalid, "annotation "+mptcpv1alpha1.AnnotationPreferredPaths+" ignored: "+problem)
	}
	allowed := map[string]bool{}
	for _, wp := range pol.Spec.Spread.Paths {
		allowed[wp.Name] = true
	}
	for _, n := range names {
		if !allowed[n] {
			return refuse(ReasonPreferencesOutside, "path "+n+" is not one of policy "+pol.Name+
				"'s spread paths; annotation "+mptcpv1alpha1.AnnotationPreferredPaths+" ignored")
		}
	}
	// Preferred paths first, in the tenant's order; the others keep the
	// policy's order after them, so a preference never removes a fallback.
	rank := map[string]int{}
	for i, n := range names {
		rank[n] = i
	}
	slices.SortStableFunc(rule.Paths, func(a, b mptcpv1alpha1.RulePath) int {
		ra, oka := rank[a.Name]
		rb, okb := rank[b.Name]
		switch {
		case oka && okb:
			return cmp.Compare(ra, rb)
		case oka:
			return -1
		case okb:
			return 1
		}
		return 0
	})
	for _, rp := range rule.Paths {
		if _, preferred := rank[rp.Name]; preferred {
			rule.PreferredPaths = append(rule.PreferredPaths, rp.Name)
		}
	}
	return nil
}

// MaxPreferredPaths bounds the annotation, as policies bound their spread.
const MaxPreferredPaths = mptcpv1alpha1.MaxPolicyPaths

// ParsePreferredPaths parses "fabric-b, fabric-a" into path names. Anything
// that is not a plain list of distinct path names (for instance a
// "namespace/pod" reference or a selector) is refused as a whole: the
// annotation speaks only for the pod that carries it.
func ParsePreferredPaths(value string) ([]string, string) {
	if strings.TrimSpace(value) == "" {
		return nil, "it is empty"
	}
	parts := strings.Split(value, ",")
	if len(parts) > MaxPreferredPaths {
		return nil, fmt.Sprintf("it names more than %d paths", MaxPreferredPaths)
	}
	seen := map[string]bool{}
	names := make([]string, 0, len(parts))
	for _, p := range parts {
		n := strings.TrimSpace(p)
		if errs := validation.IsDNS1123Label(n); len(errs) > 0 {
			return nil, quote(n) + " is not a path name: " + errs[0]
		}
		if seen[n] {
			return nil, "path " + n + " is named twice"
		}
		seen[n] = true
		names = append(names, n)
	}
	return names, ""
}

func quote(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return `"` + s + `"`
}

func podIPs(pod *corev1.Pod) []string {
	var ips []string
	for _, ip := range pod.Status.PodIPs {
		ips = append(ips, ip.IP)
	}
	if len(ips) == 0 && pod.Status.PodIP != "" {
		ips = []string{pod.Status.PodIP}
	}
	return ips
}

func mergeSorted(a, b []string) []string {
	out := append(slices.Clone(a), b...)
	slices.Sort(out)
	return slices.Compact(out)
}
