package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
)

// syncRates writes the caps of every rule of plan under its id, and clears
// the caps of ids no rule holds any more. A retired rule that live
// connections still use keeps its caps (retireRules clears them with its
// id) and is kept in its budget, which may have moved.
//
// It returns every capped rule's budget by id (rateBudgets).
func (a *Agent) syncRates(plan *Plan, ids map[string]uint32) (map[uint32]datapath.RateBudget, error) {
	var errs []error
	retired := map[uint32]datapath.RateConfig{}
	keep := map[uint32]bool{}
	for name, id := range a.ruleIDs.ByName {
		if _, current := ids[name]; current {
			continue
		}
		keep[id] = true // retired, still in use
		c, ok, err := a.dp.RateRuleAt(id)
		if err != nil {
			errs = append(errs, err)
		} else if ok {
			retired[id] = c
		}
	}
	budgets, byGroup := rateBudgets(plan, ids, a.ruleIDs.names(), retired, a.rateBudgets)
	a.rateBudgets = byGroup
	for id, c := range retired {
		if err := a.dp.SetRateRule(id, budgets[id], c); err != nil {
			errs = append(errs, fmt.Errorf("retired rule %d: rate: %w", id, err))
		}
	}
	for _, r := range plan.Rules {
		id, ok := ids[r.Name]
		if r.Rate == nil || !ok {
			continue
		}
		if err := a.dp.SetRateRule(id, budgets[id], *r.Rate); err != nil {
			errs = append(errs, fmt.Errorf("rule %q: rate: %w", r.Name, err))
			continue
		}
		keep[id] = true
	}
	capped, err := a.dp.RateRules()
	if err != nil {
		return budgets, errors.Join(append(errs, err)...)
	}
	for _, id := range capped {
		if !keep[id] {
			if err := a.dp.ClearRateRule(id); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return budgets, errors.Join(errs...)
}

// A policy's caps are one budget on a node, however many variants of it
// the node has (compile.RuleName: a tenant's preferred paths, a namespace's
// tighter caps; and a variant retired while its connections live on). Each
// variant is a rule of its own, so without a shared budget every preference
// a tenant writes would bring its pods a new pod bucket and the policy a new
// path bucket and HTB class. So the rules of one policy with the same caps
// keep their pod caps (and shape classes) under one budget, and all the
// rules of one policy in one mode their police path caps under another
// (datapath.RateBudget): a variant with a namespace's tighter caps charges
// its policy's path buckets at its own rates, so that together they never
// pass the policy's cap and the variant alone never passes its own. A
// budget is a rule id of the group's current rules (never freed while it is
// current, so never another policy's meanwhile), which stays the budget for
// as long as it is one of them (a budget that moved would start with fresh
// buckets: a burst more).

// rateBudgets gives each capped rule, by id, its budgets: plan's rules
// (current, ids), and the retired ones still in use (their caps as the
// datapath holds them, names their names by id). prev are the budgets by
// group the last reconcile chose; the second result those of this one.
func rateBudgets(plan *Plan, ids map[string]uint32, names map[uint32]string, retired map[uint32]datapath.RateConfig, prev map[string]uint32) (map[uint32]datapath.RateBudget, map[string]uint32) {
	caps := map[uint32]datapath.RateConfig{} // every capped rule's caps, by id
	current := map[uint32]string{}           // current rules' names, by id
	for _, r := range plan.Rules {
		if id, ok := ids[r.Name]; ok && r.Rate != nil {
			caps[id], current[id] = *r.Rate, r.Name
		}
	}
	for id, c := range retired {
		caps[id] = c
	}
	nameOf := func(id uint32) string {
		if n, ok := current[id]; ok {
			return n
		}
		return names[id]
	}
	chosen := map[string]uint32{}
	pick := func(groupOf func(id uint32) string) map[uint32]uint32 {
		now, old := map[string][]uint32{}, map[string][]uint32{}
		for id := range caps {
			g := groupOf(id)
			if _, ok := current[id]; ok {
				now[g] = append(now[g], id)
			} else {
				old[g] = append(old[g], id)
			}
		}
		budget := map[string]uint32{}
		for _, m := range []map[string][]uint32{now, old} {
			for g, candidates := range m {
				if _, ok := budget[g]; ok {
					continue // a retired rule's group with current rules
				}
				if p, ok := prev[g]; ok && slices.Contains(candidates, p) {
					budget[g] = p
				} else {
					budget[g] = slices.Min(candidates)
				}
				chosen[g] = budget[g]
			}
		}
		out := map[uint32]uint32{}
		for id := range caps {
			out[id] = budget[groupOf(id)]
		}
		return out
	}
	pod := pick(func(id uint32) string { return "pod\x00" + budgetGroup(nameOf(id), caps[id]) })
	path := pick(func(id uint32) string {
		return "path\x00" + policyOfRule(nameOf(id)) + "\x00" + caps[id].Mode.String()
	})
	byID := make(map[uint32]datapath.RateBudget, len(caps))
	for id := range caps {
		byID[id] = datapath.RateBudget{Pod: pod[id], Path: path[id]}
	}
	return byID, chosen
}

// budgetGroup names the budget of rule name with caps c: its policy and its
// caps as the datapath holds them (the burst resolved, directions only for
// police).
func budgetGroup(name string, c datapath.RateConfig) string {
	if c.BurstBytes == 0 {
		c.BurstBytes = datapath.DefaultBurst(c)
	}
	if c.Mode != datapath.RatePolice {
		c.Directions = 0
	}
	if len(c.PerPath) == 0 {
		c.PerPath = nil
	}
	b, _ := json.Marshal(c) // maps marshal with sorted keys
	return policyOfRule(name) + "\x00" + string(b)
}

// policyOfRule is the policy a rule name is a variant of: the name up to
// its '@' (compile.RuleName), the whole name for a rule that is not a
// variant, or one from a node state file.
func policyOfRule(name string) string {
	p, _, _ := strings.Cut(name, "@")
	return p
}

// policeHooks asks for nic_egress on the NICs of the paths of every rule
// that polices what its pods send per pod or per namespace: a pod's packets that no subflow
// entry names (plain TCP, UDP, a connection that fell back) are policed
// there, where their path is known (docs/datapath.md, "Every protocol").
func policeHooks(plan *Plan, hooks map[datapath.Attachment]bool) {
	byIndex := plan.pathsByIndex()
	for _, r := range plan.Rules {
		if c := r.Rate; c == nil || c.Mode != datapath.RatePolice || (c.PerPod == 0 && c.PerNamespace == 0) || c.Directions&datapath.Egress == 0 {
			continue
		}
		for _, index := range append(slices.Clone(r.Datapath.Paths), r.Datapath.Backup...) {
			if p, ok := byIndex[index]; ok && p.Interface != "" {
				hooks[datapath.Attachment{Interface: p.Interface, Hook: datapath.HookNICEgress}] = true
			}
		}
	}
}

// syncPodInterfaces tells the datapath by which host-side interface each
// enforced pod's packets enter the node, so that what a pod sends is charged
// to it whatever source address it writes. A pod whose interface is gone by
// now is left out: it has nothing to send.
func (a *Agent) syncPodInterfaces(plan *Plan) error {
	var want []datapath.PodInterface
	for _, pod := range plan.Pods {
		iface, err := net.InterfaceByName(pod.HostInterface)
		if err != nil {
			continue
		}
		seen := map[bool]bool{} // by family: one address each
		for _, ip := range pod.IPs {
			if v4 := ip.Unmap().Is4(); !seen[v4] {
				seen[v4] = true
				want = append(want, datapath.PodInterface{Ifindex: iface.Index, Addr: ip})
			}
		}
	}
	return a.dp.SyncPodInterfaces(want)
}
