package datapath

import (
	"net/netip"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
)

// ForgetLocal removes a released pod's connections and rate state and the
// subflows the caller does not keep, and nothing of another pod.
func TestForgetLocalRemovesOnlyThePodsState(t *testing.T) {
	other := netip.MustParseAddr("10.244.1.12")
	dp := rateBed(t, clientPod, RateConfig{Mode: RatePolice, PerConnection: 1e9, PerPod: 1e9, Directions: Egress})
	if err := dp.SetEndpoint(other, 0); err != nil {
		t.Fatal(err)
	}
	for i, pod := range []netip.Addr{clientPod, other} {
		for c := range 2 {
			port := uint16(40000 + 10*i + c)
			run(t, dp.objs.PodEgress, syn(pod, port, serverPod, 5201, testpkt.MPCapableSYN()), skbContext{})
			run(t, dp.objs.PodEgress, capableACK(pod, port, serverPod, 5201, 0x0a0b0c0d0e0f1011+uint64(port), 0x0102030405060708+uint64(port)), skbContext{})
			data := testpkt.Frame{Src: pod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: port, DstPort: 5201, Seq: 2, Ack: 8, Flags: testpkt.ACK, Payload: make([]byte, 100)}}.Bytes()
			run(t, dp.objs.PodEgress, data, skbContext{})
		}
	}
	entries := func(pod netip.Addr) (subflows, conns, buckets int) {
		t.Helper()
		sfs, err := dp.Subflows()
		if err != nil {
			t.Fatal(err)
		}
		for _, sf := range sfs {
			if sf.Local.Addr() == pod {
				subflows++
			}
		}
		cs, err := dp.Connections()
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cs {
			if c.Local == pod {
				conns++
			}
		}
		keys, err := dp.policeKeys()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if addrFrom(k.Family, k.Addr) == pod {
				buckets++
			}
		}
		return subflows, conns, buckets
	}
	for _, pod := range []netip.Addr{clientPod, other} {
		if s, c, b := entries(pod); s != 2 || c != 2 || b == 0 {
			t.Fatalf("%v before: %d subflows, %d connections, %d buckets; want 2, 2 and some", pod, s, c, b)
		}
	}

	if err := dp.DeleteEndpoint(clientPod); err != nil {
		t.Fatal(err)
	}
	keep := netip.AddrPortFrom(clientPod, 40000)
	remaining, err := dp.ForgetLocal([]netip.Addr{clientPod}, func(sf Subflow) bool { return sf.Local == keep })
	if err != nil {
		t.Fatal(err)
	}
	if s, c, b := entries(clientPod); remaining[clientPod] != 1 || s != 1 || c != 0 || b != 0 {
		t.Errorf("released pod after: %d subflows (reported %v), %d connections, %d buckets; want 1, 0, 0", s, remaining, c, b)
	}
	if s, c, b := entries(other); s != 2 || c != 2 || b == 0 {
		t.Errorf("other pod after: %d subflows, %d connections, %d buckets; want 2, 2 and some", s, c, b)
	}

	// Once its last socket closes, the rest goes.
	if remaining, err := dp.ForgetLocal([]netip.Addr{clientPod}, func(Subflow) bool { return false }); err != nil || remaining[clientPod] != 0 {
		t.Fatalf("ForgetLocal keeping nothing: %v remaining, %v", remaining, err)
	}
	if s, _, _ := entries(clientPod); s != 0 {
		t.Errorf("%d subflows of the released pod left", s)
	}
	stats, err := dp.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if stats[StatSubflowForgotten] != 2 || stats[StatConnForgotten] != 2 {
		t.Errorf("forgotten: %d subflows, %d connections; want 2 and 2", stats[StatSubflowForgotten], stats[StatConnForgotten])
	}
}
