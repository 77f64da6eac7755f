package datapath

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/internal/limits"
)

// A subflow's packet a selected pod sends to a peer's pod records the time
// in that peer's slot, and in no other; a packet to an address outside
// every peer's pod CIDRs records nothing; a forgotten slot has no record
// until the next packet (in a later tick of the coarse clock).
func TestPodTrafficToAPeerIsNotedInItsSlot(t *testing.T) {
	dp := loadForTest(t)
	setRules(t, dp, map[uint32]Rule{0: {Paths: []uint32{1}}})
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
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
	sentOn(t, dp, dataFrame(clientPod, 40001, stranger, 5201))
	for slot := uint32(1); slot <= limits.ProbedPeers; slot++ {
		if _, ok := traffic.Since(slot); ok {
			t.Fatalf("a packet to %s, in no peer's pod CIDRs, noted in slot %d", stranger, slot)
		}
	}
	sentOn(t, dp, dataFrame(clientPod, 40001, serverPod, 5201))
	if since, ok := traffic.Since(7); !ok || since > time.Second {
		t.Fatalf("after a packet to %s: slot 7 since %v (%v), want just now", serverPod, since, ok)
	}
	if _, ok := traffic.Since(8); ok {
		t.Fatal("a packet to one peer noted in another's slot")
	}
	traffic.Forget(7)
	if since, ok := traffic.Since(7); ok {
		t.Fatalf("slot 7 forgotten, still noted %v ago", since)
	}
	time.Sleep(10 * time.Millisecond) // past a tick of the coarse clock
	sentOn(t, dp, dataFrame(clientPod, 40001, serverPod, 5201))
	if _, ok := traffic.Since(7); !ok {
		t.Fatal("slot 7 forgotten: the next packet noted nothing")
	}

	// The slots go with the map: a packet to a peer no longer listed is
	// noted nowhere.
	if err := dp.SetPeerSlots(map[netip.Prefix]uint32{other: 8}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond) // past a tick of the coarse clock
	before, _ := traffic.Since(7)
	sentOn(t, dp, dataFrame(clientPod, 40001, serverPod, 5201))
	if after, _ := traffic.Since(7); after < before {
		t.Fatalf("slot 7 written (%v ago, was %v) after its peer left the map", after, before)
	}
	if err := dp.SetPeerSlots(map[netip.Prefix]uint32{peer: 0}); err == nil || !strings.Contains(err.Error(), "slot 0") {
		t.Fatalf("slot 0 accepted (%v), want an error naming it", err)
	}
}
