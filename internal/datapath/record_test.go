package datapath

import (
	"net/netip"
	"testing"

	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
)

// The record actor counts, exactly, every TCP packet of a selected pod (per
// pod), and each subflow's packets (per subflow, summed per connection),
// both ways; unselected pods have no counters.
func TestRecordCountersAreExact(t *testing.T) {
	dp := loadForTest(t)
	setRules(t, dp, map[uint32]Rule{0: {Paths: []uint32{1, 2}}})
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	const clientKey, serverKey = 0xaaaa, 0xbbbb
	var tx, rx [][]byte
	tx = append(tx, syn(clientPod, 40000, serverPod, 80, testpkt.MPCapableSYN()))
	rx = append(rx, synAck(serverPod, 80, clientPod, 40000, testpkt.MPCapableSYNACK(serverKey)))
	tx = append(tx, capableACK(clientPod, 40000, serverPod, 80, clientKey, serverKey))
	data := func(src netip.Addr, sport uint16, dst netip.Addr, dport uint16, n int) []byte {
		return testpkt.Frame{Src: src, Dst: dst, TCP: &testpkt.TCP{SrcPort: sport, DstPort: dport, Seq: 9, Ack: 9, Flags: testpkt.ACK, Payload: make([]byte, n)}}.Bytes()
	}
	tx = append(tx, data(clientPod, 40000, serverPod, 80, 100), data(clientPod, 40000, serverPod, 80, 300))
	rx = append(rx, data(serverPod, 80, clientPod, 40000, 1000))
	// A join of the connection, and its traffic.
	tx = append(tx, syn(clientPod, 40001, serverPod, 80, testpkt.MPJoinSYN(tokenOf(serverKey), 1, 1, false)))
	tx = append(tx, data(clientPod, 40001, serverPod, 80, 50))
	rx = append(rx, data(serverPod, 80, clientPod, 40001, 70))
	// Plain TCP of the pod: counted for the pod, in no subflow.
	tx = append(tx, data(clientPod, 50000, serverPod, 22, 10))
	// An unselected pod: counted nowhere.
	tx = append(tx, data(serverPod, 1, otherNet, 2, 10))

	var want TrafficCounters
	for _, f := range tx[:len(tx)-1] {
		want.TxPackets++
		want.TxBytes += uint64(len(f))
	}
	for _, f := range rx {
		want.RxPackets++
		want.RxBytes += uint64(len(f))
	}
	for _, f := range tx {
		run(t, dp.objs.PodEgress, f, skbContext{})
	}
	for _, f := range rx {
		run(t, dp.objs.PodIngress, f, skbContext{})
	}

	pods, err := dp.PodStats()
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 1 || pods[clientPod] != want {
		t.Fatalf("pod counters %+v, want only %v: %+v", pods, clientPod, want)
	}

	sfs, err := dp.Subflows()
	if err != nil {
		t.Fatal(err)
	}
	byPort := map[uint16]TrafficCounters{}
	for _, sf := range sfs {
		if sf.Conn != tokenOf(serverKey) {
			t.Errorf("subflow %v: connection %#x, want %#x", sf.Local, sf.Conn, tokenOf(serverKey))
		}
		byPort[sf.Local.Port()] = sf.Counters
	}
	wantInitial := TrafficCounters{
		TxPackets: 4, TxBytes: uint64(len(tx[0]) + len(tx[1]) + len(tx[2]) + len(tx[3])),
		RxPackets: 2, RxBytes: uint64(len(rx[0]) + len(rx[1])),
	}
	wantJoin := TrafficCounters{TxPackets: 2, TxBytes: uint64(len(tx[4]) + len(tx[5])), RxPackets: 1, RxBytes: uint64(len(rx[2]))}
	if len(byPort) != 2 || byPort[40000] != wantInitial || byPort[40001] != wantJoin {
		t.Fatalf("subflow counters %+v, want 40000: %+v, 40001: %+v", byPort, wantInitial, wantJoin)
	}

	conns, err := dp.ConnectionStats()
	if err != nil {
		t.Fatal(err)
	}
	wantConn := wantInitial
	wantConn.Add(wantJoin)
	if got := conns[ConnKey{Local: clientPod, Token: tokenOf(serverKey)}]; len(conns) != 1 || got != wantConn {
		t.Fatalf("connection counters %+v, want %+v", conns, wantConn)
	}
}

// Occupancy counts the live entries of the tables; the connection table's
// evictions are the entries created minus the live ones minus those the
// agent deleted, the subflow table counts its own.
func TestOccupancyAndEvictions(t *testing.T) {
	dp := loadForTest(t)
	setRules(t, dp, map[uint32]Rule{0: {Paths: []uint32{1, 2}}})
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		placeSYN(t, dp, clientPod, uint16(40000+i), serverPod, 80)
	}
	// A retransmitted SYN replaces its entry: no new entry.
	placeSYN(t, dp, clientPod, 40000, serverPod, 80)
	run(t, dp.objs.PodEgress, capableACK(clientPod, 40000, serverPod, 80, 1, 2), skbContext{})
	if err := dp.ForgetSubflow(netip.AddrPortFrom(clientPod, 40001), netip.AddrPortFrom(serverPod, 80)); err != nil {
		t.Fatal(err)
	}
	tables, err := dp.Occupancy()
	if err != nil {
		t.Fatal(err)
	}
	if sf := tables["subflows"]; sf.Entries != 4 || sf.Capacity != 65536 || sf.Evictions != 0 {
		t.Errorf("subflow table %+v, want 4 of 65536, no evictions", sf)
	}
	if conn := tables["connections"]; conn.Entries != 1 || conn.Capacity != 16384 || conn.Evictions != 0 {
		t.Errorf("connection table %+v, want 1 of 16384, no evictions", conn)
	}
	if pb := tables["police_buckets"]; pb.Entries != 0 || pb.Capacity != 32768 || pb.Evictions != 0 {
		t.Errorf("police buckets %+v, want none of 32768", pb)
	}
	// A connection entry that vanishes without the agent (as an LRU
	// eviction does) shows as an eviction.
	if _, err := deleteKeysWhere(dp.objs.ConnStates, func(datapathConnKey) bool { return true }); err != nil {
		t.Fatal(err)
	}
	if tables, err = dp.Occupancy(); err != nil || tables["connections"].Entries != 0 || tables["connections"].Evictions != 1 {
		t.Fatalf("after an unannounced removal: %+v, %v; want no connection, 1 eviction", tables["connections"], err)
	}
	if got := stat(t, dp, StatSubflowInsert); got != 5 {
		t.Fatalf("StatSubflowInsert = %d, want 5", got)
	}
}

