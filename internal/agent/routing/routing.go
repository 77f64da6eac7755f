// Package routing keeps a node's policy routing as the datapath's marks
// need it: one table per path holding a default route out of the path's NIC
// (and the main table's routes through an overlay's tunnel devices), one
// fwmark rule per path, and a rule that keeps traffic for the node's own
// pods in the main table. It owns a range of tables and rule priorities and
// touches nothing outside them.
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

// Sync makes the node's rules and tables in r's ranges route each path's
// mark (mark gives it) out of the path's NIC, and keep podCIDRs in the main
// table; anything else in the ranges is removed, in an order that keeps
// every mark routed (apply). Each path's table also holds tunnels' routes:
// a marked packet to a peer's pods on an overlay is encapsulated, and its
// outer packet, which keeps the mark, leaves by the path's NIC.
func Sync(r Ranges, podCIDRs []netip.Prefix, paths []Path, tunnels []Tunnel, mark func(uint32) uint32) error {
	p, err := plan(r, podCIDRs, paths, mark)
	if err != nil {
		return err
	}
	for table, routes := range p.tables {
		for _, tn := range tunnels {
			for _, tr := range tn.Routes {
				tr.Table, tr.Protocol = table, routeProtocol
				routes = append(routes, tr)
			}
		}
		p.tables[table] = routes
	}
	return p.apply()
}

// Tunnel is an overlay's tunnel device (a VXLAN or Geneve link) that routes
// of the main table go through, as flannel's flannel.1 to the peers' pods.
type Tunnel struct {
	Name  string
	Index int
	// Port is the UDP port its encapsulated packets are sent to, Local
	// the node's own address they are sent from and to (VXLAN's local;
	// invalid where the device names none).
	Port   uint16
	Local  netip.Addr
	Routes []netlink.Route
}

// Tunnels finds the tunnel devices the main table routes through, with
// those routes, found by their links' kind rather than by a CNI's name.
func Tunnels() ([]Tunnel, error) {
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: mainTable}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("listing the main table: %w", err)
	}
	var tunnels []Tunnel
	found := map[int]int{}
	for _, r := range routes {
		// A default route through a tunnel would hide the path's own; an
		// IPv6 link-local one is the device's own.
		if r.LinkIndex == 0 || r.Dst == nil || r.Type != syscall.RTN_UNICAST || r.Dst.IP.IsLinkLocalUnicast() {
			continue
		}
		if ones, _ := r.Dst.Mask.Size(); ones == 0 {
			continue // netlink gives a default route as 0.0.0.0/0 or ::/0
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
// from it.
func (p *routingPlan) rewriteTable(table int) []error {
	var errs []error
	wants := p.tables[table]
	for i := range wants {
		if err := netlink.RouteReplace(&wants[i]); err != nil {
			errs = append(errs, fmt.Errorf("route %v in table %d: %w", wants[i].Dst, table, err))
		}
		p.note()
	}
	if err := p.flushTable(table, func(r netlink.Route) bool {
		return slices.ContainsFunc(wants, func(want netlink.Route) bool {
			return r.Dst != nil && want.Dst != nil && r.Dst.String() == want.Dst.String() && r.LinkIndex == want.LinkIndex && r.Gw.Equal(want.Gw)
		})
	}); err != nil {
		errs = append(errs, err)
	}
	return errs
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
