package datapath

import (
	"net/netip"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
)

// A TCP segment to or from a selected pod that comes as IP fragments is
// dropped, each of its fragments, on the wire's way in (nic_ingress) and on
// the pod's ways out and in (pod_egress, pod_ingress): the datapath cannot
// read its options, which the pod's kernel would obey once it reassembled
// them (a join past its maximum or on a blocked path, an MP_PRIO, an
// ADD_ADDR). So is an IPv6 packet whose TCP header lies beyond more
// extension headers than the parser reads. Fragments of UDP, and of TCP of
// an address no rule selects, pass; observe-only counts and passes.
func TestTCPFragmentsOfSelectedPodsAreDropped(t *testing.T) {
	dp := twoNICResponder(t)
	server6, client6 := netip.MustParseAddr("fd00:244:2::11"), netip.MustParseAddr("fd00:244:1::11")
	if err := dp.SetEndpoint(server6, 0); err != nil {
		t.Fatal(err)
	}
	wire := skbContext{IngressIfindex: nic1Ifindex}
	join := func(src, dst netip.Addr) testpkt.Frame {
		return testpkt.Frame{Src: src, Dst: dst, TCP: &testpkt.TCP{SrcPort: 40001, DstPort: 80, Seq: 1, Flags: testpkt.SYN,
			Options: testpkt.Join(testpkt.MSS(1460), testpkt.MPJoinSYN(tokenOf(8), 1, 1, false))}}
	}
	fromPod := func(src, dst netip.Addr) testpkt.Frame {
		return testpkt.Frame{Src: src, Dst: dst, TCP: &testpkt.TCP{SrcPort: 80, DstPort: 40001, Seq: 7, Ack: 2, Flags: testpkt.ACK,
			Options: testpkt.MPPrio(false), Payload: make([]byte, 64)}}
	}
	udp := func(src, dst netip.Addr) testpkt.Frame {
		return testpkt.Frame{Src: src, Dst: dst, Protocol: 17, Payload: make([]byte, 64)}
	}
	stranger := netip.MustParseAddr("10.244.2.99")
	cases := []struct {
		name   string
		prog   Hook
		frame  testpkt.Frame
		ctx    skbContext
		passes bool
	}{
		{"a join SYN to the pod, from the wire", HookNICIngress, join(clientPod, serverPod), wire, false},
		{"IPv6: a join SYN to the pod, from the wire", HookNICIngress, join(client6, server6), wire, false},
		{"a join SYN to the pod, into it", HookPodIngress, join(clientPod, serverPod), skbContext{}, false},
		{"IPv6: a join SYN to the pod, into it", HookPodIngress, join(client6, server6), skbContext{}, false},
		{"an MP_PRIO from the pod", HookPodEgress, fromPod(serverPod, clientPod), skbContext{}, false},
		{"IPv6: an MP_PRIO from the pod", HookPodEgress, fromPod(server6, client6), skbContext{}, false},
		{"UDP to the pod, from the wire", HookNICIngress, udp(clientPod, serverPod), wire, true},
		{"UDP from the pod", HookPodEgress, udp(serverPod, clientPod), skbContext{}, true},
		{"a join SYN to an address no rule selects", HookNICIngress, join(clientPod, stranger), wire, true},
	}
	deep := func(src, dst netip.Addr) testpkt.Frame {
		f := join(src, dst)
		f.IPv6HopByHop, f.IPv6DestOpts = true, 4
		return f
	}
	for _, c := range []struct {
		name  string
		prog  Hook
		frame testpkt.Frame
		ctx   skbContext
	}{
		{"a join SYN behind five extension headers, from the wire", HookNICIngress, deep(client6, server6), wire},
		{"a join SYN behind five extension headers, into the pod", HookPodIngress, deep(client6, server6), skbContext{}},
		{"a segment behind five extension headers, from the pod", HookPodEgress, deep(server6, client6), skbContext{}},
	} {
		dropped := stat(t, dp, StatUnreadableTCPDropped)
		if ret := verdict(t, dp.Program(c.prog), c.frame.Bytes(), c.ctx); ret != tcActShot || stat(t, dp, StatUnreadableTCPDropped) != dropped+1 {
			t.Errorf("%s: verdict %d; want it dropped and counted", c.name, int32(ret))
		}
	}
	for _, c := range cases {
		for i, frag := range c.frame.Fragments(24) {
			dropped := stat(t, dp, StatUnreadableTCPDropped)
			ret := verdict(t, dp.Program(c.prog), frag, c.ctx)
			counted := stat(t, dp, StatUnreadableTCPDropped) - dropped
			switch {
			case c.passes && (ret != tcxNext || counted != 0):
				t.Errorf("%s, fragment %d: verdict %d, %d counted; want it passed", c.name, i+1, int32(ret), counted)
			case !c.passes && (ret != tcActShot || counted != 1):
				t.Errorf("%s, fragment %d: verdict %d, %d counted; want it dropped and counted", c.name, i+1, int32(ret), counted)
			}
		}
	}
	if err := dp.SetObserveOnly(true); err != nil {
		t.Fatal(err)
	}
	for i, frag := range join(clientPod, serverPod).Fragments(24) {
		observed := stat(t, dp, StatObserved)
		if ret := verdict(t, dp.objs.NicIngress, frag, wire); ret != tcxNext || stat(t, dp, StatObserved) != observed+1 {
			t.Errorf("observe-only, fragment %d: verdict %d, observed %d more; want it passed and observed",
				i+1, int32(ret), stat(t, dp, StatObserved)-observed)
		}
	}
}
