package testbed

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// counters reads every NIC of every node: c[node-1][nic-1] = {rx, tx}.
func counters(t *testing.T, b *Bed) [][][2]uint64 {
	t.Helper()
	out := make([][][2]uint64, len(b.Nodes))
	for i, n := range b.Nodes {
		for _, c := range n.NICs {
			rx, tx, err := b.NICCounters(n, c.Index)
			Must(t, err)
			out[i] = append(out[i], [2]uint64{rx, tx})
		}
	}
	return out
}

// delta returns after-before per NIC.
func delta(before, after [][][2]uint64) [][][2]uint64 {
	out := make([][][2]uint64, len(after))
	for i := range after {
		for k := range after[i] {
			out[i] = append(out[i], [2]uint64{after[i][k][0] - before[i][k][0], after[i][k][1] - before[i][k][1]})
		}
	}
	return out
}

func TestPodToPodAcrossNodes(t *testing.T) {
	b := NewForTest(t, Config{Nodes: 2, NICs: 2, PodsPerNode: 2})
	bin := BuildTraffic(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	client, server := b.Pod(1, 1), b.Pod(2, 1)
	t.Run("udp-round-trips", func(t *testing.T) {
		for _, dst := range []*Pod{server, b.Pod(2, 2), b.Pod(1, 2)} {
			echo, err := b.StartEcho(ctx, bin, dst, 7)
			Must(t, err)
			got, err := b.Probe(ctx, bin, client, echo, 20, 5*time.Millisecond)
			Must(t, err)
			if got != 20 {
				t.Errorf("%s -> %s: %d of 20 round trips", client, dst, got)
			}
		}
	})

	t.Run("tcp-transfer-is-intact-and-uses-nic1", func(t *testing.T) {
		srv, err := b.StartTrafficServer(ctx, bin, server, 5201, false)
		Must(t, err)
		before := counters(t, b)
		const size = 20 << 20
		w := b.Watch(t)
		sent, err := b.Send(ctx, bin, client, srv.Addr, false, "-conns", "2", "-bytes", fmt.Sprint(size), "-seed", "42")
		Must(t, err)
		got, err := srv.WaitReports(ctx, 2)
		Must(t, err)
		w.Match(sent, got)
		w.Close()
		d := delta(before, counters(t, b))
		t.Logf("bytes per NIC (rx, tx): node1 %v, node2 %v", d[0], d[1])
		// All 40 MiB leave node 1 on nic1 and arrive at node 2 on nic1; ACKs come back the same way.
		if d[0][0][1] < 2*size || d[1][0][0] < 2*size {
			t.Errorf("data did not cross nic1: node1 nic1 tx %d, node2 nic1 rx %d", d[0][0][1], d[1][0][0])
		}
		if d[0][0][0] == 0 || d[1][0][1] == 0 {
			t.Errorf("no ACKs on nic1 in the reverse direction: node1 nic1 rx %d, node2 nic1 tx %d", d[0][0][0], d[1][0][1])
		}
		for i := range d {
			// Idle NICs see at most a few neighbour packets.
			if d[i][1][0] > 10000 || d[i][1][1] > 10000 {
				t.Errorf("node%d nic2 carried traffic (rx %d, tx %d), want everything on nic1", i+1, d[i][1][0], d[i][1][1])
			}
		}
	})

	t.Run("same-node", func(t *testing.T) {
		srv, err := b.StartTrafficServer(ctx, bin, b.Pod(1, 2), 5202, true)
		Must(t, err)
		w := b.Watch(t)
		sent, err := b.Send(ctx, bin, client, srv.Addr, true, "-bytes", "1000000")
		Must(t, err)
		got, err := srv.WaitReports(ctx, 1)
		Must(t, err)
		w.Match(sent, got)
		w.Close()
	})
}

// singlePath measures one plain TCP connection from client to server for 6 s; goodput over [1 s, 5 s] after the
// first byte.
func singlePath(t *testing.T, ctx context.Context, b *Bed, bin string, client, server *Pod, port int) ServerReport {
	t.Helper()
	srv, err := b.StartTrafficServer(ctx, bin, server, port, false, "-warmup", "1s", "-window", "4s")
	Must(t, err)
	w := b.Watch(t)
	sent, err := b.Send(ctx, bin, client, srv.Addr, false, "-duration", "6s")
	Must(t, err)
	got, err := srv.WaitReports(ctx, 1)
	Must(t, err)
	r := w.Match(sent, got)[sent[0].Local]
	w.Close()
	if r.WindowShort {
		t.Fatalf("connection ended inside the window: %+v", r)
	}
	return r
}

// TestRate holds the bed's tests that measure a rate; `make test` runs
// them alone on the machine (docs/testing.md).
func TestRate(t *testing.T) {
	t.Run("HandRoutedBaselineUsesBothNICs", testHandRoutedBaselineUsesBothNICs)
	t.Run("AShapedSinglePathIsItsLinkRate", testAShapedSinglePathIsItsLinkRate)
}

func testAShapedSinglePathIsItsLinkRate(t *testing.T) {
	const rate = "200mbit"
	b := NewForTest(t, Config{Nodes: 2, NICs: 1, PodsPerNode: 1, LinkRate: rate})
	bin := BuildTraffic(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	want, _ := ParseRate(rate)
	for _, dir := range []struct {
		name           string
		client, server *Pod
	}{{"node1-to-node2", b.Pod(1, 1), b.Pod(2, 1)}, {"node2-to-node1", b.Pod(2, 1), b.Pod(1, 1)}} {
		t.Run(dir.name, func(t *testing.T) {
			r := singlePath(t, ctx, b, bin, dir.client, dir.server, 5201)
			ratio := r.GoodputBps / want
			t.Logf("single-path TCP goodput %s over [%.0f s, %.0f s] after the first byte = %.3f of %s",
				Mbps(r.GoodputBps), r.WindowStart, r.WindowStart+r.WindowSeconds, ratio, rate)
			if ratio < 0.90 || ratio > 1.0 {
				t.Errorf("goodput %.3f of the link rate, want within [0.90, 1.0]", ratio)
			}
		})
	}
}

func TestSetLossDropsPackets(t *testing.T) {
	b := NewForTest(t, Config{Nodes: 2, NICs: 1, PodsPerNode: 1})
	probe, _, _, _ := echoProbe(t, b)
	if got := probe(50); got != 50 {
		t.Fatalf("without loss, %d of 50 round trips", got)
	}
	const n = 1000
	Must(t, b.SetLoss(2, 1, 30))
	// A round trip survives only if both the request and the reply survive: 0.7*0.7 = 49%.
	got := probe(n)
	t.Logf("with 30%% loss each way on node2/nic1, %d of %d round trips (expected about %d)", got, n, n*49/100)
	if got < n*40/100 || got > n*58/100 {
		t.Errorf("%d of %d round trips with 30%% loss per direction, want about 49%%", got, n)
	}
	Must(t, b.SetLoss(2, 1, 100))
	if got := probe(20); got != 0 {
		t.Errorf("with 100%% loss, %d of 20 round trips", got)
	}
	Must(t, b.SetLoss(2, 1, 0))
	if got := probe(50); got != 50 {
		t.Errorf("after removing the loss, %d of 50 round trips", got)
	}
}

func TestLongestStallCountsIntervalsBelowTheThreshold(t *testing.T) {
	// 8 Mbit/s = 50 kB per 50 ms; threshold 10 % = 5 kB.
	r := ServerReport{SampleSeconds: 0.05, Samples: []int64{50e3, 0, 50e3, 4e3, 0, 1e3, 50e3, 0, 0}}
	if got := LongestStall(r, 0.8e6, 0); got != 150*time.Millisecond {
		t.Errorf("longest stall %v, want 150ms (the three intervals below 5 kB; the last, partial one ignored)", got)
	}
	if got := LongestStall(r, 0.8e6, 200*time.Millisecond); got != 100*time.Millisecond {
		t.Errorf("skipping the first 200 ms: %v, want 100ms", got)
	}
	if got := LongestStall(ServerReport{}, 1, 0); got != 0 {
		t.Errorf("no samples: %v", got)
	}
}

func TestStallsListsEachStretchFromItsStart(t *testing.T) {
	r := ServerReport{SampleSeconds: 0.05, Samples: []int64{50e3, 0, 50e3, 4e3, 0, 1e3, 50e3, 0, 0, 50e3, 0}}
	got := Stalls(r, 0.8e6, 0, 100*time.Millisecond)
	want := []Stall{{Start: 150 * time.Millisecond, Length: 150 * time.Millisecond}, {Start: 350 * time.Millisecond, Length: 100 * time.Millisecond}}
	if !slices.Equal(got, want) {
		t.Errorf("stalls of 100 ms or more: %v, want %v (the one-sample dip left out, the last sample ignored)", got, want)
	}
	if got := Stalls(r, 0.8e6, 0, 0); len(got) != 3 {
		t.Errorf("every stall: %v, want 3", got)
	}
}

// echoProbe starts an echo server in pod (2,1) and returns a function that
// sends n datagrams to it from pod (1,1) and counts the replies, with the
// echo's address, the traffic binary and the context (a minute) they use.
func echoProbe(t *testing.T, b *Bed) (probe func(n int) int, echo netip.AddrPort, bin string, ctx context.Context) {
	t.Helper()
	bin = BuildTraffic(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	echo, err := b.StartEcho(ctx, bin, b.Pod(2, 1), 7)
	Must(t, err)
	return func(n int) int {
		got, err := b.Probe(ctx, bin, b.Pod(1, 1), echo, n, time.Millisecond)
		Must(t, err)
		return got
	}, echo, bin, ctx
}
