package datapath

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/internal/limits"
)

// A subflow's packet a selected pod sends out of a path NIC to a peer's pod
// records the time in that peer's slot, and in no other; a packet to an
// address outside every peer's pod CIDRs records nothing.
func TestPodTrafficToAPeerIsNotedInItsSlot(t *testing.T) {
	dp := loadForTest(t)
	setRules(t, dp, map[uint32]Rule{0: {Paths: []uint32{1}}})
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	// The test run's device is the loopback (ifindex 1): the path NIC
	// here; the packet entered the node from the pod's veth (any other
	// index).
	if err := dp.SetNIC(1, 1); err != nil {
		t.Fatal(err)
	}
	outOfNIC := skbContext{Ifindex: 1, IngressIfindex: 9}
	stranger := netip.MustParseAddr("10.250.0.7")
	for _, to := range []netip.Addr{serverPod, stranger} {
		if p := placeSYN(t, dp, clientPod, 40001, to, 5201); p != 1 {
			t.Fatalf("subflow to %s placed on path %d, want 1", to, p)
		}
	}
	traffic, err := dp.PeerTraffic()
	if err != nil {
		t.Fatal(err)
	}
	peer, other := netip.MustParsePrefix("10.244.2.0/24"), netip.MustParsePrefix("10.244.3.0/24")
	if err := dp.SetPeerSlots(map[netip.Prefix]uint32{peer: 7, other: 8}); err != nil {
		t.Fatal(err)
	}
	if _, ok := traffic.Since(7); ok {
		t.Fatal("slot 7 has traffic before any packet")
	}
	run(t, dp.objs.NicEgress, dataFrame(clientPod, 40001, stranger, 5201), outOfNIC)
	for slot := uint32(1); slot <= limits.ProbedPeers; slot++ {
		if _, ok := traffic.Since(slot); ok {
			t.Fatalf("a packet to %s, in no peer's pod CIDRs, noted in slot %d", stranger, slot)
		}
	}
	run(t, dp.objs.NicEgress, dataFrame(clientPod, 40001, serverPod, 5201), outOfNIC)
	if since, ok := traffic.Since(7); !ok || since > time.Second {
		t.Fatalf("after a packet to %s: slot 7 since %v (%v), want just now", serverPod, since, ok)
	}
	if _, ok := traffic.Since(8); ok {
		t.Fatal("a packet to one peer noted in another's slot")
	}

	// The slots go with the map: a packet to a peer no longer listed is
	// noted nowhere.
	if err := dp.SetPeerSlots(map[netip.Prefix]uint32{other: 8}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond) // past a tick of the coarse clock
	before, _ := traffic.Since(7)
	run(t, dp.objs.NicEgress, dataFrame(clientPod, 40001, serverPod, 5201), outOfNIC)
	if after, _ := traffic.Since(7); after < before {
		t.Fatalf("slot 7 written (%v ago, was %v) after its peer left the map", after, before)
	}
	if err := dp.SetPeerSlots(map[netip.Prefix]uint32{peer: 0}); err == nil || !strings.Contains(err.Error(), "slot 0") {
		t.Fatalf("slot 0 accepted (%v), want an error naming it", err)
	}
}
