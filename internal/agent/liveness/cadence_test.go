package liveness

import (
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// podTraffic is a node's datapath record of what its pods send to each
// peer's pods (Traffic).
type podTraffic struct {
	mu   sync.Mutex
	sent map[uint32]time.Time
}

func (p *podTraffic) Since(slot uint32) (time.Duration, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	at, ok := p.sent[slot]
	return time.Since(at), ok
}

func (p *podTraffic) send(slot uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sent == nil {
		p.sent = map[uint32]time.Time{}
	}
	p.sent[slot] = time.Now()
}

const (
	testIdle = 200 * time.Millisecond
	testBusy = 1500 * time.Millisecond
)

// startCadencedProber is startProber with traffic: the peer in slot 1.
func startCadencedProber(t *testing.T, ns string, paths []Path, traffic *podTraffic, changes *atomic.Int64) *Prober {
	t.Helper()
	return startProberWith(t, ns, paths, Config{Traffic: traffic, IdleInterval: testIdle, BusyFor: testBusy}, changes)
}

// startProberWith starts a prober of cfg (its port, interval and
// multiplier the tests') on paths in ns, the peer in slot 1.
func startProberWith(t *testing.T, ns string, paths []Path, cfg Config, changes *atomic.Int64) *Prober {
	t.Helper()
	cfg.Port, cfg.Interval, cfg.Multiplier = testPort, testInterval, testMult
	p, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), func() { changes.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	for i := range paths {
		paths[i].Peers[0].Slot = 1
	}
	testutil.InNetNS(t, ns, func() {
		if err := p.Sync(paths); err != nil {
			t.Errorf("sync: %v", err)
		}
	})
	return p
}

// probesPerSecond is how many probes p sends a second, over window.
func probesPerSecond(p *Prober, window time.Duration) float64 {
	before := p.Counters().ProbesSent
	time.Sleep(window)
	return float64(p.Counters().ProbesSent-before) / window.Seconds()
}

func checkBusy(t *testing.T, p *Prober, want bool) {
	t.Helper()
	for _, s := range p.States() {
		if s.Busy != want {
			t.Fatalf("path %d, peer %s: busy %v, want %v", s.Path, s.Peer.Node, s.Busy, want)
		}
	}
}

// A peer the node's pods send nothing to is probed every idle interval; the
// first packet makes it busy, probed every interval on every path, with no
// change of state on the way; a path that then fails is down within the
// detect time, and once the pods stop sending for BusyFor the peer is idle
// again. A path that fails towards an idle peer is found within the detect
// multiplier of idle intervals, and its peer is probed at the interval for
// BusyFor after: a repair within that time is found as soon as for a busy
// peer.
func TestProbesFollowThePodsTraffic(t *testing.T) {
	a, b := twoNodes(t)
	ta, tb := &podTraffic{}, &podTraffic{}
	changesA := new(atomic.Int64)
	pa := startCadencedProber(t, a, pathsOf("1", "2"), ta, changesA)
	pb := startCadencedProber(t, b, pathsOf("2", "1"), tb, new(atomic.Int64))
	for _, p := range []*Prober{pa, pb} {
		for _, path := range []uint32{1, 2} {
			waitFor(t, "path up at the idle pace", 2*testIdle+time.Second, func() bool { return stateOf(p, path) == Up })
		}
	}
	checkBusy(t, pa, false)
	idle := probesPerSecond(pa, 5*testIdle)
	// Two paths, one probe each per idle interval.
	if want := 2 * float64(time.Second/testIdle); idle < want/2 || idle > want*1.5 {
		t.Fatalf("idle peer: %.0f probes a second, want about %.0f", idle, want)
	}

	// The pods send both ways, as every connection does.
	stop := make(chan struct{})
	sending := make(chan struct{})
	go func() {
		defer close(sending)
		for {
			ta.send(1)
			tb.send(1)
			select {
			case <-stop:
				return
			case <-time.After(testInterval):
			}
		}
	}()
	waitFor(t, "node a: peer busy", time.Second, func() bool { return pa.States()[0].Busy })
	busy := probesPerSecond(pa, 10*testInterval)
	if want := 2 * float64(time.Second/testInterval); busy < want/2 {
		t.Fatalf("busy peer: %.0f probes a second, want about %.0f", busy, want)
	}
	checkBusy(t, pa, true)
	for _, s := range append(pa.States(), pb.States()...) {
		if s.State != Up || s.Downs != 0 {
			t.Fatalf("after the peer became busy: path %d, peer %s %v after %d downs, want Up", s.Path, s.Peer.Node, s.State, s.Downs)
		}
	}

	// Path 2 drops everything both ways, its carrier up.
	testutil.Run(t, "ip", "-n", a, "neigh", "replace", "10.201.2.2", "lladdr", "02:00:00:00:00:99", "dev", "nic2", "nud", "permanent")
	testutil.Run(t, "ip", "-n", b, "neigh", "replace", "10.201.2.1", "lladdr", "02:00:00:00:00:98", "dev", "nic2", "nud", "permanent")
	detect := time.Duration(testMult) * testInterval
	took := waitFor(t, "node a: path2 down, busy", detect+testIdle, func() bool { return pa.Silent(2) })
	t.Logf("busy peer: path2 down after %v (detect time %v)", took, detect)
	testutil.Run(t, "ip", "-n", a, "neigh", "del", "10.201.2.2", "dev", "nic2")
	testutil.Run(t, "ip", "-n", b, "neigh", "del", "10.201.2.1", "dev", "nic2")
	waitFor(t, "node a: path2 up", 2*time.Second, func() bool { return !pa.Silent(2) })

	close(stop)
	<-sending
	waitFor(t, "node a: peer idle", testBusy+time.Second, func() bool { return !pa.States()[0].Busy })
	time.Sleep(testIdle) // the last busy probes' echoes
	idle = probesPerSecond(pa, 5*testIdle)
	if want := 2 * float64(time.Second/testIdle); idle > want*1.5 {
		t.Fatalf("peer idle again: %.0f probes a second, want about %.0f", idle, want)
	}

	// Path 1 fails towards the idle peer: down within the multiplier of
	// idle intervals.
	testutil.Run(t, "ip", "-n", a, "neigh", "replace", "10.201.1.2", "lladdr", "02:00:00:00:00:99", "dev", "nic1", "nud", "permanent")
	testutil.Run(t, "ip", "-n", b, "neigh", "replace", "10.201.1.1", "lladdr", "02:00:00:00:00:98", "dev", "nic1", "nud", "permanent")
	idleDetect := time.Duration(testMult) * testIdle
	took = waitFor(t, "node a: path1 down, idle", idleDetect+2*testIdle, func() bool { return pa.Silent(1) })
	t.Logf("idle peer: path1 down after %v (detect time %v)", took, idleDetect)
	if pa.Silent(2) {
		t.Fatal("path2 down with path1")
	}
	// Recovering: path1, Down, every interval; path2, Up, still at the
	// idle pace (both every interval would send twice as many).
	if rate, one := probesPerSecond(pa, 10*testInterval), float64(time.Second/testInterval); rate < one/2 || rate > one*1.5 {
		t.Fatalf("recovering peer: %.0f probes a second, want about %.0f (the Down path alone every interval)", rate, one)
	}

	testutil.Run(t, "ip", "-n", a, "neigh", "del", "10.201.1.2", "dev", "nic1")
	testutil.Run(t, "ip", "-n", b, "neigh", "del", "10.201.1.1", "dev", "nic1")
	back := waitFor(t, "node a: path1 up, idle", testBusy, func() bool { return !pa.Silent(1) })
	t.Logf("idle peer: path1 up %v after the repair", back)
}

// sinceSlot says the pods sent to the peer in slot n n milliseconds ago,
// and never to those in slots from 1000.
type sinceSlot struct{}

func (sinceSlot) Since(slot uint32) (time.Duration, bool) {
	return time.Duration(slot) * time.Millisecond, slot < 1000
}

// What is probed every interval is bounded by MaxBusyPaths: the peers the
// pods sent to last have it first, then those whose traffic cannot be told,
// then the Down paths of the peers that went Down last; the others are
// idle, and said to be over the limit.
func TestBusyPathsAreBoundedAndGoToTrafficFirst(t *testing.T) {
	p, err := New(Config{Port: testPort, Interval: testInterval, Multiplier: testMult, Traffic: sinceSlot{}},
		slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	// add makes a peer of 4 paths, down of them Down, the last down ago.
	add := func(name string, slot uint32, down int, ago time.Duration) *peerNode {
		n := &peerNode{name: name, slot: slot}
		if down > 0 {
			n.downAt = now.Add(-ago)
		}
		for k := range 4 {
			tg := &target{state: Up}
			if k < down {
				tg.state = Down
			}
			n.targets = append(n.targets, nodeTarget{t: tg})
		}
		p.nodes[name] = n
		p.order = append(p.order, n)
		return n
	}
	check := func(what string, n *peerNode, busy, recovering, over bool) {
		t.Helper()
		if n.busy != busy || n.recovering != recovering || n.over != over {
			t.Errorf("%s: busy %v, recovering %v, over %v; want %v, %v, %v", what, n.busy, n.recovering, n.over, busy, recovering, over)
		}
	}

	// 110 peers sent to: the 100 sent to last take the whole budget.
	var sent []*peerNode
	for slot := uint32(1); slot <= 110; slot++ {
		sent = append(sent, add(fmt.Sprint("sent", slot), slot, 0, 0))
	}
	unknown := add("no-cidrs", 0, 0, 0)
	fallen := add("fallen", 1000, 1, time.Second)
	p.judgeTraffic(now)
	for i, n := range sent {
		check(n.name, n, i < 100, false, i >= 100)
	}
	check("a peer without pod CIDRs, the budget spent", unknown, false, false, true)
	check("a peer Down on a path, the budget spent", fallen, false, false, true)

	// 50 sent to, one without pod CIDRs, and 200 Down on one path each:
	// 196 of those fit, those that went Down last.
	p.nodes, p.order = map[string]*peerNode{}, nil
	sent = sent[:0]
	for slot := uint32(1); slot <= 50; slot++ {
		sent = append(sent, add(fmt.Sprint("sent", slot), slot, 0, 0))
	}
	unknown = add("no-cidrs", 0, 0, 0)
	var down []*peerNode
	for i := range 200 {
		down = append(down, add(fmt.Sprint("down", i), uint32(1000+i), 1, time.Duration(i)*time.Millisecond))
	}
	stale := add("down-long-ago", 2000, 1, 2*BusyFor)
	p.judgeTraffic(now)
	for _, n := range sent {
		check(n.name, n, true, false, false)
	}
	check("a peer without pod CIDRs", unknown, true, false, false)
	for i, n := range down {
		check(n.name, n, false, i < 196, i >= 196)
	}
	check("a peer Down since before BusyFor", stale, false, false, false)
}

// A peer Up at the idle pace that becomes busy gets one detect time from
// then (its last echo may be an idle interval old), but only once per
// graceEvery: a pod that makes it busy in bursts keeps no dead path alive.
func TestTheBusyGraceIsGivenOncePerBusyFor(t *testing.T) {
	now := time.Unix(1000, 0)
	tg := newTarget("node2", 7, testMult)
	tg.state, tg.every, tg.lastEcho = Up, 10, now.Add(-time.Second)
	tg.setCadence(1, now, testBusy)
	if !tg.lastEcho.Equal(now) {
		t.Fatalf("idle to busy: last echo %v, want the grace from %v", tg.lastEcho, now)
	}
	tg.setCadence(10, now.Add(time.Second), testBusy)
	tg.setCadence(1, now.Add(time.Second), testBusy)
	if !tg.lastEcho.Equal(now) {
		t.Fatalf("busy again within graceEvery: last echo %v, want no new grace", tg.lastEcho)
	}
	later := now.Add(testBusy + time.Second)
	tg.setCadence(10, later, testBusy)
	tg.setCadence(1, later, testBusy)
	if !tg.lastEcho.Equal(later) {
		t.Fatalf("busy again after graceEvery: last echo %v, want the grace from %v", tg.lastEcho, later)
	}
}

// A peer new to the prober is probed at the next tick, and again at gaps
// that double until it echoes, not first at its idle phase: two idle
// nodes whose agents start a tenth of a second apart have each other Up
// within a tenth of the idle interval (20 s here, half of which a phase
// waits on average), and once the peer echoes it is probed at the idle
// pace. A node that leaves the peers and comes back within an idle
// interval waits for its phase.
func TestANewPeerIsProbedAtOnceNotAtItsIdlePhase(t *testing.T) {
	a, b := twoNodes(t)
	const idle = 20 * time.Second
	start := func(ns string, paths []Path) *Prober {
		return startProberWith(t, ns, paths, Config{Traffic: &podTraffic{}, IdleInterval: idle}, new(atomic.Int64))
	}
	pa := start(a, pathsOf("1", "2"))
	time.Sleep(100 * time.Millisecond)
	pb := start(b, pathsOf("2", "1"))
	for _, p := range []*Prober{pa, pb} {
		for _, path := range []uint32{1, 2} {
			took := waitFor(t, "the new peer Up", 2*time.Second, func() bool { return stateOf(p, path) == Up })
			t.Logf("path %d Up %v after the second prober started", path, took)
		}
	}
	checkBusy(t, pa, false)
	if rate := probesPerSecond(pa, time.Second); rate > 2 {
		t.Fatalf("the peer Up and idle: %.0f probes a second, want the idle pace (2 paths every %v)", rate, idle)
	}

	gone := pathsOf("1", "2")
	for i := range gone {
		gone[i].Peers = nil
	}
	testutil.InNetNS(t, a, func() {
		if err := pa.Sync(gone); err != nil {
			t.Fatal(err)
		}
		back := pathsOf("1", "2")
		for i := range back {
			back[i].Peers[0].Slot = 1
		}
		if err := pa.Sync(back); err != nil {
			t.Fatal(err)
		}
	})
	pa.mu.Lock()
	defer pa.mu.Unlock()
	for _, pp := range pa.paths {
		for addr, tg := range pp.targets {
			if tg.earlyAt != 0 {
				t.Errorf("path %s, peer %s back within an idle interval: an early probe at tick %d, want its phase", pp.spec.Name, addr, tg.earlyAt)
			}
		}
	}
}

// The probes a tick sends off their cadence to peers that never echoed
// are at most MaxEarlyProbes, and go round: every new target has its first
// probe before any has its next, so 150 new idle peers all have theirs
// within three ticks.
func TestEarlyProbesAreBoundedPerTickAndGoRound(t *testing.T) {
	const peers = 150
	p, err := New(Config{Port: testPort, Interval: time.Hour, Multiplier: testMult, Traffic: &podTraffic{}, IdleInterval: 1000 * time.Hour},
		slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// No tick comes in an hour: the test's calls are the ticks.
	p.mu.Lock()
	pp := &pathProbe{spec: Path{Name: "path1"}}
	var targets []*target
	for i := range peers {
		tg := newTarget(fmt.Sprint("peer", i), uint64(i), testMult)
		tg.earlyAt, tg.earlyGap = 1, 1
		// Idle (a slot the pods never sent to), at phase 0: its idle
		// probe is a thousand ticks away.
		n := &peerNode{name: tg.node, slot: uint32(i + 1), targets: []nodeTarget{{pp: pp, addr: netip.AddrFrom4([4]byte{10, 9, byte(i >> 8), byte(i)}), t: tg}}}
		tg.peer = n
		p.nodes[n.name] = n
		p.order = append(p.order, n)
		targets = append(targets, tg)
	}
	p.mu.Unlock()
	for tick := 1; tick <= 3; tick++ {
		sends, _ := p.probeDue(time.Now(), false)
		if len(sends) > MaxEarlyProbes {
			t.Fatalf("tick %d sent %d probes, want at most %d", tick, len(sends), MaxEarlyProbes)
		}
	}
	for i, tg := range targets {
		if tg.seq == 0 {
			t.Fatalf("peer %d never probed in three ticks", i)
		}
	}
}
