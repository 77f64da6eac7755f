package datapath

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
)

// connection reads the one entry of the connection table.
func connection(t *testing.T, dp *Datapath) Connection {
	t.Helper()
	conns, err := dp.Connections()
	if err != nil || len(conns) != 1 {
		t.Fatalf("connections = %+v, %v; want one", conns, err)
	}
	return conns[0]
}

// A join the pod's kernel closed gives its path and its count back to its
// connection, once: the join opened to replace it is placed on the same
// path and let through under a maximum of two subflows, where without the
// release it would have been refused.
func TestClosedJoinGivesItsPathBackForTheNextJoin(t *testing.T) {
	dp := loadForTest(t)
	if err := dp.SetRule(0, Rule{Paths: []uint32{1, 2}, MaxSubflows: 2}); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	const clientKey, serverKey = 5, 6
	initial := dp.pathOfMark(t, run(t, dp.objs.PodEgress, syn(clientPod, 40000, serverPod, 80, testpkt.MPCapableSYN()), skbContext{}))
	run(t, dp.objs.PodEgress, capableACK(clientPod, 40000, serverPod, 80, clientKey, serverKey), skbContext{})
	joinSYN := func(sport uint16) []byte {
		return syn(clientPod, sport, serverPod, 80, testpkt.MPJoinSYN(tokenOf(serverKey), 1, 1, false))
	}
	first := dp.pathOfMark(t, run(t, dp.objs.PodEgress, joinSYN(40001), skbContext{}))
	if first == initial {
		t.Fatalf("join placed on the initial subflow's path %d", first)
	}
	if c := connection(t, dp); c.Joins != 1 || c.UsedPaths != 1<<initial|1<<first {
		t.Fatalf("after the join: %+v", c)
	}
	// A second join is past the maximum: refused, and it changes nothing.
	if ret, _ := runOut(t, dp.objs.PodEgress, joinSYN(40002)); ret == tcxNext {
		t.Fatal("a join past the maximum went on")
	}
	if got := stat(t, dp, StatSubflowPlaced); got != 2 {
		t.Fatalf("placed %d subflows, want 2 (the join past the maximum refused)", got)
	}

	closedOn := func(sport uint16) (uint32, bool) {
		t.Helper()
		path, ok, err := dp.SubflowClosed(ClosedSubflow{Local: netip.AddrPortFrom(clientPod, sport), Remote: netip.AddrPortFrom(serverPod, 80), Heard: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		return path, ok
	}
	closed := func(sport uint16) bool {
		t.Helper()
		_, ok := closedOn(sport)
		return ok
	}
	// It says which path the join had: its replacement waits for that
	// path while it is down (podnet).
	if path, ok := closedOn(40001); !ok || path != first {
		t.Fatalf("SubflowClosed of the placed join: closed %v, on path %d, want closed on path %d", ok, path, first)
	}
	if c := connection(t, dp); c.Joins != 0 || c.UsedPaths != 1<<initial {
		t.Fatalf("after the join closed: %+v, want no join and only path %d used", c, initial)
	}
	// Told twice (or of a subflow it never had): nothing more goes back.
	if closed(40001) || closed(49999) {
		t.Fatal("SubflowClosed found an entry twice")
	}
	if c := connection(t, dp); c.Joins != 0 || c.Subflows != 1 {
		t.Fatalf("after closing again: %+v, want 0 joins and the initial subflow", c)
	}
	if got := stat(t, dp, StatSubflowClosed); got != 1 {
		t.Fatalf("StatSubflowClosed = %d, want 1", got)
	}

	again := dp.pathOfMark(t, run(t, dp.objs.PodEgress, joinSYN(40003), skbContext{}))
	if again != first {
		t.Fatalf("replacing join placed on path %d, want the freed path %d", again, first)
	}
	if got := stat(t, dp, StatSubflowPlaced); got != 3 {
		t.Fatalf("placed %d subflows, want 3 (the replacing join let through)", got)
	}
}

// nic1Ifindex is the test NICs' first (nic2Ifindex the second).
const nic1Ifindex = 6

// twoNICResponder is the datapath of serverPod's node: the pod selected by
// rule 0, over paths 1 and 2 (nic1Ifindex, nic2Ifindex), at most two
// subflows per connection.
func twoNICResponder(t *testing.T) *Datapath {
	t.Helper()
	dp := loadForTest(t)
	if err := dp.SetRule(0, Rule{Paths: []uint32{1, 2}, MaxSubflows: 2}); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetEndpoint(serverPod, 0); err != nil {
		t.Fatal(err)
	}
	for ifindex, path := range map[int]uint32{nic1Ifindex: 1, nic2Ifindex: 2} {
		if err := dp.SetNIC(ifindex, path); err != nil {
			t.Fatal(err)
		}
	}
	return dp
}

// On the responder's node, a peer's join that closed no longer counts
// against the maximum: the peer's next join is let in, not answered with a
// reset.
func TestClosedPeerJoinNoLongerCountsAgainstTheMaximum(t *testing.T) {
	dp := twoNICResponder(t)
	const clientKey, serverKey = 7, 8
	on := func(ifindex int) skbContext { return skbContext{IngressIfindex: uint32(ifindex)} }
	server := netip.AddrPortFrom(serverPod, 80)
	acceptFromWire(t, dp, netip.AddrPortFrom(clientPod, 40000), server, testpkt.MPCapableSYN(), nic1Ifindex, clientKey, serverKey)
	// join sends the peer's join (the server's token) and says whether it
	// went on into the pod; if it did, the pod answers and the peer
	// completes the handshake.
	join := func(sport uint16) bool {
		frame := syn(clientPod, sport, serverPod, 80, testpkt.MPJoinSYN(tokenOf(serverKey), 1, 1, false))
		ret, err := dp.objs.NicIngress.Run(&ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256), Context: on(nic2Ifindex), ContextOut: &skbContext{}})
		if err != nil {
			t.Fatal(err)
		}
		if ret != tcxNext {
			return false
		}
		completeFromWire(t, dp, netip.AddrPortFrom(clientPod, sport), server, 1, true, nic2Ifindex)
		return true
	}
	if !join(40001) {
		t.Fatal("the peer's first join was refused")
	}
	if c := connection(t, dp); c.Subflows != 2 {
		t.Fatalf("after the peer's join: %+v, want 2 subflows", c)
	}
	// The first join's SYN again (a retransmission): neither counted
	// again nor forgotten by what its close gives back below.
	if !join(40001) {
		t.Fatal("the retransmitted SYN of a join let in was refused")
	}
	if c := connection(t, dp); c.Subflows != 2 {
		t.Fatalf("after the retransmitted SYN: %+v, want still 2 subflows", c)
	}
	if join(40002) {
		t.Fatal("a join past the maximum went on")
	}
	if got := stat(t, dp, StatJoinRefused); got != 1 {
		t.Fatalf("joins refused = %d, want 1 (past the maximum)", got)
	}
	// The server pod sends the 4-tuple the other way round.
	if _, ok, err := dp.SubflowClosed(ClosedSubflow{Local: netip.AddrPortFrom(serverPod, 80), Remote: netip.AddrPortFrom(clientPod, 40001), Heard: time.Now()}); err != nil || !ok {
		t.Fatalf("SubflowClosed = %v, %v; want the mirrored join found", ok, err)
	}
	if c := connection(t, dp); c.Subflows != 1 || c.UsedPaths != 1<<1 {
		t.Fatalf("after the peer's join closed: %+v, want the initial subflow alone on path 1", c)
	}
	if !join(40003) {
		t.Fatal("the join replacing the closed one was refused")
	}
	if got := stat(t, dp, StatJoinRefused); got != 1 {
		t.Fatalf("joins refused = %d after the closed join, want still 1", got)
	}
}

