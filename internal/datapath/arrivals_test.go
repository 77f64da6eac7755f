package datapath

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/mptcp-operator/mptcp-operator/internal/limits"
	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
)

// A SYN from the wire with a live subflow's 4-tuple (a forger on a fabric
// needs nothing more) changes nothing while the subflow lives: not its
// path, not its flags, not its connection's counts, even when the pod
// answers it (a pod can forge its own SYN-ACK), and a join SYN is not
// refused with a reset that would carry the live 4-tuple. A neighbour that
// writes the pod's address answers nothing. Once the old subflow closes (the
// agent hears or sweeps it), the arrival the pod answered takes the
// 4-tuple, counted as a mirrored join; a late report of that close closes
// nothing new. An arrival whose old entry went before the answer
// is written at the answer; a join past the maximum on a reused 4-tuple is
// refused there, its answer dropped, as is a join's answer on a live
// 4-tuple that no arrival waits for (a decoy took the arrival's place).
func TestASYNForALiveSubflowChangesNothingUntilThePodAnswers(t *testing.T) {
	dp := twoNICResponder(t)
	on := func(ifindex int) skbContext { return skbContext{IngressIfindex: uint32(ifindex)} }
	const clientKey, serverKey = 9, 10
	const initialPort, joinPort = 40000, 40001
	synSeq := func(sport uint16, seq uint32, opts []byte) []byte {
		return testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: sport, DstPort: 80, Seq: seq, Flags: testpkt.SYN, Options: opts}}.Bytes()
	}
	joinOpts := testpkt.MPJoinSYN(tokenOf(serverKey), 1, 1, false)
	// The victim: an initial subflow on path 1, the peer's join on path 2,
	// which fills the rule's maximum of two.
	server := netip.AddrPortFrom(serverPod, 80)
	run(t, dp.objs.NicIngress, synSeq(initialPort, 100, testpkt.MPCapableSYN()), on(nic1Ifindex))
	completeFromWire(t, dp, netip.AddrPortFrom(clientPod, initialPort), server, 100, false, nic1Ifindex, clientKey, serverKey)
	run(t, dp.objs.NicIngress, synSeq(joinPort, 200, joinOpts), on(nic2Ifindex))
	completeFromWire(t, dp, netip.AddrPortFrom(clientPod, joinPort), server, 200, true, nic2Ifindex)
	staged := stat(t, dp, StatArrivalStaged) // the victim's own two SYNs
	// The victim's connection (a forger below gets one of its own learnt).
	victimConnection := func() Connection {
		t.Helper()
		conns, err := dp.Connections()
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range conns {
			if c.Token == tokenOf(serverKey) {
				return c
			}
		}
		t.Fatalf("connections %+v: the victim's is gone", conns)
		return Connection{}
	}
	key := func(sport uint16) datapathFlowKey {
		return flowKey(netip.AddrPortFrom(serverPod, 80), netip.AddrPortFrom(clientPod, sport))
	}
	victim := map[uint16]datapathSubflow{initialPort: lookupSubflow(t, dp, key(initialPort)), joinPort: lookupSubflow(t, dp, key(joinPort))}
	victimConn := victimConnection()
	if victimConn.Subflows != 2 || victimConn.UsedPaths != 1<<1|1<<2 {
		t.Fatalf("the victim's connection: %+v, want 2 subflows on paths 1 and 2", victimConn)
	}
	unchanged := func(when string) {
		t.Helper()
		for port, want := range victim {
			got := lookupSubflow(t, dp, key(port))
			// What the pod's own packets count moves; nothing else may.
			got.TxPackets, got.TxBytes, got.SeenMs = want.TxPackets, want.TxBytes, want.SeenMs
			if got != want {
				t.Errorf("%s: subflow %d is %+v, was %+v", when, port, got, want)
			}
		}
		if c := victimConnection(); c != victimConn {
			t.Errorf("%s: connection %+v, was %+v", when, c, victimConn)
		}
	}
	// replyPath is the path the pod's packet of the 4-tuple leaves by.
	// A SYN-ACK carries MP_CAPABLE (the pod's answer to an MP_CAPABLE
	// SYN, not a fallback to TCP), a later segment a DSS.
	dataACK := uint64(1)
	// reply is what the pod sends on sport: its answers have sequence
	// number 7, its next segments 8.
	reply := func(sport uint16, flags uint8, ack uint32) []byte {
		opts, seq := testpkt.DSS{DataACK: &dataACK}.Bytes(), uint32(8)
		if flags&testpkt.SYN != 0 {
			opts, seq = testpkt.MPCapableSYNACK(serverKey), 7
		}
		return testpkt.Frame{Src: serverPod, Dst: clientPod, TCP: &testpkt.TCP{SrcPort: 80, DstPort: sport, Seq: seq, Ack: ack, Flags: flags, Options: opts}}.Bytes()
	}
	replyPath := func(sport uint16, flags uint8, ack uint32) uint32 {
		t.Helper()
		return dp.pathOfMark(t, run(t, dp.objs.PodEgress, reply(sport, flags, ack), skbContext{}))
	}

	// joinReplyPath is the path the pod's answer to a join SYN leaves by.
	joinAnswer := func(sport uint16, ack uint32) []byte {
		return testpkt.Frame{Src: serverPod, Dst: clientPod, TCP: &testpkt.TCP{SrcPort: 80, DstPort: sport, Seq: 7, Ack: ack,
			Flags: testpkt.SYN | testpkt.ACK, Options: testpkt.MPJoinSYNACK(1, 2, 1, false)}}.Bytes()
	}
	joinReplyPath := func(sport uint16, ack uint32) uint32 {
		return dp.pathOfMark(t, run(t, dp.objs.PodEgress, joinAnswer(sport, ack), skbContext{}))
	}
	// joinThirdACK is the peer's third ACK of a join.
	joinThirdACK := func(sport uint16, seq, ack uint32) []byte {
		return testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: sport, DstPort: 80, Seq: seq, Ack: ack, Flags: testpkt.ACK,
			Options: testpkt.MPJoinACK([20]byte{1})}}.Bytes()
	}

	// Forged SYNs: each live 4-tuple over the other NIC, and over its own
	// with another sequence number. run checks every one goes on to the
	// pod unchanged: the join past the maximum is not answered.
	run(t, dp.objs.NicIngress, synSeq(initialPort, 999, testpkt.MPCapableSYN()), on(nic2Ifindex))
	run(t, dp.objs.NicIngress, synSeq(joinPort, 555, joinOpts), on(nic1Ifindex))
	run(t, dp.objs.NicIngress, synSeq(joinPort, 556, joinOpts), on(nic2Ifindex))
	unchanged("after forged SYNs")
	if got := stat(t, dp, StatArrivalStaged) - staged; got != 3 {
		t.Errorf("arrivals staged = %d, want the 3 forged SYNs", got)
	}
	if got := stat(t, dp, StatJoinRefused); got != 0 {
		t.Errorf("joins refused = %d: a reset carrying a live 4-tuple", got)
	}
	// The pod's sockets live: they answer with ACKs. Nothing moves.
	if p := replyPath(initialPort, testpkt.ACK, 1000); p != 1 {
		t.Errorf("the pod's answer on the initial subflow left by path %d, want 1", p)
	}
	if p := replyPath(joinPort, testpkt.ACK, 557); p != 2 {
		t.Errorf("the pod's answer on the join left by path %d, want 2", p)
	}
	unchanged("after the pod answered with ACKs")
	// The victim's own SYN again (its handshake repeats it, over either
	// path) is not staged.
	run(t, dp.objs.NicIngress, synSeq(joinPort, 200, joinOpts), on(nic2Ifindex))
	run(t, dp.objs.NicIngress, synSeq(joinPort, 200, joinOpts), on(nic1Ifindex))
	if got := stat(t, dp, StatArrivalStaged) - staged; got != 3 {
		t.Errorf("arrivals staged = %d after the join's own SYN again, want still 3", got)
	}
	unchanged("after the join's own SYN again")
	// A SYN-ACK for another sequence number answers nothing.
	if p := replyPath(initialPort, testpkt.SYN|testpkt.ACK, 5); p != 1 {
		t.Errorf("a SYN-ACK for no waiting SYN left by path %d, want 1", p)
	}
	// A neighbour pod that writes this pod's address and acknowledges
	// the waiting SYN is no answer from this pod, nor a packet of its
	// live subflow: the packet came in by the neighbour's interface (the
	// test run's device, loopback), and is dropped. A neighbour of the
	// other family only is none either.
	const lo = 1
	for _, neighbour := range []netip.Addr{netip.MustParseAddr("10.244.2.12"), netip.MustParseAddr("fd00:244:2::12")} {
		if err := dp.SyncPodInterfaces([]PodInterface{{Ifindex: lo, Addr: neighbour}}); err != nil {
			t.Fatal(err)
		}
		if v := verdict(t, dp.objs.PodEgress, reply(initialPort, testpkt.SYN|testpkt.ACK, 1000), skbContext{}); v != tcActShot {
			t.Errorf("neighbour %v's SYN-ACK with this pod's address on its live subflow: verdict %d, want dropped", neighbour, int32(v))
		}
	}
	if err := dp.SyncPodInterfaces([]PodInterface{{Ifindex: lo, Addr: serverPod}}); err != nil {
		t.Fatal(err)
	}
	// The pod answers the forged SYN on its live initial subflow (a raw
	// socket can): still nothing moves while the subflow lives.
	if p := replyPath(initialPort, testpkt.SYN|testpkt.ACK, 1000); p != 1 {
		t.Errorf("the pod's SYN-ACK on its live initial subflow left by path %d, want 1", p)
	}
	unchanged("after the pod answered a forged SYN")
	// Its sender saw the answer and acknowledges it, with keys of its
	// own: the arrival is acked, its connection learnt, and still nothing
	// moves while the subflow lives.
	const forgerClientKey, forgerServerKey = 31, 32
	forgedACK := testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: initialPort, DstPort: 80, Seq: 1000, Ack: 8, Flags: testpkt.ACK,
		Options: testpkt.MPCapableACK(forgerClientKey, forgerServerKey)}}.Bytes()
	run(t, dp.objs.NicIngress, forgedACK, on(nic2Ifindex))
	unchanged("after the peer acknowledged the answer")
	if got := stat(t, dp, StatArrivalPromoted); got != 0 {
		t.Fatalf("arrivals promoted = %d, want none while the subflows live", got)
	}

	// The initial subflow closes (the agent hears it): the acked arrival
	// takes its 4-tuple, path 2, with its own connection, after the old
	// entry gave back its path and count.
	report := func(sport uint16, token uint32, createdNs uint64) bool {
		t.Helper()
		_, ok, err := dp.SubflowClosed(ClosedSubflow{Local: netip.AddrPortFrom(serverPod, 80), Remote: netip.AddrPortFrom(clientPod, sport),
			Heard: time.Now(), Token: token, CreatedNs: createdNs})
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	closed := func(sport uint16) bool { t.Helper(); return report(sport, 0, 0) }
	// The pod's path manager names the connection by the server's token.
	if !report(initialPort, tokenOf(serverKey), 0) {
		t.Fatal("SubflowClosed found no initial subflow")
	}
	if got := stat(t, dp, StatArrivalPromoted); got != 1 {
		t.Errorf("arrivals promoted = %d, want the answered one", got)
	}
	reused := lookupSubflow(t, dp, key(initialPort))
	if reused.PathIndex != 2 || Role(reused.Role) != RoleResponder || reused.SynSeq != 999 || reused.Conn != tokenOf(forgerServerKey) {
		t.Errorf("the reused 4-tuple's entry is %+v, want a new responder entry on path 2 for SYN 999, of its own connection", reused)
	}
	if c := victimConnection(); c.Subflows != 1 || c.UsedPaths != 1<<2 {
		t.Errorf("after the initial subflow closed: %+v, want the join alone, on path 2", c)
	}
	// The same close reported again, late (by the path manager, naming
	// the old connection, or by a sweep, naming the old entry's placement
	// time), is not the new subflow's; the new one's own close is.
	if report(initialPort, tokenOf(serverKey), 0) {
		t.Error("a late report of the old close, naming the old connection, removed the new subflow")
	}
	if report(initialPort, 0, victim[initialPort].CreatedNs) {
		t.Error("a late sweep of the old entry removed the new subflow")
	}
	if !closed(initialPort) {
		t.Error("the new subflow's own close found no entry")
	}

	// The join closes before the pod answers a new SYN on its 4-tuple:
	// the answer leaves by the SYN's path, and after the peer's third ACK
	// the pod's next segment writes the arrival, counted, as on a new
	// 4-tuple.
	run(t, dp.objs.NicIngress, synSeq(joinPort, 700, joinOpts), on(nic1Ifindex))
	if !closed(joinPort) {
		t.Fatal("SubflowClosed found no join")
	}
	if p := joinReplyPath(joinPort, 701); p != 1 {
		t.Errorf("the pod's SYN-ACK to the reused join 4-tuple left by path %d, want 1", p)
	}
	run(t, dp.objs.NicIngress, joinThirdACK(joinPort, 701, 8), on(nic1Ifindex))
	if p := replyPath(joinPort, testpkt.ACK, 701); p != 1 {
		t.Errorf("the pod's segment after the reused join's handshake left by path %d, want 1", p)
	}
	if c := victimConnection(); c.Subflows != 1 || c.UsedPaths != 1<<1 {
		t.Errorf("after the join's 4-tuple was reused over path 1: %+v, want one subflow, on path 1", c)
	}

	// A join on a reused 4-tuple past the maximum: a second join fills
	// the rule's two; then a join of a connection this node does not know
	// takes a new 4-tuple (not counted) and a join SYN of the victim's
	// follows on it. The pod's answer is dropped.
	run(t, dp.objs.NicIngress, synSeq(40002, 300, joinOpts), on(nic2Ifindex))
	completeFromWire(t, dp, netip.AddrPortFrom(clientPod, 40002), server, 300, true, nic2Ifindex)
	run(t, dp.objs.NicIngress, synSeq(40003, 400, testpkt.MPJoinSYN(0xdead, 1, 1, false)), on(nic1Ifindex))
	completeFromWire(t, dp, netip.AddrPortFrom(clientPod, 40003), server, 400, true, nic1Ifindex)
	run(t, dp.objs.NicIngress, synSeq(40003, 401, joinOpts), on(nic2Ifindex))
	answer := joinAnswer(40003, 402)
	if ret, _ := runOut(t, dp.objs.PodEgress, answer); ret == tcxNext {
		t.Error("the pod's answer to a join past the maximum went on")
	}
	if got := stat(t, dp, StatJoinRefused); got != 1 {
		t.Errorf("joins refused = %d, want the one on the reused 4-tuple", got)
	}
	if c := victimConnection(); c.Subflows != 2 {
		t.Errorf("after the refused join: %+v, want the 2 subflows of the maximum", c)
	}

	// A decoy: an MP_CAPABLE SYN on the live second join's 4-tuple, which
	// the pod answers, does not hold the place of a join SYN after it
	// (joins wait apart); that join's answer is judged as the waiting
	// join's: refused as past the maximum (the old join on the 4-tuple
	// still counts).
	run(t, dp.objs.NicIngress, synSeq(40002, 900, testpkt.MPCapableSYN()), on(nic1Ifindex))
	replyPath(40002, testpkt.SYN|testpkt.ACK, 901)
	run(t, dp.objs.NicIngress, synSeq(40002, 950, joinOpts), on(nic1Ifindex))
	if ret, _ := runOut(t, dp.objs.PodEgress, joinAnswer(40002, 951)); ret == tcxNext {
		t.Error("the pod's answer to a join past the maximum went on")
	}
	if got := stat(t, dp, StatJoinRefused); got != 2 {
		t.Errorf("joins refused = %d, want 2", got)
	}
	// A join's answer on the live 4-tuple for no SYN the datapath saw
	// (its arrival gone) is dropped: the join would complete uncounted.
	if ret, _ := runOut(t, dp.objs.PodEgress, joinAnswer(40002, 1234)); ret == tcxNext {
		t.Error("the pod's answer to a join no arrival waits for, on a live 4-tuple, went on")
	}
	if got := stat(t, dp, StatAnswerDropped); got != 1 {
		t.Errorf("answers dropped = %d, want 1", got)
	}
	// The live join's own answer (its SYN repeated) still goes on.
	if p := joinReplyPath(40002, 301); p != 2 {
		t.Errorf("the live join's own answer left by path %d, want 2", p)
	}
}

