package datapath

import (
	"net/netip"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
)

// dataFrame is a data segment from src:sport to dst:dport.
func dataFrame(src netip.Addr, sport uint16, dst netip.Addr, dport uint16) []byte {
	return testpkt.Frame{Src: src, Dst: dst, TCP: &testpkt.TCP{SrcPort: sport, DstPort: dport, Seq: 2, Ack: 8, Flags: testpkt.ACK, Payload: []byte("data")}}.Bytes()
}

// arrivedOn is the context of a packet nic_ingress marked with path.
func (d *Datapath) arrivedOn(path uint32) skbContext {
	return skbContext{Mark: path << d.markShift}
}

// sentOn runs a packet the pod sends through pod_egress and returns the path
// it leaves by.
func sentOn(t *testing.T, dp *Datapath, frame []byte) uint32 {
	t.Helper()
	return dp.pathOfMark(t, run(t, dp.objs.PodEgress, frame, skbContext{}))
}

func detourOf(t *testing.T, dp *Datapath) uint32 {
	t.Helper()
	sfs, err := dp.Subflows()
	if err != nil {
		t.Fatal(err)
	}
	if len(sfs) != 1 {
		t.Fatalf("subflow table %+v, want one entry", sfs)
	}
	return sfs[0].Detour
}

// settle outlasts DETOUR_SETTLE_MS (bpf/include/detour.h), and with it
// DETOUR_SILENT_MS; followMax outlasts DETOUR_FOLLOW_MAX_MS.
const (
	settle    = 300 * time.Millisecond
	followMax = 10100 * time.Millisecond
)

// A subflow whose path goes down on its node leaves by another path of its
// rule at once, keeps its path, and goes home when the path comes back. The
// peer's packets still arriving over the detour just after are late ones:
// the subflow stays home. Once its own path has gone quiet, a move of the
// peer's is followed, and a followed detour ends after a while.
func TestSubflowDetoursWhileItsPathIsDownAndComesHome(t *testing.T) {
	dp := loadForTest(t)
	setRules(t, dp, map[uint32]Rule{0: {Paths: []uint32{1, 2}}})
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	home := uint32(placeSYN(t, dp, clientPod, 40001, serverPod, 5201))
	other := 3 - home
	out := dataFrame(clientPod, 40001, serverPod, 5201)
	in := dataFrame(serverPod, 5201, clientPod, 40001)

	if p := sentOn(t, dp, out); p != home {
		t.Fatalf("before the failure: sent on path %d, want %d", p, home)
	}
	if err := dp.SetPathDown(home, true); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if p := sentOn(t, dp, out); p != other {
			t.Fatalf("path %d down: sent on path %d, want the rule's other path %d", home, p, other)
		}
	}
	if d := detourOf(t, dp); d != other {
		t.Errorf("subflow detour %d, want %d", d, other)
	}
	if n := stat(t, dp, StatSubflowDetoured); n != 1 {
		t.Errorf("detoured counted %d times, want once", n)
	}
	// The peer answers over the detour: nothing changes.
	run(t, dp.objs.PodIngress, in, dp.arrivedOn(other))

	if err := dp.SetPathDown(home, false); err != nil {
		t.Fatal(err)
	}
	if p := sentOn(t, dp, out); p != home {
		t.Fatalf("path back up: sent on path %d, want home %d", p, home)
	}
	if n := stat(t, dp, StatSubflowHomed); n != 1 {
		t.Errorf("homed counted %d times, want once", n)
	}
	run(t, dp.objs.PodIngress, in, dp.arrivedOn(home))  // the peer is home
	run(t, dp.objs.PodIngress, in, dp.arrivedOn(other)) // a late packet of the detour
	if p := sentOn(t, dp, out); p != home {
		t.Fatalf("after a late packet over the detour: sent on path %d, want home %d", p, home)
	}
	time.Sleep(settle) // nothing over home: the peer may have moved
	run(t, dp.objs.PodIngress, in, dp.arrivedOn(other))
	if p := sentOn(t, dp, out); p != other {
		t.Fatalf("the peer moved the subflow: sent on path %d, want %d", p, other)
	}
	if d := detourOf(t, dp); d != other {
		t.Errorf("subflow detour %d after following the peer, want %d", d, other)
	}
	time.Sleep(followMax)
	if p := sentOn(t, dp, out); p != home {
		t.Fatalf("a followed detour past its time: sent on path %d, want home %d", p, home)
	}
}

