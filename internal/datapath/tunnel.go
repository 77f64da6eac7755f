package datapath

import (
	"fmt"
	"net/netip"

	"github.com/mptcp-operator/mptcp-operator/internal/limits"
)

// TunnelHop says where nic_egress sends an overlay's outer packet to To (a
// peer node's address its tunnel sends to) when the packet carries a
// subflow of Path and left by another path's NIC: from Local, the node's
// address on Path, to Remote, the peer's there, by Path's NIC; only when
// the inner destination is in the pod CIDRs of the peer in Slot
// (SetPeerSlots), so that a node that claims another's address draws
// nothing but its own pods' traffic.
type TunnelHop struct {
	To            netip.Addr
	Path          uint32
	Local, Remote netip.Addr
	Slot          uint32
}

// TunnelArrival is a peer's address on a path (From) and the node's own
// there (To): nic_ingress marks an outer packet from the tunnel's port
// between them with its NIC's path, as one to the tunnel's own address.
type TunnelArrival struct {
	From, To netip.Addr
}

// SyncTunnelHops makes the datapath hold exactly arrivals and hops, of one
// family each. Unwanted entries go first: a hop missing for a moment only
// leaves a packet by the NIC the tunnel picked.
func (d *Datapath) SyncTunnelHops(arrivals []TunnelArrival, hops []TunnelHop) error {
	want := make(map[datapathTunnelHopKey]datapathTunnelHop, len(arrivals)+len(hops))
	for _, a := range arrivals {
		from, to := a.From.Unmap(), a.To.Unmap()
		if !from.IsValid() || !to.IsValid() || from.Is4() != to.Is4() {
			return fmt.Errorf("tunnel arrival from %v to %v: invalid", a.From, a.To)
		}
		v := datapathTunnelHop{}
		copy(v.Local[:], to.AsSlice())
		want[tunnelHopKey(from, 0)] = v
	}
	for _, h := range hops {
		to, local, remote := h.To.Unmap(), h.Local.Unmap(), h.Remote.Unmap()
		if !ValidPath(h.Path) || !to.IsValid() || !local.IsValid() || !remote.IsValid() ||
			to.Is4() != local.Is4() || to.Is4() != remote.Is4() || h.Slot == 0 {
			return fmt.Errorf("tunnel hop to %v by path %d, from %v to %v (peer slot %d): invalid",
				h.To, h.Path, h.Local, h.Remote, h.Slot)
		}
		v := datapathTunnelHop{Slot: h.Slot}
		copy(v.Local[:], local.AsSlice())
		copy(v.Remote[:], remote.AsSlice())
		want[tunnelHopKey(to, h.Path)] = v
	}
	if len(want) > limits.TunnelHops {
		return fmt.Errorf("tunnel hops: %d, at most %d", len(want), limits.TunnelHops)
	}
	keep := make(map[datapathTunnelHopKey]bool, len(want))
	for k := range want {
		keep[k] = true
	}
	if err := deleteUnwanted[datapathTunnelHopKey, datapathTunnelHop](d.objs.TunnelHops, keep); err != nil {
		return err
	}
	for k, v := range want {
		if err := d.objs.TunnelHops.Put(&k, &v); err != nil {
			return fmt.Errorf("tunnel hop by path %d: %w", k.Path, err)
		}
	}
	return nil
}

func tunnelHopKey(addr netip.Addr, path uint32) datapathTunnelHopKey {
	k := datapathTunnelHopKey{Family: family(addr), Path: uint8(path)}
	copy(k.Addr[:], addr.AsSlice())
	return k
}