// A SYN from the wire writes no entry and counts nothing: not to a closed
// port (the pod answers with a reset), not a join that nobody completes,
// not with a third ACK that does not acknowledge the pod's answer (a sender
// that cannot see the pod's SYN-ACK), does not continue the SYN, or is of
// the other kind; a join's third ACK with nothing answered is dropped, so
// the join cannot complete uncounted. The third ACK that acknowledges the
// answer writes the entry, on the SYN's path, and only then is a join
// counted; a handshake the pod resets is over. SYNs, however many, never
// push an answered arrival out. A handshake the pod answers without
// MP_CAPABLE (a TCP listener) falls back: its answer leaves by the SYN's
// path, it gets no entry and learns no connection from an MP_CAPABLE ACK.
// The answer to a SYN with data (TCP Fast Open) and a second answer with
// another sequence number (SYN cookies) are answers. MP_CAPABLE ACKs
// repeated with other keys on a learnt subflow add no connection.
func TestAnArrivalBecomesAnEntryOnlyWhenThePeerAcknowledgesThePodsAnswer(t *testing.T) {
	dp := twoNICResponder(t)
	on := func(ifindex int) skbContext { return skbContext{IngressIfindex: uint32(ifindex)} }
	const clientKey, serverKey = 21, 22
	server := netip.AddrPortFrom(serverPod, 80)
	acceptFromWire(t, dp, netip.AddrPortFrom(clientPod, 40000), server, testpkt.MPCapableSYN(), nic1Ifindex, clientKey, serverKey)
	entries := func() int {
		t.Helper()
		sfs, err := dp.Subflows()
		if err != nil {
			t.Fatal(err)
		}
		return len(sfs)
	}
	connections := func() int {
		t.Helper()
		conns, err := dp.Connections()
		if err != nil {
			t.Fatal(err)
		}
		return len(conns)
	}
	if n := entries(); n != 1 {
		t.Fatalf("%d entries after the victim's handshake, want 1", n)
	}
	// Segments between client (its port sport) and the server pod.
	fromClient := func(sport uint16, dport uint16, seq, ack uint32, flags uint8, opts []byte, payload []byte) []byte {
		return testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: sport, DstPort: dport, Seq: seq, Ack: ack, Flags: flags, Options: opts, Payload: payload}}.Bytes()
	}
	fromPod := func(sport uint16, seq, ack uint32, flags uint8, opts []byte) []byte {
		return testpkt.Frame{Src: serverPod, Dst: clientPod, TCP: &testpkt.TCP{SrcPort: 80, DstPort: sport, Seq: seq, Ack: ack, Flags: flags, Options: opts}}.Bytes()
	}
	// podNext is the pod's segment after a handshake: an ACK with a DSS.
	podNext := func(sport uint16, seq, ack uint32) []byte {
		return podSegment(server, netip.AddrPortFrom(clientPod, sport), seq, ack)
	}
	joinSYN := testpkt.MPJoinSYN(tokenOf(serverKey), 1, 1, false)
	joinACK := testpkt.MPJoinACK([20]byte{1})
	nicIn := func(frame []byte, ifindex int) uint32 {
		t.Helper()
		ret, err := dp.objs.NicIngress.Run(&ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256), Context: on(ifindex), ContextOut: &skbContext{}})
		if err != nil {
			t.Fatal(err)
		}
		return ret
	}

	// A SYN to a closed port: the pod resets it.
	run(t, dp.objs.NicIngress, fromClient(40010, 81, 1, 0, testpkt.SYN, testpkt.MPCapableSYN(), nil), on(nic1Ifindex))
	run(t, dp.objs.PodEgress, testpkt.Frame{Src: serverPod, Dst: clientPod, TCP: &testpkt.TCP{SrcPort: 81, DstPort: 40010, Ack: 2, Flags: testpkt.RST | testpkt.ACK}}.Bytes(), skbContext{})
	// A join with the connection's token, unanswered, then a third ACK
	// for it anyway: dropped.
	run(t, dp.objs.NicIngress, fromClient(40011, 80, 1, 0, testpkt.SYN, joinSYN, nil), on(nic2Ifindex))
	if ret := nicIn(fromClient(40011, 80, 2, 8, testpkt.ACK, joinACK, nil), nic2Ifindex); ret != tcActShot {
		t.Errorf("a join's third ACK with nothing answered: verdict %d, want dropped", int32(ret))
	}
	if got := stat(t, dp, StatJoinACKDropped); got != 1 {
		t.Errorf("join ACKs dropped = %d, want 1", got)
	}
	if n := entries(); n != 1 {
		t.Errorf("%d entries after unanswered SYNs, want still 1", n)
	}
	// The pod answers the join (sequence number 7). Third ACKs that do
	// not acknowledge it, or are not a join's, ack nothing: the pod's
	// next segment writes nothing (its kernel would not send one).
	if p := dp.pathOfMark(t, run(t, dp.objs.PodEgress, fromPod(40011, 7, 2, testpkt.SYN|testpkt.ACK, testpkt.MPJoinSYNACK(1, 2, 1, false)), skbContext{})); p != 2 {
		t.Errorf("the pod's answer left by path %d, want the SYN's path 2", p)
	}
	nicIn(fromClient(40011, 80, 2, 9, testpkt.ACK, joinACK, nil), nic2Ifindex)
	nicIn(fromClient(40011, 80, 1<<31, 8, testpkt.ACK, joinACK, nil), nic2Ifindex)
	nicIn(fromClient(40011, 80, 2, 8, testpkt.ACK, testpkt.MPCapableACK(1, 2), nil), nic2Ifindex)
	if n := entries(); n != 1 {
		t.Errorf("%d entries after third ACKs that acknowledge no answer, want still 1", n)
	}
	if c := connection(t, dp); c.Subflows != 1 {
		t.Errorf("the connection after forged third ACKs: %+v, want 1 subflow", c)
	}
	// More SYNs than the arrivals map holds, to a closed port: the
	// answered join keeps its place.
	for i := range 17000 {
		src := netip.AddrFrom4([4]byte{10, 244, 9, byte(i)})
		frame := testpkt.Frame{Src: src, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: uint16(1024 + i/256), DstPort: 81, Seq: 1, Flags: testpkt.SYN, Options: testpkt.MPCapableSYN()}}.Bytes()
		run(t, dp.objs.NicIngress, frame, on(nic1Ifindex))
	}
	// A join the pod answers and then resets: a third ACK after that
	// finds nothing, writes nothing, and is dropped.
	run(t, dp.objs.NicIngress, fromClient(40012, 80, 1, 0, testpkt.SYN, joinSYN, nil), on(nic1Ifindex))
	run(t, dp.objs.PodEgress, fromPod(40012, 7, 2, testpkt.SYN|testpkt.ACK, testpkt.MPJoinSYNACK(1, 2, 1, false)), skbContext{})
	run(t, dp.objs.PodEgress, fromPod(40012, 8, 0, testpkt.RST, testpkt.MPTCPRst(0, 3)), skbContext{})
	if ret := nicIn(fromClient(40012, 80, 2, 8, testpkt.ACK, joinACK, nil), nic1Ifindex); ret != tcActShot {
		t.Errorf("a third ACK after the pod reset the join: verdict %d, want dropped", int32(ret))
	}
	if c := connection(t, dp); c.Subflows != 1 || entries() != 1 {
		t.Errorf("after a join the pod reset: %+v and %d entries, want still the initial subflow alone", c, entries())
	}
	// The third ACK, over the other path, writes the join on the SYN's
	// path, counted.
	nicIn(fromClient(40011, 80, 2, 8, testpkt.ACK, joinACK, nil), nic1Ifindex)
	if p := dp.pathOfMark(t, run(t, dp.objs.PodEgress, podNext(40011, 8, 2), skbContext{})); p != 2 {
		t.Errorf("the pod's first segment on the join left by path %d, want 2", p)
	}
	sf := lookupSubflow(t, dp, flowKey(server, netip.AddrPortFrom(clientPod, 40011)))
	if sf.PathIndex != 2 || Role(sf.Role) != RoleResponder || sf.Token != tokenOf(serverKey) {
		t.Errorf("the join's entry is %+v, want a responder entry on path 2 with the server's token", sf)
	}
	if c := connection(t, dp); c.Subflows != 2 || c.UsedPaths != 1<<1|1<<2 {
		t.Errorf("the connection after the join completed: %+v, want 2 subflows on paths 1 and 2", c)
	}

	// A TCP listener answers an MP_CAPABLE SYN without MP_CAPABLE: the
	// answer leaves by the SYN's path; the connection fell back and gets
	// no entry, and an MP_CAPABLE ACK with made-up keys learns nothing.
	run(t, dp.objs.NicIngress, fromClient(40020, 80, 1, 0, testpkt.SYN, testpkt.MPCapableSYN(), nil), on(nic2Ifindex))
	if p := dp.pathOfMark(t, run(t, dp.objs.PodEgress, fromPod(40020, 7, 2, testpkt.SYN|testpkt.ACK, nil), skbContext{})); p != 2 {
		t.Errorf("a TCP listener's answer left by path %d, want the SYN's 2", p)
	}
	nicIn(fromClient(40020, 80, 2, 8, testpkt.ACK, testpkt.MPCapableACK(41, 42), nil), nic2Ifindex)
	if m := run(t, dp.objs.PodEgress, fromPod(40020, 8, 2, testpkt.ACK, nil), skbContext{}); m != 0 {
		t.Errorf("the fallen-back connection's segment got mark %#x, want plain routing", m)
	}
	if n := connections(); n != 1 {
		t.Errorf("%d connections after an MP_CAPABLE ACK on a fallen-back handshake, want 1", n)
	}
	// TCP Fast Open: the answer acknowledges the SYN's data too. SYN
	// cookies: a repeated SYN is answered with another sequence number,
	// and the peer acknowledges that one.
	run(t, dp.objs.NicIngress, fromClient(40021, 80, 1, 0, testpkt.SYN, testpkt.MPCapableSYN(), []byte("hello")), on(nic2Ifindex))
	run(t, dp.objs.PodEgress, fromPod(40021, 7, 7, testpkt.SYN|testpkt.ACK, testpkt.MPCapableSYNACK(52)), skbContext{})
	run(t, dp.objs.PodEgress, fromPod(40021, 70, 7, testpkt.SYN|testpkt.ACK, testpkt.MPCapableSYNACK(52)), skbContext{})
	nicIn(fromClient(40021, 80, 7, 71, testpkt.ACK, testpkt.MPCapableACK(51, 52), nil), nic2Ifindex)
	if n := connections(); n != 2 {
		t.Errorf("%d connections after the Fast Open handshake's ACK, want 2", n)
	}
	if p := dp.pathOfMark(t, run(t, dp.objs.PodEgress, podNext(40021, 71, 7), skbContext{})); p != 2 {
		t.Errorf("the Fast Open connection's first segment left by path %d, want the SYN's 2", p)
	}
	if n := entries(); n != 3 {
		t.Errorf("%d entries, want 3: the victim's two and the Fast Open connection's", n)
	}

	// MP_CAPABLE ACKs with other keys on the learnt initial subflow.
	for i := range uint64(10) {
		run(t, dp.objs.NicIngress, capableACK(clientPod, 40000, serverPod, 80, 100+i, 200+i), on(nic1Ifindex))
	}
	if n := connections(); n != 2 {
		t.Errorf("%d connections after repeated MP_CAPABLE ACKs with other keys, want still 2", n)
	}
}

