package liveness

import (
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

const (
	testPort     = 7471
	testInterval = 20 * time.Millisecond
	testMult     = 5
)

// twoNodes joins two namespaces by two veth pairs, nic1 and nic2, with
// 10.201.k.1 on a's side and 10.201.k.2 on b's.
func twoNodes(t *testing.T) (a, b string) {
	a, b = testutil.NetNS(t, "lva"), testutil.NetNS(t, "lvb")
	for _, k := range []string{"1", "2"} {
		testutil.Run(t, "ip", "-n", a, "link", "add", "nic"+k, "type", "veth", "peer", "name", "nic"+k, "netns", b)
		testutil.Run(t, "ip", "-n", a, "addr", "add", "10.201."+k+".1/24", "dev", "nic"+k)
		testutil.Run(t, "ip", "-n", b, "addr", "add", "10.201."+k+".2/24", "dev", "nic"+k)
		testutil.Run(t, "ip", "-n", a, "link", "set", "nic"+k, "up")
		testutil.Run(t, "ip", "-n", b, "link", "set", "nic"+k, "up")
	}
	return a, b
}

// pathsOf are the two paths of the node whose addresses end in self, each
// probing the other node's address on it.
func pathsOf(self, peer string) []Path {
	var out []Path
	for k := uint32(1); k <= 2; k++ {
		local := netip.MustParseAddr("10.201." + string(rune('0'+k)) + "." + self)
		remote := netip.MustParseAddr("10.201." + string(rune('0'+k)) + "." + peer)
		out = append(out, Path{Index: k, Name: "path" + string(rune('0'+k)), Interface: "nic" + string(rune('0'+k)),
			Mark: k << 20, Local: local, Peers: []Peer{{Node: "node" + peer, Addr: remote}}})
	}
	return out
}

func startProber(t *testing.T, ns string, paths []Path, changes *atomic.Int64) *Prober {
	t.Helper()
	p, err := New(Config{Port: testPort, Interval: testInterval, Multiplier: testMult},
		slog.New(slog.NewTextHandler(io.Discard, nil)), func() { changes.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	testutil.InNetNS(t, ns, func() {
		if err := p.Sync(paths); err != nil {
			t.Errorf("sync: %v", err)
		}
	})
	return p
}

func stateOf(p *Prober, path uint32) State {
	for _, s := range p.States() {
		if s.Path == path {
			return s.State
		}
	}
	return -1
}

// checkUpAfterOneDownOn asserts that each prober has its peer Up on both
// paths, after one down on path and none on the other.
func checkUpAfterOneDownOn(t *testing.T, path uint32, probers ...*Prober) {
	t.Helper()
	for _, p := range probers {
		for _, s := range p.States() {
			want := uint64(0)
			if s.Path == path {
				want = 1
			}
			if s.State != Up || s.Downs != want {
				t.Errorf("path %d, peer %s: %v after %d downs, want Up after %d", s.Path, s.Peer.Node, s.State, s.Downs, want)
			}
		}
	}
}

// waitBothPathsUp waits until each prober has its peer Up on both paths.
func waitBothPathsUp(t *testing.T, probers ...*Prober) {
	t.Helper()
	for _, p := range probers {
		for _, path := range []uint32{1, 2} {
			waitFor(t, "path up", 2*time.Second, func() bool { return stateOf(p, path) == Up })
		}
	}
}

func waitFor(t *testing.T, what string, within time.Duration, ok func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !ok() {
		if time.Since(start) > within {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

// probingPair is twoNodes with a prober on each, a on 10.201.k.1 and b on
// 10.201.k.2, counting their changes, each with its peer Up on both paths.
func probingPair(t *testing.T) (a, b string, pa, pb *Prober, changesA *atomic.Int64) {
	t.Helper()
	a, b = twoNodes(t)
	changesA = new(atomic.Int64)
	pa = startProber(t, a, pathsOf("1", "2"), changesA)
	pb = startProber(t, b, pathsOf("2", "1"), new(atomic.Int64))
	waitBothPathsUp(t, pa, pb)
	return a, b, pa, pb, changesA
}

// A path that drops everything one way while its carrier stays up goes
// Down on both nodes within the detect time, the other path stays Up, and
// the path comes back once it carries again; neither a forged echo nor a
// probe from an address that is no peer's changes anything.
func TestAPathThatStopsCarryingGoesDownOnBothNodesAndComesBack(t *testing.T) {
	a, b, pa, pb, changesA := probingPair(t)
	if pa.Silent(1) || pb.Silent(1) {
		t.Fatal("a path whose peer echoes is silent")
	}

	// Only what a sends on nic1 is lost, its carrier up: a addresses
	// b's frames to a MAC address no one has, so b's veth drops them.
	// b's probes still reach a (and are answered into the void), a's
	// never reach b.
	testutil.Run(t, "ip", "-n", a, "neigh", "replace", "10.201.1.2", "lladdr", "02:00:00:00:00:99", "dev", "nic1", "nud", "permanent")
	before := changesA.Load()
	detect := time.Duration(testMult) * testInterval
	took := waitFor(t, "node a: path1 down", detect+time.Second, func() bool { return pa.Silent(1) })
	t.Logf("node a saw path1 down after %v (detect time %v)", took, detect)
	waitFor(t, "node b: path1 down", detect+time.Second, func() bool { return pb.Silent(1) })
	if changesA.Load() == before {
		t.Error("node a's path went down without a change reported")
	}
	if stateOf(pa, 2) != Up || stateOf(pb, 2) != Up || pa.Silent(2) || pb.Silent(2) {
		t.Fatalf("path2 went down with path1: a %v, b %v", stateOf(pa, 2), stateOf(pb, 2))
	}

	// From b's address on path1 (what b sends still reaches a), but not
	// from the probers' port: echoes, even with a's nonce and a sequence
	// number a sent, probes, and garbage. None is answered, none brings
	// path1 back on a.
	ignored := pa.Counters().Ignored
	var answered bool
	testutil.InNetNS(t, b, func() {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP("10.201.1.2"), Port: testPort + 1})
		if err != nil {
			t.Errorf("forger: %v", err)
			return
		}
		defer c.Close()
		to := &net.UDPAddr{IP: net.ParseIP("10.201.1.1"), Port: testPort}
		for seq := uint64(1); seq <= 20; seq++ {
			_, _ = c.WriteToUDP(message{kind: kindEcho, nonce: nonceOf(pa, 1, "10.201.1.2"), seq: seq}.marshal(), to)
			_, _ = c.WriteToUDP(message{kind: kindProbe, nonce: 1, seq: seq}.marshal(), to)
			_, _ = c.WriteToUDP([]byte("MPTL not a liveness message"), to)
			time.Sleep(testInterval / 2)
		}
		_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		_, _, err = c.ReadFromUDP(make([]byte, 64))
		answered = err == nil
	})
	if got := pa.Counters().Ignored - ignored; got < 60 {
		t.Errorf("node a ignored %d of the 60 forged datagrams", got)
	}
	if answered {
		t.Error("node a answered a probe from another port than the probers'")
	}
	if !pa.Silent(1) {
		t.Fatal("forged datagrams brought path1 back on node a")
	}

	// A peer that never answers (a node whose agent does not probe)
	// counts as neither: it does not bring the path back.
	withStranger := pathsOf("1", "2")
	withStranger[0].Peers = append(withStranger[0].Peers, Peer{Node: "node9", Addr: netip.MustParseAddr("10.201.1.9")})
	testutil.InNetNS(t, a, func() {
		if err := pa.Sync(withStranger); err != nil {
			t.Errorf("sync: %v", err)
		}
	})
	time.Sleep(detect)
	if !pa.Silent(1) {
		t.Fatal("a peer that never answered brought path1 back on node a")
	}
	testutil.InNetNS(t, a, func() {
		if err := pa.Sync(pathsOf("1", "2")); err != nil {
			t.Errorf("sync: %v", err)
		}
	})

	testutil.Run(t, "ip", "-n", a, "neigh", "del", "10.201.1.2", "dev", "nic1")
	back := waitFor(t, "node a: path1 up", 2*time.Second, func() bool { return !pa.Silent(1) })
	waitFor(t, "node b: path1 up", 2*time.Second, func() bool { return !pb.Silent(1) })
	t.Logf("node a saw path1 up %v after the repair (at least %d intervals of echoes)", back, UpAfter)
	checkUpAfterOneDownOn(t, 1, pa, pb)
}

// A peer silent on every path at once (its agent stopped, as in an upgrade,
// or starved of CPU) is Unknown on each, not Down: no path is taken down and
// no failure counted, and it is Up again when it answers. A path that had
// failed before stays Down when the peer then goes silent on the others.
// Every silence is judged over the peer's paths: one path's is its own only
// while another answers; while another may still answer, it waits.
func TestAPeerSilentOnEveryPathAtOnceIsUnknownNotDown(t *testing.T) {
	a, b, pa, pb, _ := probingPair(t)

	detect := time.Duration(testMult) * testInterval
	pb.Close()
	for _, path := range []uint32{1, 2} {
		waitFor(t, "node a: the silent peer Unknown", detect+time.Second, func() bool { return stateOf(pa, path) == Unknown })
	}
	time.Sleep(detect)
	for _, s := range pa.States() {
		if s.State != Unknown || s.Downs != 0 || pa.Silent(s.Path) {
			t.Errorf("path %d: peer %v after %d downs (path silent %v), want Unknown after none, the path not silent",
				s.Path, s.State, s.Downs, pa.Silent(s.Path))
		}
	}

	pb = startProber(t, b, pathsOf("2", "1"), new(atomic.Int64))
	waitBothPathsUp(t, pa, pb)

	// Path 1 fails alone: Down, found by path 2's echoes. Then the peer
	// stops: path 2 is Unknown, path 1 stays Down.
	testutil.Run(t, "ip", "-n", a, "neigh", "replace", "10.201.1.2", "lladdr", "02:00:00:00:00:99", "dev", "nic1", "nud", "permanent")
	waitFor(t, "node a: path1 down", detect+time.Second, func() bool { return pa.Silent(1) })
	pb.Close()
	waitFor(t, "node a: the silent peer Unknown on path2", detect+time.Second, func() bool { return stateOf(pa, 2) == Unknown })
	if !pa.Silent(1) || pa.Silent(2) || stateOf(pa, 1) != Down {
		t.Errorf("after the peer stopped: path1 %v (silent %v), path2 %v (silent %v); want path1 Down and silent, path2 not silent",
			stateOf(pa, 1), pa.Silent(1), stateOf(pa, 2), pa.Silent(2))
	}

	// The rule alone: a path silent for the detect time goes Down when
	// the peer answers on another, waits while another is Up and may
	// still answer, and is Unknown when none may.
	now := time.Now()
	for _, c := range []struct {
		name string
		peer peerView
		want State
	}{
		{"the peer echoed on this path only", peerView{echoed: 1}, Down},
		{"the peer answers on another path", peerView{echoed: 2, alive: true}, Down},
		{"another path may still answer", peerView{echoed: 2, waiting: true}, Up},
		{"no path answers", peerView{echoed: 2}, Unknown},
	} {
		silent := target{state: Up, lastEcho: now.Add(-detect - testInterval)}
		silent.expire(now, testInterval, testMult, 100, c.peer)
		if silent.state != c.want {
			t.Errorf("%s: %v, want %v", c.name, silent.state, c.want)
		}
	}
}

// The version step (wire.go): a probe is answered in its own version, a
// version 1 echo saying the node reads version 2 and a version 2 echo
// giving the node's nonce for the peer as its key; the node probes a peer
// in version 1 until an echo says it reads version 2, then in version 2
// with the key the peer's echo gave.
func TestProbesSpeakVersion1UntilThePeerSaysMore(t *testing.T) {
	a, b := twoNodes(t)
	var changes atomic.Int64
	pa := startProber(t, a, pathsOf("1", "2"), &changes)
	nonce := pa.Nonce(netip.MustParseAddr("10.201.1.1"), pathsOf("1", "2")[0].Peers[0])
	testutil.InNetNS(t, b, func() {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP("10.201.1.2"), Port: testPort})
		if err != nil {
			t.Errorf("peer: %v", err)
			return
		}
		defer c.Close()
		to := &net.UDPAddr{IP: net.ParseIP("10.201.1.1"), Port: testPort}
		// next reads until a message of kind comes, for a second.
		next := func(kind byte) (message, bool) {
			buf := make([]byte, 64)
			for end := time.Now().Add(time.Second); time.Now().Before(end); {
				_ = c.SetReadDeadline(end)
				n, _, err := c.ReadFromUDP(buf)
				if err != nil {
					break
				}
				if m, err := parseMessage(buf[:n]); err == nil && m.kind == kind {
					return m, true
				}
			}
			t.Errorf("no message of kind %d from a within a second", kind)
			return message{}, false
		}
		if m, ok := next(kindProbe); ok && m.v2 {
			t.Errorf("a's first probe is %+v, want version 1 before a heard b", m)
		}
		_, _ = c.WriteToUDP(message{kind: kindProbe, nonce: 5, seq: 1}.marshal(), to)
		if m, ok := next(kindEcho); ok && (m.v2 || !m.speaksV2 || m.nonce != 5) {
			t.Errorf("a's echo of a version 1 probe is %+v, want version 1 saying it reads version 2", m)
		}
		_, _ = c.WriteToUDP(message{kind: kindProbe, nonce: 5, seq: 2, v2: true}.marshal(), to)
		if m, ok := next(kindEcho); ok && (!m.v2 || m.key != nonce || m.nonce != 5) {
			t.Errorf("a's echo of a version 2 probe is %+v, want version 2 with a's nonce for b (%#x) as its key", m, nonce)
		}
		// b answers a's next probe in version 2, giving its key.
		if m, ok := next(kindProbe); ok {
			_, _ = c.WriteToUDP(message{kind: kindEcho, nonce: m.nonce, seq: m.seq, v2: true, key: 0xb0b}.marshal(), to)
		}
		for range 3 {
			if m, ok := next(kindProbe); ok && m.v2 && m.key == 0xb0b {
				return
			}
		}
		t.Error("a's probes after b's version 2 echo are not version 2 with b's key")
	})
}

// Only the path's peers get answers: a probe from any other address, on
// the path's own subnet, is dropped unanswered.
func TestProbesFromAnAddressThatIsNoPeersGetNoAnswer(t *testing.T) {
	a, b := twoNodes(t)
	var changes atomic.Int64
	pa := startProber(t, a, pathsOf("1", "2"), &changes)
	testutil.Run(t, "ip", "-n", b, "addr", "add", "10.201.1.9/24", "dev", "nic1")
	var answered bool
	testutil.InNetNS(t, b, func() {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP("10.201.1.9"), Port: testPort})
		if err != nil {
			t.Errorf("stranger: %v", err)
			return
		}
		defer c.Close()
		_, _ = c.WriteToUDP(message{kind: kindProbe, nonce: 1, seq: 1}.marshal(), &net.UDPAddr{IP: net.ParseIP("10.201.1.1"), Port: testPort})
		buf := make([]byte, 64)
		for {
			_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			n, _, err := c.ReadFromUDP(buf)
			if err != nil {
				return
			}
			// a's own probes go to its peer, 10.201.1.2, not here.
			if m, err := parseMessage(buf[:n]); err == nil && m.kind == kindEcho {
				answered = true
			}
		}
	})
	if answered {
		t.Fatal("a probe from an address that is no peer's was answered")
	}
	if pa.Counters().Ignored == 0 || pa.Counters().ProbesAnswered != 0 {
		t.Fatalf("counters %+v: want the stranger's probe ignored and none answered", pa.Counters())
	}
}

