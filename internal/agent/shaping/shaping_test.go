package shaping

import (
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// A path's capacity bounds the shaping on its NIC: the classes are all
// children of one class at the capacity, so together they never let more
// through than the path carries. Without a capacity the classes hang from
// the root again. (That each class alone is at most the capacity is the
// agent's plan: TestShapingPlanBoundsEveryClassByThePathsCapacity.)
func TestShapingStaysWithinThePathsCapacity(t *testing.T) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 1, NICs: 1, PodsPerNode: 1})
	node := bed.Node(1)
	plan := []Class{{Minor: MinorRule + 3, Bps: 20_000_000}, {Minor: MinorPod, Bps: 20_000_000}}
	classes := func() map[uint32]netlink.Class {
		link, err := netlink.LinkByName("nic1")
		if err != nil {
			t.Fatal(err)
		}
		list, err := netlink.ClassList(link, netlink.MakeHandle(shapeMajor, 0))
		if err != nil {
			t.Fatal(err)
		}
		out := map[uint32]netlink.Class{}
		for _, c := range list {
			out[c.Attrs().Handle] = c
		}
		return out
	}
	top, path := netlink.MakeHandle(shapeMajor, 0), netlink.MakeHandle(shapeMajor, shapeMinorPath)
	err := netnsutil.Do("/var/run/netns/"+node.NetNS, func() error {
		if err := syncHTB("nic1", 20_000_000, plan); err != nil {
			return err
		}
		got := classes()
		if c, ok := got[path].(*netlink.HtbClass); !ok || classParent(c) != top || c.Ceil != 20_000_000/8 {
			t.Errorf("path class %+v, want one under the root at 20 Mbit/s", got[path])
		}
		for _, c := range plan {
			if h := netlink.MakeHandle(shapeMajor, c.Minor); got[h] == nil || classParent(got[h]) != path {
				t.Errorf("class %s: %+v, want it under the path's class", netlink.HandleStr(h), got[h])
			}
		}
		// Capacity gone: the classes move back under the root.
		if err := syncHTB("nic1", 0, plan); err != nil {
			return err
		}
		got = classes()
		if got[path] != nil {
			t.Errorf("path class left after its capacity went: %+v", got[path])
		}
		for _, c := range plan {
			if h := netlink.MakeHandle(shapeMajor, c.Minor); got[h] == nil || classParent(got[h]) != top {
				t.Errorf("class %s: %+v, want it under the root", netlink.HandleStr(h), got[h])
			}
		}
		return RemoveFrom("nic1")
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A pod's and a namespace's classes are on the shaping device, and a NIC
// that carries pods' shaped traffic redirects the packets nic_egress sends
// to its class MinorViaDevice there (one filter, mirred to the device),
// and takes what the device gives back in that class's child. When no pod
// is shaped any more, the filter, those classes and the device go, and the
// NIC keeps its path classes.
func TestShapingSendsPodsThroughTheDevice(t *testing.T) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 1, NICs: 1, PodsPerNode: 1})
	node := bed.Node(1)
	path := []Class{{Minor: MinorRule + 3, Bps: 20_000_000}}
	dev := Device{Classes: []Class{{Minor: MinorNamespace, Bps: 30_000_000}, {Minor: MinorPod, Parent: MinorNamespace, Bps: 15_000_000, Ceil: 20_000_000}}}
	err := netnsutil.Do("/var/run/netns/"+node.NetNS, func() error {
		link, err := ensureDevice()
		if err != nil {
			return err
		}
		t.Cleanup(func() { _ = netnsutil.Do("/var/run/netns/"+node.NetNS, RemoveDevice) })
		if err := syncHTB(DeviceName, 0, dev.Classes); err != nil {
			return err
		}
		device := link.Attrs().Index
		nic := NIC{Path: "p", Interface: "nic1", Capacity: 50_000_000, Classes: path, ViaDevice: true}
		classes := []Class{{Minor: MinorViaDevice, Bps: nic.Capacity}, {Minor: minorFromDevice, Parent: MinorViaDevice, Bps: nic.Capacity}}
		if err := syncHTB("nic1", nic.Capacity, append(classes, path...)); err != nil {
			return err
		}
		if err := syncRedirect("nic1", true, device); err != nil {
			return err
		}
		// Twice: the second finds the filter in place.
		if err := syncRedirect("nic1", true, device); err != nil {
			return err
		}
		nicLink, err := netlink.LinkByName("nic1")
		if err != nil {
			return err
		}
		filters, err := netlink.FilterList(nicLink, netlink.MakeHandle(shapeMajor, MinorViaDevice))
		if err != nil {
			return err
		}
		if len(filters) != 1 {
			t.Fatalf("filters on the via-device class: %+v, want one", filters)
		}
		u, ok := filters[0].(*netlink.U32)
		if !ok || len(u.Actions) != 1 || u.ClassId != netlink.MakeHandle(shapeMajor, minorFromDevice) {
			t.Fatalf("filter %+v, want a u32 to %s with one action", filters[0], netlink.HandleStr(netlink.MakeHandle(shapeMajor, minorFromDevice)))
		}
		if m, ok := u.Actions[0].(*netlink.MirredAction); !ok || m.Ifindex != device || m.MirredAction != netlink.TCA_EGRESS_REDIR {
			t.Errorf("action %+v, want a redirect to %s (ifindex %d)", u.Actions[0], DeviceName, device)
		}
		devClasses, err := netlink.ClassList(link, netlink.MakeHandle(shapeMajor, 0))
		if err != nil {
			return err
		}
		got := map[uint32]uint32{}
		for _, c := range devClasses {
			got[c.Attrs().Handle] = classParent(c)
		}
		pod, ns := netlink.MakeHandle(shapeMajor, MinorPod), netlink.MakeHandle(shapeMajor, MinorNamespace)
		if got[pod] != ns || got[ns] != netlink.MakeHandle(shapeMajor, 0) {
			t.Errorf("device classes by parent %v, want the pod's under the namespace's under the root", got)
		}
		// No pod shaped any more: the filter before its classes.
		if err := syncRedirect("nic1", false, 0); err != nil {
			return err
		}
		if err := syncHTB("nic1", nic.Capacity, path); err != nil {
			return err
		}
		if filters, _ := netlink.FilterList(nicLink, netlink.MakeHandle(shapeMajor, MinorViaDevice)); len(filters) != 0 {
			t.Errorf("filters left: %+v", filters)
		}
		if err := RemoveDevice(); err != nil {
			return err
		}
		if _, err := netlink.LinkByName(DeviceName); err == nil {
			t.Error("the shaping device is still there")
		}
		return RemoveFrom("nic1")
	})
	if err != nil {
		t.Fatal(err)
	}
}
