package agent

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/mptcp-operator/mptcp-operator/internal/agent/shaping"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
)

// A namespace whose pods have a rule with a perNamespace cap has an id on
// the node, kept like the pods' (podids.go) and for the same reason: its
// police bucket (datapath.PodNamespace) and its HTB class on the shaping
// device (shaping.MinorNamespace + id) must not move when other tenants'
// namespaces come and go.
const namespaceIDsFile = "namespace-ids.json"

func newNamespaceIDs() *idTable {
	return &idTable{ByName: map[string]uint32{}, file: namespaceIDsFile, size: shaping.MaxNamespaces, what: "namespace",
		heldBy: "the namespaces of the node's pods with a perNamespace cap"}
}

// capsNamespace says whether rule r caps its pods' namespace (in any mode).
func capsNamespace(r *PlanRule) bool {
	return r != nil && r.Rate != nil && r.Rate.PerNamespace > 0
}

// podRules calls fn with each rule of pod's chain that the datapath holds
// (the first datapath.MaxPodRules) and its place in the chain.
func podRules(plan *Plan, pod PlanPod, fn func(k int, name string, r *PlanRule)) {
	for k, name := range pod.Rules {
		if k >= datapath.MaxPodRules {
			return
		}
		if r := plan.rule(name); r != nil {
			fn(k, name, r)
		}
	}
}

// assignNamespaceIDs gives each namespace whose pods plan caps per
// namespace its id, and frees the ids of the others.
func (a *Agent) assignNamespaceIDs(plan *Plan) (map[string]uint32, error) {
	if a.nsIDs == nil {
		a.nsIDs, _ = newNamespaceIDs().read(a.settings.StateDir)
	}
	var want []string
	for _, pod := range plan.Pods {
		podRules(plan, pod, func(_ int, _ string, r *PlanRule) {
			if capsNamespace(r) && !slices.Contains(want, pod.Ref.Namespace) {
				want = append(want, pod.Ref.Namespace)
			}
		})
	}
	slices.Sort(want)
	ids, err := a.nsIDs.assign(want, nil, nil)
	keep := make(map[string]bool, len(ids))
	for ns := range ids {
		keep[ns] = true
	}
	a.nsIDs.retire(keep, nil)
	if werr := a.nsIDs.write(a.settings.StateDir); werr != nil {
		err = errors.Join(err, fmt.Errorf("keeping the namespace ids: %w", werr))
	}
	return ids, err
}

// syncShaping keeps the namespaces' police buckets, the shaping device's
// and the path NICs' HTB classes (shaping), and asks for nic_egress where
// they are.
func (a *Agent) syncShaping(plan *Plan, ids, podIDs map[string]uint32, budgets map[uint32]datapath.RateBudget, hooks map[datapath.Attachment]bool) error {
	nsIDs, err := a.assignNamespaceIDs(plan)
	errs := []error{err}
	errs = append(errs, a.dp.SyncPodNamespaces(planPodNamespaces(plan, nsIDs)))
	nics, dev := planShaping(plan, ids, podIDs, budgets, nsIDs)
	ifaces, device, err := shaping.Sync(a.dp, nics, dev)
	errs = append(errs, err, a.dp.SetShapeDevice(device))
	for _, iface := range ifaces {
		hooks[datapath.Attachment{Interface: iface, Hook: datapath.HookNICEgress}] = true
	}
	return errors.Join(errs...)
}

// planPodNamespaces puts the addresses of the pods whose police rules cap
// their namespace in their namespace's bucket: one rate per namespace, the
// smallest perNamespace of its pods' police rules on the node (with that
// rule's burst), so that neither more pods nor another policy lift it.
func planPodNamespaces(plan *Plan, nsIDs map[string]uint32) []datapath.PodNamespace {
	type cap struct{ bps, burst uint64 }
	caps := map[string]cap{}
	for _, pod := range plan.Pods {
		podRules(plan, pod, func(_ int, _ string, r *PlanRule) {
			if !capsNamespace(r) || r.Rate.Mode != datapath.RatePolice {
				return
			}
			if c, ok := caps[pod.Ref.Namespace]; !ok || r.Rate.PerNamespace < c.bps {
				caps[pod.Ref.Namespace] = cap{r.Rate.PerNamespace, r.Rate.BurstBytes}
			}
		})
	}
	var out []datapath.PodNamespace
	for _, pod := range plan.Pods {
		c, capped := caps[pod.Ref.Namespace]
		id, ok := nsIDs[pod.Ref.Namespace]
		if !capped || !ok {
			continue
		}
		for _, ip := range pod.IPs {
			out = append(out, datapath.PodNamespace{Pod: ip, ID: id + 1, Bps: c.bps, BurstBytes: c.burst})
		}
	}
	return out
}