// An answered arrival keeps its place against the answer to another SYN of
// its 4-tuple: the third ACK of the first answer still writes it. In
// observe-only mode nothing is dropped: a join's third ACK with nothing
// answered, and the pod's answer to a join past the maximum, pass, counted
// as observed.
func TestAnAnsweredArrivalKeepsItsPlaceAndObserveOnlyDropsNothing(t *testing.T) {
	dp := twoNICResponder(t)
	on := func(ifindex int) skbContext { return skbContext{IngressIfindex: uint32(ifindex)} }
	const clientKey, serverKey = 61, 62
	server := netip.AddrPortFrom(serverPod, 80)
	acceptFromWire(t, dp, netip.AddrPortFrom(clientPod, 40000), server, testpkt.MPCapableSYN(), nic1Ifindex, clientKey, serverKey)
	joinSYN := func(sport uint16, seq uint32) []byte {
		return testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: sport, DstPort: 80, Seq: seq, Flags: testpkt.SYN,
			Options: testpkt.MPJoinSYN(tokenOf(serverKey), 1, 1, false)}}.Bytes()
	}
	answer := func(sport uint16, seq, ack uint32) []byte {
		return testpkt.Frame{Src: serverPod, Dst: clientPod, TCP: &testpkt.TCP{SrcPort: 80, DstPort: sport, Seq: seq, Ack: ack, Flags: testpkt.SYN | testpkt.ACK,
			Options: testpkt.MPJoinSYNACK(1, 2, 1, false)}}.Bytes()
	}
	third := func(sport uint16, seq, ack uint32) []byte {
		return testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: sport, DstPort: 80, Seq: seq, Ack: ack, Flags: testpkt.ACK,
			Options: testpkt.MPJoinACK([20]byte{1})}}.Bytes()
	}
	run(t, dp.objs.NicIngress, joinSYN(40030, 100), on(nic2Ifindex))
	run(t, dp.objs.PodEgress, answer(40030, 7, 101), skbContext{})
	run(t, dp.objs.NicIngress, joinSYN(40030, 200), on(nic1Ifindex))
	if m := run(t, dp.objs.PodEgress, answer(40030, 70, 201), skbContext{}); m != 0 {
		t.Errorf("the answer to a second SYN of an answered 4-tuple got mark %#x, want none: the first keeps its place", m)
	}
	run(t, dp.objs.NicIngress, third(40030, 101, 8), on(nic2Ifindex))
	if sf := lookupSubflow(t, dp, flowKey(server, netip.AddrPortFrom(clientPod, 40030))); sf.SynSeq != 100 || sf.PathIndex != 2 {
		t.Errorf("the entry is %+v, want the first SYN's (sequence number 100, path 2)", sf)
	}

	// The rule's maximum of two is reached. Observe-only from here.
	if err := dp.SetObserveOnly(true); err != nil {
		t.Fatal(err)
	}
	observed := stat(t, dp, StatObserved)
	ret, err := dp.objs.NicIngress.Run(&ebpf.RunOptions{Data: third(40031, 2, 8), DataOut: make([]byte, 512), Context: on(nic1Ifindex), ContextOut: &skbContext{}})
	if err != nil || ret != tcxNext {
		t.Errorf("observe-only: a join's third ACK with nothing answered: verdict %d (%v), want it passed", int32(ret), err)
	}
	if got := stat(t, dp, StatJoinACKDropped); got != 1 {
		t.Errorf("observe-only: join ACKs that would have been dropped = %d, want 1", got)
	}
	// A join past the maximum on a 4-tuple with an entry is refused at
	// the pod's answer, which would be dropped.
	run(t, dp.objs.NicIngress, joinSYN(40030, 300), on(nic1Ifindex))
	if ret, _ := runOut(t, dp.objs.PodEgress, answer(40030, 9, 301)); ret != tcxNext {
		t.Errorf("observe-only: the pod's answer to a join past the maximum: verdict %d, want it passed", int32(ret))
	}
	if got := stat(t, dp, StatJoinRefused); got != 1 {
		t.Errorf("observe-only: joins refused = %d, want 1", got)
	}
	if got := stat(t, dp, StatObserved); got < observed+2 {
		t.Errorf("observe-only: observed %d, want at least %d: the two drops it did not make", got, observed+2)
	}
}

