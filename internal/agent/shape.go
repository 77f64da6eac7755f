package agent

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/vishvananda/netlink"

	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
)

// shapeMajor is the handle major of the HTB root qdiscs the agent creates on
// path NICs ("mp"). A root qdisc with another handle belongs to someone else
// (an admin, another tool) and is never replaced or deleted; the kernel's
// default root qdisc (handle 0: noqueue, pfifo_fast, fq_codel, mq) is
// replaced, and comes back by itself when ours is deleted.
const shapeMajor = 0x6d70

// Class minors: the path's own class (its capacity, the parent of the
// others), one per shaping rule on a path, one per pod and path.
const (
	shapeMinorPath = 0x1
	shapeMinorRule = 0x10
	shapeMinorPod  = 0x1000
)

// shapeClass is one HTB class on one NIC and the classification entry that
// feeds it.
type shapeClass struct {
	iface string
	minor uint16
	bps   uint64
	entry datapath.ShapeClass
}

// planShaping lists the classes cfg wants: for each shaping rule, a class
// per capped path on that path's NIC, and a class per selected pod on each
// of the rule's paths' NICs (perPod caps a pod per path: its sending over
// two paths can reach twice the cap; docs/datapath.md).
func planShaping(cfg *Config, paths map[string]Path, ids map[string]uint32) ([]shapeClass, error) {
	var out []shapeClass
	for _, r := range cfg.Rules {
		rule, ok := ids[r.Name]
		if r.Rate == nil || r.Rate.Mode != "shape" || !ok {
			continue
		}
		c, err := r.Rate.datapathConfig(r, paths)
		if err != nil {
			return nil, fmt.Errorf("rule %q: %w", r.Name, err)
		}
		for _, p := range cfg.Paths {
			if rate, ok := c.PerPath[p.Index]; ok {
				out = append(out, shapeClass{iface: p.Interface, minor: shapeMinorRule + uint16(rule), bps: rate,
					entry: datapath.ShapeClass{Rule: rule, Path: p.Index}})
			}
		}
		if c.PerPod == 0 {
			continue
		}
		for j, pod := range cfg.Pods {
			k := slices.Index(pod.ruleNames(), r.Name)
			if k < 0 {
				continue
			}
			// One class per pod and rule: a pod may have several
			// shaping rules (at most datapath.MaxPodRules).
			minor := shapeMinorPod + uint16(j*datapath.MaxPodRules+k)
			for _, name := range append(slices.Clone(r.Paths), r.BackupPaths...) {
				p := paths[name]
				for _, ip := range pod.IPs {
					out = append(out, shapeClass{iface: p.Interface, minor: minor, bps: capped(c.PerPod, p.Capacity),
						entry: datapath.ShapeClass{Rule: rule, Path: p.Index, Pod: ip}})
				}
			}
		}
	}
	return out, nil
}

