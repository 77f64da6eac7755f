package agent

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
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

// Translation is an MPTCPNodeState turned into the agent's Config, with what
// the agent found (or failed to find) for each path and pod. Errors are the
// problems that keep the spec from being enforced as a whole: with any, the
// caller keeps the last good configuration in force. PathProblems are paths
// the node cannot carry (no interface, an ambiguous one, one another path
// has): each is left out and reported on its path, the rest is enforced.
type Translation struct {
	Config       *Config
	Paths        []mptcpv1alpha1.PathState
	Applied      []mptcpv1alpha1.AppliedPolicy
	Errors       []string
	PathProblems []string
	PodNames     map[string]PodRef // Config pod name -> the API pod
}

// PodRef names a pod of the API.
type PodRef struct{ Namespace, Name, UID string }

// FromNodeState translates state into a configuration on top of base (which
// supplies the node-local settings: pin and state directories, tables, mark
// mask, observe-only). links are the node's interfaces; locate finds a pod by
// its addresses.
func FromNodeState(base Config, state *mptcpv1alpha1.MPTCPNodeState, links []NodeLink, locate func([]netip.Addr) (LocatedPod, error)) *Translation {
	cfg := base
	cfg.Node = state.Name
	cfg.Paths, cfg.Rules, cfg.Pods, cfg.PodCIDRs = nil, nil, nil, nil
	t := &Translation{Config: &cfg, PodNames: map[string]PodRef{}}
	fail := func(format string, args ...any) { t.Errors = append(t.Errors, fmt.Sprintf(format, args...)) }

	for _, s := range state.Spec.PodCIDRs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			fail("podCIDRs: %q is not a prefix", s)
			continue
		}
		cfg.PodCIDRs = append(cfg.PodCIDRs, p.Masked())
	}

	resolved := map[string]bool{}
	owners := map[string]string{} // interface -> the path that has it
	leaveOut := func(name, msg string) { t.PathProblems = append(t.PathProblems, fmt.Sprintf("path %s: %s", name, msg)) }
	// Lower indexes first: the older path keeps an interface two paths'
	// selectors find (the controller gives the lowest free index to the
	// oldest path).
	nodePaths := slices.Clone(state.Spec.Paths)
	slices.SortStableFunc(nodePaths, func(a, b mptcpv1alpha1.NodePath) int { return int(a.Index) - int(b.Index) })
	for _, np := range nodePaths {
		ps := mptcpv1alpha1.PathState{Name: np.Name}
		link, state, msg := resolveInterface(np.Interface, links)
		ps.Link, ps.Message = state, msg
		if link != nil {
			ps.Interface = link.Name
			for _, a := range link.Addresses {
				if len(ps.Addresses) < 4 {
					ps.Addresses = append(ps.Addresses, a.Addr().String())
				}
			}
		}
		switch {
		case link == nil:
			leaveOut(np.Name, msg)
		case np.Index < 1 || !datapath.ValidPath(uint32(np.Index)):
			ps.Message = fmt.Sprintf("index %d is beyond the %d paths the datapath supports", np.Index, datapath.MaxPaths)
			fail("path %s: %s", np.Name, ps.Message)
		case owners[link.Name] != "":
			ps.Link = mptcpv1alpha1.LinkAmbiguous
			ps.Message = fmt.Sprintf("interface %s is also path %s's: a NIC carries one path", link.Name, owners[link.Name])
			leaveOut(np.Name, ps.Message)
		case !link.Gateway.IsValid():
			ps.Message = fmt.Sprintf("no next hop found on %s: neither a default route through it nor an IPv4 subnet on it", link.Name)
			fail("path %s: %s", np.Name, ps.Message)
		default:
			owners[link.Name] = np.Name
			cfg.Paths = append(cfg.Paths, Path{Name: np.Name, Index: uint32(np.Index), Interface: link.Name, Gateway: link.Gateway,
				Capacity: uint64(max(np.Capacity.Value(), 0))})
			resolved[np.Name] = true
		}
		t.Paths = append(t.Paths, ps)
	}
	slices.SortFunc(t.Paths, func(a, b mptcpv1alpha1.PathState) int { return strings.Compare(a.Name, b.Name) })

	// Each rule once, under its name: pods refer to it.
	rules := map[string]Rule{}
	generations := map[string]mptcpv1alpha1.AppliedPolicy{}
	ruleErrs := map[string]error{}
	for _, cr := range state.Spec.Rules {
		rule, err := RuleFromCompiled(cr, resolved)
		if err != nil {
			ruleErrs[cr.Name] = fmt.Errorf("policy %s: %w", cr.Policy, err)
			continue
		}
		rule.Name = cr.Name
		rules[cr.Name] = rule
		generations[cr.Name] = mptcpv1alpha1.AppliedPolicy{Name: cr.Policy, Generation: cr.PolicyGeneration}
	}
	applied := map[string]int64{}
	used := map[string]bool{}
	for _, pod := range state.Spec.Pods {
		id := pod.Namespace + "/" + pod.Name
		if len(pod.Rules) == 0 {
			continue
		}
		var ips []netip.Addr
		for _, s := range pod.IPs {
			a, err := netip.ParseAddr(s)
			if err != nil {
				fail("pod %s: ip %q is not an address", id, s)
				continue
			}
			ips = append(ips, a)
		}
		if len(ips) == 0 {
			// Not an error: the pod has no address yet; it is
			// configured once the controller copies one.
			continue
		}
		// Every rule of the pod, in precedence order: the datapath
		// gives each new subflow the first whose traffic selects it.
		ok := true
		for _, name := range pod.Rules {
			switch _, found := rules[name]; {
			case ruleErrs[name] != nil:
				fail("pod %s, %v", id, ruleErrs[name])
				ok = false
			case !found:
				fail("pod %s: no rule named %s in the spec", id, name)
				ok = false
			}
		}
		if !ok {
			continue
		}
		loc, err := locate(ips)
		if err != nil {
			fail("pod %s: %v", id, err)
			continue
		}
		// A veth NIC (the test bed's, a VM's) has a peer namespace too:
		// an address that leads out of a path is no local pod's.
		if i := slices.IndexFunc(cfg.Paths, func(p Path) bool { return p.Interface == loc.HostInterface }); i >= 0 {
			fail("pod %s: its address %s leads out of path %s (%s), not to a local pod", id, ips[0], cfg.Paths[i].Name, loc.HostInterface)
			continue
		}
		name := pod.Namespace + "." + pod.Name
		cfg.Pods = append(cfg.Pods, Pod{Name: name, NetNS: loc.NetNS, HostInterface: loc.HostInterface, IPs: ips, Rules: slices.Clone(pod.Rules)})
		t.PodNames[name] = PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}
		for _, r := range pod.Rules {
			used[r] = true
			g := generations[r]
			applied[g.Name] = max(applied[g.Name], g.Generation)
		}
	}
	// Only the rules some configured pod uses reach the datapath.
	for _, name := range slices.Sorted(maps.Keys(used)) {
		cfg.Rules = append(cfg.Rules, rules[name])
	}
	for _, name := range slices.Sorted(maps.Keys(applied)) {
		t.Applied = append(t.Applied, mptcpv1alpha1.AppliedPolicy{Name: name, Generation: applied[name]})
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		for _, e := range strings.Split(err.Error(), "\n") {
			fail("%s", e)
		}
	}
	return t
}