// A reset the pod's listener sends for a stray or forged ACK leaves the
// handshake it answered alone: the real third ACK still writes the join.
// The pod answers at most the rule's maximum of one connection's joins,
// and a few more, within a few seconds, so that a peer cannot have it
// answer thousands and push other pods' joins out. A join's third ACK on a 4-tuple whose
// live entry is another handshake's is dropped: the join would complete
// uncounted.
func TestAForgedACKOrAFloodOfJoinsLosesNoOnesJoin(t *testing.T) {
	dp := twoNICResponder(t) // maximum of two subflows
	on := func(ifindex int) skbContext { return skbContext{IngressIfindex: uint32(ifindex)} }
	const clientKey, serverKey = 71, 72
	server := netip.AddrPortFrom(serverPod, 80)
	acceptFromWire(t, dp, netip.AddrPortFrom(clientPod, 40000), server, testpkt.MPCapableSYN(), nic1Ifindex, clientKey, serverKey)
	segment := func(src, dst netip.AddrPort, seq, ack uint32, flags uint8, opts []byte) []byte {
		return testpkt.Frame{Src: src.Addr(), Dst: dst.Addr(), TCP: &testpkt.TCP{SrcPort: src.Port(), DstPort: dst.Port(), Seq: seq, Ack: ack, Flags: flags, Options: opts}}.Bytes()
	}
	joinSYN := testpkt.MPJoinSYN(tokenOf(serverKey), 1, 1, false)
	joinSYNACK := testpkt.MPJoinSYNACK(1, 2, 1, false)
	joinACK := testpkt.MPJoinACK([20]byte{1})
	peer := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(clientPod, port) }
	// The join is answered; a forged ACK draws the listener's reset
	// (its sequence number is the forged ACK's ack number).
	run(t, dp.objs.NicIngress, segment(peer(40040), server, 100, 0, testpkt.SYN, joinSYN), on(nic2Ifindex))
	run(t, dp.objs.PodEgress, segment(server, peer(40040), 7, 101, testpkt.SYN|testpkt.ACK, joinSYNACK), skbContext{})
	run(t, dp.objs.PodEgress, segment(server, peer(40040), 0xdead, 0, testpkt.RST, nil), skbContext{})
	run(t, dp.objs.NicIngress, segment(peer(40040), server, 101, 8, testpkt.ACK, joinACK), on(nic2Ifindex))
	if c := connection(t, dp); c.Subflows != 2 {
		t.Errorf("after a listener's reset and the real third ACK: %+v, want the join counted", c)
	}

	// Twenty joins of one connection, each answered by the pod before
	// any completes (as a peer flooding joins with its own token would
	// have it): the answers beyond the rule's maximum and a few more
	// within the window are dropped.
	dp2 := twoNICResponder(t)
	acceptFromWire(t, dp2, netip.AddrPortFrom(clientPod, 40000), server, testpkt.MPCapableSYN(), nic1Ifindex, clientKey, serverKey)
	if err := dp2.SetRule(0, Rule{Paths: []uint32{1, 2}, MaxSubflows: 3}); err != nil {
		t.Fatal(err)
	}
	var passed int
	for i := range uint16(20) {
		run(t, dp2.objs.NicIngress, segment(peer(41000+i), server, 1, 0, testpkt.SYN, joinSYN), on(nic2Ifindex))
		if verdict(t, dp2.objs.PodEgress, segment(server, peer(41000+i), 7, 2, testpkt.SYN|testpkt.ACK, joinSYNACK), skbContext{}) == tcxNext {
			passed++
		}
	}
	if passed != 3+8 {
		t.Errorf("%d of 20 join answers of one connection went on within the window, want the rule's maximum and 8 more, 11", passed)
	}

	// A live join J1 on 40050; a second handshake on its 4-tuple, which
	// the pod answers and then refuses (its reset continues its answer):
	// that handshake's third ACK is dropped.
	dp3 := twoNICResponder(t)
	if err := dp3.SetRule(0, Rule{Paths: []uint32{1, 2}, MaxSubflows: 3}); err != nil {
		t.Fatal(err)
	}
	acceptFromWire(t, dp3, netip.AddrPortFrom(clientPod, 40000), server, testpkt.MPCapableSYN(), nic1Ifindex, clientKey, serverKey)
	acceptFromWire(t, dp3, peer(40050), server, joinSYN, nic2Ifindex)
	run(t, dp3.objs.NicIngress, segment(peer(40050), server, 500, 0, testpkt.SYN, joinSYN), on(nic1Ifindex))
	run(t, dp3.objs.PodEgress, segment(server, peer(40050), 70, 501, testpkt.SYN|testpkt.ACK, joinSYNACK), skbContext{})
	run(t, dp3.objs.PodEgress, segment(server, peer(40050), 71, 0, testpkt.RST, nil), skbContext{})
	if ret := verdict(t, dp3.objs.NicIngress, segment(peer(40050), server, 501, 71, testpkt.ACK, joinACK), on(nic1Ifindex)); ret != tcActShot {
		t.Errorf("a third ACK of another handshake on a live join's 4-tuple: verdict %d, want dropped", int32(ret))
	}
	if c := connection(t, dp3); c.Subflows != 2 {
		t.Errorf("connection %+v, want 2 subflows", c)
	}
}

