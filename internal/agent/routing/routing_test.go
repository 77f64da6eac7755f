package routing

import (
	"fmt"
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

// On an overlay (a VXLAN device the main table routes the peers' pods
// through, as flannel's), a marked packet to a peer's pod takes the tunnel
// from its path's table, and the outer packet, with the same mark, leaves by
// the path's NIC towards the peer's VTEP; an unmarked one keeps the main
// table. Tunnels finds the device by its kind and port, not by its name.
func TestPathTablesCarryTheOverlaysTunnelRoutes(t *testing.T) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 1, NICs: 2})
	node := bed.Node(1)
	cfg := Ranges{TableBase: 3200, RulePriority: 3200, MarkMask: datapath.DefaultMarkMask}
	var paths []Path
	for _, nic := range node.NICs {
		paths = append(paths, Path{Name: nic.Name, Index: uint32(nic.Index), Interface: nic.Name, Gateway: nic.Gateway})
	}
	mark := func(i uint32) uint32 { return i << 20 }
	peerPod, vtep := net.ParseIP("10.244.9.9"), net.ParseIP("10.100.0.9")
	err := netnsutil.Do("/var/run/netns/"+node.NetNS, func() error {
		vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "ovl0"}, VxlanId: 1, Port: 8472, SrcAddr: net.ParseIP("10.100.0.1")}
		if err := netlink.LinkAdd(vx); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(vx); err != nil {
			return err
		}
		_, peerCIDR, _ := net.ParseCIDR("10.244.9.0/24")
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: vx.Index, Dst: peerCIDR, Gw: net.ParseIP("10.244.9.0"), Flags: int(netlink.FLAG_ONLINK)}); err != nil {
			return err
		}
		// A default route through the tunnel (behind the node's own) is
		// not copied: it would take the place of each path's.
		_, anywhere, _ := net.ParseCIDR("0.0.0.0/0")
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: vx.Index, Dst: anywhere, Priority: 5000}); err != nil {
			return err
		}
		tunnels, err := Tunnels()
		if err != nil {
			return err
		}
		if len(tunnels) != 1 || tunnels[0].Name != "ovl0" || tunnels[0].Port != 8472 || len(tunnels[0].Routes) != 1 ||
			tunnels[0].Local != netip.MustParseAddr("10.100.0.1") {
			return fmt.Errorf("tunnels %+v: want ovl0, port 8472, local 10.100.0.1, its route to 10.244.9.0/24 alone", tunnels)
		}
		if err := Sync(cfg, []netip.Prefix{node.PodCIDR}, paths, tunnels, mark); err != nil {
			return err
		}
		via := func(dst net.IP, m uint32) string {
			routes, err := netlink.RouteGetWithOptions(dst, &netlink.RouteGetOptions{Mark: m})
			if err != nil || len(routes) != 1 {
				return fmt.Sprintf("%v %v", routes, err)
			}
			l, _ := netlink.LinkByIndex(routes[0].LinkIndex)
			return l.Attrs().Name
		}
		for _, nic := range node.NICs {
			m := mark(uint32(nic.Index))
			if got := via(peerPod, m); got != "ovl0" {
				t.Errorf("a packet of path %d to a peer's pod goes by %s, want the tunnel ovl0", nic.Index, got)
			}
			if got := via(vtep, m); got != nic.Name {
				t.Errorf("an outer packet of path %d goes by %s, want %s", nic.Index, got, nic.Name)
			}
		}
		if got := via(peerPod, 0); got != "ovl0" {
			t.Errorf("an unmarked packet to a peer's pod goes by %s, want ovl0 from the main table", got)
		}
		// The tunnel gone, its routes leave the path tables.
		if err := netlink.LinkDel(vx); err != nil {
			return err
		}
		if err := Sync(cfg, []netip.Prefix{node.PodCIDR}, paths, nil, mark); err != nil {
			return err
		}
		if routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: cfg.TableBase + 1}, netlink.RT_FILTER_TABLE); err != nil || len(routes) != 1 {
			t.Errorf("table %d holds %v (%v), want the path's default route only", cfg.TableBase+1, routes, err)
		}
		return Remove(cfg)
	})
	if err != nil {
		t.Fatal(err)
	}
}
