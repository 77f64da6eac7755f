package agent

import (
	"net/netip"
	"sort"

	"github.com/mptcp-operator/mptcp-operator/internal/agent/liveness"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
)

// tunnelHops are where an overlay's outer packets go by each path, from the
// liveness plan (the peers the node probes on each path and their addresses)
// and the peers' slots (syncPeerSlots): for each address a peer has on a
// path, which its tunnel may send to, the peer's address on every other path
// with the node's own there, of the same family; and each peer address with
// the node's own on its path, between which arrivals take their NIC's path.
// A peer without a slot (no pod CIDRs known) gets no hop: the datapath could
// not check that the inner packet goes to its pods.
func tunnelHops(paths []liveness.Path, slots map[string]uint32) ([]datapath.TunnelArrival, []datapath.TunnelHop) {
	type peerAddrs struct {
		slot   uint32
		byPath map[uint32]netip.Addr
	}
	local := map[uint32]netip.Addr{}
	peers := map[string]*peerAddrs{}
	var arrivals []datapath.TunnelArrival
	for _, p := range paths {
		if !p.Local.IsValid() {
			continue
		}
		local[p.Index] = p.Local
		for _, peer := range p.Peers {
			if peer.Addr.Is4() != p.Local.Is4() {
				continue
			}
			arrivals = append(arrivals, datapath.TunnelArrival{From: peer.Addr, To: p.Local})
			if peers[peer.Node] == nil {
				peers[peer.Node] = &peerAddrs{byPath: map[uint32]netip.Addr{}}
			}
			peers[peer.Node].slot = slots[peer.Node]
			peers[peer.Node].byPath[p.Index] = peer.Addr
		}
	}
	var hops []datapath.TunnelHop
	for _, peer := range peers {
		if peer.slot == 0 {
			continue
		}
		for _, to := range peer.byPath {
			for path, remote := range peer.byPath {
				if remote != to && remote.Is4() == to.Is4() {
					hops = append(hops, datapath.TunnelHop{To: to, Path: path, Local: local[path], Remote: remote, Slot: peer.slot})
				}
			}
		}
	}
	sort.Slice(arrivals, func(i, j int) bool { return arrivals[i].From.Less(arrivals[j].From) })
	sort.Slice(hops, func(i, j int) bool {
		if hops[i].To != hops[j].To {
			return hops[i].To.Less(hops[j].To)
		}
		return hops[i].Path < hops[j].Path
	})
	return arrivals, hops
}
