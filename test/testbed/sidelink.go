package testbed

import (
	"context"
	"fmt"
	"net/netip"
	"time"
)

// SideLink is a link between two nodes that no path names, as a management network or an overlay's tunnel is: a
// veth straight from node A's namespace ("side<B>") to node B's ("side<A>"), addresses 10.99.0.<node>/24. It
// carries only what a test routes over it (RouteTCPPortOver): IPv6 is off on it and each end knows the other's MAC,
// so neither neighbour discovery nor ARP adds packets to its counters.
type SideLink struct {
	A, B         *Node
	AIf, BIf     string
	AAddr, BAddr netip.Addr
}

func sideAddr(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 99, 0, byte(i)}) }

// AddSideLink cables node i to node j directly. Reverse-path filtering is loose on both ends, as a node routing
// another network's traffic in over its management NIC has it: the node's routes to the other node's pods go by the
// fabrics. Everything it makes lives in the two node namespaces and goes with them.
func (b *Bed) AddSideLink(i, j int) (SideLink, error) {
	if i == j || i < 1 || j < 1 || i > len(b.Nodes) || j > len(b.Nodes) {
		return SideLink{}, fmt.Errorf("side link between nodes %d and %d of a bed of %d", i, j, len(b.Nodes))
	}
	l := SideLink{A: b.Node(i), B: b.Node(j), AIf: fmt.Sprintf("side%d", j), BIf: fmt.Sprintf("side%d", i), AAddr: sideAddr(i), BAddr: sideAddr(j)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ipBatch(ctx, l.A.NetNS, fmt.Sprintf("link add %s type veth peer name %s netns %s", l.AIf, l.BIf, l.B.NetNS)); err != nil {
		return SideLink{}, err
	}
	ends := []struct {
		node           *Node
		dev, peerDev   string
		addr, peerAddr netip.Addr
	}{{l.A, l.AIf, l.BIf, l.AAddr, l.BAddr}, {l.B, l.BIf, l.AIf, l.BAddr, l.AAddr}}
	for _, e := range ends {
		if err := b.sysctl(ctx, e.node.NetNS, fmt.Sprintf("net.ipv6.conf.%s.disable_ipv6=1", e.dev),
			fmt.Sprintf("net.ipv4.conf.%s.rp_filter=2", e.dev)); err != nil {
			return SideLink{}, err
		}
		if err := ipBatch(ctx, e.node.NetNS, fmt.Sprintf("addr add %s/24 dev %s", e.addr, e.dev), fmt.Sprintf("link set dev %s up", e.dev)); err != nil {
			return SideLink{}, err
		}
	}
	for _, e := range ends {
		mac, err := linkMAC(e.node.NetNS, e.dev)
		if err != nil {
			return SideLink{}, err
		}
		other := ends[0]
		if e.node == l.A {
			other = ends[1]
		}
		if err := ipBatch(ctx, other.node.NetNS, fmt.Sprintf("neigh replace %s lladdr %s dev %s nud permanent", e.addr, mac, other.dev)); err != nil {
			return SideLink{}, err
		}
	}
	return l, nil
}

// RouteTCPPortOver makes node A send its pods' TCP to port dport of node B's pods over the side link (ip rules by
// the pod's interface, protocol and destination port, priority 90, before the main table, to table 90), and nothing
// else: B's answers, and everything else A sends, go by the fabrics as before. Reverse-path filtering on A's NICs
// becomes loose: its reverse lookup for B's answers from that port takes the side link's table (the kernel does
// that lookup with the ports swapped), and strict filtering would drop them on the fabrics they come by.
func (b *Bed) RouteTCPPortOver(l SideLink, dport int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var sc []string
	for _, c := range l.A.NICs {
		sc = append(sc, fmt.Sprintf("net.ipv4.conf.%s.rp_filter=2", c.Name))
	}
	if err := b.sysctl(ctx, l.A.NetNS, sc...); err != nil {
		return err
	}
	cmds := []string{fmt.Sprintf("route add %s via %s dev %s table 90", l.B.PodCIDR, l.BAddr, l.AIf)}
	for _, p := range l.A.Pods {
		cmds = append(cmds, fmt.Sprintf("rule add priority 90 iif %s ipproto tcp dport %d lookup 90", p.HostIf, dport))
	}
	return ipBatch(ctx, l.A.NetNS, cmds...)
}

// SideLinkRxPackets is how many packets node B received on the side link.
func (b *Bed) SideLinkRxPackets(l SideLink) (uint64, error) {
	h, err := nsHandle(l.B.NetNS)
	if err != nil {
		return 0, err
	}
	defer h.Close()
	link, err := h.LinkByName(l.BIf)
	if err != nil {
		return 0, err
	}
	s := link.Attrs().Statistics
	if s == nil {
		return 0, fmt.Errorf("%s: no statistics", l.BIf)
	}
	return s.RxPackets, nil
}

func linkMAC(ns, dev string) (string, error) {
	h, err := nsHandle(ns)
	if err != nil {
		return "", err
	}
	defer h.Close()
	link, err := h.LinkByName(dev)
	if err != nil {
		return "", err
	}
	return link.Attrs().HardwareAddr.String(), nil
}