// The responder's node follows a subflow the peer moved onto another path,
// so that the replies take the live path too, and follows it back home
// once the detour has gone quiet.
func TestResponderFollowsThePeersDetourAndBack(t *testing.T) {
	dp := mirroredJoinBed(t) // the peer's join arrived on path 2
	in := dataFrame(clientPod, 45000, serverPod, 5201)
	reply := dataFrame(serverPod, 5201, clientPod, 45000)

	run(t, dp.objs.PodIngress, in, dp.arrivedOn(1))
	if p := sentOn(t, dp, reply); p != 1 {
		t.Fatalf("peer sends over path 1: reply on path %d, want 1", p)
	}
	if d := detourOf(t, dp); d != 1 {
		t.Errorf("subflow detour %d, want 1", d)
	}
	run(t, dp.objs.PodIngress, in, dp.arrivedOn(2)) // too soon after the move
	if p := sentOn(t, dp, reply); p != 1 {
		t.Fatalf("a packet over path 2 right after the move: reply on path %d, want still 1", p)
	}
	time.Sleep(settle)
	run(t, dp.objs.PodIngress, in, dp.arrivedOn(2))
	run(t, dp.objs.PodIngress, in, dp.arrivedOn(1)) // late, from the detour's queue
	if p := sentOn(t, dp, reply); p != 2 {
		t.Fatalf("peer back on path 2: reply on path %d, want 2", p)
	}
	if d := detourOf(t, dp); d != 0 {
		t.Errorf("subflow detour %d after the peer came home, want none", d)
	}
	if n := stat(t, dp, StatSubflowFollowed); n != 2 {
		t.Errorf("followed counted %d times, want 2", n)
	}
	// A path the follower's own node has down is not taken: home instead.
	time.Sleep(settle)
	run(t, dp.objs.PodIngress, in, dp.arrivedOn(1))
	if err := dp.SetPathDown(1, true); err != nil {
		t.Fatal(err)
	}
	if p := sentOn(t, dp, reply); p != 2 {
		t.Fatalf("followed onto path 1, which is down here: reply on path %d, want home 2", p)
	}
}

// A packet with a subflow's 4-tuple arriving over a path the subflow's rule
// does not list (forged on another fabric) does not move the subflow there;
// nor does one no path NIC marked, nor one over a listed path while the
// peer's packets still arrive over the subflow's own, nor a SYN.
func TestForgedArrivalMovesNothing(t *testing.T) {
	dp := mirroredJoinBed(t)
	in := dataFrame(clientPod, 45000, serverPod, 5201)
	reply := dataFrame(serverPod, 5201, clientPod, 45000)
	run(t, dp.objs.PodIngress, in, dp.arrivedOn(3))
	run(t, dp.objs.PodIngress, in, skbContext{})
	for i := 0; i < 5; i++ {
		run(t, dp.objs.PodIngress, in, dp.arrivedOn(2)) // the peer's own
		run(t, dp.objs.PodIngress, in, dp.arrivedOn(1)) // forged
	}
	if p := sentOn(t, dp, reply); p != 2 {
		t.Fatalf("reply on path %d, want 2", p)
	}
	if n := stat(t, dp, StatSubflowFollowed); n != 0 {
		t.Errorf("followed counted %d times, want none", n)
	}
	// Nor a SYN with its 4-tuple over the other path once it is quiet: a
	// moved subflow sends none, and anyone can send one.
	time.Sleep(settle)
	run(t, dp.objs.PodIngress, syn(clientPod, 45000, serverPod, 5201, testpkt.MPCapableSYN()), dp.arrivedOn(1))
	if p := sentOn(t, dp, reply); p != 2 {
		t.Fatalf("after a SYN over path 1: reply on path %d, want 2", p)
	}
}