// RuleFromCompiled is the one place where a compiled rule's fields become the
// agent's Rule. paths are the node's paths the agent resolved: a rule path
// left out by the controller never reaches here, one the agent could not
// resolve is dropped with the path's own error reported. The Rule is checked
// with the rest of the configuration (Config.Validate).
func RuleFromCompiled(cr mptcpv1alpha1.CompiledRule, paths map[string]bool) (Rule, error) {
	r := Rule{Name: cr.Policy, MaxSubflows: int(cr.MaxSubflows), HeaderRewriting: cr.HeaderRewriting}
	for _, p := range cr.Paths {
		if !paths[p.Name] {
			continue
		}
		r.Paths = append(r.Paths, p.Name)
		if cr.SpreadMode == mptcpv1alpha1.SpreadWeighted {
			if r.Weights == nil {
				r.Weights = map[string]uint32{}
			}
			r.Weights[p.Name] = uint32(max(p.Weight, 0))
		}
	}
	if len(r.Paths) == 0 {
		return r, errors.New("none of its paths is usable on this node")
	}
	for _, name := range cr.PreferredPaths {
		if paths[name] {
			r.PreferredPaths = append(r.PreferredPaths, name)
		}
	}
	for _, name := range cr.BackupPaths {
		if paths[name] {
			r.BackupPaths = append(r.BackupPaths, name)
		}
	}
	for _, name := range cr.BlockedPaths {
		if paths[name] {
			r.BlockedPaths = append(r.BlockedPaths, name)
		}
	}
	switch cr.SpreadMode {
	case mptcpv1alpha1.SpreadRoundRobin, "":
		r.SpreadMode = "roundRobin"
	case mptcpv1alpha1.SpreadWeighted:
		r.SpreadMode = "weighted"
	case mptcpv1alpha1.SpreadPreferredFirst:
		r.SpreadMode = "preferred"
	default:
		return r, fmt.Errorf("spreadMode %q is not one this agent knows", cr.SpreadMode)
	}
	switch cr.SubflowCreation {
	case mptcpv1alpha1.SubflowCreationUserspace, "":
		r.Subflows = SubflowsUserspace
	case mptcpv1alpha1.SubflowCreationSignal:
		r.Subflows = SubflowsSignal
	case mptcpv1alpha1.SubflowCreationGuest:
		// The guest's own stack opens its subflows: the agent leaves
		// the pod's MPTCP settings alone.
		r.Subflows = SubflowsNone
	default:
		return r, fmt.Errorf("subflowCreation %q is not one this agent knows", cr.SubflowCreation)
	}
	r.DataChecksums = cr.DataChecksums
	for _, p := range cr.SignalPorts {
		if p < 1 || p > 65535 {
			return r, fmt.Errorf("signal port %d is out of range", p)
		}
		r.SignalPorts = append(r.SignalPorts, uint16(p))
	}
	traffic, err := trafficFromCompiled(cr.Traffic)
	if err != nil {
		return r, err
	}
	r.Traffic = traffic
	if rl := cr.RateLimits; rl != nil {
		r.Rate = &RateLimits{Mode: string(rl.Mode), PerConnection: rl.PerConnection, PerPod: rl.PerPod, Direction: string(rl.Direction)}
		if rl.Burst != nil {
			r.Rate.BurstBytes = uint64(max(rl.Burst.Value(), 0))
		}
		for _, pr := range rl.PerPath {
			// A cap on a path this node lacks has nothing to cap here.
			if paths[pr.Path] {
				r.Rate.PerPath = append(r.Rate.PerPath, PathRate(pr))
			}
		}
	}
	return r, nil
}

