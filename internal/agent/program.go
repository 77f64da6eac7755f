package agent

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"

	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
)

// Programming the datapath: the path NICs, the rules under their ids, and
// the programs on their hooks. (Caps: rate.go; endpoints: syncPods.)

// syncNICs declares each path's NIC to the datapath and marks a path down
// when its NIC is missing or has no carrier (at this reconcile; between
// reconciles link events do it, linkChanged) or flaps (held down by the
// damper), and asks for nic_ingress on each NIC, and nic_egress where the
// CNI may route its pods' packets in BPF, past the policy routing the marks
// select (steerAtEdge: nic_egress sends a subflow's packet on to its path's
// NIC). A path away from its link is down.
func (a *Agent) syncNICs(plan *Plan, hooks map[datapath.Attachment]bool, steerAtEdge bool) error {
	var errs []error
	a.linkMu.Lock()
	defer a.linkMu.Unlock()
	nics := map[string]nicInForce{}
	defer func() { a.nics.Store(&nics) }()
	named := map[uint32]bool{}
	for _, p := range plan.Paths {
		iface, err := net.InterfaceByName(p.Interface)
		if err != nil {
			errs = append(errs, fmt.Errorf("path %q: %w", p.Name, err))
			// Index 0: when a NIC of that name appears, its event
			// asks for a reconcile, which programs it.
			n := nics[p.Interface]
			n.paths, n.down = append(n.paths, p.Index), true
			nics[p.Interface] = n
			// No NIC: spread must not place new subflows on the path.
			if err := a.setPathDown(p.Index, true); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if err := a.dp.SetNIC(iface.Index, p.Index); err != nil {
			errs = append(errs, err)
		}
		named[p.Index] = true
		if err := a.dp.SetPathNIC(p.Index, iface.Index, p.Gateway); err != nil {
			errs = append(errs, err)
		}
		if steerAtEdge {
			hooks[datapath.Attachment{Interface: p.Interface, Hook: datapath.HookNICEgress}] = true
		}
		down := !a.usable(p.Interface, iface.Flags&net.FlagRunning != 0)
		n := nics[p.Interface]
		n.index, n.down, n.gateway = iface.Index, down, p.Gateway
		n.paths = append(n.paths, p.Index)
		nics[p.Interface] = n
		if err := a.setPathDown(p.Index, down); err != nil {
			errs = append(errs, err)
		}
		hooks[datapath.Attachment{Interface: p.Interface, Hook: datapath.HookNICIngress}] = true
	}
	// A path away from its link is down until the reconcile that finds
	// the link programs it: then it is back for the path managers too.
	for _, p := range plan.Awaiting {
		if !p.Away {
			continue
		}
		if err := a.setPathDown(p.Index, true); err != nil {
			errs = append(errs, err)
		}
	}
	// Paths without a NIC here are sent nowhere at the edge.
	for path := uint32(1); path <= datapath.MaxPaths; path++ {
		if !named[path] {
			if err := a.dp.SetPathNIC(path, 0, netip.Addr{}); err != nil {
				errs = append(errs, err)
			}
		}
	}
	a.forgetPathsLeft(plan)
	return errors.Join(errs...)
}

// syncRules writes each rule under its id: before any pod points at it,
// and in place when its name already had the id.
func (a *Agent) syncRules(plan *Plan, ids map[string]uint32) error {
	var errs []error
	for _, r := range plan.Rules {
		id, ok := ids[r.Name]
		if !ok {
			continue
		}
		if err := a.dp.SetRule(id, r.Datapath); err != nil {
			errs = append(errs, fmt.Errorf("rule %q: %w", r.Name, err))
		}
	}
	return errors.Join(errs...)
}

// syncHooks attaches the programs hooks wants and detaches the agent's
// others (a pod released, a NIC that no longer shapes).
func (a *Agent) syncHooks(hooks map[datapath.Attachment]bool) error {
	var errs []error
	for att := range hooks {
		if err := a.dp.Attach(att); err != nil {
			errs = append(errs, err)
		}
	}
	atts, err := a.dp.Attachments()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, att := range atts {
		if !hooks[att] {
			if err := a.dp.Detach(att); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// Prior is what the node holds before the next plan (FromNodeState): the
// pods it enforces, the names that hold a rule id and the ids live
// connections use that no name holds. While the table is still to be adopted from the pins (the first
// start of a release that keeps one), the ids live connections use are
// the ones the plan's rules adopt, and are not counted apart.
func (a *Agent) Prior() (Prior, error) {
	var live map[uint32]bool
	if !a.adopt {
		var err error
		if live, err = liveRuleIDs(a.dp); err != nil {
			return Prior{}, fmt.Errorf("reading the rule ids live connections use: %w", err)
		}
	}
	p := priorOf(a.ruleIDs, live)
	// The pods of the last plan reconciled (at start: the previous
	// process's), those it could not configure left out.
	if a.previous != nil {
		p.Pods = make(map[PodRef]bool, len(a.previous.Pods))
		for _, pod := range a.previous.Pods {
			p.Pods[pod.Ref] = true
		}
		p.Paths = pathsInForce(a.previous)
	}
	return p, nil
}

// pathsInForce are plan's paths that have a link, and those away from
// theirs, by name: a path among them whose link is missing at the next
// reconcile is away (AwaitingPath.Away).
func pathsInForce(plan *Plan) map[string]bool {
	in := map[string]bool{}
	for _, path := range plan.Paths {
		in[path.Name] = true
	}
	for _, path := range plan.Awaiting {
		if path.Away {
			in[path.Name] = true
		}
	}
	return in
}

// priorOf is what table and the ids live entries use (live) take.
func priorOf(table *ruleIDs, live map[uint32]bool) Prior {
	p := Prior{HeldRules: slices.Sorted(maps.Keys(table.ByName))}
	named := table.names()
	for id := range live {
		if _, ok := named[id]; !ok {
			p.HeldIDs++
		}
	}
	return p
}

// assignRuleIDs gives each rule of plan its datapath id (ruleids.go).
func (a *Agent) assignRuleIDs(plan *Plan) (map[string]uint32, error) {
	live, err := liveRuleIDs(a.dp)
	if err != nil {
		return nil, fmt.Errorf("reading the rule ids live connections use: %w", err)
	}
	var adopt map[string]uint32
	if a.adopt {
		adopt = adoptedRuleIDs(a.dp, plan)
	}
	want := make([]string, 0, len(plan.Rules))
	for _, r := range plan.Rules {
		want = append(want, r.Name)
	}
	ids, err := a.ruleIDs.assign(want, adopt, live)
	if werr := a.ruleIDs.write(a.settings.StateDir); werr != nil {
		err = errors.Join(err, fmt.Errorf("keeping the rule ids: %w", werr))
	}
	a.adopt = false
	return ids, err
}

// retireRules frees the ids of rules plan no longer has once no live
// subflow or connection uses them (their closed ones forgotten first), and
// clears their datapath entries; until then a retired rule's entries stay
// as they were, so its connections keep its paths and caps.
func (a *Agent) retireRules(plan *Plan, current map[string]uint32, view *sweepView) error {
	ids := map[uint32]bool{}
	want := map[string]bool{}
	for name, id := range current {
		ids[id], want[name] = true, true
	}
	err := a.sweepRetiredRules(plan, ids, view)
	live, lerr := liveRuleIDs(a.dp)
	if lerr != nil {
		return errors.Join(err, lerr)
	}
	errs := []error{err}
	for _, id := range a.ruleIDs.retire(want, live) {
		errs = append(errs, a.dp.DeleteRule(id), a.dp.ClearRateRule(id))
	}
	if werr := a.ruleIDs.write(a.settings.StateDir); werr != nil {
		errs = append(errs, fmt.Errorf("keeping the rule ids: %w", werr))
	}
	return errors.Join(errs...)
}