func TestParseMessageAcceptsOnlyWhatMarshalWrites(t *testing.T) {
	for _, m := range []message{{kind: kindProbe, nonce: 7, seq: 9}, {kind: kindEcho, nonce: 7, seq: 9}, {kind: kindEcho, nonce: 7, seq: 9, heldDown: true},
		{kind: kindEcho, nonce: 7, seq: 9, heldDown: true, ready: true}, {kind: kindEcho, nonce: 7, seq: 9, speaksV2: true},
		{kind: kindProbe, nonce: 7, seq: 9, v2: true, key: 11}, {kind: kindEcho, nonce: 7, seq: 9, v2: true, key: 11, heldDown: true}} {
		if got, err := parseMessage(m.marshal()); err != nil || got != m {
			t.Fatalf("round trip of %+v: %+v, %v", m, got, err)
		}
	}
	good := message{kind: kindProbe, nonce: 7, seq: 9}.marshal()
	for name, mutate := range map[string]func([]byte) []byte{
		"short":                           func(b []byte) []byte { return b[:messageLen-1] },
		"long":                            func(b []byte) []byte { return append(b, 0) },
		"magic":                           func(b []byte) []byte { b[0] = 'X'; return b },
		"version":                         func(b []byte) []byte { b[4] = 3; return b },
		"version 2 of version 1's length": func(b []byte) []byte { b[4] = 2; return b },
		"version 1 of version 2's length": func(b []byte) []byte { return append(b, make([]byte, 8)...) },
		"kind":                            func(b []byte) []byte { b[5] = 3; return b },
		"reserved":                        func(b []byte) []byte { b[7] = 1; return b },
		"kind absent":                     func(b []byte) []byte { b[5] = 0; return b },
		// A probe says nothing of the prober's view: anyone may send
		// one, so only an echo (which carries the prober's nonce) may.
		"probe held down": func(b []byte) []byte { b[6] = flagHeldDown; return b },
		"probe ready":     func(b []byte) []byte { b[6] = flagHeldDown | flagReady; return b },
		"probe unknown":   func(b []byte) []byte { b[6] = 4; return b },
	} {
		b := mutate(append([]byte(nil), good...))
		if _, err := parseMessage(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// An echo's flags that a release does not know are ignored, not the echo:
// flagReady means nothing without flagHeldDown, and a bit no release sends
// yet is dropped.
func TestParseMessageIgnoresUnknownEchoFlags(t *testing.T) {
	for flags, want := range map[byte]message{
		flagReady:                     {kind: kindEcho, nonce: 7, seq: 9},
		8:                             {kind: kindEcho, nonce: 7, seq: 9},
		flagHeldDown | 8:              {kind: kindEcho, nonce: 7, seq: 9, heldDown: true},
		flagHeldDown | flagReady | 16: {kind: kindEcho, nonce: 7, seq: 9, heldDown: true, ready: true},
		flagSpeaksV2 | 32:             {kind: kindEcho, nonce: 7, seq: 9, speaksV2: true},
	} {
		b := message{kind: kindEcho, nonce: 7, seq: 9}.marshal()
		b[6] = flags
		if got, err := parseMessage(b); err != nil || got != want {
			t.Errorf("an echo with flags %#x: %+v, %v; want %+v", flags, got, err, want)
		}
	}
}

func FuzzParseMessage(f *testing.F) {
	f.Add(message{kind: kindEcho, nonce: 1, seq: 2}.marshal())
	f.Add(message{kind: kindEcho, nonce: 1, seq: 2, heldDown: true}.marshal())
	f.Add(message{kind: kindEcho, nonce: 1, seq: 2, heldDown: true, ready: true}.marshal())
	f.Add(message{kind: kindEcho, nonce: 1, seq: 2, speaksV2: true}.marshal())
	f.Add(message{kind: kindProbe, nonce: 1, seq: 2, v2: true, key: 3}.marshal())
	f.Add([]byte("MPTL"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseMessage(b)
		if err != nil {
			return
		}
		// Only an echo's flag byte may differ: its unknown flags are
		// dropped.
		got, want := m.marshal(), append([]byte(nil), b...)
		if m.kind == kindEcho {
			want[6] = got[6]
		}
		if string(got) != string(want) {
			t.Fatalf("accepted %x, which marshals back as %x", b, got)
		}
		if again, err := parseMessage(got); err != nil || again != m {
			t.Fatalf("%x parsed as %+v, which marshals as %x and parses as %+v, %v", b, m, got, again, err)
		}
	})
}

// An agent that restarts while a path is down (Path.AssumeDown) keeps it
// down until its peers echo; a peer that never does is Unknown again after
// AssumedDownFor, as one that runs no prober is.
func TestAPathAssumedDownStaysDownUntilItsPeersEcho(t *testing.T) {
	a, b := twoNodes(t)
	var changes atomic.Int64
	startProber(t, b, pathsOf("2", "1"), &changes)
	paths := pathsOf("1", "2")
	for i := range paths {
		paths[i].AssumeDown = true
	}
	p, err := New(Config{Port: testPort, Interval: testInterval, Multiplier: testMult}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	testutil.InNetNS(t, a, func() {
		if err := p.Sync(paths); err != nil {
			t.Errorf("sync: %v", err)
		}
	})
	if !p.Silent(1) || !p.Silent(2) {
		t.Fatal("paths assumed down are not silent before any probe")
	}
	took := waitFor(t, "paths up", 2*time.Second, func() bool { return !p.Silent(1) && !p.Silent(2) })
	t.Logf("assumed down, up %v after the first sync (%d intervals of echoes)", took, UpAfter)
	for _, s := range p.States() {
		if s.Downs != 0 {
			t.Errorf("path %d: %d downs counted for an assumption", s.Path, s.Downs)
		}
	}

	now := time.Now()
	silent := target{state: Down, assumedUntil: now.Add(-time.Millisecond)}
	if !silent.expire(now, testInterval, testMult, 100, peerView{}) || silent.state != Unknown {
		t.Errorf("a peer assumed down that never echoed: %v after AssumedDownFor, want Unknown", silent.state)
	}
	lost := target{state: Down, assumedUntil: now.Add(-time.Millisecond), lastEcho: now.Add(-time.Second), downs: 1}
	if lost.expire(now, testInterval, testMult, 100, peerView{}) || lost.state != Down {
		t.Errorf("a peer that echoed, then stopped: %v, want it kept Down", lost.state)
	}
}

// lossyRun drives a target as the prober does, one tick per interval from
// sequence number 1.
type lossyRun struct {
	t   *target
	seq uint64
	now time.Time
	// peerHolds: the echoes say the peer holds this node Down;
	// peerReady: and that it waits only for this node.
	peerHolds, peerReady bool
}

func newLossyRun() *lossyRun {
	return &lossyRun{t: newTarget("node2", 7, testMult), now: time.Unix(1000, 0)}
}

// ticks runs n ticks: each sends a probe (tally), and answered(seq) says
// whether its echo comes back within the tick. It returns the sequence
// numbers of the ticks in which the peer's state changed.
func (r *lossyRun) ticks(n int, answered func(seq uint64) bool) (changes []uint64) {
	for range n {
		r.seq++
		r.now = r.now.Add(testInterval)
		was := r.t.state
		r.t.expire(r.now, testInterval, testMult, r.seq, peerView{})
		r.t.tally(r.seq, testMult)
		if answered(r.seq) {
			r.t.answer(r.seq)
			r.t.heard(r.peerHolds, r.peerReady, r.seq, r.seq)
			r.t.echo(r.now.Add(testInterval/2), testInterval, r.seq)
		}
		if r.t.state != was {
			changes = append(changes, r.seq)
		}
	}
	return changes
}

func always(uint64) bool { return true }
func never(uint64) bool  { return false }

// A peer that answers three probes in four (25 % of round trips lost, so
// that echoes still come three in a row) is Down for loss within a window,
// stays Down for as long as the loss lasts although it keeps echoing, and
// is Up again once ClearRun probes in a row were answered. One that loses
// one in ten is never taken down.
func TestAPeerLosingAQuarterOfItsEchoesIsDownUntilARunIsClean(t *testing.T) {
	r := newLossyRun()
	if ch := r.ticks(100, always); len(ch) != 1 || ch[0] != 1 || r.t.state != Up || r.t.lost != 0 {
		t.Fatalf("a peer that answers everything: changes at %v, %v, %d lost; want Up at 1, none lost", ch, r.t.state, r.t.lost)
	}

	lossFrom := r.seq + 1
	quarter := func(seq uint64) bool { return seq%4 != 0 }
	ch := r.ticks(200, quarter)
	if len(ch) != 1 || r.t.state != Down || !r.t.lossy || r.t.downs != 1 {
		t.Fatalf("25 %% loss for 200 ticks: changes at %v, ends %v (lossy %v, %d downs); want one change to Down for loss", ch, r.t.state, r.t.lossy, r.t.downs)
	}
	// The window of the tick that found it holds only probes sent
	// since the loss began: at most LossWindow+Multiplier+1 ticks in.
	if took := ch[0] - lossFrom + 1; took > LossWindow+testMult+1 {
		t.Errorf("found %d ticks after the loss began, want at most %d", took, LossWindow+testMult+1)
	} else {
		t.Logf("25 %% loss found after %d ticks (%d lost of the last %d)", took, r.t.lost, LossWindow)
	}

	repairFrom := r.seq + 1
	ch = r.ticks(100, always)
	if len(ch) != 1 || r.t.state != Up || r.t.lossy {
		t.Fatalf("after the repair: changes at %v, ends %v (lossy %v); want Up once", ch, r.t.state, r.t.lossy)
	}
	// Up once the last ClearRun probes were answered: the probes of the
	// loss must be behind them, and no more than that is waited for.
	if took := ch[0] - repairFrom + 1; took < ClearRun || took > ClearRun+2 {
		t.Errorf("Up %d ticks after the repair, want from %d to %d", took, ClearRun, ClearRun+2)
	}

	if ch := r.ticks(1000, func(seq uint64) bool { return seq%10 != 0 }); len(ch) != 0 || r.t.downs != 1 {
		t.Errorf("10 %% loss for 1000 ticks: changes at %v (%d downs), want none", ch, r.t.downs)
	}
}

// A peer that came back Up after going silent is not taken down again for
// the probes lost while it was silent: only losses since it is Up count.
func TestLossesWhileSilentDoNotMakeTheReturnLossy(t *testing.T) {
	r := newLossyRun()
	r.ticks(100, always)
	if ch := r.ticks(30, func(uint64) bool { return false }); len(ch) != 1 || r.t.state != Down || r.t.lossy {
		t.Fatalf("silent for 30 ticks: changes at %v, %v (lossy %v), want Down for silence", ch, r.t.state, r.t.lossy)
	}
	ch := r.ticks(100, always)
	if len(ch) != 1 || r.t.state != Up {
		t.Fatalf("answering again: changes at %v, ends %v; want Up once", ch, r.t.state)
	}
	if ch[0] > 130+UpAfter {
		t.Errorf("Up at tick %d, want by %d (UpAfter echoes)", ch[0], 130+UpAfter)
	}
}

// A path that loses at random goes silent for a detect time now and then:
// the peer is Down then, and the echoes that follow, three in a row among
// the losses, must not bring it back. It stays Down until ClearRun probes
// in a row were answered, once.
func TestAPeerSilentAmidLossesStaysDownUntilTheLossesEnd(t *testing.T) {
	r := newLossyRun()
	r.ticks(100, always)
	// Cycles of 14: 6 lost (an outage of more than the detect time),
	// then 3 echoes in a row, a loss, an echo, a loss, 2 echoes.
	cycle := func(seq uint64) bool {
		switch seq % 14 {
		case 0, 1, 2, 3, 4, 5, 9, 11:
			return false
		}
		return true
	}
	ch := r.ticks(240, cycle)
	if len(ch) != 1 || r.t.state != Down || r.t.downs != 1 {
		t.Fatalf("silent runs amid losses for 240 ticks: changes at %v, ends %v after %d downs; want one change, to Down", ch, r.t.state, r.t.downs)
	}
	repairFrom := r.seq + 1
	ch = r.ticks(100, always)
	if len(ch) != 1 || r.t.state != Up {
		t.Fatalf("after the repair: changes at %v, ends %v; want Up once", ch, r.t.state)
	}
	if took := ch[0] - repairFrom + 1; took < ClearRun {
		t.Errorf("Up %d ticks after the repair, before %d probes in a row were answered", took, ClearRun)
	}
}

// A peer Down for loss comes back on the answer that completes a run of
// ClearRun, not one answer sooner, and not later: the run ends at the
// newest answered probe, whose echo is known, not at the newest whose echo
// can no longer come.
func TestAPeerComesBackOnTheAnswerThatCompletesTheRun(t *testing.T) {
	r := newLossyRun()
	r.ticks(100, always)
	lossy := func() {
		t.Helper()
		ch := append(r.ticks(100, func(seq uint64) bool { return seq%2 == 0 }), r.ticks(1, never)...)
		if len(ch) != 1 || r.t.state != Down {
			t.Fatalf("half the round trips lost: changes at %v, ends %v; want Down once", ch, r.t.state)
		}
	}
	lossy()
	from := r.seq + 1
	ch := r.ticks(ClearRun+2*testMult, func(seq uint64) bool { return seq < from+ClearRun-1 })
	if len(ch) != 0 || r.t.state != Down {
		t.Fatalf("%d answers then silence: changes at %v, ends %v; want Down throughout", ClearRun-1, ch, r.t.state)
	}
	r.ticks(100, always)
	lossy()
	from = r.seq + 1
	ch = r.ticks(ClearRun, always)
	if len(ch) != 1 || ch[0] != from+ClearRun-1 {
		t.Errorf("%d answers: changes at %v, want Up at %d", ClearRun, ch, from+ClearRun-1)
	}
}

// Only the silence that took the peer down is forgiven: losses after its
// first echo since count, however they line up in the window; and a peer
// assumed down (a restart during an outage) is silent from its first
// probe, so it is Up UpAfter echoes after the repair.
func TestOnlyTheSilenceThatTookAPeerDownIsForgiven(t *testing.T) {
	r := newLossyRun()
	r.ticks(100, always)
	// 101-108 lost (silent), 109-111 answered, 112-121 lost, then all.
	ch := r.ticks(100, func(seq uint64) bool { return seq >= 109 && seq <= 111 || seq >= 122 })
	if len(ch) != 2 || r.t.state != Up {
		t.Fatalf("changes at %v, ends %v; want Down, then Up", ch, r.t.state)
	}
	// 121 is lost: the run of ClearRun answered probes starts after it.
	if want := uint64(121 + ClearRun); ch[1] < want {
		t.Errorf("Up at tick %d with losses after the silence still in the window, want from %d", ch[1], want)
	}

	assumed := &lossyRun{t: newTarget("node2", 7, testMult), now: time.Unix(1000, 0)}
	assumed.t.state = Down
	assumed.t.silence(assumed.t.first)
	assumed.ticks(50, func(uint64) bool { return false })
	ch = assumed.ticks(50, always)
	if len(ch) != 1 || ch[0] > 50+UpAfter {
		t.Errorf("a peer assumed down, answering from tick 51: changes at %v, want Up by tick %d", ch, 50+UpAfter)
	}
}

// A peer that holds this node Down on a path (its echoes say so) takes it
// Down here at once, on the change only: the peer's probes found a lossy
// path before this node's did. It comes back by this node's own rules,
// whatever the peer still says; a peer heard holding it Down from the
// first echo (this node restarted during the peer's hold) takes nothing
// down.
func TestAPeerHoldingThisNodeDownTakesThePathDownOnTheChange(t *testing.T) {
	r := newLossyRun()
	r.ticks(30, always)
	if r.t.state != Up {
		t.Fatalf("state %v after 30 clean ticks, want Up", r.t.state)
	}
	if r.t.heard(false, false, r.seq, r.seq) || r.t.state != Up {
		t.Fatalf("an echo not holding this node Down changed the state to %v", r.t.state)
	}
	if !r.t.heard(true, false, r.seq, r.seq) || r.t.state != Down || !r.t.byPeer || r.t.downs != 1 {
		t.Fatalf("the peer began holding this node Down: state %v, by the peer %v, downs %d; want Down by the peer, 1 down", r.t.state, r.t.byPeer, r.t.downs)
	}
	// Its echoes go on saying so; all of them come back. Past the
	// hold of a window this node would let the peer Up, but the peer
	// still holds this node Down: it stays Down, its echoes saying it is
	// ready (ownReady), until the peer's say the same; then Up, once.
	r.peerHolds = true
	if changes := r.ticks(LossWindow+testMult+5, always); len(changes) != 0 || r.t.state != Down || !r.t.ownReady(r.seq) {
		t.Fatalf("changes at %v, state %v, ready %v: want Down and ready, the peer still holding", changes, r.t.state, r.t.ownReady(r.seq))
	}
	r.peerReady = true
	changes := r.ticks(1, always)
	if len(changes) != 1 || r.t.state != Up || r.t.byPeer || r.t.downs != 1 {
		t.Fatalf("changes at %v, state %v, by the peer %v, downs %d: want Up again once the peer is ready too", changes, r.t.state, r.t.byPeer, r.t.downs)
	}
	// A peer that holds this node Down and never says it is ready (an
	// agent that knows the held flag and not the ready one) holds it
	// back a window past this node's readiness, no longer.
	held := newLossyRun()
	held.ticks(30, always)
	held.t.heard(true, false, held.seq, held.seq)
	held.peerHolds = true
	ready := held.seq + LossWindow // held Down a window
	changes = held.ticks(2*LossWindow+testMult, always)
	if len(changes) != 1 || held.t.state != Up || changes[0] < ready+LossWindow || changes[0] > ready+LossWindow+2 {
		t.Fatalf("a peer holding this node Down for good: changes at %v, state %v; want Up once, a window after tick %d", changes, held.t.state, ready)
	}
	// The peer lets go; a late echo from before, still holding, says
	// nothing; a new one holding it Down again is a new change.
	r.t.heard(false, false, r.seq, r.seq)
	if r.t.heard(true, false, r.seq-1, r.seq) || r.t.state != Up {
		t.Fatalf("a late echo from before the peer let go: state %v, want Up", r.t.state)
	}
	if !r.t.heard(true, false, r.seq+1, r.seq+1) || r.t.state != Down || r.t.downs != 2 {
		t.Fatalf("the peer held this node Down again: state %v, downs %d; want Down, 2 downs", r.t.state, r.t.downs)
	}

	restarted := newTarget("node2", 7, testMult)
	if restarted.heard(true, false, 1, 1) || !restarted.echo(time.Unix(1000, 0), testInterval, 1) || restarted.state != Up {
		t.Fatalf("a peer holding a new prober's node Down from its first echo: state %v, want Up", restarted.state)
	}
	if restarted.heard(true, false, 2, 2) || restarted.state != Up {
		t.Fatalf("the same peer, still holding: state %v, want Up", restarted.state)
	}
	assumed := newTarget("node2", 7, testMult)
	assumed.state = Down
	if assumed.heard(true, false, 1, 1) || assumed.downs != 0 {
		t.Fatalf("a peer assumed Down and held Down by its peer: %d downs, want none", assumed.downs)
	}
}

// nonceOf is the nonce p's probes carry to the peer at addr on path.
func nonceOf(p *Prober, path uint32, addr string) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.paths[path].targets[netip.MustParseAddr(addr)].nonce
}

// seqOf is the sequence number of p's newest probe to the peer at addr on
// path.
func seqOf(p *Prober, path uint32, addr string) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.paths[path].targets[netip.MustParseAddr(addr)].seq
}

// The flag by which an echo says its sender holds the prober down counts
// only with the nonce of the probes to that peer on that path: an echo
// forged from the peer's address and the probers' port (a raw socket, as a
// spoofing sender would), flagged, with any other nonce (another path's
// too) takes nothing down. With the right one it does, on both nodes (the
// prober, fooled, then holds its peer down, and its own echoes say so),
// and both come back by their own rules, the path being healthy.
func TestAForgedHeldDownFlagCountsOnlyWithThePathsNonce(t *testing.T) {
	_, b, pa, pb, _ := probingPair(t)
	forge := func(nonce uint64, rounds int) {
		testutil.InNetNS(t, b, func() {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_UDP)
			if err != nil {
				t.Errorf("raw socket: %v", err)
				return
			}
			defer unix.Close(fd)
			if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{10, 201, 2, 2}}); err != nil {
				t.Errorf("bind: %v", err)
				return
			}
			for range rounds {
				seq := seqOf(pa, 2, "10.201.2.2")
				for back := range uint64(testMult) {
					payload := message{kind: kindEcho, nonce: nonce, seq: seq - back, heldDown: true}.marshal()
					udp := make([]byte, 8, 8+len(payload))
					binary.BigEndian.PutUint16(udp[0:], testPort)
					binary.BigEndian.PutUint16(udp[2:], testPort)
					binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
					udp = append(udp, payload...) // checksum 0: none, as IPv4 allows
					if err := unix.Sendto(fd, udp, 0, &unix.SockaddrInet4{Addr: [4]byte{10, 201, 2, 1}}); err != nil {
						t.Errorf("sendto: %v", err)
						return
					}
				}
				time.Sleep(testInterval / 2)
			}
		})
	}
	ignored := pa.Counters().Ignored
	forge(nonceOf(pa, 1, "10.201.1.2"), 20) // path 1's nonce
	forge(nonceOf(pa, 2, "10.201.2.2")^1, 20)
	if got := pa.Counters().Ignored - ignored; got < 150 {
		t.Errorf("node a ignored %d of the 200 forged echoes with a wrong nonce", got)
	}
	for _, s := range append(pa.States(), pb.States()...) {
		if s.State != Up || s.Downs != 0 {
			t.Fatalf("after forged flags with wrong nonces: path %d, peer %s %v after %d downs, want Up", s.Path, s.Peer.Node, s.State, s.Downs)
		}
	}

	forge(nonceOf(pa, 2, "10.201.2.2"), 3)
	waitFor(t, "node a: path2 down", time.Second, func() bool { return pa.Silent(2) })
	waitFor(t, "node b: path2 down (a's echoes hold it)", time.Second, func() bool { return pb.Silent(2) })
	waitFor(t, "node a: path2 up", 3*time.Second, func() bool { return !pa.Silent(2) })
	waitFor(t, "node b: path2 up", 3*time.Second, func() bool { return !pb.Silent(2) })
	checkUpAfterOneDownOn(t, 2, pa, pb)
}