// A flood of SYNs at one selected pod, twice as many as the whole node's
// waiting SYNs could once hold, evicts only that pod's own: another pod's
// join, waiting for its answer through the flood, is answered, and its third
// ACK writes its entry. The flooded pod keeps what fits its share
// (LIMIT_POD_ARRIVALS), its oldest waiting SYN evicted.
func TestASYNFloodAtOnePodEvictsNoOtherPodsWaitingJoin(t *testing.T) {
	dp := twoNICResponder(t)
	flooded := netip.MustParseAddr("10.244.2.12")
	if err := dp.SetEndpoint(flooded, 0); err != nil {
		t.Fatal(err)
	}
	on := func(ifindex int) skbContext { return skbContext{IngressIfindex: uint32(ifindex)} }
	const clientKey, serverKey = 21, 22
	server := netip.AddrPortFrom(serverPod, 80)
	acceptFromWire(t, dp, netip.AddrPortFrom(clientPod, 40000), server, testpkt.MPCapableSYN(), nic1Ifindex, clientKey, serverKey)

	const joinPort, joinSeq = 40001, 300
	join := testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: joinPort, DstPort: 80, Seq: joinSeq,
		Flags: testpkt.SYN, Options: testpkt.MPJoinSYN(tokenOf(serverKey), 1, 1, false)}}.Bytes()
	run(t, dp.objs.NicIngress, join, on(nic2Ifindex))
	// 32768 4-tuples, each from an address of its own.
	floodSYN := func(i int) []byte {
		src := netip.AddrFrom4([4]byte{192, 168, byte(i >> 8), byte(i)})
		return testpkt.Frame{Src: src, Dst: flooded, TCP: &testpkt.TCP{SrcPort: 40000, DstPort: 80, Seq: 1,
			Flags: testpkt.SYN, Options: testpkt.MPCapableSYN()}}.Bytes()
	}
	const flood = 32768
	staged := stat(t, dp, StatArrivalStaged)
	for i := range flood {
		run(t, dp.objs.NicIngress, floodSYN(i), on(nic1Ifindex))
	}
	if got := stat(t, dp, StatArrivalStaged) - staged; got != flood {
		t.Fatalf("the flood staged %d SYNs, want each of its %d", got, flood)
	}
	if n, _ := countPodMap(t, dp, dp.objs.Arrivals, flooded); n == 0 || n > limits.PodArrivals {
		t.Errorf("the flooded pod has %d SYNs waiting, want 1 to its share of %d", n, limits.PodArrivals)
	}
	if n, _ := countPodMap(t, dp, dp.objs.Arrivals, serverPod); n != 1 {
		t.Errorf("the other pod has %d SYNs waiting, want its join", n)
	}

	answer := testpkt.Frame{Src: serverPod, Dst: clientPod, TCP: &testpkt.TCP{SrcPort: 80, DstPort: joinPort, Seq: 7, Ack: joinSeq + 1,
		Flags: testpkt.SYN | testpkt.ACK, Options: testpkt.MPJoinSYNACK(1, 2, 1, false)}}.Bytes()
	if mark := run(t, dp.objs.PodEgress, answer, skbContext{}); dp.pathOfMark(t, mark) != 2 {
		t.Errorf("the join's answer leaves by path %d, want 2, the path its SYN came in by", dp.pathOfMark(t, mark))
	}
	thirdACKWritesItsEntry(t, dp, testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: joinPort, DstPort: 80,
		Seq: joinSeq + 1, Ack: 8, Flags: testpkt.ACK, Options: testpkt.MPJoinACK([20]byte{1})}}.Bytes(), on(nic2Ifindex))
	if sf := lookupSubflow(t, dp, flowKey(server, netip.AddrPortFrom(clientPod, joinPort))); sf.PathIndex != 2 {
		t.Errorf("the join's entry is on path %d, want 2", sf.PathIndex)
	}
}

