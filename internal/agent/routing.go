package agent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"github.com/vishvananda/netlink"
)

// routeProtocol tags the routes this agent writes ("proto 0x4d" in ip route),
// so that they are told apart from everyone else's.
const routeProtocol = netlink.RouteProtocol(0x4d)

const mainTable = 254

// routingPlan is the policy routing the datapath's marks need: one table per
// path holding a default route out of its NIC, one fwmark rule per path, and
// rules that keep traffic for local pods in the main table (a mark set at a
// NIC's ingress must not send the packet back out).
type routingPlan struct {
	tables   map[int]netlink.Route // table -> its default route
	rules    []*netlink.Rule
	minPrio  int
	maxPrio  int
	minTable int
	maxTable int
}

func planRouting(c *Config, mark func(uint32) uint32) (*routingPlan, error) {
	p := &routingPlan{
		tables:   map[int]netlink.Route{},
		minPrio:  c.RulePriority - 1,
		maxPrio:  c.RulePriority + 15,
		minTable: c.TableBase,
		maxTable: c.TableBase + 15,
	}
	for _, cidr := range c.PodCIDRs {
		r := netlink.NewRule()
		r.Priority = c.RulePriority - 1
		r.Family = family(cidr.Addr())
		r.Dst = prefixToIPNet(cidr)
		r.Table = mainTable
		p.rules = append(p.rules, r)
	}
	for _, path := range c.Paths {
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
		p.tables[table] = route

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
func (p *routingPlan) apply() error {
	var errs []error
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		existing, err := netlink.RuleList(fam)
		if err != nil {
			return fmt.Errorf("listing rules: %w", err)
		}
		for i := range existing {
			r := &existing[i]
			if r.Priority < p.minPrio || r.Priority > p.maxPrio {
				continue
			}
			wanted := false
			for _, w := range p.rules {
				wanted = wanted || (w.Family == fam && sameRule(r, w))
			}
			if !wanted {
				r.Family = fam
				if err := netlink.RuleDel(r); err != nil {
					errs = append(errs, fmt.Errorf("removing stale rule %v: %w", r, err))
				}
			}
		}
		for _, w := range p.rules {
			if w.Family != fam {
				continue
			}
			found := false
			for i := range existing {
				found = found || sameRule(&existing[i], w)
			}
			if !found {
				if err := netlink.RuleAdd(w); err != nil && !errors.Is(err, syscall.EEXIST) {
					errs = append(errs, fmt.Errorf("adding rule %v: %w", w, err))
				}
			}
		}
	}
	for table := p.minTable; table <= p.maxTable; table++ {
		want, ok := p.tables[table]
		if ok {
			if err := netlink.RouteReplace(&want); err != nil {
				errs = append(errs, fmt.Errorf("route in table %d: %w", table, err))
			}
		}
		if err := flushTable(table, func(r netlink.Route) bool {
			return ok && r.Dst != nil && want.Dst != nil && r.Dst.String() == want.Dst.String() && r.LinkIndex == want.LinkIndex && r.Gw.Equal(want.Gw)
		}); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// flushTable removes the routes of table that keep() rejects.
func flushTable(table int, keep func(netlink.Route) bool) error {
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
	}
	return nil
}

// removeRouting removes every rule and table in the agent's ranges.
func removeRouting(c *Config) error {
	empty := &routingPlan{tables: map[int]netlink.Route{}, minPrio: c.RulePriority - 1, maxPrio: c.RulePriority + 15, minTable: c.TableBase, maxTable: c.TableBase + 15}
	return empty.apply()
}
