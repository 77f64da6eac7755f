// Package shaping keeps the HTB qdiscs the rate actor's shape mode needs:
// on the paths' NICs the agent's own root (handle 6d70:), one class at each
// path's capacity, and under it the classes of the rules' path caps; on the
// node's shaping device (an ifb, Device) the classes of the namespaces' and
// pods' caps, one queue for all of a pod's paths. A NIC that carries pods'
// shaped traffic has a class (MinorViaDevice) whose filter redirects it to
// the device, which gives it back to the NIC when its class lets it go. The
// datapath's nic_egress sends each packet to its class. Only the kernel's
// default root qdisc is ever replaced, and only the agent's own is ever
// deleted.
package shaping

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
)

// shapeMajor is the handle major of the HTB root qdiscs the agent creates on
// path NICs ("mp"). A root qdisc with another handle belongs to someone else
// (an admin, another tool) and is never replaced or deleted; the kernel's
// default root qdisc (handle 0: noqueue, pfifo_fast, fq_codel, mq) is
// replaced, and comes back by itself when ours is deleted.
const shapeMajor = 0x6d70

// Class minors. On a NIC: the path's own class (its capacity, the parent of
// the others), the class that redirects to the shaping device and its one
// child (where what the device gives back goes), one per shaping rule on a
// path. On the shaping device: one per namespace, one per pod and rule.
// (SHAPE_MINOR_VIA_IFB and SHAPE_MINOR_FROM_IFB of bpf/include/rate.h are
// MinorViaDevice and minorFromDevice.)
const (
	shapeMinorPath         = 0x1
	MinorViaDevice         = 0x2
	minorFromDevice        = 0x3
	MinorRule              = 0x10
	MinorNamespace         = 0x200
	MinorPod               = 0x1000
	MaxNamespaces          = MinorPod - MinorNamespace
	DeviceName             = "mptcp-shape"
	deviceQueue            = 1000  // packets: the ifb's default, 32, drops a GSO burst
	unboundedBps    uint64 = 100e9 // the via-device classes of a path without a capacity
	// MinClassBps is the least rate a class is given: HTB counts whole
	// bytes a second, and below about 6 of them a class's burst (an MTU's
	// time at its rate, in 32 bits of scheduler ticks) wraps around.
	MinClassBps uint64 = 8 * 8
)

// Class is one HTB class and the classification entries that send packets
// to it (nic_egress reads them).
type Class struct {
	// Minor is the class's minor handle: MinorRule+rule id for a rule's
	// cap on a path, MinorNamespace+n for a namespace's, MinorPod+n for a
	// pod's (n from the pod's id, which does not move while the pod is
	// there, and its rule).
	Minor uint16
	// Parent is the minor of the class's parent, 0 for the default (the
	// path's capacity class on a NIC, the root on the device).
	Parent uint16
	// Bps is the class's rate (what it is assured), Ceil its ceiling
	// (what it may borrow up to from its parent; 0: Bps), in bits per
	// second.
	Bps, Ceil uint64
	Entries   []datapath.ShapeClass
}

// NIC is a path NIC and the classes it shapes.
type NIC struct {
	Path      string
	Interface string
	// Capacity is the path's: its classes are children of one class at
	// the capacity (0: of the root).
	Capacity uint64
	Classes  []Class
	// ViaDevice: pods' traffic leaves this NIC through the shaping
	// device, which holds their classes.
	ViaDevice bool
}

// Device is what the node's shaping device holds: the namespaces' and
// pods' classes. Without classes there is no device.
type Device struct {
	Classes []Class
}

