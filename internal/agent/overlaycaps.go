package agent

import (
	"fmt"
	"slices"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/routing"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
)

// capsPastOverlay are the problems of the rules whose caps miss what an
// overlay's tunnel encapsulates. nic_egress, where shape classifies a pod's
// packets and police charges what a pod sends outside its subflows, sees
// only the outer packet, which no interface of the node received, and lets
// it pass (docs/datapath.md, "Overlays"): shape caps nothing that goes
// through the tunnel, police only the subflows. The rest of the node is
// enforced; the node is Degraded (CapsNotEnforced) until the policy takes
// a mode that holds (police of subflows, window) or the CNI routes.
func capsPastOverlay(rules []PlanRule, tunnels []routing.Tunnel) []Problem {
	if len(tunnels) == 0 {
		return nil
	}
	tunnel := tunnels[0].Name
	var out []Problem
	for _, r := range rules {
		var msg string
		switch capsAtNIC(r) {
		case shapeAtNIC:
			msg = fmt.Sprintf("rule %s: its shape caps do not reach what the overlay's tunnel %s encapsulates "+
				"(the NIC's classifier sees outer packets only); use rate mode police or window on this CNI", r.Name, tunnel)
		case policeAtNIC:
			msg = fmt.Sprintf("rule %s: its police caps on what pods send reach only their subflows through the "+
				"overlay's tunnel %s: their other traffic leaves uncapped", r.Name, tunnel)
		default:
			continue
		}
		out = append(out, Problem{Reason: mptcpv1alpha1.ReasonCapsNotEnforced, Message: msg})
	}
	return out
}

// nicCaps are the caps of a rule that nic_egress enforces, where it must
// tell which pod sent a packet.
type nicCaps int

const (
	noCapsAtNIC nicCaps = iota
	// shapeAtNIC: shape classifies every packet a pod sends there.
	shapeAtNIC
	// policeAtNIC: police caps pods' (or namespaces', or paths') sending
	// there, for what leaves outside subflows.
	policeAtNIC
)

func capsAtNIC(r PlanRule) nicCaps {
	switch {
	case r.Rate == nil:
		return noCapsAtNIC
	case r.Rate.Mode == datapath.RateShape:
		return shapeAtNIC
	case r.Rate.Mode == datapath.RatePolice && r.Rate.Directions&datapath.Egress != 0 &&
		(r.Rate.PerPod > 0 || r.Rate.PerNamespace > 0 || len(r.Rate.PerPath) > 0):
		return policeAtNIC
	}
	return noCapsAtNIC
}

// capsBehindBridge are the problems of the rules whose caps miss pods whose
// host-side veth is a port of a bridge (bridged says so: flannel's cni0,
// the bridge plugin). Their packets reach the NIC from the bridge, not from
// their own interface, so nic_egress cannot tell which pod sent them: shape
// classifies none of them, and police charges only their subflows (at their
// veths). One problem per rule, naming its first such pod.
func capsBehindBridge(rules []PlanRule, pods []PlanPod, bridged func(hostIf string) bool) []Problem {
	// Only pods under a rule with caps at the NIC are looked up (a
	// netlink request each).
	capped := map[string]bool{}
	for _, r := range rules {
		capped[r.Name] = capsAtNIC(r) != noCapsAtNIC
	}
	missed := map[string][]string{}
	for _, p := range pods {
		if !slices.ContainsFunc(p.Rules, func(r string) bool { return capped[r] }) || !bridged(p.HostInterface) {
			continue
		}
		for _, r := range p.Rules {
			missed[r] = append(missed[r], p.Name)
		}
	}
	var out []Problem
	for _, r := range rules {
		names := missed[r.Name]
		if len(names) == 0 {
			continue
		}
		var what string
		switch capsAtNIC(r) {
		case shapeAtNIC:
			what = "its shape caps"
		case policeAtNIC:
			what = "its police caps on what pods send outside their subflows"
		default:
			continue
		}
		out = append(out, Problem{Reason: mptcpv1alpha1.ReasonCapsNotEnforced, Message: fmt.Sprintf(
			"rule %s: %s do not reach %d pod(s) behind a bridge, %s first (the NIC cannot tell which pod sent a packet the "+
				"bridge forwarded); use rate mode window, or police of subflows, on this CNI", r.Name, what, len(names), names[0])})
	}
	return out
}

// Unenforced are the problems of the last reconcile that leave part of an
// enforced plan without effect (capsPastOverlay): the node is enforced, and
// Degraded for them.
func (a *Agent) Unenforced() []Problem { return slices.Clone(a.unenforced) }

// noteUnenforced keeps problems as the last reconcile's and logs them when
// they change.
func (a *Agent) noteUnenforced(problems []Problem) {
	if !slices.Equal(problems, a.unenforced) && len(problems) > 0 {
		a.log.Warn("caps not enforced", "problems", Messages(problems))
	}
	a.unenforced = problems
}
