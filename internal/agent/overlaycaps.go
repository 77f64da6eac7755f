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
		if r.Rate == nil {
			continue
		}
		var msg string
		switch {
		case r.Rate.Mode == datapath.RateShape:
			msg = fmt.Sprintf("rule %s: its shape caps do not reach what the overlay's tunnel %s encapsulates "+
				"(the NIC's classifier sees outer packets only); use rate mode police or window on this CNI", r.Name, tunnel)
		case r.Rate.Mode == datapath.RatePolice && r.Rate.Directions&datapath.Egress != 0 &&
			(r.Rate.PerPod > 0 || r.Rate.PerNamespace > 0 || len(r.Rate.PerPath) > 0):
			msg = fmt.Sprintf("rule %s: its police caps on what pods send reach only their subflows through the "+
				"overlay's tunnel %s: their other traffic leaves uncapped", r.Name, tunnel)
		default:
			continue
		}
		out = append(out, Problem{Reason: mptcpv1alpha1.ReasonCapsNotEnforced, Message: msg})
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
