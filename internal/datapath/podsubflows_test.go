package datapath

import (
	"maps"
	"net/netip"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/internal/limits"
	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
)

// podSlots is how many subflow entries the programs count for each pod
// slot that has any.
func podSlots(t *testing.T, dp *Datapath) map[uint32]uint32 {
	t.Helper()
	counts, err := dp.PodSubflows()
	if err != nil {
		t.Fatal(err)
	}
	return counts
}

// podEntries is how many subflow entries the programs count for slot.
func podEntries(t *testing.T, dp *Datapath, slot uint32) uint32 {
	t.Helper()
	var n uint32
	if err := dp.objs.PodSubflows.Lookup(slot, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A pod holds at most limits.PodSubflows entries of the subflow table: its
// connections beyond, its own and those peers open to it, are left
// unplaced, joins its rules select are refused (its own and its peers', a
// peer's answered before the pod filled stopped at its third ACK: it would
// complete uncounted), and another pod of the node is placed as before. A subflow of the pod
// that closes makes room for one more. The programs' count is the table's:
// counting the table again changes nothing.
func TestAPodHoldsAtMostItsShareOfTheSubflowTable(t *testing.T) {
	dp := loadForTest(t)
	if err := dp.SetRule(0, Rule{Paths: []uint32{1, 2}, CIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}); err != nil {
		t.Fatal(err)
	}
	neighbour := netip.MustParseAddr("10.244.1.12")
	for _, pod := range []netip.Addr{clientPod, neighbour} {
		if err := dp.SetEndpoint(pod, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := dp.SetNIC(nic2Ifindex, 2); err != nil {
		t.Fatal(err)
	}
	podEgress := dp.objs.PodEgress
	placed := func(mark uint32) bool { return mark&dp.markMask != 0 }

	// A peer's join waits for its third ACK while the pod fills.
	joiner := netip.AddrPortFrom(serverPod, 50001)
	run(t, dp.objs.NicIngress, syn(joiner.Addr(), joiner.Port(), clientPod, 80, testpkt.MPJoinSYN(tokenOf(0x2222), 5, 1, false)),
		skbContext{IngressIfindex: nic2Ifindex})
	answer := testpkt.Frame{Src: clientPod, Dst: joiner.Addr(), TCP: &testpkt.TCP{SrcPort: 80, DstPort: joiner.Port(), Seq: 7, Ack: 2,
		Flags: testpkt.SYN | testpkt.ACK, Options: testpkt.MPJoinSYNACK(1, 2, 1, false)}}.Bytes()
	run(t, podEgress, answer, skbContext{})

	// The pod opens connections until it holds its share. Its own
	// subflows may evict each other from a full bucket (a few of 4096
	// keys in 16384 buckets of four): the count is of the entries it
	// holds, so open more until it is full.
	first := syn(clientPod, 20000, serverPod, 5201, testpkt.MPCapableSYN())
	if !placed(run(t, podEgress, first, skbContext{})) {
		t.Fatal("the pod's first subflow was not placed")
	}
	slot := uint32(0)
	for s, n := range podSlots(t, dp) {
		if n == 1 {
			slot = s
		}
	}
	if slot == 0 {
		t.Fatalf("no pod slot counts the first subflow: %v", podSlots(t, dp))
	}
	opened := 1
	for port := 0; podEntries(t, dp, slot) < uint32(limits.PodSubflows); port++ {
		if opened > 2*limits.PodSubflows {
			t.Fatalf("%d subflows opened, the pod holds %d entries, want %d", opened, podEntries(t, dp, slot), limits.PodSubflows)
		}
		frame := syn(clientPod, uint16(20001+port%40000), serverPod, uint16(6000+port/40000), testpkt.MPCapableSYN())
		if !placed(run(t, podEgress, frame, skbContext{})) {
			t.Fatalf("subflow %d of the pod was not placed with %d entries held", opened, podEntries(t, dp, slot))
		}
		opened++
	}

	// Full: its next subflow takes plain routing and writes no entry.
	refused := stat(t, dp, StatPodSubflowsFull)
	extra := netip.AddrPortFrom(clientPod, 61000)
	if mark := run(t, podEgress, syn(clientPod, extra.Port(), serverPod, 5201, testpkt.MPCapableSYN()), skbContext{}); placed(mark) {
		t.Errorf("a subflow of the full pod was placed (mark %#x)", mark)
	}
	if hasEntry(t, dp, extra, netip.AddrPortFrom(serverPod, 5201)) {
		t.Error("a subflow of the full pod has an entry")
	}
	if got := stat(t, dp, StatPodSubflowsFull); got != refused+1 {
		t.Errorf("pod_subflows_full = %d, want %d", got, refused+1)
	}

	// A join of its own is refused, with a reset into the pod (unplaced,
	// it would escape its rule's maximum).
	ownJoin := syn(clientPod, 61001, serverPod, 5201, testpkt.MPJoinSYN(tokenOf(0x3333), 5, 1, false))
	if ret := verdict(t, podEgress, ownJoin, skbContext{}); ret != tcActRedirect {
		t.Errorf("a join of the full pod: verdict %d, want TC_ACT_REDIRECT (refused)", int32(ret))
	}

	// A join no rule selects was never placed, and is not refused.
	unselected := syn(clientPod, 61002, otherNet, 5201, testpkt.MPJoinSYN(tokenOf(0x4444), 5, 1, false))
	if ret := verdict(t, podEgress, unselected, skbContext{}); ret != tcxNext {
		t.Errorf("a join of the full pod that no rule selects: verdict %d, want it passed", int32(ret))
	}

	// A peer's connection to it runs unplaced; a peer's join is refused
	// at its SYN, with a reset, and one answered before the pod filled is
	// stopped at its third ACK (it would complete uncounted).
	peer := netip.AddrPortFrom(serverPod, 50000)
	acceptFromWire(t, dp, peer, netip.AddrPortFrom(clientPod, 80), testpkt.MPCapableSYN(), nic2Ifindex, 0x1111, 0x2222)
	if hasEntry(t, dp, netip.AddrPortFrom(clientPod, 80), peer) {
		t.Error("a peer's connection to the full pod has an entry")
	}
	lateJoin := syn(serverPod, 50002, clientPod, 80, testpkt.MPJoinSYN(tokenOf(0x2222), 5, 1, false))
	if ret := verdict(t, dp.objs.NicIngress, lateJoin, skbContext{IngressIfindex: nic2Ifindex}); ret != tcActRedirect {
		t.Errorf("a peer's join SYN to the full pod: verdict %d, want TC_ACT_REDIRECT (refused)", int32(ret))
	}
	third := testpkt.Frame{Src: joiner.Addr(), Dst: clientPod, TCP: &testpkt.TCP{SrcPort: joiner.Port(), DstPort: 80, Seq: 2, Ack: 8,
		Flags: testpkt.ACK, Options: testpkt.MPJoinACK([20]byte{1})}}.Bytes()
	if ret := verdict(t, dp.objs.NicIngress, third, skbContext{IngressIfindex: nic2Ifindex}); ret != tcActShot {
		t.Errorf("a join's third ACK to the full pod returned %d, want TC_ACT_SHOT", int32(ret))
	}
	if got := podEntries(t, dp, slot); got != uint32(limits.PodSubflows) {
		t.Errorf("the full pod holds %d entries, want %d", got, limits.PodSubflows)
	}

	// The neighbour is placed as before.
	if !placed(run(t, podEgress, syn(neighbour, 40000, serverPod, 5201, testpkt.MPCapableSYN()), skbContext{})) {
		t.Error("the neighbour's subflow was not placed while the other pod is full")
	}

	// One of the pod's subflows closes: there is room for one more.
	if err := dp.ForgetSubflow(netip.AddrPortFrom(clientPod, 20000), netip.AddrPortFrom(serverPod, 5201)); err != nil {
		t.Fatal(err)
	}
	if got := podEntries(t, dp, slot); got != uint32(limits.PodSubflows)-1 {
		t.Errorf("after a close the pod holds %d entries, want %d", got, limits.PodSubflows-1)
	}
	if !placed(run(t, podEgress, syn(clientPod, extra.Port(), serverPod, 5201, testpkt.MPCapableSYN()), skbContext{})) {
		t.Error("after a close the pod's new subflow was not placed")
	}

	// The programs counted what the table holds.
	before := podSlots(t, dp)
	if err := dp.RecountPodSubflows(); err != nil {
		t.Fatal(err)
	}
	if after := podSlots(t, dp); !maps.Equal(before, after) {
		t.Errorf("the programs counted %v entries per pod slot, the table holds %v", before, after)
	}
}

// hasEntry says whether the subflow table has an entry for local -> remote.
func hasEntry(t *testing.T, dp *Datapath, local, remote netip.AddrPort) bool {
	t.Helper()
	sfs, err := dp.Subflows()
	if err != nil {
		t.Fatal(err)
	}
	for _, sf := range sfs {
		if sf.Local == local && sf.Remote == remote {
			return true
		}
	}
	return false
}

// endpointSlot is the pod slot the datapath gave addr.
func endpointSlot(t *testing.T, dp *Datapath, addr netip.Addr) uint32 {
	t.Helper()
	k := endpointKey(addr)
	var ep datapathEndpoint
	if err := dp.objs.Endpoints.Lookup(&k, &ep); err != nil {
		t.Fatalf("endpoint %v: %v", addr, err)
	}
	return ep.PodSlot
}

// A pod released while its subflows are open leaves their entries counted
// on its slot: a pod selected next gets another slot (it would start with
// the released pod's entries held), and the released pod, selected again,
// gets its own back (it would start a new share beside its old entries).
func TestAReleasedPodsSlotGoesBackToItAndToNoOtherPod(t *testing.T) {
	dp := loadForTest(t)
	if err := dp.SetRule(0, Rule{Paths: []uint32{1, 2}}); err != nil {
		t.Fatal(err)
	}
	released, next := clientPod, netip.MustParseAddr("10.244.1.12")
	if err := dp.SetEndpoint(released, 0); err != nil {
		t.Fatal(err)
	}
	old := endpointSlot(t, dp, released)
	for port := range uint16(10) {
		run(t, dp.objs.PodEgress, syn(released, 30000+port, serverPod, 5201, testpkt.MPCapableSYN()), skbContext{})
	}
	if got := podEntries(t, dp, old); got != 10 {
		t.Fatalf("the pod holds %d entries, want 10", got)
	}
	if err := dp.DeleteEndpoint(released); err != nil {
		t.Fatal(err)
	}

	if err := dp.SetEndpoint(next, 0); err != nil {
		t.Fatal(err)
	}
	if s := endpointSlot(t, dp, next); s == old || podEntries(t, dp, s) != 0 {
		t.Errorf("the pod selected next got slot %d holding %d entries; the released pod's slot is %d", s, podEntries(t, dp, s), old)
	}
	if err := dp.SetEndpoint(released, 0); err != nil {
		t.Fatal(err)
	}
	if s := endpointSlot(t, dp, released); s != old {
		t.Errorf("the released pod selected again got slot %d, want its own %d", s, old)
	}
	run(t, dp.objs.PodEgress, syn(released, 30010, serverPod, 5201, testpkt.MPCapableSYN()), skbContext{})
	if got := podEntries(t, dp, old); got != 11 {
		t.Errorf("the pod selected again holds %d entries, want its 10 and the new one", got)
	}
}