// applyShaping makes each path NIC's HTB classes and the classification
// table match cfg, and asks for nic_egress on NICs that shape. A NIC that
// no rule shapes any more loses the agent's qdisc.
func (a *Agent) applyShaping(cfg *Config, paths map[string]Path, ids map[string]uint32, wantAttach map[datapath.Attachment]bool) error {
	plan, err := planShaping(cfg, paths, ids)
	if err != nil {
		return err
	}
	var errs []error
	byIface := map[string][]shapeClass{}
	for _, c := range plan {
		byIface[c.iface] = append(byIface[c.iface], c)
	}
	var entries []datapath.ShapeClass
	for _, p := range cfg.Paths {
		classes := byIface[p.Interface]
		if len(classes) == 0 {
			if err := removeShapingOn(p.Interface); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if err := syncHTB(p.Interface, p.Capacity, classes); err != nil {
			errs = append(errs, fmt.Errorf("path %q: shape: %w", p.Name, err))
			continue
		}
		for _, c := range classes {
			c.entry.ClassID = netlink.MakeHandle(shapeMajor, c.minor)
			entries = append(entries, c.entry)
		}
		wantAttach[datapath.Attachment{Interface: p.Interface, Hook: datapath.HookNICEgress}] = true
	}
	if err := a.dp.SyncShapeClasses(entries); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// rootQdisc returns the root qdisc of link, if any.
func rootQdisc(link netlink.Link) (netlink.Qdisc, error) {
	qs, err := netlink.QdiscList(link)
	if err != nil {
		return nil, err
	}
	for _, q := range qs {
		if q.Attrs().Parent == netlink.HANDLE_ROOT {
			return q, nil
		}
	}
	return nil, nil
}

func ours(q netlink.Qdisc) bool {
	return q != nil && q.Type() == "htb" && q.Attrs().Handle == netlink.MakeHandle(shapeMajor, 0)
}

// syncHTB puts the agent's HTB root on iface (unless it is there) and makes
// its classes exactly classes, all children of one class at the path's
// capacity (when it has one), so that together they never let more through
// than the path carries. Unclassified traffic (HTB default 0) is sent
// unshaped.
func syncHTB(iface string, capacity uint64, classes []shapeClass) error {
	link, err := netlink.LinkByName(iface)
	if err != nil {
		return err
	}
	root, err := rootQdisc(link)
	if err != nil {
		return err
	}
	if !ours(root) {
		if root != nil && root.Attrs().Handle != 0 {
			return fmt.Errorf("%s has a root qdisc %s %s the agent did not create: not replacing it",
				iface, root.Type(), netlink.HandleStr(root.Attrs().Handle))
		}
		htb := netlink.NewHtb(netlink.QdiscAttrs{LinkIndex: link.Attrs().Index, Handle: netlink.MakeHandle(shapeMajor, 0), Parent: netlink.HANDLE_ROOT})
		if err := netlink.QdiscReplace(htb); err != nil {
			return fmt.Errorf("adding HTB to %s: %w", iface, err)
		}
	}
	top := netlink.MakeHandle(shapeMajor, 0)
	existing, err := netlink.ClassList(link, top)
	if err != nil {
		return err
	}
	parentOf := map[uint32]uint32{}
	for _, cls := range existing {
		parentOf[cls.Attrs().Handle] = classParent(cls)
	}
	// put creates or changes a class; HTB cannot move a class to another
	// parent, so one under the wrong parent is deleted first.
	put := func(handle, parent uint32, bps uint64) error {
		if old, ok := parentOf[handle]; ok && old != parent {
			if err := netlink.ClassDel(netlink.NewHtbClass(netlink.ClassAttrs{LinkIndex: link.Attrs().Index, Parent: old, Handle: handle}, netlink.HtbClassAttrs{})); err != nil {
				return fmt.Errorf("moving HTB class %s on %s: %w", netlink.HandleStr(handle), iface, err)
			}
		}
		parentOf[handle] = parent
		cls := netlink.NewHtbClass(netlink.ClassAttrs{LinkIndex: link.Attrs().Index, Parent: parent, Handle: handle},
			netlink.HtbClassAttrs{Rate: bps, Ceil: bps})
		if err := netlink.ClassReplace(cls); err != nil {
			return fmt.Errorf("HTB class %s on %s: %w", netlink.HandleStr(handle), iface, err)
		}
		return nil
	}
	want := map[uint32]bool{}
	parent := top
	if capacity > 0 {
		parent = netlink.MakeHandle(shapeMajor, shapeMinorPath)
		want[parent] = true
		if err := put(parent, top, capacity); err != nil {
			return err
		}
	}
	for _, c := range classes {
		handle := netlink.MakeHandle(shapeMajor, c.minor)
		if want[handle] {
			continue // a pod's second address: same class
		}
		want[handle] = true
		if err := put(handle, parent, c.bps); err != nil {
			return err
		}
	}
	// Children before their parent: HTB refuses to delete a class that
	// still has some.
	slices.SortFunc(existing, func(a, b netlink.Class) int {
		return cmp.Compare(b.Attrs().Handle&0xffff, a.Attrs().Handle&0xffff)
	})
	for _, cls := range existing {
		if h := cls.Attrs().Handle; !want[h] && h>>16 == shapeMajor {
			if err := netlink.ClassDel(cls); err != nil {
				return fmt.Errorf("removing HTB class %s from %s: %w", netlink.HandleStr(h), iface, err)
			}
		}
	}
	return nil
}

// classParent is the handle of cls's parent: the kernel reports a class
// directly under the qdisc with TC_H_ROOT.
func classParent(cls netlink.Class) uint32 {
	if p := cls.Attrs().Parent; p != netlink.HANDLE_ROOT {
		return p
	}
	return netlink.MakeHandle(shapeMajor, 0)
}

// removeShapingOn deletes the agent's HTB root from iface; any other qdisc
// stays. A missing interface has nothing to remove.
func removeShapingOn(iface string) error {
	link, err := netlink.LinkByName(iface)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return err
	}
	root, err := rootQdisc(link)
	if err != nil || !ours(root) {
		return err
	}
	return netlink.QdiscDel(root)
}

// removeShaping deletes the agent's qdiscs from every path NIC of cfg.
func removeShaping(cfg *Config) error {
	var errs []error
	for _, p := range cfg.Paths {
		if err := removeShapingOn(p.Interface); err != nil {
			errs = append(errs, fmt.Errorf("path %q: %w", p.Name, err))
		}
	}
	return errors.Join(errs...)
}