// pairRun drives the targets two nodes keep of each other on one path, one
// tick per interval each, in lockstep: an echo carries what its sender
// holds of the prober (Down, and ready to let it Up), as read answers a
// probe.
type pairRun struct{ a, b *lossyRun }

// ticks runs n ticks; aAnswered and bAnswered say whether a's and b's probe
// of the tick come back. It returns the ticks in which a and b changed
// their peer's state.
func (p *pairRun) ticks(n int, aAnswered, bAnswered func(seq uint64) bool) (changesA, changesB []uint64) {
	for range n {
		wasA, wasB := p.a.t.state, p.b.t.state
		heldA, readyA := p.a.t.state == Down, p.a.t.ownReady(p.a.seq)
		heldB, readyB := p.b.t.state == Down, p.b.t.ownReady(p.b.seq)
		p.a.peerHolds, p.a.peerReady = heldB, readyB
		p.b.peerHolds, p.b.peerReady = heldA, readyA
		p.a.ticks(1, aAnswered)
		p.b.ticks(1, bAnswered)
		if p.a.t.state != wasA {
			changesA = append(changesA, p.a.seq)
		}
		if p.b.t.state != wasB {
			changesB = append(changesB, p.b.seq)
		}
	}
	return changesA, changesB
}

// Both nodes take a path back together, when the later of them finds it
// clean: here, after an outage, b's own probes go on getting no echo for a
// while, so that b is ready a dozen ticks after a is. a waits for b (b's
// echoes hold it Down and say b is not ready), and comes back within a tick
// of b; before, a came back alone, and its subflows went home while b
// still detoured the replies.
func TestBothNodesTakeAPathBackTogether(t *testing.T) {
	p := &pairRun{a: newLossyRun(), b: newLossyRun()}
	p.ticks(30, always, always)
	if p.a.t.state != Up || p.b.t.state != Up {
		t.Fatalf("after 30 clean ticks: a %v, b %v, want both Up", p.a.t.state, p.b.t.state)
	}
	p.ticks(20, never, never)
	if p.a.t.state != Down || p.b.t.state != Down {
		t.Fatalf("after 20 silent ticks: a %v, b %v, want both Down", p.a.t.state, p.b.t.state)
	}
	changesA, changesB := p.ticks(15, always, never)
	if len(changesA) != 0 || len(changesB) != 0 || !p.a.t.ownReady(p.a.seq) {
		t.Fatalf("while b's probes get no echo: a changed at %v (ready %v), b at %v; want a ready, waiting, and neither Up",
			changesA, p.a.t.ownReady(p.a.seq), changesB)
	}
	changesA, changesB = p.ticks(LossWindow+testMult+5, always, always)
	if len(changesA) != 1 || len(changesB) != 1 || p.a.t.state != Up || p.b.t.state != Up {
		t.Fatalf("after the repair: a changed at %v, b at %v (a %v, b %v); want each Up once", changesA, changesB, p.a.t.state, p.b.t.state)
	}
	if d := int64(changesA[0]) - int64(changesB[0]); d < -1 || d > 1 {
		t.Errorf("a came back at tick %d, b at %d: want within a tick of each other", changesA[0], changesB[0])
	}
}
