package datapath

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/internal/limits"
)

// A subflow's first packet a selected pod sends to a peer's pod, and one in
// TRAFFIC_SAMPLE after, records the time in that peer's slot, and in no
// other; a packet to an address outside every peer's pod CIDRs records
// nothing, nor does one to a peer no longer listed.
func TestPodTrafficToAPeerIsNotedInItsSlot(t *testing.T) {
	dp := loadForTest(t)
	setRules(t, dp, map[uint32]Rule{0: {Paths: []uint32{1}}})
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	traffic, err := dp.PeerTraffic()
	if err != nil {
		t.Fatal(err)
	}
	peer, other := netip.MustParsePrefix("10.244.2.0/24"), netip.MustParsePrefix("10.244.3.0/24")
	if err := dp.SetPeerSlots(map[netip.Prefix]uint32{peer: 7, other: 8}); err != nil {
		t.Fatal(err)
	}
	noted := func() []uint32 {
		var out []uint32
		for slot := uint32(1); slot <= limits.ProbedPeers; slot++ {
			if _, ok := traffic.Since(slot); ok {
				out = append(out, slot)
			}
		}
		return out
	}
	stranger := netip.MustParseAddr("10.250.0.7")
	if p := placeSYN(t, dp, clientPod, 40001, stranger, 5201); p != 1 {
		t.Fatalf("subflow to %s placed on path %d, want 1", stranger, p)
	}
	if got := noted(); len(got) != 0 {
		t.Fatalf("a SYN to %s, in no peer's pod CIDRs, noted in slots %v", stranger, got)
	}
	if p := placeSYN(t, dp, clientPod, 40001, serverPod, 5201); p != 1 {
		t.Fatalf("subflow to %s placed on path %d, want 1", serverPod, p)
	}
	if got := noted(); !slices.Equal(got, []uint32{7}) {
		t.Fatalf("after the SYN to %s: slots %v noted, want 7", serverPod, got)
	}
	if since, _ := traffic.Since(7); since > time.Second {
		t.Fatalf("slot 7 noted %v ago, want just now", since)
	}

	// The next packets: one in 16 of the subflow's is noted.
	traffic.Forget(7)
	data := dataFrame(clientPod, 40001, serverPod, 5201)
	for range trafficSample - 2 {
		sentOn(t, dp, data)
	}
	if _, ok := traffic.Since(7); ok {
		t.Fatalf("slot 7 noted by one of the subflow's packets 2..%d", trafficSample-1)
	}
	sentOn(t, dp, data)
	if _, ok := traffic.Since(7); !ok {
		t.Fatalf("slot 7 not noted by the subflow's packet %d", trafficSample)
	}

	// The slots go with the map: a packet to a peer no longer listed is
	// noted nowhere.
	if err := dp.SetPeerSlots(map[netip.Prefix]uint32{other: 8}); err != nil {
		t.Fatal(err)
	}
	traffic.Forget(7)
	for range 2 * trafficSample {
		sentOn(t, dp, data)
	}
	if got := noted(); len(got) != 0 {
		t.Fatalf("packets to a peer no longer listed noted in slots %v", got)
	}
	if err := dp.SetPeerSlots(map[netip.Prefix]uint32{peer: 0}); err == nil || !strings.Contains(err.Error(), "slot 0") {
		t.Fatalf("slot 0 accepted (%v), want an error naming it", err)
	}
}

// trafficSample is TRAFFIC_SAMPLE (bpf/datapath.c).
const trafficSample = 16