// Sync makes the shaping device's and each NIC's HTB classes, and the
// datapath's classification table, match dev and nics. It returns the
// interfaces nic_egress must run on (the NICs that shape, and the device)
// and the device's ifindex (0: none). A NIC without classes loses the
// agent's qdisc, and a plan without device classes the device. A device
// that cannot be made (no ifb module, another link by its name) is an error
// (the node reports it), and the NICs keep only their path classes.
func Sync(dp *datapath.Datapath, nics []NIC, dev Device) (shaping []string, device int, err error) {
	var errs []error
	var entries []datapath.ShapeClass
	add := func(cs []Class) {
		for _, c := range cs {
			for _, e := range c.Entries {
				e.ClassID = netlink.MakeHandle(shapeMajor, c.Minor)
				entries = append(entries, e)
			}
		}
	}
	if len(dev.Classes) > 0 {
		link, err := ensureDevice()
		if err == nil {
			err = syncHTB(DeviceName, 0, dev.Classes)
		}
		if err != nil {
			// Without the device no pod's class is anywhere: say
			// what that leaves unenforced, not only what failed.
			errs = append(errs, fmt.Errorf("shaping device: %w: the pods' perPod and perNamespace shape caps do not hold on this node (perPath ones do)", err))
		} else {
			device = link.Attrs().Index
			add(dev.Classes)
			shaping = append(shaping, DeviceName)
		}
	}
	for _, n := range nics {
		if len(n.Classes) == 0 && (!n.ViaDevice || device == 0) {
			if err := RemoveFrom(n.Interface); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		classes := n.Classes
		via := n.ViaDevice && device != 0
		if !via {
			// Before its classes go: HTB keeps a class a filter
			// is bound to.
			if err := syncRedirect(n.Interface, false, 0); err != nil {
				errs = append(errs, fmt.Errorf("path %q: shape: %w", n.Path, err))
				continue
			}
		}
		if via {
			bps := n.Capacity
			if bps == 0 {
				bps = unboundedBps
			}
			classes = append([]Class{{Minor: MinorViaDevice, Bps: bps}, {Minor: minorFromDevice, Parent: MinorViaDevice, Bps: bps}}, classes...)
		}
		if err := syncHTB(n.Interface, n.Capacity, classes); err != nil {
			errs = append(errs, fmt.Errorf("path %q: shape: %w", n.Path, err))
			continue
		}
		if err := syncRedirect(n.Interface, via, device); via && err != nil {
			errs = append(errs, fmt.Errorf("path %q: shape: %w", n.Path, err))
			continue
		}
		add(n.Classes)
		shaping = append(shaping, n.Interface)
	}
	if device == 0 {
		if err := RemoveDevice(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := dp.SyncShapeClasses(entries); err != nil {
		errs = append(errs, err)
	}
	return shaping, device, errors.Join(errs...)
}

// ensureDevice creates the shaping device (an ifb: what is sent to it is
// queued by its root qdisc, then given back to the interface it came from)
// unless it is there, and sets it up.
func ensureDevice() (netlink.Link, error) {
	link, err := netlink.LinkByName(DeviceName)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return nil, err
		}
		ifb := &netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: DeviceName, TxQLen: deviceQueue}}
		if err := netlink.LinkAdd(ifb); err != nil {
			return nil, fmt.Errorf("adding %s: %w", DeviceName, err)
		}
		if link, err = netlink.LinkByName(DeviceName); err != nil {
			return nil, err
		}
	}
	if link.Type() != "ifb" {
		return nil, fmt.Errorf("%s is a %s the agent did not create", DeviceName, link.Type())
	}
	if link.Attrs().Flags&unix.IFF_UP == 0 {
		if err := netlink.LinkSetUp(link); err != nil {
			return nil, err
		}
	}
	return link, nil
}

// RemoveDevice deletes the shaping device, if there is one.
func RemoveDevice() error {
	link, err := netlink.LinkByName(DeviceName)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return err
	}
	if link.Type() != "ifb" {
		return nil
	}
	return netlink.LinkDel(link)
}

// syncRedirect keeps the filter of iface's MinorViaDevice class: every
// packet nic_egress sends to that class goes to the shaping device (mirred
// redirect), and comes back to the class's child, where nic_egress sends
// what the device gives back unless its rule's path class takes it (the
// device leaves its pod's class in skb->priority, which the NIC lacks).
// Without via, there is none.
func syncRedirect(iface string, via bool, device int) error {
	link, err := netlink.LinkByName(iface)
	if err != nil {
		return err
	}
	parent := netlink.MakeHandle(shapeMajor, MinorViaDevice)
	filters, err := netlink.FilterList(link, parent)
	if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
		return err
	}
	ok := false
	for _, f := range filters {
		if u, isU32 := f.(*netlink.U32); via && isU32 && !ok && len(u.Actions) == 1 {
			if m, isMirred := u.Actions[0].(*netlink.MirredAction); isMirred && m.Ifindex == device && u.ClassId == netlink.MakeHandle(shapeMajor, minorFromDevice) {
				ok = true
				continue
			}
		}
		if err := netlink.FilterDel(f); err != nil {
			return fmt.Errorf("removing a filter of %s: %w", iface, err)
		}
	}
	if !via || ok {
		return nil
	}
	f := &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: link.Attrs().Index, Parent: parent, Priority: 1, Protocol: unix.ETH_P_ALL},
		ClassId:     netlink.MakeHandle(shapeMajor, minorFromDevice),
		Sel:         &netlink.TcU32Sel{Flags: netlink.TC_U32_TERMINAL, Nkeys: 1, Keys: []netlink.TcU32Key{{}}},
		Actions:     []netlink.Action{netlink.NewMirredAction(device)},
	}
	if err := netlink.FilterAdd(f); err != nil {
		return fmt.Errorf("redirecting %s's pods to %s: %w", iface, DeviceName, err)
	}
	return nil
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
	if err := ensureHTBRoot(link); err != nil {
		return err
	}
	existing, err := netlink.ClassList(link, netlink.MakeHandle(shapeMajor, 0))
	if err != nil {
		return err
	}
	tree := htbTree{link: link, parentOf: map[uint32]uint32{}}
	for _, cls := range existing {
		tree.parentOf[cls.Attrs().Handle] = classParent(cls)
	}
	want, err := tree.putAll(capacity, classes)
	if err != nil {
		return err
	}
	return removeClassesNotIn(link, existing, want)
}