// A detoured subflow is policed as the path it travels: a per-path cap on
// the detour holds the subflow whose own path is down.
func TestDetouredSubflowIsPolicedOnThePathItTravels(t *testing.T) {
	const rateBps, burst = 8_000_000, 64 << 10
	dp := loadForTest(t)
	setRules(t, dp, map[uint32]Rule{0: {Paths: []uint32{1, 2}, Spread: SpreadPreferred}})
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetRateRule(0, OwnBudget(0), RateConfig{Mode: RatePolice, PerPath: map[uint32]uint64{2: rateBps}, Directions: Egress, BurstBytes: burst}); err != nil {
		t.Fatal(err)
	}
	if p := placeSYN(t, dp, clientPod, 40001, serverPod, 5201); p != 1 {
		t.Fatalf("placed on path %d, want 1 (preferred)", p)
	}
	run(t, dp.objs.PodEgress, capableACK(clientPod, 40001, serverPod, 5201, 1, 2), skbContext{})
	out := testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: 40001, DstPort: 5201, Seq: 2, Ack: 8, Flags: testpkt.ACK, Payload: make([]byte, 1400)}}.Bytes()
	send := func(n int) (dropped int) {
		for range n {
			if ret, _ := runOut(t, dp.objs.PodEgress, out); ret == tcActShot {
				dropped++
			}
		}
		return dropped
	}
	if d := send(100); d != 0 {
		t.Fatalf("on its own path 1, uncapped: %d of 100 packets dropped", d)
	}
	if err := dp.SetPathDown(1, true); err != nil {
		t.Fatal(err)
	}
	if d := send(100); d < 40 {
		t.Errorf("detoured onto path 2, capped at 1 MB/s with a 64 KiB burst: %d of 100 packets of 1.4 kB dropped, want all but the burst", d)
	}
	if n := stat(t, dp, StatRateDropPath); n == 0 {
		t.Error("no drop counted against the path")
	}
}

// A path down towards one peer alone (its probes are answered by other
// peers) sends that peer's subflows round it, from their next packet, and
// leaves every other peer's subflow at home; once the peer answers again
// they come home.
func TestSubflowDetoursFromAPathDownTowardsItsPeerAlone(t *testing.T) {
	dp := loadForTest(t)
	setRules(t, dp, map[uint32]Rule{0: {Paths: []uint32{1, 2}, Spread: SpreadPreferred}})
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	elsewhere := netip.MustParseAddr("10.244.3.11") // a pod of another peer
	if p := placeSYN(t, dp, clientPod, 40001, serverPod, 5201); p != 1 {
		t.Fatalf("first subflow placed on path %d, want 1", p)
	}
	if p := placeSYN(t, dp, clientPod, 40002, elsewhere, 5201); p != 1 {
		t.Fatalf("second subflow placed on path %d, want 1", p)
	}
	toPeer := dataFrame(clientPod, 40001, serverPod, 5201)
	toOther := dataFrame(clientPod, 40002, elsewhere, 5201)

	peer := netip.MustParsePrefix("10.244.2.0/24")
	if err := dp.SetPeersDown(map[netip.Prefix]PathMask{peer: PathMask(0).With(1)}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if p := sentOn(t, dp, toPeer); p != 2 {
			t.Fatalf("path 1 down towards %s: sent on path %d, want 2", peer, p)
		}
		if p := sentOn(t, dp, toOther); p != 1 {
			t.Fatalf("path 1 down towards %s alone: a packet to %s sent on path %d, want 1", peer, elsewhere, p)
		}
	}
	if n := stat(t, dp, StatSubflowDetoured); n != 1 {
		t.Errorf("detoured counted %d times, want once", n)
	}

	// Both paths down towards the peer: nowhere to go, the kernel's own
	// recovery over the subflow's path.
	if err := dp.SetPeersDown(map[netip.Prefix]PathMask{peer: PathMask(0).With(1).With(2)}); err != nil {
		t.Fatal(err)
	}
	if p := sentOn(t, dp, toPeer); p != 1 {
		t.Fatalf("every path down towards %s: sent on path %d, want its own path 1", peer, p)
	}

	if err := dp.SetPeersDown(nil); err != nil {
		t.Fatal(err)
	}
	if p := sentOn(t, dp, toPeer); p != 1 {
		t.Fatalf("the peer answers again: sent on path %d, want home 1", p)
	}
	if n := stat(t, dp, StatSubflowHomed); n != 1 {
		t.Errorf("homed counted %d times, want once", n)
	}
	var used uint32
	if err := dp.objs.PeersDownUsed.Lookup(uint32(0), &used); err != nil || used != 0 {
		t.Errorf("peers_down_used %d (%v) with nothing down, want 0", used, err)
	}
}
