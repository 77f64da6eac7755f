// Package shaping keeps the HTB qdiscs the rate actor's shape mode needs on
// the paths' NICs: the agent's own root (handle 6d70:), one class at each
// path's capacity, and under it the classes of the rules' and pods' caps;
// the datapath's nic_egress sends each packet to its class. Only the
// kernel's default root qdisc is ever replaced, and only the agent's own is
// ever deleted.
package shaping

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
	MinorRule      = 0x10
	MinorPod       = 0x1000
)

// Class is one HTB class on a path's NIC and the classification entry that
// sends packets to it (nic_egress reads the entry).
type Class struct {
	// Minor is the class's minor handle: MinorRule+rule id for a rule's
	// cap on the path, MinorPod+n for a pod's (n from the pod's id, which
	// does not move while the pod is there, and its rule).
	Minor uint16
	// Bps is the class's rate and ceiling, in bits per second.
	Bps   uint64
	Entry datapath.ShapeClass
}

// NIC is a path NIC and the classes it shapes.
type NIC struct {
	Path      string
	Interface string
	// Capacity is the path's: its classes are children of one class at
	// the capacity (0: of the root).
	Capacity uint64
	Classes  []Class
}

// Sync makes each NIC's HTB classes and the datapath's classification
// table match nics, and returns the NICs that shape (nic_egress must run on
// them). A NIC without classes loses the agent's qdisc.
func Sync(dp *datapath.Datapath, nics []NIC) (shaping []string, err error) {
	var errs []error
	var entries []datapath.ShapeClass
	for _, n := range nics {
		if len(n.Classes) == 0 {
			if err := RemoveFrom(n.Interface); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if err := syncHTB(n.Interface, n.Capacity, n.Classes); err != nil {
			errs = append(errs, fmt.Errorf("path %q: shape: %w", n.Path, err))
			continue
		}
		for _, c := range n.Classes {
			c.Entry.ClassID = netlink.MakeHandle(shapeMajor, c.Minor)
			entries = append(entries, c.Entry)
		}
		shaping = append(shaping, n.Interface)
	}
	if err := dp.SyncShapeClasses(entries); err != nil {
		errs = append(errs, err)
	}
	return shaping, errors.Join(errs...)
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
func syncHTB(iface string, capacity uint64, classes []Class) error {
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
		handle := netlink.MakeHandle(shapeMajor, c.Minor)
		if want[handle] {
			continue // a pod's second address: same class
		}
		want[handle] = true
		if err := put(handle, parent, c.Bps); err != nil {
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

// RemoveFrom deletes the agent's HTB root from iface; any other qdisc
// stays. A missing interface has nothing to remove.
func RemoveFrom(iface string) error {
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
