package agent

import (
	"maps"
	"net/netip"
	"slices"

	"github.com/mptcp-operator/mptcp-operator/internal/agent/liveness"
	"github.com/mptcp-operator/mptcp-operator/internal/limits"
)

// peerSlots numbers the probed peers for the datapath's traffic record
// (datapath.SetPeerSlots): a peer keeps its slot while it is probed, so
// that what its slot recorded stays its own, and a slot freed by a peer
// that left is given to the next newcomer, its record cleared first.
type peerSlots struct {
	byNode  map[string]uint32
	written map[netip.Prefix]uint32
}

// assign gives every node in nodes a slot, 1..limits.ProbedPeers, keeping
// those they had, and frees the others'; a node beyond the slots gets 0.
// fresh are the nodes given a slot now.
func (s *peerSlots) assign(nodes []string) (slots map[string]uint32, fresh []string) {
	want := map[string]bool{}
	for _, n := range nodes {
		want[n] = true
	}
	used := map[uint32]bool{}
	for n, slot := range s.byNode {
		if !want[n] {
			delete(s.byNode, n)
			continue
		}
		used[slot] = true
	}
	if s.byNode == nil {
		s.byNode = map[string]uint32{}
	}
	next := uint32(1)
	for _, n := range slices.Sorted(maps.Keys(want)) {
		if s.byNode[n] != 0 {
			continue
		}
		for next <= limits.ProbedPeers && used[next] {
			next++
		}
		if next > limits.ProbedPeers {
			break
		}
		s.byNode[n], used[next] = next, true
		fresh = append(fresh, n)
	}
	return s.byNode, fresh
}

// syncPeerSlots numbers the peers of paths (Peer.Slot), writes their pod
// CIDRs' slots to the datapath, and clears the record of the slots given
// now (a departed peer's traffic is not the newcomer's). A peer without pod
// CIDRs keeps slot 0: its traffic cannot be told (the prober ranks it after
// those with traffic). A write that fails leaves every slot 0 (the same),
// is logged, and is tried again at the next plan.
func (a *Agent) syncPeerSlots(paths []liveness.Path, cidrs map[string][]netip.Prefix) {
	var nodes []string
	for _, p := range paths {
		for _, peer := range p.Peers {
			if len(cidrs[peer.Node]) > 0 {
				nodes = append(nodes, peer.Node)
			}
		}
	}
	slots, fresh := a.peerSlots.assign(nodes)
	want := map[netip.Prefix]uint32{}
	for node, slot := range slots {
		for _, cidr := range cidrs[node] {
			want[cidr] = slot
		}
	}
	if a.peerSlots.written == nil || !maps.Equal(want, a.peerSlots.written) {
		if err := a.dp.SetPeerSlots(want); err != nil {
			a.log.Error("liveness: writing the peers' pod CIDRs", "err", err)
			a.peerSlots.written = nil
			for _, n := range fresh {
				delete(slots, n) // fresh again at the next plan
			}
			return
		}
		a.peerSlots.written = want
	}
	for _, n := range fresh {
		a.peerTraffic.Forget(slots[n])
	}
	for i := range paths {
		peers := slices.Clone(paths[i].Peers)
		for j := range peers {
			peers[j].Slot = slots[peers[j].Node]
		}
		paths[i].Peers = peers
	}
}
