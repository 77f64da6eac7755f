package datapath

import (
	"net/netip"
	"strconv"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
)

// nicNoPath is an interface that carries traffic to the pods but is no
// path's (a management NIC, an overlay's tunnel): nic_ingress is not on it.
const nicNoPath = 9

// A peer's join SYN that reaches the pod by no path's NIC (nic_ingress never
// saw it, so it was neither staged nor counted) is refused at the pod's veth
// when its rule limits joins: beyond the maximum, within it (it is on no
// path, so it would never be counted), and under a rule that only blocks a
// path. The SYN becomes the reset nic_ingress sends (MP_TCPRST reason 3,
// from the server pod to the client, valid checksums), redirected
// (TC_ACT_REDIRECT; into the node, as if the pod sent it), counted, and not
// mirrored. On a 4-tuple with an entry it is dropped. What passes, byte for
// byte: the same join by a path's NIC (judged there), a join no rule limits,
// an MP_CAPABLE SYN and a plain TCP SYN by the same interface, and, in
// observe-only mode, the refused join (counted as observed).
func TestAJoinThatCameByNoPathNICIsRefusedAtThePodsVeth(t *testing.T) {
	server := netip.AddrPortFrom(serverPod, 5201)
	join := func(sport uint16) []byte {
		return peerJoinSYN(sport, testpkt.MPJoinSYN(tokenOf(serverKey), 7, 1, false))
	}
	podIn := func(dp *Datapath, frame []byte, ifindex uint32) (uint32, []byte) {
		return runVerdict(t, dp.objs.PodIngress, frame, skbContext{IngressIfindex: ifindex})
	}
	passes := func(t *testing.T, dp *Datapath, what string, frame []byte, ifindex uint32) {
		t.Helper()
		if ret, out := podIn(dp, frame, ifindex); ret != tcxNext || string(out[:len(frame)]) != string(frame) {
			t.Errorf("%s: verdict %d, changed %v; want it passed unchanged", what, int32(ret), string(out[:len(frame)]) != string(frame))
		}
	}
	refused := func(t *testing.T, dp *Datapath, what string, sport uint16) {
		t.Helper()
		before := stat(t, dp, StatJoinRefused)
		ret, rst := podIn(dp, join(sport), nicNoPath)
		if ret != tcActRedirect {
			t.Fatalf("%s: verdict %d, want TC_ACT_REDIRECT (the reset)", what, int32(ret))
		}
		d := tsharkDecode(t, [][]byte{rst}, []string{"ip.checksum.status", "tcp.checksum.status", "ip.src", "ip.dst", "tcp.srcport", "tcp.dstport",
			"tcp.flags.reset", "tcp.flags.ack", "tcp.ack_raw", "tcp.options.mptcp.subtype", "tcp.options.mptcp.rst_reason"})[0]
		want := map[string]string{"ip.checksum.status": tsharkGood, "tcp.checksum.status": tsharkGood, "ip.src": serverPod.String(), "ip.dst": clientPod.String(),
			"tcp.srcport": "5201", "tcp.dstport": strconv.Itoa(int(sport)), "tcp.flags.reset": "1", "tcp.flags.ack": "1", "tcp.ack_raw": "1001",
			"tcp.options.mptcp.subtype": "8", "tcp.options.mptcp.rst_reason": "0x03"}
		for k, v := range want {
			if d[k] != v {
				t.Errorf("%s: tshark: %s = %q, want %q", what, k, d[k], v)
			}
		}
		if n := stat(t, dp, StatJoinRefused); n != before+1 {
			t.Errorf("%s: StatJoinRefused = %d, want %d", what, n, before+1)
		}
	}

	t.Run("maxSubflows", func(t *testing.T) {
		// The first subflow on path 1; maximum 3.
		dp := peerJoinBed(t, Rule{Paths: []uint32{1, 2}, MaxSubflows: 3}, 0)
		// Within the maximum, but on no path: refused all the same.
		refused(t, dp, "a join within the maximum by no path's NIC", 40001)
		// By a path's NIC it is judged there, and passes the pod's
		// veth.
		if ret, _ := runVerdict(t, dp.objs.NicIngress, join(40002), skbContext{IngressIfindex: nicPath2}); ret != tcxNext {
			t.Fatalf("the join by path 2's NIC: nic_ingress verdict %d, want TCX_NEXT", int32(ret))
		}
		passes(t, dp, "the join by path 2's NIC, into the pod", join(40002), nicPath2)
		completeFromWire(t, dp, netip.AddrPortFrom(clientPod, 40002), server, 1000, true, nicPath2)
		acceptFromWire(t, dp, netip.AddrPortFrom(clientPod, 40003), server, testpkt.MPJoinSYN(tokenOf(serverKey), 7, 1, false), nicPath2)
		// The connection is at its maximum: beyond it, by no path.
		refused(t, dp, "a join beyond the maximum by no path's NIC", 40004)
		// A join on the 4-tuple of a live subflow: dropped.
		if ret, _ := podIn(dp, join(40002), nicNoPath); ret != tcActShot {
			t.Errorf("a join by no path's NIC on a live subflow's 4-tuple: verdict %d, want TC_ACT_SHOT", int32(ret))
		}
		// First subflows and plain TCP by the same interface pass.
		passes(t, dp, "an MP_CAPABLE SYN by no path's NIC", peerJoinSYN(40005, testpkt.MPCapableSYN()), nicNoPath)
		passes(t, dp, "a plain TCP SYN by no path's NIC", peerJoinSYN(40006, nil), nicNoPath)
		sfs, err := dp.Subflows()
		if err != nil {
			t.Fatal(err)
		}
		for _, sf := range sfs {
			if p := sf.Remote.Port(); p == 40001 || p == 40004 {
				t.Errorf("the refused join from port %d was mirrored: %+v", p, sf)
			}
		}
		// Observe-only: counted, passed.
		if err := dp.SetObserveOnly(true); err != nil {
			t.Fatal(err)
		}
		observed := stat(t, dp, StatObserved)
		passes(t, dp, "observe-only: a join beyond the maximum by no path's NIC", join(40007), nicNoPath)
		if n := stat(t, dp, StatObserved); n <= observed {
			t.Errorf("observe-only: StatObserved %d, want more than %d", n, observed)
		}
	})
	t.Run("blockedPaths", func(t *testing.T) {
		dp := peerJoinBed(t, Rule{Paths: []uint32{1, 2}, Blocked: []uint32{3}}, 0)
		refused(t, dp, "a join by no path's NIC under a rule that blocks a path", 40001)
	})
	t.Run("no limit", func(t *testing.T) {
		dp := peerJoinBed(t, Rule{Paths: []uint32{1, 2}}, 0)
		passes(t, dp, "a join by no path's NIC under a rule without limits", join(40001), nicNoPath)
		if n := stat(t, dp, StatJoinRefused); n != 0 {
			t.Errorf("StatJoinRefused = %d, want 0", n)
		}
	})
}

