package agent

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Links reads the links of the agent's network namespace for path resolution.
//
// A path's gateway is, in order: the next hop of a default route in the main
// table through the link; otherwise the first host address of the link's
// IPv4 subnet (the router address by convention on a NIC's subnet, and in
// the test bed). The agent writes the path's routing table with that next
// hop, so a path whose NIC has no default route still gets one in its table.
func Links() ([]NodeLink, error) {
	all, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("listing routes: %w", err)
	}
	out := make([]NodeLink, 0, len(all))
	for _, l := range all {
		attrs := l.Attrs()
		nl := NodeLink{Name: attrs.Name, AltNames: attrs.AltNames, Up: attrs.Flags&net.FlagUp != 0 && attrs.OperState != netlink.OperDown}
		addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return nil, fmt.Errorf("addresses of %s: %w", attrs.Name, err)
		}
		var subnetGW netip.Addr
		for _, a := range addrs {
			ip, ok := netip.AddrFromSlice(a.IP)
			if !ok || ip.IsLinkLocalUnicast() {
				continue
			}
			ones, _ := a.Mask.Size()
			p := netip.PrefixFrom(ip.Unmap(), ones)
			nl.Addresses = append(nl.Addresses, p)
			if p.Addr().Is4() && !subnetGW.IsValid() && p.Bits() < 31 {
				if first := p.Masked().Addr().Next(); first != p.Addr() {
					subnetGW = first
				}
			}
		}
		for _, r := range routes {
			if r.LinkIndex == attrs.Index && r.Gw != nil && (r.Dst == nil || isDefault(r.Dst)) {
				if gw, ok := netip.AddrFromSlice(r.Gw); ok {
					nl.Gateway = gw.Unmap()
					break
				}
			}
		}
		if !nl.Gateway.IsValid() {
			nl.Gateway = subnetGW
		}
		out = append(out, nl)
	}
	return out, nil
}

func isDefault(n *net.IPNet) bool { ones, _ := n.Mask.Size(); return ones == 0 }
