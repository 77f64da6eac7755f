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