// A join whose SYN came by a path's NIC and which the pod answered, but
// whose third ACK reaches the pod by no path's NIC (where nic_ingress would
// never take it, and the join would complete uncounted) is dropped at the
// pod's veth, counted; the same ACK by the path's NIC then completes the join
// and counts it, so the next join, beyond the maximum, is refused at its NIC.
func TestAJoinsThirdACKByNoPathNICIsDropped(t *testing.T) {
	dp := peerJoinBed(t, Rule{Paths: []uint32{1, 2}, MaxSubflows: 2}, 0)
	client := netip.AddrPortFrom(clientPod, 40001)
	join := func(sport uint16) []byte {
		return peerJoinSYN(sport, testpkt.MPJoinSYN(tokenOf(serverKey), 7, 1, false))
	}
	if ret, _ := runVerdict(t, dp.objs.NicIngress, join(client.Port()), skbContext{IngressIfindex: nicPath2}); ret != tcxNext {
		t.Fatalf("the join by path 2's NIC: verdict %d, want TCX_NEXT", int32(ret))
	}
	answer := testpkt.Frame{Src: serverPod, Dst: clientPod, TCP: &testpkt.TCP{SrcPort: 5201, DstPort: client.Port(), Seq: 7, Ack: 1001,
		Flags: testpkt.SYN | testpkt.ACK, Options: testpkt.MPJoinSYNACK(1, 2, 1, false)}}.Bytes()
	run(t, dp.objs.PodEgress, answer, skbContext{})
	third := testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: client.Port(), DstPort: 5201, Seq: 1001, Ack: 8,
		Flags: testpkt.ACK, Options: testpkt.MPJoinACK([20]byte{1})}}.Bytes()
	if ret, _ := runVerdict(t, dp.objs.PodIngress, third, skbContext{IngressIfindex: nicNoPath}); ret != tcActShot {
		t.Fatalf("the join's third ACK by no path's NIC: verdict %d, want TC_ACT_SHOT", int32(ret))
	}
	if n := stat(t, dp, StatJoinACKDropped); n != 1 {
		t.Errorf("StatJoinACKDropped = %d, want 1", n)
	}
	// By the path's NIC, and on into the pod: taken, counted.
	run(t, dp.objs.NicIngress, third, skbContext{IngressIfindex: nicPath2})
	run(t, dp.objs.PodIngress, third, skbContext{IngressIfindex: nicPath2})
	if conns, err := dp.Connections(); err != nil || len(conns) != 1 || conns[0].Subflows != 2 {
		t.Fatalf("connections %+v (%v), want one of 2 subflows", conns, err)
	}
	if ret, _ := runVerdict(t, dp.objs.NicIngress, join(40002), skbContext{IngressIfindex: nicPath2}); ret != tcActRedirect {
		t.Errorf("the next join, beyond the maximum, by path 2's NIC: verdict %d, want TC_ACT_REDIRECT", int32(ret))
	}
}