// trafficFromCompiled is a compiled traffic selector as the agent's; nil
// (select everything) when it is unset or selects everything.
func trafficFromCompiled(ct *mptcpv1alpha1.CompiledTraffic) (*Traffic, error) {
	if ct == nil {
		return nil, nil
	}
	t := &Traffic{}
	for _, s := range ct.CIDRs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("traffic: cidr %q is not a prefix", s)
		}
		t.CIDRs = append(t.CIDRs, p.Masked())
	}
	for _, pr := range ct.Ports {
		last := pr.EndPort
		if last == 0 {
			last = pr.Port
		}
		if pr.Port < 1 || pr.Port > 65535 || last < pr.Port || last > 65535 {
			return nil, fmt.Errorf("traffic: port range %d-%d is out of range", pr.Port, last)
		}
		t.Ports = append(t.Ports, PortRange{First: uint16(pr.Port), Last: uint16(last)})
	}
	switch ct.Family {
	case mptcpv1alpha1.IPFamilyIPv4, mptcpv1alpha1.IPFamilyIPv6:
		t.Family = string(ct.Family)
	case mptcpv1alpha1.IPFamilyAny, "":
	default:
		return nil, fmt.Errorf("traffic: family %q is not IPv4, IPv6 or Any", ct.Family)
	}
	if len(t.CIDRs) == 0 && len(t.Ports) == 0 && t.Family == "" {
		return nil, nil
	}
	return t, nil
}

// resolveInterface finds the one link sel names: by exact name, by alternative
// name, or by a shell pattern over names and alternative names.
func resolveInterface(sel mptcpv1alpha1.NodeInterface, links []NodeLink) (*NodeLink, mptcpv1alpha1.LinkState, string) {
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

// NodeDefaults is the base configuration of a node in kube mode when no file
// supplies its node-local settings.
func NodeDefaults(node string) Config {
	c := Config{Node: node}
	c.setDefaults()
	return c
}