// planShaping lists the classes plan wants on each path NIC and on the
// shaping device. On a NIC: for each shaping rule, a class per capped path,
// at most the path's capacity. On the device: a class per namespace whose
// pods' shaping rules cap it (the smallest of their perNamespace), and a
// class per selected pod and shaping rule that caps it per pod or per
// namespace, one queue for all the rule's paths, under its namespace's
// class when the rule caps namespaces: there each pod is assured an equal
// share of the namespace's rate and may borrow up to its own cap (or the
// namespace's), so that the namespace's pods together never pass its rate.
// Classes are their rules' budgets' (rateBudgets, by rule id): the variants
// of a policy share its classes. A pod's classes are numbered by its id
// (podIDs, podids.go), so that other pods coming and going move none of
// them; a pod without an id gets none. No class gets less than
// shaping.MinClassBps (atLeast), and that is no error: a rate HTB refuses
// (under a byte a second) would fail the whole device (every pod's cap) or
// the NIC, where one class a few bits a second above its cap fails nothing
// else; and an error here would fail the node's reconcile, which a tenant
// could then do by running more pods under its namespace's cap.
func planShaping(plan *Plan, ids, podIDs map[string]uint32, budgets map[uint32]datapath.RateBudget, nsIDs map[string]uint32) ([]shaping.NIC, shaping.Device) {
	budgetOf := func(id uint32) uint32 { return budgetID(budgets, id) }
	classes := nicRuleClasses(plan, ids, budgetOf)
	pods, via := podShapeClasses(plan, ids, podIDs, nsIDs, budgetOf)
	dev := deviceClasses(pods, namespaceShapeRates(plan), nsIDs)
	return pathNICs(plan, classes, via), dev
}

// atLeast raises a class's rate to shaping.MinClassBps: planShaping's
// comment says why a rate below it is no error.
func atLeast(bps uint64) uint64 { return max(bps, shaping.MinClassBps) }

// budgetID is the id of the rate budget rule id draws from (rateBudgets):
// its pod budget's when it has one, else its own.
func budgetID(budgets map[uint32]datapath.RateBudget, id uint32) uint32 {
	if b, ok := budgets[id]; ok {
		return b.Pod
	}
	return id
}

// nicRuleClasses gives, by path index, the classes of the shaping rules on
// that path's NIC: one per budget and path, whichever of the budget's
// rules comes first naming its rate.
func nicRuleClasses(plan *Plan, ids map[string]uint32, budgetOf func(uint32) uint32) map[uint32][]shaping.Class {
	classes := map[uint32][]shaping.Class{} // path index -> its NIC's classes
	pathClassOf := map[[2]uint32]bool{}     // budget and path index with a class
	for _, r := range plan.Rules {
		id, ok := ids[r.Name]
		if r.Rate == nil || r.Rate.Mode != datapath.RateShape || !ok {
			continue
		}
		// An HTB class has one rate: a shaping rule's path classes
		// are its pod budget's, not its policy's.
		budget := budgetOf(id)
		for index, bps := range r.Rate.PerPath {
			if pathClassOf[[2]uint32{budget, index}] {
				continue
			}
			pathClassOf[[2]uint32{budget, index}] = true
			classes[index] = append(classes[index], shaping.Class{Minor: shaping.MinorRule + uint16(budget), Bps: bps,
				Entries: []datapath.ShapeClass{{Rule: budget, Path: index}}})
		}
	}
	return classes
}

// namespaceShapeRates gives each namespace whose pods' shaping rules cap
// it the smallest of those rules' perNamespace rates.
func namespaceShapeRates(plan *Plan) map[string]uint64 {
	nsRate := map[string]uint64{}
	for _, pod := range plan.Pods {
		podRules(plan, pod, func(_ int, _ string, r *PlanRule) {
			if capsNamespace(r) && r.Rate.Mode == datapath.RateShape {
				if cur, ok := nsRate[pod.Ref.Namespace]; !ok || r.Rate.PerNamespace < cur {
					nsRate[pod.Ref.Namespace] = r.Rate.PerNamespace
				}
			}
		})
	}
	return nsRate
}

