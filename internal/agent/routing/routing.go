// Package routing keeps a node's policy routing as the datapath's marks
// need it: one table per path holding a default route out of the path's NIC,
// the NIC's own subnets, and the main table's routes that the path must take
// its own way (through an overlay's tunnel devices, or straight to a peer
// node, as host-gw routes), one fwmark rule per path, and a rule that keeps
// traffic for the node's own pods in the main table. It owns a range of
// tables and rule priorities and touches nothing outside them.
package routing

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"syscall"

	"github.com/vishvananda/netlink"

	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
)

// Ranges are the tables and rule priorities the agent owns, and the mark
// bits of the path: path i uses table TableBase+i behind the rule of
// priority RulePriority+i; the pod CIDRs' rule sits at RulePriority-1.
type Ranges struct {
	TableBase, RulePriority int
	MarkMask                uint32
}

// Path is a path's routing: the NIC its table routes out of and the next
// hop beyond (invalid: the NIC's link scope).
type Path struct {
	Name string `json:"name"`
	// Index is the API's: the mark's value and the table's offset.
	Index     uint32     `json:"index"`
	Interface string     `json:"interface"`
	Gateway   netip.Addr `json:"gateway"`
}

// Want is the routing a node's plan needs.
type Want struct {
	// PodCIDRs are the node's own pods' ranges, kept in the main table.
	PodCIDRs []netip.Prefix
	Paths    []Path
	// Tunnels are the overlay devices the main table routes through
	// (Tunnels), Peers the other nodes the paths reach.
	Tunnels []Tunnel
	Peers   []Peer
}

// Peer is another node as this node's paths reach it: its address on each
// path they share, by the path's index, and its pod CIDRs.
type Peer struct {
	Addresses map[uint32]netip.Addr
	PodCIDRs  []netip.Prefix
}

// routesPods says whether dst lies in one of the peer's pod CIDRs.
func (p *Peer) routesPods(dst netip.Prefix) bool {
	return slices.ContainsFunc(p.PodCIDRs, func(c netip.Prefix) bool { return c.Bits() <= dst.Bits() && c.Contains(dst.Addr()) })
}

// Sync makes the node's rules and tables in r's ranges route each path's
// mark (mark gives it) out of the path's NIC, and keep w's pod CIDRs in the
// main table; anything else in the ranges is removed, in an order that
// keeps every mark routed (apply). Besides its default route, each path's
// table holds:
//   - its NIC's own subnets, so that a neighbour on the path's link (a
//     peer node's address, as liveness probes it) is reached directly
//     whatever the gateway;
//   - the tunnels' routes: a marked packet to a peer's pods on an overlay
//     is encapsulated, and its outer packet, which keeps the mark, leaves
//     by the path's NIC;
//   - direct routes (neighbourRoutes): what the main table routes to a
//     neighbour on a path's link, as host-gw routes a peer's pods to the
//     peer.
func Sync(r Ranges, w Want, mark func(uint32) uint32) error {
	p, err := plan(r, w.PodCIDRs, w.Paths, mark)
	if err != nil {
		return err
	}
	links := make([]netlink.Link, len(w.Paths))
	pathOf := map[int]uint32{} // link index -> path index
	for i, path := range w.Paths {
		if links[i], err = netlink.LinkByName(path.Interface); err != nil {
			return fmt.Errorf("path %q: interface %q: %w", path.Name, path.Interface, err)
		}
		pathOf[links[i].Attrs().Index] = path.Index
	}
	main, err := mainRoutes()
	if err != nil {
		return err
	}
	neighbours := neighbourRoutes(main, w.Peers, pathOf, w.Paths)
	for i, path := range w.Paths {
		table := r.TableBase + int(path.Index)
		routes := p.tables[table]
		for _, tn := range w.Tunnels {
			routes = append(routes, tn.Routes...)
		}
		own, err := linkRoutes(path, links[i], neighbours)
		if err != nil {
			return err
		}
		routes = append(routes, own...)
		for j := range routes {
			routes[j].Table, routes[j].Protocol = table, routeProtocol
		}
		p.tables[table] = routes
	}
	return p.apply()
}

// mainRoutes lists the main table, again when a change to it interrupted
// the dump (its result may then be incomplete).
func mainRoutes() ([]netlink.Route, error) {
	var err error
	for range 3 {
		var routes []netlink.Route
		routes, err = netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: mainTable}, netlink.RT_FILTER_TABLE)
		if err == nil {
			return routes, nil
		}
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	return nil, fmt.Errorf("listing the main table: %w", err)
}