// podMapOf is selected pod's map in outer, a map of per-pod maps (nil:
// none).
func podMapOf(t *testing.T, dp *Datapath, outer *ebpf.Map, pod netip.Addr) *ebpf.Map {
	t.Helper()
	var ep datapathEndpoint
	k := endpointKey(pod)
	if err := dp.objs.Endpoints.Lookup(&k, &ep); err != nil {
		t.Fatalf("endpoint %v: %v", pod, err)
	}
	var inner *ebpf.Map
	err := outer.Lookup(ep.PodSlot, &inner)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return nil
	}
	if err != nil {
		t.Fatalf("the per-pod map of %v (slot %d): %v", pod, ep.PodSlot, err)
	}
	return inner
}

// Each selected pod has its own maps of waiting SYNs and answered joins from
// its selection on; a released pod's slot keeps none, and a pod selected
// again gets fresh ones. A new load (a restarted agent: the endpoints are
// pinned, the maps of maps are not) gives every selected pod them again
// before its programs run.
func TestEachSelectedPodHasItsOwnWaitingSYNs(t *testing.T) {
	pin := bpffsPinDir(t)
	dp, err := Load(Options{PinDir: pin})
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	if err := dp.SetRule(0, Rule{Paths: []uint32{1}}); err != nil {
		t.Fatal(err)
	}
	pods := []netip.Addr{clientPod, serverPod}
	for _, pod := range pods {
		if err := dp.SetEndpoint(pod, 0); err != nil {
			t.Fatal(err)
		}
	}
	for _, outer := range []func(*Datapath) *ebpf.Map{
		func(dp *Datapath) *ebpf.Map { return dp.objs.Arrivals },
		func(dp *Datapath) *ebpf.Map { return dp.objs.Answered },
		func(dp *Datapath) *ebpf.Map { return dp.objs.AnsweredJoins },
	} {
		checkOwnPodMaps(t, pin, dp, outer, pods)
	}
}

