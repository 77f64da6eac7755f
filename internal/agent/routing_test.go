package agent

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/mptcp-operator/mptcp-operator/hack/testbed"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
)

// A path's index is its mark's value and its table's offset: path i's rule
// is "fwmark i<<shift lookup tableBase+i". A node routed by a release that
// numbered paths from 0 (mark i, table tableBase+i-1) moves to that without
// a single step, among all the rule and route changes, at which a packet of
// any path's mark would leave by another NIC or by none: the kernel's own
// route lookup is asked after every change.
func TestRoutingMovesToTheAPIsNumberingWithoutLosingAPath(t *testing.T) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 1, NICs: 3, PodsPerNode: 1})
	node := bed.Node(1)
	remote := net.ParseIP("10.244.9.9") // a pod of another node
	cfg := NodeDefaults("n1")
	cfg.PodCIDRs = []netip.Prefix{node.PodCIDR}
	for _, nic := range node.NICs {
		cfg.Paths = append(cfg.Paths, Path{Name: nic.Name, Index: uint32(nic.Index), Interface: nic.Name, Gateway: nic.Gateway})
	}
	const shift = 20
	mark := func(i uint32) uint32 { return i << shift }
	err := netnsutil.Do("/var/run/netns/"+node.NetNS, func() error {
		// As the previous release left the node: path i in table
		// tableBase+i-1 behind rule priority rulePriority+i-1.
		old := cfg
		old.Paths = nil
		for _, p := range cfg.Paths {
			p.Index--
			old.Paths = append(old.Paths, p)
		}
		before, err := planRouting(&old, func(i uint32) uint32 { return mark(i + 1) })
		if err != nil {
			return err
		}
		if err := before.apply(); err != nil {
			return err
		}
		steps := 0
		check := func(when string) {
			t.Helper()
			for _, nic := range node.NICs {
				routes, err := netlink.RouteGetWithOptions(remote, &netlink.RouteGetOptions{Mark: mark(uint32(nic.Index))})
				link, _ := netlink.LinkByName(nic.Name)
				if err != nil || len(routes) != 1 || link == nil || routes[0].LinkIndex != link.Attrs().Index {
					t.Errorf("%s: a packet of path %d (mark %#x) is routed %+v (%v), want out of %s", when, nic.Index, mark(uint32(nic.Index)), routes, err, nic.Name)
				}
			}
		}
		check("before")
		after, err := planRouting(&cfg, mark)
		if err != nil {
			return err
		}
		after.changed = func() {
			steps++
			check("during the move")
		}
		if err := after.apply(); err != nil {
			return err
		}
		check("after")
		if steps == 0 {
			t.Error("the move changed nothing")
		}
		rules, err := netlink.RuleList(netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, r := range rules {
			if r.Mark != 0 && (r.Priority < cfg.RulePriority || r.Priority > cfg.RulePriority+datapath.MaxPaths) {
				continue
			}
			if r.Mark != 0 && (r.Table != cfg.TableBase+int(r.Mark>>shift) || r.Priority != cfg.RulePriority+int(r.Mark>>shift)) {
				t.Errorf("rule %v left: want path i's rule at priority %d+i looking up table %d+i", r, cfg.RulePriority, cfg.TableBase)
			}
		}
		if routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: cfg.TableBase}, netlink.RT_FILTER_TABLE); err != nil || len(routes) != 0 {
			t.Errorf("table %d (no path's since) still holds %v (%v)", cfg.TableBase, routes, err)
		}
		return removeRouting(&cfg)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A path's capacity bounds the shaping on its NIC: every class is at most
// the capacity, and all of them are children of one class at the capacity,
// so together they never let more through. Without a capacity the classes
// hang from the root again.
func TestShapingStaysWithinThePathsCapacity(t *testing.T) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 1, NICs: 1, PodsPerNode: 1})
	node := bed.Node(1)
	pod := node.Pods[0]
	cfg := NodeDefaults("n1")
	cfg.Paths = []Path{{Name: "a", Index: 1, Interface: "nic1", Gateway: node.NICs[0].Gateway, Capacity: 20_000_000}}
	perPod, perPath := resource.MustParse("150M"), resource.MustParse("100M")
	cfg.Rules = []Rule{{Name: "shaped", Paths: []string{"a"}, Rate: &RateLimits{Mode: "shape", PerPod: &perPod,
		PerPath: []PathRate{{Path: "a", Rate: perPath}}}}}
	cfg.Pods = []Pod{{Name: "p", NetNS: "/var/run/netns/" + pod.NetNS, HostInterface: pod.HostIf, IPs: []netip.Addr{pod.Addr}, Rule: "shaped"}}
	paths := map[string]Path{"a": cfg.Paths[0]}
	plan, err := planShaping(&cfg, paths, map[string]uint32{"shaped": 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(plan) != 2 {
		t.Fatalf("plan %+v, want a class for the rule's path cap and one for the pod", plan)
	}
	for _, c := range plan {
		if c.bps != 20_000_000 {
			t.Errorf("class %#x at %d bit/s, want the path's 20 Mbit/s capacity", c.minor, c.bps)
		}
	}
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
	err = netnsutil.Do("/var/run/netns/"+node.NetNS, func() error {
		if err := syncHTB("nic1", 20_000_000, plan); err != nil {
			return err
		}
		got := classes()
		if c, ok := got[path].(*netlink.HtbClass); !ok || classParent(c) != top || c.Ceil != 20_000_000/8 {
			t.Errorf("path class %+v, want one under the root at 20 Mbit/s", got[path])
		}
		for _, c := range plan {
			if h := netlink.MakeHandle(shapeMajor, c.minor); got[h] == nil || classParent(got[h]) != path {
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
			if h := netlink.MakeHandle(shapeMajor, c.minor); got[h] == nil || classParent(got[h]) != top {
				t.Errorf("class %s: %+v, want it under the root", netlink.HandleStr(h), got[h])
			}
		}
		return removeShapingOn("nic1")
	})
	if err != nil {
		t.Fatal(err)
	}
}
