package testbed

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// waitOperState polls nic<k> of node 1 until want(state, carrier) holds, for at most two seconds (the kernel's link
// watch may take a second to report a carrier change), and returns what it saw last.
func waitOperState(t *testing.T, b *Bed, k int, want func(state string, carrier bool) bool) (string, bool) {
	t.Helper()
	var state string
	var carrier bool
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var err error
		state, carrier, err = b.OperState(1, k)
		Must(t, err)
		if want(state, carrier) || time.Now().After(deadline) {
			return state, carrier
		}
	}
}

// adminUp reports whether nic<k> of node i is administratively up (IFF_UP).
func adminUp(t *testing.T, b *Bed, i, k int) bool {
	t.Helper()
	h, err := nsHandle(b.Node(i).NetNS)
	Must(t, err)
	defer h.Close()
	l, err := h.LinkByName(b.Node(i).NIC(k).Name)
	Must(t, err)
	return l.Attrs().RawFlags&unix.IFF_UP != 0
}

// SetCarrier takes a node NIC's carrier away while the NIC stays administratively up, traffic over it stops, and
// it comes back; the other NIC is untouched; Down still removes everything with a carrier away.
func TestSetCarrierTakesTheNICsCarrierAwayAndBack(t *testing.T) {
	b := NewForTest(t, Config{Nodes: 2, NICs: 2, PodsPerNode: 1})
	probe, echo, bin, ctx := echoProbe(t, b)
	isUp := func(s string, c bool) bool { return s == "up" && c }
	isDown := func(s string, c bool) bool { return (s == "down" || s == "lower-layer-down") && !c }

	if s, c := waitOperState(t, b, 1, isUp); !isUp(s, c) {
		t.Fatalf("node 1 nic1 before: operstate %s, carrier %v", s, c)
	}
	if got := probe(20); got != 20 {
		t.Fatalf("before: %d of 20 round trips", got)
	}

	Must(t, b.SetCarrier(1, 1, false))
	start := time.Now()
	s, c := waitOperState(t, b, 1, isDown)
	t.Logf("carrier away: node 1 nic1 operstate %s, carrier %v after %v", s, c, time.Since(start).Round(time.Millisecond))
	if !isDown(s, c) {
		t.Errorf("node 1 nic1 after SetCarrier(false): operstate %s, carrier %v, want down or lower-layer-down without carrier", s, c)
	}
	if !adminUp(t, b, 1, 1) {
		t.Errorf("node 1 nic1 is administratively down: the carrier alone should have gone")
	}
	if s, c := waitOperState(t, b, 2, isUp); !isUp(s, c) {
		t.Errorf("node 1 nic2 (untouched): operstate %s, carrier %v", s, c)
	}
	// Node 1's default route leaves over nic1.
	if got := probe(20); got != 0 {
		t.Errorf("without carrier: %d of 20 round trips over nic1", got)
	}

	Must(t, b.SetCarrier(1, 1, true))
	start = time.Now()
	s, c = waitOperState(t, b, 1, isUp)
	t.Logf("carrier back: node 1 nic1 operstate %s, carrier %v after %v", s, c, time.Since(start).Round(time.Millisecond))
	if !isUp(s, c) {
		t.Fatalf("node 1 nic1 after SetCarrier(true): operstate %s, carrier %v", s, c)
	}
	// The wire's own end is up again too (its bridge port forwards).
	wire := b.Node(1).NIC(1)
	h, err := nsHandle(wire.WireNS)
	Must(t, err)
	defer h.Close()
	for {
		l, err := h.LinkByName(wire.WireNodeSide)
		Must(t, err)
		if l.Attrs().OperState.String() == "up" {
			t.Logf("carrier back: the wire's node-side end operstate up after %v", time.Since(start).Round(time.Millisecond))
			break
		}
		if time.Since(start) > 3*time.Second {
			t.Fatalf("carrier back: the wire's node-side end is still %s after 3 s", l.Attrs().OperState)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Round trips resume: one datagram at a time, each waiting 20 ms for its reply. Up to a second late: the node
	// resolves its gateway again only at its next ARP retry (see SetCarrier).
	for tries := 0; ; tries++ {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("carrier back: round trips did not resume within 5 s")
		}
		out, err := b.CommandContext(ctx, b.Pod(1, 1).NetNS, bin, "probe", "-to", echo.String(), "-count", "1", "-wait", "20ms").Output()
		Must(t, err)
		if strings.Contains(string(out), `"received":1`) || strings.Contains(string(out), `"Received":1`) {
			t.Logf("carrier back: round trips resumed after %v (%d lost before)", time.Since(start).Round(time.Millisecond), tries)
			break
		}
	}

	// Down removes a bed whose carrier is away.
	Must(t, b.SetCarrier(1, 1, false))
	Must(t, b.Down())
	if left := leftovers(t, b.Name); len(left) > 0 {
		t.Errorf("left behind by Down with a carrier away: %v", left)
	}
}

// SetOneWayLoss drops one direction only: with Out on node 2's nic1, the requests still reach node 2 and the
// replies are lost; with In, the requests are lost before node 2.
func TestSetOneWayLossDropsOneDirection(t *testing.T) {
	b := NewForTest(t, Config{Nodes: 2, NICs: 1, PodsPerNode: 1})
	bin := BuildTraffic(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	echo, err := b.StartEcho(ctx, bin, b.Pod(2, 1), 7)
	Must(t, err)
	// rx counts what node 2's nic1 received during n round trips.
	probe := func(n int) (got int, rx uint64) {
		rx0, _, err := b.NICCounters(b.Node(2), 1)
		Must(t, err)
		got, err = b.Probe(ctx, bin, b.Pod(1, 1), echo, n, time.Millisecond)
		Must(t, err)
		rx1, _, err := b.NICCounters(b.Node(2), 1)
		Must(t, err)
		return got, rx1 - rx0
	}
	if got, _ := probe(20); got != 20 {
		t.Fatalf("without loss, %d of 20 round trips", got)
	}
	Must(t, b.SetOneWayLoss(2, 1, 100, Out))
	got, rx := probe(20)
	t.Logf("100%% loss out of node 2 nic1: %d of 20 round trips, node 2 nic1 received %d bytes", got, rx)
	if got != 0 || rx < 20*28 {
		t.Errorf("100%% loss out of node 2 nic1: %d of 20 round trips (want 0), %d bytes received (want the 20 requests)", got, rx)
	}
	if p, d := b.LossDirection(2, 1); p != 100 || d != Out {
		t.Errorf("LossDirection = %v, %q", p, d)
	}
	Must(t, b.SetOneWayLoss(2, 1, 100, In))
	got, rx = probe(20)
	t.Logf("100%% loss into node 2 nic1: %d of 20 round trips, node 2 nic1 received %d bytes", got, rx)
	if got != 0 || rx != 0 {
		t.Errorf("100%% loss into node 2 nic1: %d of 20 round trips (want 0), %d bytes received (want 0)", got, rx)
	}
	Must(t, b.SetLoss(2, 1, 0))
	if got, _ := probe(20); got != 20 {
		t.Errorf("after removing the loss, %d of 20 round trips", got)
	}
	if err := b.SetOneWayLoss(2, 1, 10, ""); err == nil {
		t.Errorf("SetOneWayLoss without a direction succeeded")
	}
}

// A removed NIC is gone with its wire end, and round trips over it stop; a
// restored one is a new link (another ifindex) with its address, its
// default route and its rate, and round trips resume.
func TestRemoveNICAndRestoreIt(t *testing.T) {
	b := NewForTest(t, Config{Nodes: 2, NICs: 2, PodsPerNode: 1, LinkRate: "200mbit"})
	probe, _, _, _ := echoProbe(t, b)
	node, err := nsHandle(b.Node(1).NetNS)
	Must(t, err)
	defer node.Close()
	before, err := node.LinkByName("nic1")
	Must(t, err)
	if got := probe(20); got != 20 {
		t.Fatalf("before: %d of 20 round trips", got)
	}

	Must(t, b.RemoveNIC(1, 1))
	if _, err := node.LinkByName("nic1"); err == nil {
		t.Fatal("nic1 is still in node 1 after RemoveNIC")
	}
	wire, err := nsHandle(b.Node(1).NIC(1).WireNS)
	Must(t, err)
	defer wire.Close()
	if _, err := wire.LinkByName(b.Node(1).NIC(1).WireNodeSide); err == nil {
		t.Error("the wire's node-side end outlived the NIC")
	}
	// Node 1's default route left over nic1, and went with it.
	if got := probe(20); got != 0 {
		t.Errorf("without nic1: %d of 20 round trips", got)
	}

	Must(t, b.RestoreNIC(1, 1))
	after, err := node.LinkByName("nic1")
	Must(t, err)
	if after.Attrs().Index == before.Attrs().Index {
		t.Errorf("restored nic1 has the old ifindex %d, want a new link", after.Attrs().Index)
	}
	out, err := exec.Command("tc", "-n", b.Node(1).NIC(1).WireNS, "qdisc", "show", "dev", b.Node(1).NIC(1).WireNodeSide).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "tbf") || !strings.Contains(string(out), "clsact") {
		t.Errorf("the restored wire end's qdiscs: %v: %s, want tbf and clsact", err, out)
	}
	start := time.Now()
	for {
		if probe(1) == 1 {
			t.Logf("round trips resumed %v after RestoreNIC", time.Since(start).Round(time.Millisecond))
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatal("round trips over the restored nic1 did not resume within 5 s")
		}
	}
}

// SetLinkRate changes one NIC's link, both wire ends (each way), and leaves
// the others at the bed's rate.
func TestSetLinkRateChangesOneLinkEachWay(t *testing.T) {
	b := NewForTest(t, Config{Nodes: 1, NICs: 2, PodsPerNode: 1, LinkRate: "200mbit"})
	Must(t, b.SetLinkRate(1, 2, "50mbit"))
	for k, want := range map[int]string{1: "rate 200Mbit", 2: "rate 50Mbit"} {
		c := b.Node(1).NIC(k)
		for _, dev := range []string{c.WireNodeSide, c.WireFabricSide} {
			out, err := exec.Command("tc", "-n", c.WireNS, "qdisc", "show", "dev", dev, "root").CombinedOutput()
			Must(t, err)
			if !strings.Contains(string(out), want) {
				t.Errorf("NIC %d, wire end %s: %q, want %s", k, dev, out, want)
			}
		}
	}
	if err := (&Bed{}).SetLinkRate(1, 1, "50mbit"); err == nil {
		t.Error("SetLinkRate on a bed with unshaped links succeeded")
	}
}