// neighbourRoute is a route of the main table to a destination through a
// next hop on a path NIC's link (the path's index), and the peer whose
// address that next hop is, and whose pods the destination is (nil: none
// the agent knows).
type neighbourRoute struct {
	route netlink.Route
	path  uint32
	peer  *Peer
}

// neighbourRoutes are the main table's routes (not default ones: each path
// has its own) through a next hop on the link of a path's NIC (pathOf, by
// link index), found by their next hop rather than by the CNI: flannel's
// host-gw routes each peer's pod CIDR so, Calico's BGP on one segment its
// blocks, Cilium's direct node routes its CIDRs. Each path's table takes a
// route to a peer's pods through the peer's address on the path where the
// path's link holds it, so that the path's subflows reach the peer by its
// NIC although the fabric routes no pod CIDR; where it does not, by the
// path's gateway, as any destination. A route through a next hop that is
// no peer's (a router, or a node the agent has no MPTCPPeer of) is taken as
// the main table takes it by the path whose NIC it leaves by, and by the
// path's gateway on every other path: the gateways of routed fabrics keep
// their subflows (and their arrivals' reverse path) on their NICs.
//
// Addresses are what nodes report: a next hop is a peer's only where it is
// the peer's address on the path of the route's NIC, none of this node's
// gateways, and only for a destination in the peer's pod CIDRs, so that a
// node that claimed a router's address draws nothing but its own pods'
// subflows. Of the main table's routes to one destination only the one
// the main table prefers (the lowest metric) counts.
func neighbourRoutes(main []netlink.Route, peers []Peer, pathOf map[int]uint32, paths []Path) []neighbourRoute {
	gateways := map[netip.Addr]bool{}
	for _, p := range paths {
		gateways[p.Gateway] = true
	}
	best := map[string]int{} // destination -> the lowest metric of its routes
	for _, r := range main {
		if isDefault(r) {
			if gw, ok := netip.AddrFromSlice(r.Gw); ok {
				gateways[gw.Unmap()] = true
			}
			continue
		}
		if m, ok := best[r.Dst.String()]; r.Type == syscall.RTN_UNICAST && (!ok || r.Priority < m) {
			best[r.Dst.String()] = r.Priority
		}
	}
	var out []neighbourRoute
	for _, r := range main {
		path, onPath := pathOf[r.LinkIndex]
		if r.Gw == nil || isDefault(r) || r.Type != syscall.RTN_UNICAST || !onPath || len(r.MultiPath) > 0 ||
			best[r.Dst.String()] != r.Priority {
			continue
		}
		out = append(out, neighbourRoute{
			// Of the flags only onlink: a copied linkdown would be refused.
			route: netlink.Route{LinkIndex: r.LinkIndex, Dst: r.Dst, Gw: r.Gw, Flags: r.Flags & int(netlink.FLAG_ONLINK), Family: r.Family},
			path:  path,
		})
	}
	for i := range out {
		gw, _ := netip.AddrFromSlice(out[i].route.Gw)
		dst, _ := netip.AddrFromSlice(out[i].route.Dst.IP)
		ones, _ := out[i].route.Dst.Mask.Size()
		if gateways[gw.Unmap()] {
			continue
		}
		for j := range peers {
			if peers[j].Addresses[out[i].path] == gw.Unmap() && peers[j].routesPods(netip.PrefixFrom(dst.Unmap(), ones)) {
				out[i].peer = &peers[j]
				break
			}
		}
	}
	return out
}

// isDefault says whether r is a default route (netlink gives one with no
// destination, or as 0.0.0.0/0 or ::/0).
func isDefault(r netlink.Route) bool {
	if r.Dst == nil {
		return true
	}
	ones, _ := r.Dst.Mask.Size()
	return ones == 0
}

// linkRoutes are the routes of path's table that its NIC's addresses
// decide: the NIC's subnets, and the neighbour routes as those subnets
// place them (neighbourRoutes).
func linkRoutes(path Path, link netlink.Link, neighbours []neighbourRoute) ([]netlink.Route, error) {
	addrs, err := netlink.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("path %q: addresses of %q: %w", path.Name, path.Interface, err)
	}
	var subnets []netip.Prefix
	var out []netlink.Route
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || a.IPNet == nil || ip.IsLinkLocalUnicast() {
			continue
		}
		ones, _ := a.Mask.Size()
		subnet := netip.PrefixFrom(ip.Unmap(), ones).Masked()
		if slices.Contains(subnets, subnet) {
			continue
		}
		subnets = append(subnets, subnet)
		out = append(out, netlink.Route{LinkIndex: link.Attrs().Index, Dst: prefixToIPNet(subnet), Scope: netlink.SCOPE_LINK,
			Family: family(subnet.Addr())})
	}
	onLink := func(a netip.Addr) bool {
		return slices.ContainsFunc(subnets, func(s netip.Prefix) bool { return s.Contains(a) })
	}
	for _, n := range neighbours {
		if n.peer != nil {
			if via, ok := n.peer.Addresses[path.Index]; ok && via.Is4() == (n.route.Dst.IP.To4() != nil) && onLink(via) {
				out = append(out, netlink.Route{LinkIndex: link.Attrs().Index, Dst: n.route.Dst, Gw: via.AsSlice(), Family: family(via)})
				continue
			}
		}
		if n.path == path.Index {
			out = append(out, n.route)
		}
	}
	return out, nil
}

