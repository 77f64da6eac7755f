package compile

import (
	"cmp"
	"net/netip"
	"slices"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
)

// Pod CIDRs shorter than these are no node's pod range (the Kubernetes
// defaults are /24 and /64): a node that claims one would have every
// peer steer traffic to far more than its pods.
const (
	minPodCIDRBits4 = 16
	minPodCIDRBits6 = 48
)

// peerPodCIDRs are the pod CIDRs each node state's peers may act on
// (NodePeer.PodCIDRs), by node name: those that parse, are no shorter than
// a node's pod range, overlap no other node's, and hold no address another
// node state lists (its pods', its paths'). A node sets its own
// Node's spec.podCIDRs while they are empty (clusters whose network plugin
// assigns pod addresses itself), so a compromised node could claim another
// node's range, or a wider one: an overlapping CIDR is dropped for every
// node that claims it, since which of them is honest cannot be told, and
// the peers of a node whose CIDR is dropped reach it as when nodes have
// none. At most two per node (one per family, as Kubernetes allows).
func peerPodCIDRs(states []mptcpv1alpha1.MPTCPNodeState) map[string][]netip.Prefix {
	type claim struct {
		node   string
		prefix netip.Prefix
	}
	var claims []claim
	for i := range states {
		n := 0
		for _, s := range states[i].Spec.PodCIDRs {
			p, err := netip.ParsePrefix(s)
			if err != nil || p.Addr().Zone() != "" || p.Addr().Is4In6() || n == 2 {
				continue
			}
			floor := minPodCIDRBits6
			if p.Addr().Is4() {
				floor = minPodCIDRBits4
			}
			if p.Bits() < floor {
				continue
			}
			claims = append(claims, claim{states[i].Name, p.Masked()})
			n++
		}
	}
	// CIDRs nest or are disjoint: in order of their first address, one
	// overlaps an earlier one exactly when it starts before the furthest
	// end so far, which belongs to a CIDR that holds it.
	slices.SortFunc(claims, func(a, b claim) int {
		if c := a.prefix.Addr().Compare(b.prefix.Addr()); c != 0 {
			return c
		}
		return cmp.Compare(a.prefix.Bits(), b.prefix.Bits())
	})
	dropped := make([]bool, len(claims))
	// A claim that holds an address another node has (its pods', or its
	// own on a path) is no pod range of the claimant's: in a cluster whose
	// nodes declare no CIDRs, a claim of the whole pod pool is caught so.
	held := heldAddresses(states)
	for i, c := range claims {
		first, last := c.prefix.Addr(), lastAddr(c.prefix)
		at, _ := slices.BinarySearchFunc(held, first, func(h heldAddress, a netip.Addr) int { return h.addr.Compare(a) })
		for ; at < len(held) && held[at].addr.Compare(last) <= 0; at++ {
			if held[at].node != c.node {
				dropped[i] = true
				break
			}
		}
	}
	widest := -1
	for i, c := range claims {
		if widest >= 0 && claims[widest].prefix.Addr().Is4() == c.prefix.Addr().Is4() && claims[widest].prefix.Overlaps(c.prefix) {
			dropped[i], dropped[widest] = true, true
			if lastAddr(c.prefix).Compare(lastAddr(claims[widest].prefix)) <= 0 {
				continue
			}
		}
		widest = i
	}
	out := map[string][]netip.Prefix{}
	for i, c := range claims {
		if !dropped[i] {
			out[c.node] = append(out[c.node], c.prefix)
		}
	}
	for _, ps := range out {
		slices.SortFunc(ps, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	}
	return out
}

// lastAddr is the last address of p (masked).
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// heldAddress is an address a node state lists: one of its pods' or one
// the controller gave it on a path.
type heldAddress struct {
	addr netip.Addr
	node string
}

// heldAddresses are the addresses the node states list, sorted.
func heldAddresses(states []mptcpv1alpha1.MPTCPNodeState) []heldAddress {
	var out []heldAddress
	add := func(node, s string) {
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, heldAddress{a.Unmap().WithZone(""), node})
		}
	}
	for i := range states {
		for _, p := range states[i].Spec.Pods {
			for _, ip := range p.IPs {
				add(states[i].Name, ip)
			}
		}
		for _, p := range states[i].Spec.Paths {
			for _, ip := range p.Addresses {
				add(states[i].Name, ip)
			}
		}
	}
	slices.SortFunc(out, func(a, b heldAddress) int { return a.addr.Compare(b.addr) })
	return out
}
