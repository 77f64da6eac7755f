package datapath

import (
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
)

// A packet a CNI hands to the pod's own end of its veth (bpf_redirect_peer,
// past the host-side veth) keeps nic_ingress's mark: pod_peer_ingress
// judges it as pod_ingress would (counted for the pod, a peer's move
// followed) and takes the mark's path bits off. One without them crossed
// the host-side veth, where pod_ingress judged it: passed, not counted
// twice.
func TestAPacketHandedPastTheHostVethIsJudgedOnThePodsOwnEnd(t *testing.T) {
	dp, home, other := oneSubflowOfTwoPaths(t)
	in := dataFrame(serverPod, 5201, clientPod, 40001)
	rx := func() uint64 {
		t.Helper()
		stats, err := dp.PodStats()
		if err != nil {
			t.Fatal(err)
		}
		return stats[clientPod].RxPackets
	}

	before := rx()
	const foreign = 0x0000_0a00 // a CNI's bits, outside the mask
	if mark := run(t, dp.objs.PodPeerIngress, in, skbContext{Mark: foreign}); mark != foreign {
		t.Errorf("unmarked packet: mark %#x after, want %#x untouched", mark, foreign)
	}
	if n := rx(); n != before {
		t.Errorf("unmarked packet counted for the pod (%d -> %d): pod_ingress on the host side counts it", before, n)
	}

	arrived := dp.arrivedOn(home)
	arrived.Mark |= foreign
	if mark := run(t, dp.objs.PodPeerIngress, in, arrived); mark != foreign {
		t.Errorf("packet marked with path %d: mark %#x after, want %#x (the path's bits off, the CNI's kept)", home, mark, foreign)
	}
	if n := rx(); n != before+1 {
		t.Errorf("marked packet: pod received %d packets, want %d", n, before+1)
	}

	// The peer moves the subflow once home has gone quiet: followed, as
	// pod_ingress follows (detour_test.go).
	time.Sleep(settle)
	run(t, dp.objs.PodPeerIngress, in, dp.arrivedOn(other))
	if p := sentOn(t, dp, dataFrame(clientPod, 40001, serverPod, 5201)); p != other {
		t.Errorf("the peer moved the subflow to path %d: the pod's replies leave by path %d", other, p)
	}
}

// On the pod's own end a join SYN from a selected pod of the same node,
// which the CNI hands over with the path pod_egress marked it with, is no
// NIC's arrival: judged as one by no path, it is refused where its rule
// limits joins (the reset sent back out of the pod's interface). The same
// join from a remote peer, marked by nic_ingress, was judged there: passed.
func TestALocalPodsJoinIsJudgedAsOneByNoPath(t *testing.T) {
	dp := peerJoinBed(t, Rule{Paths: []uint32{1, 2}, MaxSubflows: 3}, 0)
	join := peerJoinSYN(40001, testpkt.MPJoinSYN(tokenOf(serverKey), 7, 1, false))
	if ret, _ := runVerdict(t, dp.objs.PodPeerIngress, join, dp.arrivedOn(2)); ret != tcxNext {
		t.Errorf("a remote peer's join marked by nic_ingress: verdict %d, want TCX_NEXT", int32(ret))
	}
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	before := stat(t, dp, StatJoinRefused)
	if ret, _ := runVerdict(t, dp.objs.PodPeerIngress, join, dp.arrivedOn(2)); ret != tcActRedirect {
		t.Errorf("a join from a pod of the node, with its path in the mark: verdict %d, want TC_ACT_REDIRECT (the reset)", int32(ret))
	}
	if n := stat(t, dp, StatJoinRefused); n != before+1 {
		t.Errorf("StatJoinRefused = %d, want %d", n, before+1)
	}
}