// A pod's counters live at the slot its endpoint got. A slot freed when its
// pod is released and given to the next pod starts at zero, and a subflow of
// the released pod that is still open (it keeps the slot in its entry) adds
// nothing to the new owner's counters; selected again, with another slot,
// the pod counts that subflow at its new slot. A subflow entry without a slot
// (made before slots existed) learns it from the endpoint and counts.
func TestRecordPodSlotsAreNeverShared(t *testing.T) {
	dp := loadForTest(t)
	if got := dp.objs.PodRecords.MaxEntries(); int(got) != MaxPods+1 {
		t.Fatalf("pod_records has %d entries, want MaxPods+1 = %d (slot 0 is none)", got, MaxPods+1)
	}
	setRules(t, dp, map[uint32]Rule{0: {Paths: []uint32{1, 2}}})
	other := netip.MustParseAddr("10.244.1.12")
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	data := func(src netip.Addr, sport uint16) []byte {
		return testpkt.Frame{Src: src, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: sport, DstPort: 80, Seq: 9, Ack: 9, Flags: testpkt.ACK, Payload: make([]byte, 100)}}.Bytes()
	}
	run(t, dp.objs.PodEgress, syn(clientPod, 40000, serverPod, 80, testpkt.MPCapableSYN()), skbContext{})
	run(t, dp.objs.PodEgress, data(clientPod, 40000), skbContext{})

	// Released, and its slot taken by the next pod. The open subflow's
	// entry counts on slot 1, which therefore goes to no other pod while
	// another is free (TestAReleasedPodsSlotGoesBackToItAndToNoOtherPod);
	// uncounted, as the entries a release before the count wrote are until
	// the agent counts them, it goes to the next pod.
	if err := dp.DeleteEndpoint(clientPod); err != nil {
		t.Fatal(err)
	}
	if err := dp.objs.PodSubflows.Put(uint32(1), uint32(0)); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetEndpoint(other, 0); err != nil {
		t.Fatal(err)
	}
	var a, b datapathEndpoint
	if err := dp.objs.Endpoints.Lookup(endpointKey(other), &b); err != nil {
		t.Fatal(err)
	}
	if b.PodSlot != 1 {
		t.Fatalf("the next pod got slot %d, want the freed slot 1", b.PodSlot)
	}
	run(t, dp.objs.PodEgress, data(clientPod, 40000), skbContext{}) // the released pod's open subflow
	pods, err := dp.PodStats()
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 1 || pods[other] != (TrafficCounters{}) {
		t.Fatalf("pod counters %+v, want only %v at zero", pods, other)
	}

	// Both selected: two slots; a rewrite of an endpoint keeps its slot.
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetEndpointRules(other, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := dp.objs.Endpoints.Lookup(endpointKey(clientPod), &a); err != nil {
		t.Fatal(err)
	}
	if err := dp.objs.Endpoints.Lookup(endpointKey(other), &b); err != nil {
		t.Fatal(err)
	}
	if a.PodSlot == 0 || a.PodSlot == b.PodSlot || b.PodSlot != 1 {
		t.Fatalf("slots %d and %d, want two distinct ones and the rewritten endpoint's kept (1)", a.PodSlot, b.PodSlot)
	}

	// The released pod's subflow, still open, kept slot 1, which is the
	// other pod's now: selected again, with another slot, the pod counts
	// that subflow's packets at its new slot, and the entry follows.
	k := datapathFlowKey{Family: 2, Sport: htons(40000), Dport: htons(80)}
	copy(k.Saddr[:], clientPod.AsSlice())
	copy(k.Daddr[:], serverPod.AsSlice())
	var sf datapathSubflow
	frame := data(clientPod, 40000)
	slotAfter := func(packets uint64) {
		t.Helper()
		run(t, dp.objs.PodEgress, frame, skbContext{})
		sf = lookupSubflow(t, dp, k)
		if sf.PodSlot != a.PodSlot {
			t.Errorf("the subflow entry's slot is %d after a packet, want the endpoint's %d", sf.PodSlot, a.PodSlot)
		}
		if pods, err = dp.PodStats(); err != nil {
			t.Fatal(err)
		}
		if want := (TrafficCounters{TxPackets: packets, TxBytes: packets * uint64(len(frame))}); pods[clientPod] != want || pods[other] != (TrafficCounters{}) {
			t.Errorf("counters %+v, want %v at %+v and %v at zero", pods, clientPod, want, other)
		}
	}
	slotAfter(1)

	// An entry without a slot, as an upgrade leaves the subflows it
	// carries over, learns the pod's on its next packet.
	sf.PodSlot = 0
	putSubflow(t, dp, k, sf)
	slotAfter(2)
}