// Tunnel is an overlay's tunnel device (a VXLAN or Geneve link) that routes
// of the main table go through, as flannel's flannel.1 to the peers' pods.
type Tunnel struct {
	Name  string
	Index int
	// Port is the UDP port its encapsulated packets are sent to, Local
	// the node's own address they are sent from and to (VXLAN's local;
	// invalid where the device names none).
	Port  uint16
	Local netip.Addr
	// FlowBased: a VXLAN device that takes each packet's outer addresses
	// from whoever sends into it (collect_md, "external": Cilium's), so it
	// has no local address and the main table may route nothing through
	// it.
	FlowBased bool
	Routes    []netlink.Route
}

// Tunnels finds the tunnel devices the main table routes through, with
// those routes, and the flow-based VXLAN ones whatever routes through them
// (the datapath reads VXLAN's header, not Geneve's), found by their links'
// kind rather than by a CNI's name.
func Tunnels() ([]Tunnel, error) {
	routes, err := mainRoutes()
	if err != nil {
		return nil, err
	}
	var tunnels []Tunnel
	found := map[int]int{}
	for _, r := range routes {
		// A default route through a tunnel would hide the path's own; an
		// IPv6 link-local one is the device's own.
		if r.LinkIndex == 0 || isDefault(r) || r.Type != syscall.RTN_UNICAST || r.Dst.IP.IsLinkLocalUnicast() {
			continue
		}
		i, ok := found[r.LinkIndex]
		if !ok {
			link, err := netlink.LinkByIndex(r.LinkIndex)
			if err != nil {
				continue // gone since the listing
			}
			var port uint16
			var local netip.Addr
			switch l := link.(type) {
			case *netlink.Vxlan:
				port = uint16(l.Port)
				local, _ = netip.AddrFromSlice(l.SrcAddr)
				local = local.Unmap()
			case *netlink.Geneve:
				port = l.Dport
			default:
				found[r.LinkIndex] = -1
				continue
			}
			i = len(tunnels)
			found[r.LinkIndex] = i
			tunnels = append(tunnels, Tunnel{Name: link.Attrs().Name, Index: r.LinkIndex, Port: port, Local: local})
		}
		if i < 0 {
			continue
		}
		tunnels[i].Routes = append(tunnels[i].Routes, netlink.Route{
			// Of the flags only onlink: a copied linkdown would be refused.
			LinkIndex: r.LinkIndex, Dst: r.Dst, Gw: r.Gw, Src: r.Src, Flags: r.Flags & int(netlink.FLAG_ONLINK),
			Scope: r.Scope, Family: r.Family,
		})
	}
	links, err := netlink.LinkList()
	if err != nil {
		return nil, err
	}
	for _, link := range links {
		if _, ok := found[link.Attrs().Index]; ok {
			continue
		}
		if l, ok := link.(*netlink.Vxlan); ok && l.FlowBased {
			tunnels = append(tunnels, Tunnel{Name: l.Name, Index: l.Index, Port: uint16(l.Port), FlowBased: true})
		}
	}
	return tunnels, nil
}

// Remove removes every rule and table in r's ranges.
func Remove(r Ranges) error {
	empty := &routingPlan{tables: map[int][]netlink.Route{}, minPrio: r.RulePriority - 1, maxPrio: r.RulePriority + datapath.MaxPaths,
		minTable: r.TableBase, maxTable: r.TableBase + datapath.MaxPaths}
	return empty.apply()
}

// routeProtocol tags the routes this agent writes ("proto 0x4d" in ip route),
// so that they are told apart from everyone else's.
const routeProtocol = netlink.RouteProtocol(0x4d)

const mainTable = 254