// checkOwnPodMaps is TestEachSelectedPodHasItsOwnWaitingSYNs for one map of
// per-pod maps (outer of a datapath), on dp with pods selected.
func checkOwnPodMaps(t *testing.T, pin string, dp *Datapath, outer func(*Datapath) *ebpf.Map, pods []netip.Addr) {
	t.Helper()
	id := func(dp *Datapath, pod netip.Addr) ebpf.MapID {
		t.Helper()
		m := podMapOf(t, dp, outer(dp), pod)
		if m == nil {
			t.Fatalf("selected pod %v has no map of its own in %v", pod, outer(dp))
		}
		defer m.Close()
		info, err := m.Info()
		if err != nil {
			t.Fatal(err)
		}
		mid, _ := info.ID()
		return mid
	}
	first := id(dp, clientPod)
	if first == id(dp, serverPod) {
		t.Fatalf("two pods share the map %d", first)
	}

	var ep datapathEndpoint
	k := endpointKey(clientPod)
	if err := dp.objs.Endpoints.Lookup(&k, &ep); err != nil {
		t.Fatal(err)
	}
	if err := dp.DeleteEndpoint(clientPod); err != nil {
		t.Fatal(err)
	}
	var inner *ebpf.Map
	if err := outer(dp).Lookup(ep.PodSlot, &inner); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("the released pod's slot %d still has its map in %v (%v)", ep.PodSlot, outer(dp), err)
	}
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	if again := id(dp, clientPod); again == first {
		t.Errorf("the pod selected again has its old map %d, want a fresh one", again)
	}

	reloaded, err := Load(Options{PinDir: pin})
	if err != nil {
		t.Fatal(err)
	}
	defer reloaded.Close()
	for _, pod := range pods {
		id(reloaded, pod)
	}
}