// podShapeClass is a pod's class on the shaping device for one of its
// rules, before deviceClasses shares its namespace's rate out.
type podShapeClass struct {
	shaping.Class
	ns string // its namespace's class is its parent
}

// podShapeClasses lists the device classes of each pod with an id and of
// each of its shaping rules that caps it per pod or per namespace, and the
// path indexes whose NICs must send those pods to the device.
func podShapeClasses(plan *Plan, ids, podIDs, nsIDs map[string]uint32, budgetOf func(uint32) uint32) ([]podShapeClass, map[uint32]bool) {
	var pods []podShapeClass
	via := map[uint32]bool{} // path indexes whose NIC sends pods to the device
	for _, pod := range plan.Pods {
		j, ok := podIDs[podKey(pod)]
		if !ok {
			continue
		}
		podRules(plan, pod, func(k int, name string, r *PlanRule) {
			id, ok := ids[name]
			if !ok || r.Rate == nil || r.Rate.Mode != datapath.RateShape {
				return
			}
			c := podShapeClass{Class: shaping.Class{Minor: shaping.MinorPod + uint16(j*datapath.MaxPodRules+uint32(k)), Bps: r.Rate.PerPod}}
			if c.Bps > 0 {
				c.Bps = atLeast(c.Bps)
			}
			if nid, ok := nsIDs[pod.Ref.Namespace]; ok && capsNamespace(r) {
				c.ns, c.Parent = pod.Ref.Namespace, shaping.MinorNamespace+uint16(nid)
			}
			if c.Bps == 0 && c.ns == "" {
				return // a namespace cap without an id for the namespace: reported by assignNamespaceIDs
			}
			for _, index := range append(slices.Clone(r.Datapath.Paths), r.Datapath.Backup...) {
				via[index] = true
				for _, ip := range pod.IPs {
					c.Entries = append(c.Entries, datapath.ShapeClass{Rule: budgetOf(id), Path: index, Pod: ip})
				}
			}
			pods = append(pods, c)
		})
	}
	return pods, via
}

// deviceClasses lays out the shaping device: a class per namespace with
// pod classes under it (in name order, so that the plan is stable), then
// the pods' classes, those under a namespace given an equal share of its
// rate.
func deviceClasses(pods []podShapeClass, nsRate map[string]uint64, nsIDs map[string]uint32) shaping.Device {
	under := map[string]int{} // pod classes under each namespace's
	for _, c := range pods {
		if c.ns != "" {
			under[c.ns]++
		}
	}
	var dev shaping.Device
	for _, ns := range slices.Sorted(maps.Keys(under)) {
		nsRate[ns] = atLeast(nsRate[ns])
		dev.Classes = append(dev.Classes, shaping.Class{Minor: shaping.MinorNamespace + uint16(nsIDs[ns]), Bps: nsRate[ns]})
	}
	for _, c := range pods {
		if c.ns != "" {
			rate := nsRate[c.ns]
			c.Ceil = rate
			if c.Bps > 0 {
				c.Ceil = min(c.Bps, rate)
			}
			// HTB lets a class send at its own rate whatever its
			// parent has left, so the pods' rates sum to at most
			// the namespace's: none is raised above its share. A
			// share below MinClassBps cannot be given: the pods get
			// MinClassBps, and the namespace may pass its rate
			// by at most MinClassBps a pod, which holds it far
			// closer than leaving its pods unshaped.
			c.Bps = min(max(rate/uint64(under[c.ns]), shaping.MinClassBps), c.Ceil)
		}
		dev.Classes = append(dev.Classes, c.Class)
	}
	return dev
}

// pathNICs gives each of plan's paths its NIC's classes, each at most the
// path's capacity, and whether the NIC sends pods to the shaping device.
func pathNICs(plan *Plan, classes map[uint32][]shaping.Class, via map[uint32]bool) []shaping.NIC {
	nics := make([]shaping.NIC, 0, len(plan.Paths))
	for _, p := range plan.Paths {
		for i := range classes[p.Index] {
			c := &classes[p.Index][i]
			c.Bps = atLeast(capped(c.Bps, p.Capacity))
		}
		nics = append(nics, shaping.NIC{Path: p.Name, Interface: p.Interface, Capacity: p.Capacity, Classes: classes[p.Index], ViaDevice: via[p.Index]})
	}
	return nics
}