// Only what a subflow took goes back: a join that shares a path another
// subflow holds gives back its count but not the path's bit, and a close
// heard before the 4-tuple's entry was placed (a new subflow of the same
// 4-tuple) leaves the entry alone.
func TestClosedSubflowGivesBackOnlyWhatItTook(t *testing.T) {
	dp := loadForTest(t)
	if err := dp.SetRule(0, Rule{Paths: []uint32{1, 2}}); err != nil {
		t.Fatal(err)
	}
	if err := dp.SetEndpoint(clientPod, 0); err != nil {
		t.Fatal(err)
	}
	const clientKey, serverKey = 9, 10
	run(t, dp.objs.PodEgress, syn(clientPod, 40000, serverPod, 80, testpkt.MPCapableSYN()), skbContext{})
	run(t, dp.objs.PodEgress, capableACK(clientPod, 40000, serverPod, 80, clientKey, serverKey), skbContext{})
	var beforeSharing time.Time
	for sport := uint16(40001); sport <= 40002; sport++ { // the second shares a path
		beforeSharing = time.Now()
		run(t, dp.objs.PodEgress, syn(clientPod, sport, serverPod, 80, testpkt.MPJoinSYN(tokenOf(serverKey), 1, 1, false)), skbContext{})
	}
	if c := connection(t, dp); c.Joins != 2 || c.UsedPaths != 0b110 {
		t.Fatalf("after two joins on two paths: %+v", c)
	}
	remote := netip.AddrPortFrom(serverPod, 80)
	if _, ok, err := dp.SubflowClosed(ClosedSubflow{Local: netip.AddrPortFrom(clientPod, 40002), Remote: remote, Heard: beforeSharing}); err != nil || ok {
		t.Fatalf("a close heard before the entry was placed: closed %v, %v; want the entry kept", ok, err)
	}
	if _, ok, err := dp.SubflowClosed(ClosedSubflow{Local: netip.AddrPortFrom(clientPod, 40002), Remote: remote, Heard: time.Now()}); err != nil || !ok {
		t.Fatalf("SubflowClosed(the sharing join) = %v, %v", ok, err)
	}
	if c := connection(t, dp); c.Joins != 1 || c.UsedPaths != 0b110 {
		t.Fatalf("after the sharing join closed: %+v, want 1 join and both paths still held", c)
	}
}
