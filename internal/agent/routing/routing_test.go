package routing

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
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
	cfg := Ranges{TableBase: 3100, RulePriority: 3100, MarkMask: datapath.DefaultMarkMask}
	podCIDRs := []netip.Prefix{node.PodCIDR}
	var paths []Path
	for _, nic := range node.NICs {
		paths = append(paths, Path{Name: nic.Name, Index: uint32(nic.Index), Interface: nic.Name, Gateway: nic.Gateway})
	}
	const shift = 20
	mark := func(i uint32) uint32 { return i << shift }
	err := netnsutil.Do("/var/run/netns/"+node.NetNS, func() error {
		// As the previous release left the node: path i in table
		// tableBase+i-1 behind rule priority rulePriority+i-1.
		var old []Path
		for _, p := range paths {
			p.Index--
			old = append(old, p)
		}
		before, err := plan(cfg, podCIDRs, old, func(i uint32) uint32 { return mark(i + 1) })
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
		after, err := plan(cfg, podCIDRs, paths, mark)
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
		return Remove(cfg)
	})
	if err != nil {
		t.Fatal(err)
	}
}
