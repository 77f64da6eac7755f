package routing

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
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
// table. Tunnels finds the device by its kind and port, not by its name, and
// a flow-based one whatever routes through it.
func TestPathTablesCarryTheOverlaysTunnelRoutes(t *testing.T) {
	node, cfg, paths, mark := twoPathNode(t, 3200)
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
		if err := Sync(cfg, Want{PodCIDRs: []netip.Prefix{node.PodCIDR}, Paths: paths, Tunnels: tunnels}, mark); err != nil {
			return err
		}
		for _, nic := range node.NICs {
			m := mark(uint32(nic.Index))
			if got := routeOf(peerPod, m); !strings.HasPrefix(got, "ovl0 ") {
				t.Errorf("a packet of path %d to a peer's pod goes by %s, want the tunnel ovl0", nic.Index, got)
			}
			if got := routeOf(vtep, m); !strings.HasPrefix(got, nic.Name+" ") {
				t.Errorf("an outer packet of path %d goes by %s, want %s", nic.Index, got, nic.Name)
			}
		}
		if got := routeOf(peerPod, 0); !strings.HasPrefix(got, "ovl0 ") {
			t.Errorf("an unmarked packet to a peer's pod goes by %s, want ovl0 from the main table", got)
		}
		// The tunnel gone, its routes leave the path tables.
		if err := netlink.LinkDel(vx); err != nil {
			return err
		}
		if err := Sync(cfg, Want{PodCIDRs: []netip.Prefix{node.PodCIDR}, Paths: paths}, mark); err != nil {
			return err
		}
		if routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: cfg.TableBase + 1}, netlink.RT_FILTER_TABLE); err != nil || len(routes) != 2 {
			t.Errorf("table %d holds %v (%v), want the path's default route and its NIC's subnet only", cfg.TableBase+1, routes, err)
		}
		// A flow-based device (Cilium's cilium_vxlan) is found though
		// nothing routes through it.
		ext := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "ext0"}, FlowBased: true, Port: 8473}
		if err := netlink.LinkAdd(ext); err != nil {
			return err
		}
		if tunnels, err := Tunnels(); err != nil || len(tunnels) != 1 || tunnels[0].Name != "ext0" || !tunnels[0].FlowBased ||
			tunnels[0].Port != 8473 || tunnels[0].Local.IsValid() || len(tunnels[0].Routes) != 0 {
			t.Errorf("tunnels %+v (%v): want ext0, flow-based, port 8473, no address, no routes", tunnels, err)
		}
		return Remove(cfg)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Where the CNI routes a peer's pods straight to the peer (flannel's