// routingPlan is the policy routing the datapath's marks need: one table per
// path holding a default route out of its NIC, one fwmark rule per path, and
// rules that keep traffic for local pods in the main table (a mark set at a
// NIC's ingress must not send the packet back out).
type routingPlan struct {
	tables   map[int][]netlink.Route // table -> its routes, the default route first
	rules    []*netlink.Rule
	minPrio  int
	maxPrio  int
	minTable int
	maxTable int
	// changed, when set, runs after each change apply makes to the
	// kernel's rules and routes (a test checks every step's routing).
	changed func()
}

func (p *routingPlan) note() {
	if p.changed != nil {
		p.changed()
	}
}

func plan(c Ranges, podCIDRs []netip.Prefix, paths []Path, mark func(uint32) uint32) (*routingPlan, error) {
	p := &routingPlan{
		tables:   map[int][]netlink.Route{},
		minPrio:  c.RulePriority - 1,
		maxPrio:  c.RulePriority + datapath.MaxPaths,
		minTable: c.TableBase,
		maxTable: c.TableBase + datapath.MaxPaths,
	}
	for _, cidr := range podCIDRs {
		r := netlink.NewRule()
		r.Priority = c.RulePriority - 1
		r.Family = family(cidr.Addr())
		r.Dst = prefixToIPNet(cidr)
		r.Table = mainTable
		p.rules = append(p.rules, r)
	}
	for _, path := range paths {
		link, err := netlink.LinkByName(path.Interface)
		if err != nil {
			return nil, fmt.Errorf("path %q: interface %q: %w", path.Name, path.Interface, err)
		}
		table := c.TableBase + int(path.Index)
		route := netlink.Route{
			LinkIndex: link.Attrs().Index,
			Table:     table,
			Protocol:  routeProtocol,
			Family:    netlink.FAMILY_V4,
			Dst:       &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)},
		}
		if path.Gateway.IsValid() {
			route.Gw = path.Gateway.AsSlice()
			route.Family = family(path.Gateway)
			if path.Gateway.Is6() {
				route.Dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
			}
		} else {
			route.Scope = netlink.SCOPE_LINK
		}
		p.tables[table] = []netlink.Route{route}

		r := netlink.NewRule()
		r.Priority = c.RulePriority + int(path.Index)
		r.Family = route.Family
		r.Mark = mark(path.Index)
		m := c.MarkMask
		r.Mask = &m
		r.Table = table
		p.rules = append(p.rules, r)
	}
	return p, nil
}

func family(a netip.Addr) int {
	if a.Is4() {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}

func prefixToIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func sameRule(a, b *netlink.Rule) bool {
	dst := func(n *net.IPNet) string {
		if n == nil {
			return ""
		}
		return n.String()
	}
	mask := func(m *uint32) uint32 {
		if m == nil {
			return 0
		}
		return *m
	}
	return a.Priority == b.Priority && a.Table == b.Table && a.Mark == b.Mark && mask(a.Mask) == mask(b.Mask) && dst(a.Dst) == dst(b.Dst)
}

// apply makes the node's rules and tables match the plan: what is missing is
// added, what is ours (by priority and table range) and no longer wanted is
// removed, and nothing else is touched.
//
// The order keeps every mark routed while tables change meaning (an upgrade
// that renumbered paths: mark m used table base+m-1 and now uses base+m, so
// table base+m served mark m+1 before and serves mark m after). Tables are
// rewritten from the highest down; before a table gets its new route, every
// stale rule still looking it up is replaced: its mark's new rule (whose
// table is higher, so already right) is added first, then the stale rule,
// at a lower priority number and so consulted first until then, goes.
func (p *routingPlan) apply() error {
	s, err := p.listRules()
	if err != nil {
		return err
	}
	for _, w := range p.rules {
		if w.Mark == 0 {
			s.add(w) // the pod CIDR rules: the main table, which never changes
		}
	}
	for table := p.maxTable; table >= p.minTable; table-- {
		s.remove(func(r *netlink.Rule) bool { return r.Table == table })
		s.errs = append(s.errs, p.rewriteTable(table)...)
		for _, w := range p.rules {
			if w.Table == table {
				s.add(w)
			}
		}
	}
	for _, w := range p.rules {
		s.add(w)
	}
	s.remove(func(*netlink.Rule) bool { return true })
	return errors.Join(s.errs...)
}

// ruleSync is apply's view of the node's rules as it changes them: what it
// listed, less what it removed, plus what it added, so that each step sees
// the steps before without listing again; and the errors so far, since one
// rule that fails must not keep the others from their place.
type ruleSync struct {
	p        *routingPlan
	existing map[int][]netlink.Rule // by family
	errs     []error
}

// listRules reads the node's IPv4 and IPv6 rules for apply.
func (p *routingPlan) listRules() (*ruleSync, error) {
	s := &ruleSync{p: p, existing: map[int][]netlink.Rule{}}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rules, err := netlink.RuleList(fam)
		if err != nil {
			return nil, fmt.Errorf("listing rules: %w", err)
		}
		for i := range rules {
			rules[i].Family = fam
		}
		s.existing[fam] = rules
	}
	return s, nil
}

