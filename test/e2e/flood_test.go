package e2e

import (
	"math/rand/v2"
	"net/netip"
	"strconv"
	"testing"
	"time"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testpkt"
)

// A remote sender on the fabrics that knows a victim connection's 4-tuples
// and token (docs/security.md, "A remote sender") floods the server's node
// with SYNs that carry them, MP_CAPABLE and MP_JOIN, over the NIC each
// subflow does not use, and with SYNs to a closed port of the server pod:
// 300 of each kind in a second, from bed addresses only. The victim's
// subflows stay as they were on the server's node (path, role, token,
// connection), the forged SYNs only wait (arrival_staged): none takes a
// live 4-tuple (arrival_promoted) and none writes an entry
// (subflow_mirrored), the transfer keeps both NICs busy and arrives whole,
// and a new connection of the client still gets its join, on the other
// NIC.
func testForgedSYNsMoveNoLiveSubflow(t *testing.T) {
	const (
		port, closedPort = 5620, 5629 // and port+1 for the connection after
		length           = 8 * time.Second
		perKind          = 300
		carrying         = 250e3 // bytes a second: a NIC that carries a subflow of the transfer
	)
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "100mbit"})
	ctx := background(t)
	agents, err := framework.StartAgents(ctx, bed, bins.Agent, mptcpv1alpha1.CompiledRule{MaxSubflows: 2}, declaredCaps)
	if err != nil {
		t.Fatal(err)
	}
	client, server := bed.Pod(1, 1), bed.Pod(2, 1)
	w := bed.Watch(t, framework.DatapathEvidence(bed))
	defer w.Close()
	srv, err := bed.StartTrafficServer(ctx, bins.Traffic, server, port, true)
	if err != nil {
		t.Fatal(err)
	}
	done := sendInBackground(ctx, bed, client, server, port, length)
	waitPlaced(t, bed, agents[0], client, 2)

	// The victim as the server's node holds it: its initial subflow and
	// its join, each on its own path.
	victim := func() map[netip.AddrPort]datapath.Subflow {
		sfs, err := agents[1].Subflows()
		if err != nil {
			t.Fatal(err)
		}
		out := map[netip.AddrPort]datapath.Subflow{}
		for _, sf := range sfs {
			if sf.Local == netip.AddrPortFrom(server.Addr, port) {
				sf.Counters = datapath.TrafficCounters{}
				out[sf.Remote] = sf
			}
		}
		return out
	}
	before := victim()
	paths := map[uint32]bool{}
	for _, sf := range before {
		paths[sf.Path] = true
	}
	if len(before) != 2 || len(paths) != 2 {
		t.Fatalf("the server's node holds %+v of the victim, want two subflows on distinct paths", before)
	}

	// The flood, sent from the fabric of the path each subflow does not
	// use, so that it arrives on the other NIC.
	forged := map[int][][]byte{}
	syn := func(src, dst netip.AddrPort, opts []byte) []byte {
		frame := testpkt.Frame{Src: src.Addr(), Dst: dst.Addr(), TCP: &testpkt.TCP{SrcPort: src.Port(), DstPort: dst.Port(),
			Seq: rand.Uint32(), Flags: testpkt.SYN, Window: 64240, Options: opts}}
		return frame.Bytes()[14:] // from the IP header on
	}
	for remote, sf := range before {
		other := 3 - int(sf.Path)
		for range perKind / 2 {
			forged[other] = append(forged[other],
				syn(remote, sf.Local, testpkt.MPCapableSYN()),
				syn(remote, sf.Local, testpkt.MPJoinSYN(sf.Conn, rand.Uint32(), 1, false)))
		}
	}
	for i := range perKind {
		src := netip.AddrPortFrom(client.Addr, uint16(20000+i))
		forged[1+i%2] = append(forged[1+i%2], syn(src, netip.AddrPortFrom(server.Addr, closedPort), testpkt.MPCapableSYN()))
	}
	stats0, err := agents[1].DatapathStats()
	if err != nil {
		t.Fatal(err)
	}
	// What each NIC carries in a second just before the flood is the
	// yardstick for what it carries during it: the machine's other load
	// slows both alike. The join starts held as backup and is made active
	// once its acceptor answered, which a busy machine can delay past the
	// first second: the second is measured again, twice at most, until
	// both NICs carry the transfer.
	var txPre, tx0 []uint64
	var pre time.Duration
	for second := 1; ; second++ {
		_, txPre = nicBytes(t, bed, bed.Node(1))
		preStart := time.Now()
		time.Sleep(time.Second)
		_, tx0 = nicBytes(t, bed, bed.Node(1))
		pre = time.Since(preStart)
		idle := false
		for k := range tx0 {
			idle = idle || float64(tx0[k]-txPre[k])/pre.Seconds() < carrying
		}
		if !idle || second == 3 {
			t.Logf("the yardstick is second %d after the join was placed", second)
			break
		}
	}
	start := time.Now()
	errs := make(chan error, 2)
	for k, pkts := range forged {
		go func() { errs <- bed.Forge(bed.Fabrics[k-1], pkts, time.Second) }()
	}
	for range forged {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	flood := time.Since(start)
	_, tx1 := nicBytes(t, bed, bed.Node(1))

	after := victim()
	for remote, b := range before {
		if a, ok := after[remote]; !ok || a != b {
			t.Errorf("the victim's subflow from %v was %+v before the flood, %+v after", remote, b, a)
		}
	}
	stats, err := agents[1].DatapathStats()
	if err != nil {
		t.Fatal(err)
	}
	total := len(forged[1]) + len(forged[2])
	staged, promoted, mirrored := stats[datapath.StatArrivalStaged]-stats0[datapath.StatArrivalStaged],
		stats[datapath.StatArrivalPromoted]-stats0[datapath.StatArrivalPromoted], stats[datapath.StatSubflowMirrored]-stats0[datapath.StatSubflowMirrored]
	t.Logf("flood of %d SYNs in %v: node 2 staged %d arrivals, promoted %d, mirrored %d subflows; node 1 sent %d and %d bytes over its NICs meanwhile",
		total, flood.Round(time.Millisecond), staged, promoted, mirrored, tx1[0]-tx0[0], tx1[1]-tx0[1])
	// The wires are shaped and carry the transfer: a few forged SYNs may
	// be dropped on the way.
	if staged < uint64(total)*9/10 {
		t.Errorf("node 2 staged %d arrivals, want (nearly) all %d forged SYNs (did they arrive?)", staged, total)
	}
	if promoted != 0 {
		t.Errorf("node 2 let %d forged SYNs take a live 4-tuple", promoted)
	}
	if mirrored != 0 {
		t.Errorf("node 2 wrote %d entries during the flood, want none: no forged SYN was acknowledged", mirrored)
	}
	for k := range tx0 {
		// A quarter of its rate before the flood means the NIC kept
		// carrying its subflow through it.
		rateBefore := float64(tx0[k]-txPre[k]) / pre.Seconds()
		if rateBefore < carrying {
			t.Fatalf("nic%d of node 1 sent %.0f bytes a second before the flood: the transfer is not spread over both NICs, the test proves nothing", k+1, rateBefore)
		}
		if sent, least := tx1[k]-tx0[k], uint64(flood.Seconds()*rateBefore/4); sent < least {
			t.Errorf("nic%d of node 1 sent %d bytes during the %v of the flood, want at least %d (a quarter of its %.1f MB/s just before)", k+1, sent, flood, least, rateBefore/1e6)
		}
	}
	res := <-done
	finishTransfer(t, w, srv, res.Sent, res.Err)

	// A new connection of the client still gets its join, on the other
	// path than its initial subflow.
	const newPort = port + 1
	srv2, err := bed.StartTrafficServer(ctx, bins.Traffic, server, newPort, true)
	if err != nil {
		t.Fatal(err)
	}
	sent, err := bed.Send(ctx, bins.Traffic, client, netip.AddrPortFrom(server.Addr, newPort), true, "-conns", "1", "-duration", "1s", "-seed", strconv.Itoa(newPort))
	finishTransfer(t, w, srv2, sent, err)
	sfs, err := agents[0].Subflows()
	if err != nil {
		t.Fatal(err)
	}
	local := netip.MustParseAddrPort(sent[0].Local)
	var initial datapath.Subflow
	for _, sf := range sfs {
		if sf.Local == local {
			initial = sf
		}
	}
	var joins []datapath.Subflow
	for _, sf := range sfs {
		if initial.Conn != 0 && sf.Conn == initial.Conn && sf.Token != 0 {
			joins = append(joins, sf)
		}
	}
	if initial.Conn == 0 || len(joins) != 1 || joins[0].Path == initial.Path {
		t.Errorf("a new connection after the flood: initial subflow %+v, joins %+v; want one join, on the other path", initial, joins)
	}
}
