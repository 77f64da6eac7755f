package agent

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/internal/agent/liveness"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
)

// An overlay may send to any of a peer's addresses: for each, the hops lead
// to the peer's address on every other path from this node's own there,
// of the same family, checked against the peer's slot; a peer with no
// address on a path has no hop by it, one without a slot (no pod CIDRs
// known) none at all; every peer address is an arrival's source towards
// the node's own address on its path.
func TestTunnelHopsLeadToEachPeersAddressOnEveryOtherPath(t *testing.T) {
	a := netip.MustParseAddr
	paths := []liveness.Path{
		{Index: 1, Local: a("10.101.1.2"), Peers: []liveness.Peer{
			{Node: "n2", Addr: a("10.101.2.2")}, {Node: "n3", Addr: a("10.101.3.2")}, {Node: "n4", Addr: a("10.101.4.2")}}},
		{Index: 2, Local: a("10.102.1.2"), Peers: []liveness.Peer{{Node: "n2", Addr: a("10.102.2.2")}, {Node: "n4", Addr: a("10.102.4.2")}}},
		{Index: 3, Local: a("fd00:3::1"), Peers: []liveness.Peer{{Node: "n2", Addr: a("fd00:3::2")}}},
	}
	arrivals, hops := tunnelHops(paths, map[string]uint32{"n2": 4, "n3": 5})
	wantArrivals := []datapath.TunnelArrival{
		{From: a("10.101.2.2"), To: a("10.101.1.2")}, {From: a("10.101.3.2"), To: a("10.101.1.2")},
		{From: a("10.101.4.2"), To: a("10.101.1.2")}, {From: a("10.102.2.2"), To: a("10.102.1.2")},
		{From: a("10.102.4.2"), To: a("10.102.1.2")}, {From: a("fd00:3::2"), To: a("fd00:3::1")},
	}
	if !reflect.DeepEqual(arrivals, wantArrivals) {
		t.Errorf("arrivals\n%v\nwant\n%v", arrivals, wantArrivals)
	}
	want := []datapath.TunnelHop{
		{To: a("10.101.2.2"), Path: 2, Local: a("10.102.1.2"), Remote: a("10.102.2.2"), Slot: 4},
		{To: a("10.102.2.2"), Path: 1, Local: a("10.101.1.2"), Remote: a("10.101.2.2"), Slot: 4},
	}
	if !reflect.DeepEqual(hops, want) {
		t.Errorf("hops\n%v\nwant\n%v", hops, want)
	}
}