func (s *ruleSync) has(w *netlink.Rule) bool {
	for i := range s.existing[w.Family] {
		if sameRule(&s.existing[w.Family][i], w) {
			return true
		}
	}
	return false
}

// add adds wanted rule w unless the node has it already.
func (s *ruleSync) add(w *netlink.Rule) {
	if s.has(w) {
		return
	}
	if err := netlink.RuleAdd(w); err != nil && !errors.Is(err, syscall.EEXIST) {
		s.errs = append(s.errs, fmt.Errorf("adding rule %v: %w", w, err))
		return
	}
	s.p.note()
	s.existing[w.Family] = append(s.existing[w.Family], *w)
}

// ours says whether r is in the plan's priority range, so apply's to manage.
func (s *ruleSync) ours(r *netlink.Rule) bool {
	return r.Priority >= s.p.minPrio && r.Priority <= s.p.maxPrio
}

func (s *ruleSync) wanted(r *netlink.Rule) bool {
	return slices.ContainsFunc(s.p.rules, func(w *netlink.Rule) bool { return w.Family == r.Family && sameRule(r, w) })
}

// remove deletes the stale rules of ours that match, once the wanted
// rules of their marks are in place.
func (s *ruleSync) remove(match func(*netlink.Rule) bool) {
	for fam, rules := range s.existing {
		kept := rules[:0]
		for i := range rules {
			r := rules[i]
			if !s.ours(&r) || s.wanted(&r) || !match(&r) {
				kept = append(kept, r)
				continue
			}
			for _, w := range s.p.rules {
				if w.Family == fam && w.Mark == r.Mark && maskOf(w.Mask) == maskOf(r.Mask) && w.Mark != 0 {
					s.add(w)
				}
			}
			if err := netlink.RuleDel(&r); err != nil && !errors.Is(err, syscall.ENOENT) {
				s.errs = append(s.errs, fmt.Errorf("removing stale rule %v: %w", &r, err))
				kept = append(kept, r)
			}
			s.p.note()
		}
		s.existing[fam] = kept
	}
}

// rewriteTable gives table the plan's routes and flushes the others
// from it. A route the table holds already is left as it is: a table may
// hold many (direct routes), and each write is a notification to every
// routing daemon of the node.
func (p *routingPlan) rewriteTable(table int) []error {
	var errs []error
	wants := p.tables[table]
	held, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: table}, netlink.RT_FILTER_TABLE)
	if err != nil {
		held = nil // write them all
	}
	for i := range wants {
		if slices.ContainsFunc(held, func(r netlink.Route) bool { return sameRoute(r, wants[i]) && r.Scope == wants[i].Scope }) {
			continue
		}
		if err := netlink.RouteReplace(&wants[i]); err != nil {
			errs = append(errs, fmt.Errorf("route %v in table %d: %w", wants[i].Dst, table, err))
		}
		p.note()
	}
	if err := p.flushTable(table, func(r netlink.Route) bool {
		return slices.ContainsFunc(wants, func(want netlink.Route) bool { return sameRoute(r, want) })
	}); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// sameRoute says whether a route of a table is want: the same destination
// through the same device and next hop, onlink or not.
func sameRoute(r, want netlink.Route) bool {
	const onlink = int(netlink.FLAG_ONLINK)
	return r.Dst != nil && want.Dst != nil && r.Dst.String() == want.Dst.String() && r.LinkIndex == want.LinkIndex &&
		r.Gw.Equal(want.Gw) && r.Flags&onlink == want.Flags&onlink
}

func maskOf(m *uint32) uint32 {
	if m == nil {
		return 0
	}
	return *m
}

// flushTable removes the routes of table that keep() rejects.
func (p *routingPlan) flushTable(table int, keep func(netlink.Route) bool) error {
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: table}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return fmt.Errorf("listing table %d: %w", table, err)
	}
	for i := range routes {
		if keep(routes[i]) {
			continue
		}
		if err := netlink.RouteDel(&routes[i]); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("removing route from table %d: %w", table, err)
		}
		p.note()
	}
	return nil
}