// Handshakes one pod answers by the thousand (more than the whole node's
// answered joins, or answered initial subflows, could once hold), each of a
// connection of its own and so within every connection's ration of answers,
// push out only that pod's answered handshakes: another pod's handshake of
// the same kind, answered before them, completes at its third ACK.
func TestHandshakesOnePodAnswersPushOutNoOtherPodsAnswered(t *testing.T) {
	for _, c := range []struct {
		name    string
		join    bool
		answers int
		limit   int
	}{
		{"joins", true, 5000, limits.PodAnsweredJoins},
		{"initial subflows", false, 20000, limits.PodAnswered},
	} {
		t.Run(c.name, func(t *testing.T) { testOnePodsAnswersPushOutNoOthers(t, c.join, c.answers, c.limit) })
	}
}

func testOnePodsAnswersPushOutNoOthers(t *testing.T, join bool, answers, limit int) {
	dp := twoNICResponder(t)
	flooded := netip.MustParseAddr("10.244.2.12")
	if err := dp.SetEndpoint(flooded, 0); err != nil {
		t.Fatal(err)
	}
	on := func(ifindex int) skbContext { return skbContext{IngressIfindex: uint32(ifindex)} }
	const clientKey, serverKey = 31, 32
	synOpts := func(token uint32) []byte {
		if join {
			return testpkt.MPJoinSYN(token, 1, 1, false)
		}
		return testpkt.MPCapableSYN()
	}
	answerOpts, thirdOpts := testpkt.MPCapableSYNACK(serverKey), testpkt.MPCapableACK(clientKey, serverKey)
	if join {
		answerOpts, thirdOpts = testpkt.MPJoinSYNACK(1, 2, 1, false), testpkt.MPJoinACK([20]byte{1})
		acceptFromWire(t, dp, netip.AddrPortFrom(clientPod, 40000), netip.AddrPortFrom(serverPod, 80), testpkt.MPCapableSYN(),
			nic1Ifindex, clientKey, serverKey)
	}

	// The victim's handshake, answered: it waits for its third ACK.
	const victimPort, victimSeq = 40001, 300
	run(t, dp.objs.NicIngress, testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: victimPort, DstPort: 80, Seq: victimSeq,
		Flags: testpkt.SYN, Options: synOpts(tokenOf(serverKey))}}.Bytes(), on(nic2Ifindex))
	run(t, dp.objs.PodEgress, testpkt.Frame{Src: serverPod, Dst: clientPod, TCP: &testpkt.TCP{SrcPort: 80, DstPort: victimPort, Seq: 7,
		Ack: victimSeq + 1, Flags: testpkt.SYN | testpkt.ACK, Options: answerOpts}}.Bytes(), skbContext{})

	for i := range answers {
		peer := netip.AddrFrom4([4]byte{192, 168, byte(i >> 8), byte(i)})
		port := uint16(40000 + i>>16)
		run(t, dp.objs.NicIngress, testpkt.Frame{Src: peer, Dst: flooded, TCP: &testpkt.TCP{SrcPort: port, DstPort: 80, Seq: 1,
			Flags: testpkt.SYN, Options: synOpts(uint32(1000 + i))}}.Bytes(), on(nic1Ifindex))
		run(t, dp.objs.PodEgress, testpkt.Frame{Src: flooded, Dst: peer, TCP: &testpkt.TCP{SrcPort: 80, DstPort: port, Seq: 7,
			Ack: 2, Flags: testpkt.SYN | testpkt.ACK, Options: answerOpts}}.Bytes(), skbContext{})
	}
	outer := dp.objs.Answered
	if join {
		outer = dp.objs.AnsweredJoins
	}
	n, size := countPodMap(t, dp, outer, flooded)
	limit = max(limit, size) // more on kernels before 6.16 (podMapEntries)
	if n == 0 || n > limit {
		t.Errorf("the pod that answered %d handshakes has %d waiting, want 1 to its share of %d", answers, n, limit)
	}
	if n, _ := countPodMap(t, dp, outer, serverPod); n != 1 {
		t.Errorf("the other pod has %d answered handshakes waiting, want its one", n)
	}
	thirdACKWritesItsEntry(t, dp, testpkt.Frame{Src: clientPod, Dst: serverPod, TCP: &testpkt.TCP{SrcPort: victimPort, DstPort: 80,
		Seq: victimSeq + 1, Ack: 8, Flags: testpkt.ACK, Options: thirdOpts}}.Bytes(), on(nic2Ifindex))
}

// countPodMap counts the entries of pod's map in outer, a map of per-pod
// maps, and gives its size.
func countPodMap(t *testing.T, dp *Datapath, outer *ebpf.Map, pod netip.Addr) (n, size int) {
	t.Helper()
	m := podMapOf(t, dp, outer, pod)
	if m == nil {
		t.Fatalf("%v has no map of its own in %v", pod, outer)
	}
	defer m.Close()
	var fk datapathFlowKey
	var a []byte
	it := m.Iterate()
	for it.Next(&fk, &a) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n, int(m.MaxEntries())
}

// thirdACKWritesItsEntry runs a peer's third ACK through nic_ingress and
// checks that it passes and writes its subflow's entry.
func thirdACKWritesItsEntry(t *testing.T, dp *Datapath, third []byte, in skbContext) {
	t.Helper()
	mirrored, dropped := stat(t, dp, StatSubflowMirrored), stat(t, dp, StatJoinACKDropped)
	if ret := verdict(t, dp.objs.NicIngress, third, in); ret != tcxNext {
		t.Fatalf("the third ACK: verdict %d, want it passed (join_ack_dropped %d more)",
			int32(ret), stat(t, dp, StatJoinACKDropped)-dropped)
	}
	if got := stat(t, dp, StatSubflowMirrored) - mirrored; got != 1 {
		t.Errorf("the third ACK mirrored %d entries, want its own", got)
	}
}

// Before Linux 6.16 each per-pod map holds at least two of an LRU map's
// free batches per possible CPU, up to 4096 entries, so that it does not
// evict a live entry for want of free ones; from 6.16 its own limit.
func TestPerPodMapsHoldTwoFreeBatchesPerCPUBeforeLinux616(t *testing.T) {
	for _, c := range []struct {
		release string
		cpus    int
		want    uint32
	}{
		{"6.18.44-fc", 64, 256},
		{"6.16.0", 8, 256},
		{"7.0.1", 8, 256},
		{"6.15.9", 2, 512},
		{"6.6.58-talos", 8, 2048},
		{"6.6.58-talos", 64, 4096},
		{"", 1, 256},
	} {
		if got := podMapEntries(256, c.release, c.cpus); got != c.want {
			t.Errorf("kernel %q, %d CPUs: %d entries, want %d", c.release, c.cpus, got, c.want)
		}
	}
}