// ensureHTBRoot puts the agent's HTB root on link unless it is there; it
// never replaces a root qdisc another tool made.
func ensureHTBRoot(link netlink.Link) error {
	root, err := rootQdisc(link)
	if err != nil || ours(root) {
		return err
	}
	iface := link.Attrs().Name
	if root != nil && root.Attrs().Handle != 0 {
		return fmt.Errorf("%s has a root qdisc %s %s the agent did not create: not replacing it",
			iface, root.Type(), netlink.HandleStr(root.Attrs().Handle))
	}
	htb := netlink.NewHtb(netlink.QdiscAttrs{LinkIndex: link.Attrs().Index, Handle: netlink.MakeHandle(shapeMajor, 0), Parent: netlink.HANDLE_ROOT})
	if err := netlink.QdiscReplace(htb); err != nil {
		return fmt.Errorf("adding HTB to %s: %w", iface, err)
	}
	return nil
}

// htbTree is the agent's HTB classes on a link, by the parent each has.
type htbTree struct {
	link     netlink.Link
	parentOf map[uint32]uint32
}

// putAll puts the path's class at capacity (when it has one) and classes
// under it, and returns the handles it put.
func (tree htbTree) putAll(capacity uint64, classes []Class) (map[uint32]bool, error) {
	top := netlink.MakeHandle(shapeMajor, 0)
	want := map[uint32]bool{}
	parent := top
	if capacity > 0 {
		parent = netlink.MakeHandle(shapeMajor, shapeMinorPath)
		want[parent] = true
		if err := tree.put(parent, top, capacity, capacity); err != nil {
			return nil, err
		}
	}
	for _, c := range classes {
		handle := netlink.MakeHandle(shapeMajor, c.Minor)
		if want[handle] {
			continue // a pod's second address: same class
		}
		want[handle] = true
		p := parent
		if c.Parent != 0 {
			p = netlink.MakeHandle(shapeMajor, c.Parent)
		}
		ceil := c.Ceil
		if ceil == 0 {
			ceil = c.Bps
		}
		if err := tree.put(handle, p, c.Bps, ceil); err != nil {
			return nil, err
		}
	}
	return want, nil
}

// put creates or changes a class; HTB cannot move a class to another
// parent, so one under the wrong parent is deleted first.
func (tree htbTree) put(handle, parent uint32, bps, ceil uint64) error {
	index, iface := tree.link.Attrs().Index, tree.link.Attrs().Name
	if old, ok := tree.parentOf[handle]; ok && old != parent {
		if err := netlink.ClassDel(netlink.NewHtbClass(netlink.ClassAttrs{LinkIndex: index, Parent: old, Handle: handle}, netlink.HtbClassAttrs{})); err != nil {
			return fmt.Errorf("moving HTB class %s on %s: %w", netlink.HandleStr(handle), iface, err)
		}
	}
	tree.parentOf[handle] = parent
	cls := netlink.NewHtbClass(netlink.ClassAttrs{LinkIndex: index, Parent: parent, Handle: handle},
		netlink.HtbClassAttrs{Rate: bps, Ceil: ceil})
	if err := netlink.ClassReplace(cls); err != nil {
		return fmt.Errorf("HTB class %s on %s: %w", netlink.HandleStr(handle), iface, err)
	}
	return nil
}

// removeClassesNotIn deletes the agent's classes of existing that want
// lacks, children before their parent: HTB refuses to delete a class that
// still has some. (Minors grow from parents to children.)
func removeClassesNotIn(link netlink.Link, existing []netlink.Class, want map[uint32]bool) error {
	slices.SortFunc(existing, func(a, b netlink.Class) int {
		return cmp.Compare(b.Attrs().Handle&0xffff, a.Attrs().Handle&0xffff)
	})
	for _, cls := range existing {
		if h := cls.Attrs().Handle; !want[h] && h>>16 == shapeMajor {
			if err := netlink.ClassDel(cls); err != nil {
				return fmt.Errorf("removing HTB class %s from %s: %w", netlink.HandleStr(h), link.Attrs().Name, err)
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
