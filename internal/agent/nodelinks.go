package agent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"

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

// NetNSDir is where named network namespaces live (ip netns; CNI plugins
// and the test bed put pods' namespaces there).
var NetNSDir = "/var/run/netns"

// LocatePod finds a local pod from its addresses: the route to the first
// address (main table) leads to the pod's host-side interface, a veth; the
// veth's peer lives in the pod's network namespace, which the kernel names to
// this namespace by a netnsid. The namespace is found by comparing that id
// with the ids of the named namespaces under NetNSDir, then of the processes'
// /proc/<pid>/ns/net (a pod whose runtime does not name namespaces).
func LocatePod(ips []netip.Addr) (LocatedPod, error) {
	if len(ips) == 0 {
		return LocatedPod{}, errors.New("no address")
	}
	routes, err := netlink.RouteGet(ips[0].AsSlice())
	if err != nil || len(routes) == 0 {
		return LocatedPod{}, fmt.Errorf("no route to the pod's address %s: %v", ips[0], err)
	}
	link, err := netlink.LinkByIndex(routes[0].LinkIndex)
	if err != nil {
		return LocatedPod{}, fmt.Errorf("interface of the route to %s: %w", ips[0], err)
	}
	attrs := link.Attrs()
	if link.Type() != "veth" {
		return LocatedPod{}, fmt.Errorf("the route to %s leaves through %s, a %s and not a pod's veth", ips[0], attrs.Name, link.Type())
	}
	if attrs.NetNsID < 0 {
		return LocatedPod{}, fmt.Errorf("the peer of %s (route to %s) is in this namespace, not a pod's", attrs.Name, ips[0])
	}
	ns, err := namespaceByID(attrs.NetNsID)
	if err != nil {
		return LocatedPod{}, fmt.Errorf("namespace of %s's peer (route to %s): %w", attrs.Name, ips[0], err)
	}
	return LocatedPod{HostInterface: attrs.Name, NetNS: ns}, nil
}

func namespaceByID(id int) (string, error) {
	named, _ := filepath.Glob(filepath.Join(NetNSDir, "*"))
	procs, _ := filepath.Glob("/proc/[0-9]*/ns/net")
	for _, p := range append(named, procs...) {
		if nsid(p) == id {
			return p, nil
		}
	}
	return "", fmt.Errorf("no namespace under %s or /proc has netnsid %d", NetNSDir, id)
}

// nsid is the id this namespace gives the namespace at path, or -1.
func nsid(path string) int {
	f, err := os.Open(path)
	if err != nil {
		return -1
	}
	defer f.Close()
	id, err := netlink.GetNetNsIdByFd(int(f.Fd()))
	if err != nil {
		return -1
	}
	return id
}