// host-gw: "10.244.9.0/24 via <the peer's address> dev nic1"), each path's
// table routes them to the peer's address on that path, when the path's
// link holds it: on fabrics that route no pod CIDR, the path's gateway
// would drop them. A peer whose address on a path is beyond the path's link
// keeps the path's default route there. A next hop that is no peer's (a
// node without an MPTCPPeer, a router), a peer's next hop to anything but
// its pods, or one of this node's gateways that a peer claims, keeps the
// main table's route on the path of its own NIC, and each other path's
// gateway. A neighbour on the link is reached directly, not through the
// gateway; and the direct routes leave with the CNI's.
func TestPathTablesRouteAPeersPodsStraightToItOnEachPathsLink(t *testing.T) {
	node, cfg, paths, mark := twoPathNode(t, 3300)
	// Both peers' addresses are the 9th and 7th hosts of each NIC's /24,
	// but peer B's on path 2 is in another subnet, beyond nic2's link.
	near := func(nic testbed.NIC, host byte) netip.Addr {
		a := nic.Addr.Addr().As4()
		a[3] = host
		return netip.AddrFrom4(a)
	}
	nic1, nic2 := node.NICs[0], node.NICs[1]
	cidrs := func(s string) []netip.Prefix { return []netip.Prefix{netip.MustParsePrefix(s)} }
	peerA := Peer{Addresses: map[uint32]netip.Addr{1: near(nic1, 9), 2: near(nic2, 9)}, PodCIDRs: cidrs("10.244.9.0/24")}
	peerB := Peer{Addresses: map[uint32]netip.Addr{1: near(nic1, 7), 2: netip.MustParseAddr("10.102.77.7")}, PodCIDRs: cidrs("10.244.7.0/24")}
	podA, podB, podC := net.ParseIP("10.244.9.9"), net.ParseIP("10.244.7.7"), net.ParseIP("10.244.5.5")
	nodeC := Peer{Addresses: map[uint32]netip.Addr{1: near(nic1, 5)}} // no MPTCPPeer: not in Want.Peers
	// Peer D reports a router's address on path 1 as its own: the
	// router's route to another network is no route to D's pods. Peer E
	// reports this node's gateway on path 1 as its own, and a network
	// the gateway routes as its pods.
	router := Peer{Addresses: map[uint32]netip.Addr{1: near(nic1, 254)}}
	gateway := Peer{Addresses: map[uint32]netip.Addr{1: nic1.Gateway}}
	peerD := Peer{Addresses: map[uint32]netip.Addr{1: near(nic1, 254), 2: near(nic2, 4)}, PodCIDRs: cidrs("10.244.4.0/24")}
	peerE := Peer{Addresses: map[uint32]netip.Addr{1: nic1.Gateway, 2: near(nic2, 3)}, PodCIDRs: cidrs("10.60.0.0/16")}
	beyond, behindGateway := net.ParseIP("10.50.0.1"), net.ParseIP("10.60.0.1")
	err := netnsutil.Do("/var/run/netns/"+node.NetNS, func() error {
		link, err := netlink.LinkByName(nic1.Name)
		if err != nil {
			return err
		}
		hostGW := func(cidr string, peer Peer) *netlink.Route {
			_, dst, _ := net.ParseCIDR(cidr)
			return &netlink.Route{LinkIndex: link.Attrs().Index, Dst: dst, Gw: peer.Addresses[1].AsSlice()}
		}
		cniRoutes := []*netlink.Route{hostGW("10.244.9.0/24", peerA), hostGW("10.244.7.0/24", peerB), hostGW("10.244.5.0/24", nodeC),
			hostGW("10.50.0.0/16", router), hostGW("10.60.0.0/16", gateway)}
		for _, r := range cniRoutes {
			if err := netlink.RouteAdd(r); err != nil {
				return err
			}
		}
		want := Want{PodCIDRs: []netip.Prefix{node.PodCIDR}, Paths: paths, Peers: []Peer{peerA, peerB, peerD, peerE}}
		if err := Sync(cfg, want, mark); err != nil {
			return err
		}
		for _, c := range []struct {
			dst     net.IP
			path    uint32
			want    string
			because string
		}{
			{podA, 1, "nic1 via " + near(nic1, 9).String(), "the CNI's own route, on path 1's table"},
			{podA, 2, "nic2 via " + near(nic2, 9).String(), "peer A's address on path 2"},
			{podB, 1, "nic1 via " + near(nic1, 7).String(), "the CNI's own route, on path 1's table"},
			{podB, 2, "nic2 via " + nic2.Gateway.String(), "the path's gateway: peer B's address on path 2 is beyond nic2's link"},
			{podC, 1, "nic1 via " + near(nic1, 5).String(), "the main table's route, by its own NIC's path: node C is no known peer"},
			{podC, 2, "nic2 via " + nic2.Gateway.String(), "the path's gateway: node C is no known peer"},
			{beyond, 1, "nic1 via " + near(nic1, 254).String(), "the main table's route: not to peer D's pods"},
			{beyond, 2, "nic2 via " + nic2.Gateway.String(), "the path's gateway: not to peer D's pods"},
			{behindGateway, 2, "nic2 via " + nic2.Gateway.String(), "the path's gateway: this node's gateway is no peer's"},
			{near(nic2, 9).AsSlice(), 2, "nic2 via <nil>", "a neighbour on the path's link"},
		} {
			if got := routeOf(c.dst, mark(c.path)); got != c.want {
				t.Errorf("a packet of path %d to %s goes by %s, want %s (%s)", c.path, c.dst, got, c.want, c.because)
			}
		}
		if got := routeOf(podA, 0); got != "nic1 via "+near(nic1, 9).String() {
			t.Errorf("an unmarked packet to peer A's pod goes by %s, want the main table's route", got)
		}
		// The CNI's routes gone, the paths' direct routes go with them.
		for _, r := range cniRoutes {
			if err := netlink.RouteDel(r); err != nil {
				return err
			}
		}
		if err := Sync(cfg, want, mark); err != nil {
			return err
		}
		if got := routeOf(podA, mark(2)); got != "nic2 via "+nic2.Gateway.String() {
			t.Errorf("with the CNI's route gone, a packet of path 2 to peer A's pod goes by %s, want the path's gateway", got)
		}
		return Remove(cfg)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// twoPathNode is a bed's one node with two NICs, and its routing as Sync
// takes it: tables and rule priorities from base, NIC k as path k through
// the bed's gateway, path k's mark k<<20.
func twoPathNode(t *testing.T, base int) (*testbed.Node, Ranges, []Path, func(uint32) uint32) {
	t.Helper()
	node := testbed.NewForTest(t, testbed.Config{Nodes: 1, NICs: 2}).Node(1)
	var paths []Path
	for _, nic := range node.NICs {
		paths = append(paths, Path{Name: nic.Name, Index: uint32(nic.Index), Interface: nic.Name, Gateway: nic.Gateway})
	}
	return node, Ranges{TableBase: base, RulePriority: base, MarkMask: datapath.DefaultMarkMask}, paths,
		func(i uint32) uint32 { return i << 20 }
}

// routeOf is the kernel's route for a packet to dst with mark, run in the
// node's namespace: "nic2 via 10.102.1.1".
func routeOf(dst net.IP, mark uint32) string {
	routes, err := netlink.RouteGetWithOptions(dst, &netlink.RouteGetOptions{Mark: mark})
	if err != nil || len(routes) != 1 {
		return fmt.Sprintf("%v %v", routes, err)
	}
	l, err := netlink.LinkByIndex(routes[0].LinkIndex)
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("%s via %v", l.Attrs().Name, routes[0].Gw)
}

// A table that already holds what the plan wants is not written again:
// every route write is a notification to each routing daemon of the node,
// and a reconcile comes at least every 30 s.
func TestAnUnchangedPlanWritesNothing(t *testing.T) {
	node, cfg, paths, mark := twoPathNode(t, 3400)
	err := netnsutil.Do("/var/run/netns/"+node.NetNS, func() error {
		first, err := plan(cfg, []netip.Prefix{node.PodCIDR}, paths, mark)
		if err != nil {
			return err
		}
		if err := first.apply(); err != nil {
			return err
		}
		again, err := plan(cfg, []netip.Prefix{node.PodCIDR}, paths, mark)
		if err != nil {
			return err
		}
		writes := 0
		again.changed = func() { writes++ }
		if err := again.apply(); err != nil {
			return err
		}
		if writes != 0 {
			t.Errorf("applying the plan the node holds made %d changes, want none", writes)
		}
		return Remove(cfg)
	})
	if err != nil {
		t.Fatal(err)
	}
}
