// Package liveness tells, for each of a node's paths and each peer node
// that path reaches, whether small UDP probes sent over the path's NIC come
// back: what a carrier cannot say (a dead switch port, a fabric that drops
// everything one way, a far side that failed). One socket per path, bound
// to the node's address on the path and its NIC and carrying the path's
// mark, sends the probes and answers the peers' (so an echo comes back over
// the path the probe went out by, on both nodes); a peer that stops
// echoing for Multiplier intervals is Down on that path, one that echoes
// for UpAfter intervals in a row is Up again. A peer whose echoes go
// missing too often is Down too (lossy: LossyAt of the last LossWindow),
// and Up again only once ClearRun probes in a row were answered: a path
// that loses a third of its packets keeps its carrier and most of its
// echoes, and drags down every MPTCP connection with a subflow on it. An
// echo tells whether its sender holds the prober Down, so the node whose
// probes find a failure first takes its peer's view of the path down with
// it. The agent marks a path down in the datapath when no peer is Up on
// it and one is Down (Silent).
//
// What probes cost follows the traffic, not the cluster: with a Traffic
// source (the datapath's record of what the node's pods send to each peer),
// a peer is probed every Interval only while it is busy (the node's pods
// sent to its pods within BusyFor), and every IdleInterval otherwise. Every
// connection sends both ways, so both its nodes find their peer busy. A path that fails towards an idle peer
// is found within Multiplier idle intervals, before most connections to it;
// the first packet a pod sends the peer makes it busy, and its paths are
// then judged at the interval again.
package liveness

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Config is how often probes go and how many may go unanswered.
type Config struct {
	// Port is the UDP port every node's agent probes from and answers on.
	Port int
	// Interval between two probes to one peer over one path.
	Interval time.Duration
	// Multiplier: a peer that echoed nothing for Multiplier intervals is
	// Down on the path.
	Multiplier int
	// Traffic tells when the node's pods last sent to each peer's pods
	// (by Peer.Slot). Nil: every peer is busy, probed every Interval.
	Traffic Traffic
	// IdleInterval and BusyFor: 0 for the defaults of the same names.
	IdleInterval, BusyFor time.Duration
}

// Traffic is how long ago the node's pods last sent to the pods of the peer
// in a slot (Peer.Slot); false if they never did.
type Traffic interface {
	Since(slot uint32) (time.Duration, bool)
}

// A peer is busy while the node's pods sent to it within BusyFor; an idle
// peer is probed every IdleInterval (Config.IdleInterval): at 1,000 peers
// over 4 paths that is 2,000 probes a second, where probing them all at
// 30 ms took 133,000. What the peer's probes say is not asked:
// two nodes whose probes made each other busy would stay busy for good, and
// a forger could make a node busy towards every peer.
const (
	BusyFor      = 10 * time.Second
	IdleInterval = 2 * time.Second
)

// MaxBusyPaths bounds what is probed every interval, in peers' paths: pods
// that send to every peer's pods (a tenant's scan), a cluster whose nodes
// have no pod CIDRs, or a path that fails towards every peer at once cost
// their node at most 400 probes an interval, 100 peers over 4 paths, about a
// quarter of a core (docs/benchmarks.md). The budget goes to the peers the
// pods sent to last, then to those whose traffic cannot be told, then to
// the Down paths of the peers that went Down last; the others are probed
// every idle interval (PeerState.OverBusyLimit).
const MaxBusyPaths = 400

// MaxEarlyProbes bounds the probes one tick sends off their cadence to
// targets that never echoed (target.earlyAt): an agent that starts beside
// 1,000 peers over 4 paths has probed them all within 63 ticks (1.9 s at
// the default interval), as the idle cadence would have, and one beside a
// few peers within a tick.
const MaxEarlyProbes = 64

// UpAfter is how many intervals in a row a Down peer must echo in before
// it is Up again: one lucky echo through a path that loses most packets
// does not bring it back.
const UpAfter = 3

// Loss detection: a peer Up on a path is Down (lossy) once LossyAt of the
// last LossWindow probes whose echo can no longer count (sent more than
// Multiplier intervals ago) went unanswered, and Up again only once the
// last ClearRun probes up to the newest answered one were all answered,
// besides the silence that took it down (tally, mayComeUp). At the default
// 30 ms, the window is 600 ms: half the round trips lost (30 % each way)
// is found in about half a second; a round-trip loss of 2 % at random
// takes a peer down about once in half an hour (docs/agent.md,
// "Liveness"; TestLossVerdictRatesOnRandomLoss).
//
// The return looks at fewer probes, and at the newest answered rather than
// at those whose echo can no longer come: an answered probe is known
// good at once, and waiting for the detect time and a whole window kept a
// repaired path idle for 780 ms, most of the second a repair may take
// (docs/design.md, "Targets"). Eighteen answers in a row come by chance once in 380,000
// tries on a path losing half its round trips (0.49^18); one losing a
// third (20 % each way) comes back about 14 times an hour, where a run of
// 20 let it back 7 times (flap damping holds it if that repeats).
const (
	LossWindow = 20
	LossyAt    = 5
	ClearRun   = 18
)

// Peer is a peer node's address on a path.
type Peer struct {
	Node string     `json:"node"`
	Addr netip.Addr `json:"addr"`
	// Slot is the peer's slot in the Traffic source, 0 for none: a peer
	// whose traffic cannot be told (no pod CIDRs known) is always busy.
	Slot uint32 `json:"slot,omitempty"`
}

// Path is one of this node's paths with the peers it probes over it.
type Path struct {
	Index     uint32     `json:"index"`
	Name      string     `json:"name"`
	Interface string     `json:"interface"`
	Mark      uint32     `json:"mark"`
	Local     netip.Addr `json:"local"`
	Peers     []Peer     `json:"peers,omitempty"`
	// AssumeDown: peers new to the prober start Down rather than
	// Unknown, for AssumedDownFor at most unless they echo: the path was
	// down when the agent started (it restarted during a failure), and
	// must not come up before its probes say so.
	AssumeDown bool `json:"-"`
}

// AssumedDownFor bounds how long a peer assumed Down (Path.AssumeDown)
// that never echoes stays Down: then it is Unknown, as a peer that runs no
// prober is, so that a node whose peers stopped probing (an upgrade, or
// liveness turned off) does not keep the path down for good.
const AssumedDownFor = 10 * time.Second

func (p Path) sameSocket(o Path) bool {
	return p.Index == o.Index && p.Interface == o.Interface && p.Mark == o.Mark && p.Local == o.Local
}

// State is a peer's liveness on a path.
type State int

const (
	// Unknown: the peer has not echoed yet (it may run no prober).
	Unknown State = iota
	Up
	Down
)

func (s State) String() string {
	switch s {
	case Up:
		return "Up"
	case Down:
		return "Down"
	}
	return "Unknown"
}

// PeerState is what the prober knows of one peer on one path.
type PeerState struct {
	Path  uint32
	Peer  Peer
	State State
	// Lost is how many of the last LossWindow probes whose echo can no
	// longer come were not answered; -1 until LossWindow of them were
	// sent.
	Lost int
	// Downs counts the peer's transitions from Up to Down on the path.
	Downs uint64
	// Busy: the peer is probed every interval on the path
	// (Config.Traffic), not every IdleInterval. OverBusyLimit: it would
	// be, but MaxBusyPaths went to others.
	Busy, OverBusyLimit bool
}

// Counters are the prober's datagrams since it started.
type Counters struct {
	// ProbesSent and EchoesReceived: this node's probes and their echoes.
	ProbesSent, EchoesReceived uint64
	// ProbesAnswered: the peers' probes echoed.
	ProbesAnswered uint64
	// Ignored: datagrams that are not a probe or an echo of this prober's
	// (a wrong nonce, a sequence number not sent lately), or do not come
	// from a peer's address and port on the path.
	Ignored uint64
	// SocketDrops: datagrams the kernel dropped because a path's socket
	// was full (SO_RXQ_OVFL), before the prober could read them.
	SocketDrops uint64
}

// Prober probes the paths Sync gives it until Close.
type Prober struct {
	cfg     Config
	log     *slog.Logger
	changed func()

	// secret keys the nonces (Nonce): drawn when the prober starts.
	secret [32]byte

	mu    sync.Mutex
	paths map[uint32]*pathProbe
	// nodes: each peer node's traffic, shared by its targets on every
	// path; tick counts the intervals, which idle targets are probed in
	// one of every idleEvery (at their phase).
	nodes map[string]*peerNode
	order []*peerNode
	// earlyFrom is where in order the last tick's budget of early probes
	// ran out: the next tick walks order from there, so that every new
	// target gets its first probe before any gets its next.
	earlyFrom int
	// earlyStarted: when each node last started an early schedule, kept
	// for an idle interval: a node that leaves the peers and comes back
	// again and again (a compromised node withdrawing its addresses and
	// claiming them again) starts one at most once an idle interval.
	earlyStarted map[string]time.Time
	wanting      []wantingPeer
	seed         maphash.Seed
	tick         uint64
	idleEvery    uint64
	counters     Counters
	closed       bool
	cancel       context.CancelFunc
	done         chan struct{}
}

type pathProbe struct {
	spec    Path
	conn    *net.UDPConn
	targets map[netip.Addr]*target
	closed  chan struct{}
	// overflows is the socket's last SO_RXQ_OVFL count (read's).
	overflows uint32
}

// peerNode is a peer node: its targets on every path, probed in the same
// tick (at phase of the idle cadence while it is idle), its slot in the
// Traffic source, when one of its targets last went Down, and the last
// tick's verdict (judgeTraffic): busy (every target every interval),
// recovering (its Down targets every interval), over (one of those, but
// for MaxBusyPaths).
type peerNode struct {
	name                   string
	targets                []nodeTarget
	phase                  uint64
	slot                   uint32
	downAt                 time.Time
	busy, recovering, over bool
}

// nodeTarget is one of a peer node's targets, with its path and address.
type nodeTarget struct {
	pp   *pathProbe
	addr netip.Addr
	t    *target
}

// wantingPeer is a peer node that would be probed every interval, in the
// order the budget goes to them (rank, then since).
type wantingPeer struct {
	node  *peerNode
	rank  int
	since time.Duration
}

// The ranks of wantingPeer: traffic, unknown traffic, a Down path.
const (
	rankTraffic = iota
	rankUnknown
	rankRecovering
)

type target struct {
	node string
	// peer is the node's traffic (Prober.nodes).
	peer *peerNode
	// seq is the sequence number of the newest probe to the peer on the
	// path: an echo counts only for one of the last Multiplier+1. every
	// is how many ticks apart its probes go now (1 while the peer is
	// busy, Prober.idleEvery while idle); graced: when setCadence last
	// gave it a detect time's grace.
	seq, every uint64
	graced     time.Time
	// nonce goes in every probe to the peer on the path, and an echo
	// counts only with it: one per peer and path, so that what a peer, or
	// someone who sees one path, learns is good for nothing else.
	nonce uint64
	// peerV2: the peer's echoes say it reads version 2 probes; key is
	// the nonce its version 2 echoes gave for this node (wire.go), sent
	// back in each probe so that its datapath lets them by.
	peerV2   bool
	key      uint64
	state    State
	lastEcho time.Time
	// streak: echoes in a row, each within two intervals of the one
	// before.
	streak int
	downs  uint64
	// assumedUntil: the peer was assumed Down (Path.AssumeDown) and
	// becomes Unknown then if it never echoed.
	assumedUntil time.Time
	// earlyAt is the tick of the next probe before the target's first
	// echo, whatever its cadence (0: none), and earlyGap the ticks since
	// the last: a new target is probed at the next tick, then at gaps
	// that double until it echoes or the gap reaches the idle cadence. A
	// peer whose agent starts with this one is Up within about twice the
	// time between the two starts, not at its idle phase, up to an idle
	// interval later.
	earlyAt, earlyGap uint64
	// echoed[s % len] tells whether the probe of sequence number s was
	// answered, for the last LossWindow+Multiplier+1 probes; first is the
	// first sequence number sent to the peer, upSince the first sent
	// since it was last Up (a loss before does not make an Up peer
	// lossy). lost counts the last tick's window, -1 while it is not
	// full (tally).
	echoed         []bool
	first, upSince uint64
	lost           int
	lossy          bool
	// heldByPeer: the peer's newest echo (of probe flagSeq) said it
	// holds this node Down on the path, and peerReady that it waits only
	// for this node to let it Up (mayComeUp); byPeer: that is what took
	// the peer Down (heard).
	heldByPeer, peerReady, byPeer bool
	flagSeq                       uint64
	// readySince: the tick since which this node's own rules would let
	// the Down peer Up (mayComeUp); 0 while they do not.
	readySince uint64
	// silentEverywhere: the peer went silent on every path at once, and
	// is Unknown here for it (expire).
	silentEverywhere bool
	// heldUntil: a peer that went Down is not Up again before this
	// sequence number (mayComeUp). [silentFrom, silentTo] are the probes
	// of the silence that made it Down (from the first after the newest
	// answered to the last before the first answered since); silentTo
	// is open (the largest number) until an echo comes, and both are 0
	// if it went Down for loss. answered is the newest answered.
	heldUntil, silentFrom, silentTo, answered uint64
}

// New starts a prober with no paths. changed is called, without the
// prober's lock held, whenever a peer's state changes on a path; it must
// not block.
func New(cfg Config, log *slog.Logger, changed func()) (*Prober, error) {
	if cfg.Port <= 0 || cfg.Port > 65535 || cfg.Interval <= 0 || cfg.Multiplier < 1 || cfg.IdleInterval < 0 || cfg.BusyFor < 0 {
		return nil, fmt.Errorf("liveness: port %d, interval %v, multiplier %d, idle interval %v, busy for %v: "+
			"want a port, a positive interval, a multiplier from 1 and no negative duration",
			cfg.Port, cfg.Interval, cfg.Multiplier, cfg.IdleInterval, cfg.BusyFor)
	}
	if cfg.IdleInterval == 0 {
		cfg.IdleInterval = IdleInterval
	}
	if cfg.BusyFor == 0 {
		cfg.BusyFor = BusyFor
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Prober{cfg: cfg, log: log, changed: changed, paths: map[uint32]*pathProbe{}, nodes: map[string]*peerNode{}, seed: maphash.MakeSeed(),
		earlyStarted: map[string]time.Time{},
		idleEvery:    max(1, uint64(cfg.IdleInterval/cfg.Interval)), cancel: cancel, done: make(chan struct{})}
	_, _ = rand.Read(p.secret[:]) // never fails (crypto/rand)
	go p.run(ctx)
	return p, nil
}

// Sync makes the prober probe exactly paths (the first of two with one
// index). A path whose socket cannot be opened is left out and its error
// returned; the others go on. The sockets are opened in the calling
// thread's network namespace. Calls must not overlap; after Close, Sync
// does nothing.
func (p *Prober) Sync(paths []Path) error {
	paths, want := uniquePaths(paths)
	if !p.closeProbesNotIn(want) {
		return nil
	}
	var errs []error
	nodes := map[string]bool{}
	for _, path := range paths {
		pp, err := p.probeOf(path)
		if err != nil {
			errs = append(errs, fmt.Errorf("path %s: %w", path.Name, err))
			continue
		}
		p.mu.Lock()
		p.syncTargets(pp, path, nodes)
		p.mu.Unlock()
	}
	p.mu.Lock()
	p.indexNodes(nodes)
	for name, at := range p.earlyStarted {
		if time.Since(at) >= p.cfg.IdleInterval {
			delete(p.earlyStarted, name)
		}
	}
	p.mu.Unlock()
	return errors.Join(errs...)
}

// uniquePaths keeps the first of paths with one index, and maps each index
// to its path.
func uniquePaths(paths []Path) ([]Path, map[uint32]Path) {
	want := map[uint32]Path{}
	var unique []Path
	for _, path := range paths {
		if _, dup := want[path.Index]; !dup {
			want[path.Index] = path
			unique = append(unique, path)
		}
	}
	return unique, want
}

// closeProbesNotIn closes the probes of paths that want lacks or whose
// socket it changes; false when the prober is closed.
func (p *Prober) closeProbesNotIn(want map[uint32]Path) bool {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return false
	}
	var closing []*pathProbe
	for index, pp := range p.paths {
		if w, ok := want[index]; !ok || !w.sameSocket(pp.spec) {
			closing = append(closing, pp)
			delete(p.paths, index)
		}
	}
	p.mu.Unlock()
	for _, pp := range closing {
		pp.close()
	}
	return true
}

// probeOf is path's probe, its socket opened and its reader started if it
// had none.
func (p *Prober) probeOf(path Path) (*pathProbe, error) {
	p.mu.Lock()
	pp := p.paths[path.Index]
	p.mu.Unlock()
	if pp != nil {
		return pp, nil
	}
	conn, err := p.open(path)
	if err != nil {
		return nil, err
	}
	pp = &pathProbe{spec: path, conn: conn, targets: map[netip.Addr]*target{}, closed: make(chan struct{})}
	p.mu.Lock()
	p.paths[path.Index] = pp
	p.mu.Unlock()
	go p.read(pp, path.Name)
	return pp, nil
}

// syncTargets makes pp's targets path's peers, and marks their nodes in
// nodes, true for a node the prober did not know before this Sync. A peer
// already probed at its address keeps its target. Called with p.mu held.
func (p *Prober) syncTargets(pp *pathProbe, path Path, nodes map[string]bool) {
	pp.spec = path
	peers := map[netip.Addr]bool{}
	for _, peer := range path.Peers {
		peers[peer.Addr] = true
		node := p.nodes[peer.Node]
		if node == nil {
			// A keyed hash of its name spreads the idle peers'
			// probes over the idle interval.
			node = &peerNode{name: peer.Node, busy: true, phase: maphash.String(p.seed, peer.Node) % p.idleEvery}
			p.nodes[peer.Node] = node
			nodes[peer.Node] = p.startEarly(peer.Node)
		} else if _, ok := nodes[peer.Node]; !ok {
			nodes[peer.Node] = false
		}
		node.slot = peer.Slot
		if t := pp.targets[peer.Addr]; t != nil && t.node == peer.Node {
			continue
		}
		// New, or its address now another node's: a target of its
		// own, with its own nonce.
		t := newTarget(peer.Node, p.Nonce(path.Local, peer), p.cfg.Multiplier)
		t.peer, t.every = node, 1
		if nodes[peer.Node] {
			// A node new to the prober only (startEarly): one whose
			// address changes (its own claims, which a compromised
			// node could change at will) waits for its phase.
			t.earlyAt, t.earlyGap = p.tick+1, 1
		}
		if path.AssumeDown {
			// Silent since before its first probe: the outage its
			// predecessor saw, recovering.
			t.state, t.assumedUntil = Down, time.Now().Add(AssumedDownFor)
			t.silence(t.first)
			node.downAt = time.Now()
		}
		pp.targets[peer.Addr] = t
	}
	for addr := range pp.targets {
		if !peers[addr] {
			delete(pp.targets, addr)
		}
	}
}

// startEarly tells whether a node new to the prober has its targets
// probed early (target.earlyAt): unless it started that within the last
// idle interval. Called with p.mu held.
func (p *Prober) startEarly(node string) bool {
	now := time.Now()
	if at, ok := p.earlyStarted[node]; ok && now.Sub(at) < p.cfg.IdleInterval {
		return false
	}
	p.earlyStarted[node] = now
	return true
}

// indexNodes drops the peer nodes that nodes lacks and lists every
// node's targets over all paths, in the order the prober walks. Called
// with p.mu held.
func (p *Prober) indexNodes(nodes map[string]bool) {
	p.order = p.order[:0]
	for name, node := range p.nodes {
		if _, ok := nodes[name]; !ok {
			delete(p.nodes, name)
			continue
		}
		node.targets = node.targets[:0]
		p.order = append(p.order, node)
	}
	// By name: earlyFrom keeps its place across Syncs.
	slices.SortFunc(p.order, func(a, b *peerNode) int { return strings.Compare(a.name, b.name) })
	for _, pp := range p.paths {
		for addr, t := range pp.targets {
			t.peer.targets = append(t.peer.targets, nodeTarget{pp, addr, t})
		}
	}
}

// open binds the path's socket: its address and port, its NIC, its mark,
// and the network-control class, so that a congested fabric that honours
// it drops probes last.
func (p *Prober) open(path Path) (*net.UDPConn, error) {
	network, tos := "udp4", func(fd int) error { return unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_TOS, 0xc0) }
	if path.Local.Is6() && !path.Local.Is4In6() {
		network, tos = "udp6", func(fd int) error { return unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_TCLASS, 0xc0) }
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if serr = unix.SetsockoptString(int(fd), unix.SOL_SOCKET, unix.SO_BINDTODEVICE, path.Interface); serr != nil {
				serr = fmt.Errorf("binding to %s: %w", path.Interface, serr)
				return
			}
			if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(path.Mark)); serr != nil {
				serr = fmt.Errorf("mark %#x: %w", path.Mark, serr)
				return
			}
			// Room for every peer's probe and echo through a pause
			// of the reader (past net.core.rmem_max: the agent has
			// CAP_NET_ADMIN; without it the default stays), and the
			// count of what overflowed all the same.
			if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, socketBuffer) != nil {
				_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, socketBuffer)
			}
			if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RXQ_OVFL, 1); serr != nil {
				serr = fmt.Errorf("SO_RXQ_OVFL: %w", serr)
				return
			}
			serr = tos(int(fd))
		})
		return errors.Join(err, serr)
	}}
	c, err := lc.ListenPacket(context.Background(), network, netip.AddrPortFrom(path.Local.Unmap(), uint16(p.cfg.Port)).String())
	if err != nil {
		return nil, err
	}
	return c.(*net.UDPConn), nil
}

// socketBuffer is each path socket's receive buffer: about 2,700 queued
// datagrams (the kernel doubles it and charges about 768 bytes each), a
// pause of a second for 40 peers probing every 30 ms, or of 40 ms for 1,000.
const socketBuffer = 1 << 20

// dropsSince returns how many datagrams the socket dropped, full, since the
// last call, from a read's control messages (SO_RXQ_OVFL's count, which
// comes with every datagram once one was dropped).
func (pp *pathProbe) dropsSince(oob []byte) uint32 {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SO_RXQ_OVFL && len(m.Data) >= 4 {
			total := binary.NativeEndian.Uint32(m.Data)
			d := total - pp.overflows
			pp.overflows = total
			return d
		}
	}
	return 0
}

func (pp *pathProbe) close() {
	_ = pp.conn.Close()
	<-pp.closed
}

// read answers the peers' probes and records the echoes of this prober's,
// until the socket is closed.
func (p *Prober) read(pp *pathProbe, name string) {
	defer close(pp.closed)
	buf, oob := make([]byte, 64), make([]byte, unix.CmsgSpace(4))
	for {
		n, oobn, _, from, err := pp.conn.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			p.log.Warn("liveness: reading", "path", name, "err", err)
			time.Sleep(p.cfg.Interval)
			continue
		}
		drops := pp.dropsSince(oob[:oobn])
		m, err := parseMessage(buf[:n])
		addr := from.Addr().Unmap()
		p.mu.Lock()
		p.counters.SocketDrops += uint64(drops)
		// Only a peer's prober, from the port every prober uses: an
		// echo then goes only to a peer's prober (which ignores what it
		// did not ask for), one for one, whoever forged the probe.
		t := pp.targets[addr]
		switch {
		case err != nil || t == nil || int(from.Port()) != p.cfg.Port:
			p.counters.Ignored++
		case m.kind == kindProbe:
			// One echo for one probe, to the claimed peer's prober
			// (which ignores what it did not ask for): a forger makes
			// the node send no more than it sent, and nic_ingress
			// bounds how much that is (wire.go).
			p.counters.ProbesAnswered++
			// In the probe's version; a version 2 echo gives this
			// node's nonce for the peer as the key its probes carry.
			echo := message{kind: kindEcho, nonce: m.nonce, seq: m.seq, heldDown: t.state == Down, ready: t.ownReady(t.seq),
				v2: m.v2, speaksV2: true, key: t.nonce}
			p.mu.Unlock()
			_, _ = pp.conn.WriteToUDPAddrPort(echo.marshal(), from)
			continue
		case m.nonce != t.nonce || m.seq > t.seq || t.seq-m.seq > uint64(p.cfg.Multiplier):
			p.counters.Ignored++
		default:
			p.counters.EchoesReceived++
			t.peerV2 = m.v2 || m.speaksV2
			if m.v2 {
				t.key = m.key
			}
			t.answer(m.seq)
			was := t.state
			changed := t.heard(m.heldDown, m.ready, m.seq, t.seq)
			changed = t.echo(time.Now(), t.interval(p.cfg.Interval), t.seq) || changed
			if changed {
				p.logChange(pp.spec.Name, addr, t, was)
			}
			p.mu.Unlock()
			if changed {
				p.notify()
			}
			continue
		}
		p.mu.Unlock()
	}
}

// interval is how far apart the target's probes go now.
func (t *target) interval(base time.Duration) time.Duration {
	return base * time.Duration(t.every)
}

// newTarget is a peer probed with nonce, whose first probe has sequence
// number 1 and whose echoes may come multiplier probes late.
func newTarget(node string, nonce uint64, multiplier int) *target {
	return &target{node: node, nonce: nonce, echoed: make([]bool, LossWindow+multiplier+1), first: 1, upSince: 1, lost: -1}
}

// Nonce is the nonce of this prober's probes from local to peer (wire.go):
// keyed by the prober's secret, so that it is unknown off the path, and the
// same for the prober's life, so that the datapath's filter (which checks
// it) can be written whenever the peers are. The peer's node is part of
// it: a node that leaves and whose address another node takes knows
// nothing of the newcomer's nonce.
func (p *Prober) Nonce(local netip.Addr, peer Peer) uint64 {
	mac := hmac.New(sha256.New, p.secret[:])
	l, r := local.Unmap().As16(), peer.Addr.Unmap().As16()
	mac.Write(l[:])
	mac.Write(r[:])
	mac.Write([]byte(peer.Node))
	return binary.BigEndian.Uint64(mac.Sum(nil))
}

// echo records an echo at now, in the tick of sequence number seq; it
// returns whether the peer's state changed.
func (t *target) echo(now time.Time, interval time.Duration, seq uint64) bool {
	if !t.lastEcho.IsZero() && now.Sub(t.lastEcho) <= 2*interval {
		t.streak++
	} else {
		t.streak = 1
	}
	t.lastEcho, t.earlyAt = now, 0
	switch {
	case t.state == Unknown:
		t.up(seq)
		return true
	case t.mayComeUp(seq):
		t.up(seq)
		return true
	}
	return false
}

// up makes the peer Up in the tick of sequence number seq: losses from
// then on count.
func (t *target) up(seq uint64) {
	t.state, t.lossy, t.byPeer, t.silentEverywhere, t.upSince = Up, false, false, false, seq+1
}

// heard records whether the peer holds this node Down on the path, and
// whether it is ready to let it Up, as its echo of the probe of sequence
// number echoSeq says, in the tick of sequence number seq; it returns
// whether the peer's state changed. An echo older than the one the flags
// were last read from says nothing: a late "held" must not make a new
// change of one the peer has let go. The peer's change from not holding
// this node Down to holding it takes an Up peer Down at once, for loss:
// the peer's probes found the failure first (a path losing at random is
// found by one node's window before the other's, by hundreds of
// milliseconds), and the subflows of both nodes then leave it at once. It
// comes back when both nodes would let it (mayComeUp); a peer that held
// this node Down already when the prober first heard of it (it was
// Unknown, or Down) takes nothing down, so an agent that restarts during
// its peer's hold does not go down with it.
func (t *target) heard(heldDown, ready bool, echoSeq, seq uint64) bool {
	if echoSeq < t.flagSeq {
		return false
	}
	t.flagSeq = echoSeq
	edge := heldDown && !t.heldByPeer
	t.heldByPeer, t.peerReady = heldDown, heldDown && ready
	if !edge || t.state != Up {
		return false
	}
	t.down(seq, true)
	t.byPeer = true
	return true
}

// down makes an Up peer Down in the tick of sequence number seq, for loss
// or silence, and holds it Down for LossWindow ticks.
func (t *target) down(seq uint64, lossy bool) {
	t.state, t.lossy, t.heldUntil = Down, lossy, seq+LossWindow
	if t.peer != nil {
		t.peer.downAt = time.Now()
	}
	t.silentFrom, t.silentTo = 0, 0
	if !lossy {
		t.silence(t.answered + 1)
	}
	t.downs++
}

// silence opens a silence at sequence number from: the probes from there
// to the first answered are the outage (cleanRun does not hold them
// against the peer's return).
func (t *target) silence(from uint64) {
	t.silentFrom, t.silentTo = from, math.MaxUint64
}

// answer records the echo of the probe of sequence number seq, which ends
// an open silence.
func (t *target) answer(seq uint64) {
	t.echoed[seq%uint64(len(t.echoed))] = true
	t.answered = max(t.answered, seq)
	if t.silentTo == math.MaxUint64 && seq >= t.silentFrom {
		t.silentTo = seq - 1
	}
}

// mayComeUp tells whether a Down peer is Up again in the tick of sequence
// number seq: this node's own rules let it (ownReady), and the peer does
// not hold this node Down, or would let it Up but for this node (its
// echoes' flags). So both nodes take a path back within an echo of each
// other, when the later of the two finds it clean: one that came back
// alone sent its subflows home while the other still detoured its
// replies, which moved them away again and, after the datapath's settling
// time, home (a quarter of a second lost to a repair, in e2e). A peer
// whose agent knows no flags never holds this node Down by them.
//
// The wait is bounded: a peer that holds this node Down and has not said it
// is ready a window (LossWindow ticks) after this node was, is left to come
// back by its own rules (an agent that knows the held flag and not the
// ready one, a broken or forging peer). mayComeUp records when this node
// was first ready; it is called at every tick and echo.
func (t *target) mayComeUp(seq uint64) bool {
	if !t.ownReady(seq) {
		t.readySince = 0
		return false
	}
	if t.readySince == 0 {
		t.readySince = seq
	}
	return !t.heldByPeer || t.peerReady || seq >= t.readySince+LossWindow
}

// ownReady tells whether this node's own rules let a Down peer Up in the
// tick of sequence number seq: its echoes came UpAfter in a row, the last
// ClearRun probes up to the newest answered lost nothing besides the
// silence that took the peer Down (cleanRun), and it has been Down for
// LossWindow ticks. That hold is what tells a path back from an outage
// from one that loses at random and began with a silence: by then the
// run shows the probes after the silence, and any loss among them.
func (t *target) ownReady(seq uint64) bool {
	return t.state == Down && t.streak >= UpAfter && seq >= t.heldUntil && t.cleanRun(seq)
}

// cleanRun tells whether the ClearRun probes up to the newest answered
// were all answered, those of the silence that took the peer Down aside,
// seq being the newest probe sent. A probe older than the newest answered
// and not answered yet counts as lost: on one path, echoes come back in
// order. Probes after the newest answered need no look: once none has
// come back for two intervals the streak is over (expire), and ownReady
// says no before any of them is overdue.
func (t *target) cleanRun(seq uint64) bool {
	n, end := uint64(len(t.echoed)), t.answered
	if end+1 < t.first+ClearRun || end > seq || end+n < seq+ClearRun {
		return false // fewer than ClearRun probes answered, or the run is older than the ring
	}
	for s := end + 1 - ClearRun; s <= end; s++ {
		if !t.echoed[s%n] && (s < t.silentFrom || s > t.silentTo) {
			return false
		}
	}
	return true
}

// tally judges the window of the last LossWindow probes whose echo can no
// longer come, seq being the tick's sequence number (sent now) and
// multiplier how many ticks an echo may take; it returns whether the
// peer's state changed. An Up peer that lost LossyAt of the window's probes
// sent since it was Up is Down for loss. A Down peer whose echoes come in a
// row is Up again once its last ClearRun probes lost nothing outside the
// silence that made the peer Down (mayComeUp). So a path back from a total
// failure is Up after UpAfter echoes, and one that loses at random only
// once the losses are ClearRun probes behind, however it went down: a path
// losing half its round trips goes silent for multiplier intervals now and
// then, and must not come back for its next three echoes in a row.
func (t *target) tally(seq uint64, multiplier int) bool {
	n := uint64(len(t.echoed))
	t.echoed[seq%n] = false // sent now, not answered yet
	t.lost = -1
	if seq <= uint64(multiplier)+1 {
		return false
	}
	last := seq - uint64(multiplier) - 1 // the newest probe whose echo is too late to count
	from := t.first
	if last >= LossWindow && last+1-LossWindow > from {
		from = last + 1 - LossWindow
	}
	lost, sinceUp := 0, 0
	for s := from; s <= last; s++ {
		if t.echoed[s%n] {
			continue
		}
		lost++
		if s >= t.upSince {
			sinceUp++
		}
	}
	if last+1-from == LossWindow {
		t.lost = lost
	}
	switch {
	case t.state == Up && sinceUp >= LossyAt:
		t.down(seq, true)
		return true
	case t.mayComeUp(seq):
		t.up(seq)
		return true
	}
	return false
}

// peerView is what a tick knows of one peer node over all its paths,
// before judging any of them: a silence on one path means that path failed
// only when the peer is heard on another. A peer silent on every path at
// once (its agent restarting or starved of CPU, its node gone) says nothing
// of the paths, and no path would be better for it: taking them all Down
// only took every path of this node down with it, and counted a failure on
// each, at every upgrade of a peer's agent.
type peerView struct {
	// echoed: the peer's paths that ever echoed; alive: one of them
	// echoed within the last two intervals (the peer answers now);
	// waiting: one of them is Up and not silent for the detect time yet.
	echoed         int
	alive, waiting bool
}

// viewOf sums up a peer node's targets over the paths, at now.
func (p *Prober) viewOf(node *peerNode, now time.Time) peerView {
	var v peerView
	for _, nt := range node.targets {
		t := nt.t
		if t.lastEcho.IsZero() {
			continue
		}
		interval := t.interval(p.cfg.Interval)
		v.echoed++
		v.alive = v.alive || now.Sub(t.lastEcho) <= 2*interval
		v.waiting = v.waiting || (t.state == Up && now.Sub(t.lastEcho) <= time.Duration(p.cfg.Multiplier)*interval)
	}
	return v
}

// expire turns an Up peer that has not echoed for multiplier intervals
// Down in the tick of sequence number seq, when peer, the peer's view over
// all its paths, says the silence is this path's: the peer echoed on one
// path only, or it answers now on another. While another path of the peer
// may still answer, it waits; when none does, the peer is silent on every
// path, and Unknown on this one, as a peer that never echoed is. It
// returns whether the peer's state changed.
func (t *target) expire(now time.Time, interval time.Duration, multiplier int, seq uint64, peer peerView) bool {
	if now.Sub(t.lastEcho) > 2*interval {
		t.streak = 0
	}
	if t.state == Up && now.Sub(t.lastEcho) > time.Duration(multiplier)*interval {
		switch {
		case peer.echoed < 2 || peer.alive:
			t.down(seq, false)
			return true
		case peer.waiting:
			return false
		}
		t.state, t.silentEverywhere = Unknown, true
		return true
	}
	if t.state == Down && t.lastEcho.IsZero() && !t.assumedUntil.IsZero() && now.After(t.assumedUntil) {
		t.state = Unknown
		return true
	}
	return false
}

// run sends a probe to every peer of every path each interval and expires
// the peers that stopped echoing.
func (p *Prober) run(ctx context.Context) {
	defer close(p.done)
	tick := time.NewTicker(p.cfg.Interval)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		// A tick more than two intervals late means this process did
		// not run meanwhile (CPU starved, a long GC pause): the echoes
		// that arrived are still in the sockets, unread. Expiring now
		// would take healthy paths down; the next tick decides.
		late := time.Since(last) > 2*p.cfg.Interval
		last = time.Now()
		sends, changed := p.probeDue(last, late)
		if changed {
			p.notify()
		}
		for _, s := range sends {
			// A path without carrier or route fails here at every
			// probe; its peers expire, which is what it means.
			_, _ = s.conn.WriteToUDPAddrPort(s.msg, s.to)
		}
	}
}

// probeSend is a probe to send once the prober's lock is released.
type probeSend struct {
	conn *net.UDPConn
	to   netip.AddrPort
	msg  []byte
}

// probeDue judges every target due at this tick (unless late: then none
// expires) and returns the probes to send, and whether a state changed.
func (p *Prober) probeDue(now time.Time, late bool) (sends []probeSend, changed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.tick++
	p.judgeTraffic(now)
	early, from, resume := MaxEarlyProbes, p.earlyFrom, -1
	for i := range p.order {
		node := p.order[(from+i)%len(p.order)]
		idleDue := (p.tick+node.phase)%p.idleEvery == 0
		if !node.busy && !node.recovering && !idleDue && !node.earlyDue(p.tick) {
			continue
		}
		// The peer's view over all its paths, before judging any of
		// them.
		view := p.viewOf(node, now)
		for _, nt := range node.targets {
			t, addr, pp := nt.t, nt.addr, nt.pp
			every := p.idleEvery
			if node.busy || (node.recovering && t.state == Down) {
				every = 1
			}
			if every != 1 && !idleDue {
				if !t.earlyDue(p.tick) {
					continue
				}
				if early == 0 {
					if resume < 0 {
						resume = (from + i) % len(p.order)
					}
					continue
				}
				early--
				t.nextEarly(p.tick, p.idleEvery)
			}
			t.setCadence(every, now, p.cfg.BusyFor)
			t.seq++
			interval := t.interval(p.cfg.Interval)
			if !late {
				was := t.state
				// Both, always: tally also clears the slot of the
				// probe sent now.
				expired := t.expire(now, interval, p.cfg.Multiplier, t.seq, view)
				if t.tally(t.seq, p.cfg.Multiplier) || expired {
					p.logChange(pp.spec.Name, addr, t, was)
					changed = true
				}
			} else {
				t.echoed[t.seq%uint64(len(t.echoed))] = false
			}
			// A peer silent for the detect time may have gone back to
			// version 1 (a rollback): every other probe is then one
			// every agent reads, and its echo says which version the
			// peer speaks.
			v2 := t.peerV2 && (t.seq%2 == 0 || now.Sub(t.lastEcho) <= time.Duration(p.cfg.Multiplier)*interval)
			sends = append(sends, probeSend{pp.conn, netip.AddrPortFrom(addr, uint16(p.cfg.Port)),
				message{kind: kindProbe, nonce: t.nonce, seq: t.seq, v2: v2, key: t.key}.marshal()})
		}
	}
	if resume >= 0 {
		p.earlyFrom = resume
	}
	p.counters.ProbesSent += uint64(len(sends))
	return sends, changed
}

// judgeTraffic decides, at now, which peer nodes are busy: without a
// Traffic source, all of them; with one, within MaxBusyPaths, those the
// node's pods sent to within BusyFor (those sent to last first), those
// whose traffic cannot be told (no slot), and, recovering (their Down
// paths only), those that went Down within BusyFor (a repair within that
// time is found as soon as for a busy peer: an idle peer comes back only
// after a window of idle probes and a run of them answered).
func (p *Prober) judgeTraffic(now time.Time) {
	wanting := p.wanting[:0]
	for _, node := range p.order {
		node.busy, node.recovering, node.over = p.cfg.Traffic == nil, false, false
		switch {
		case node.busy:
		case node.slot == 0:
			wanting = append(wanting, wantingPeer{node: node, rank: rankUnknown})
		default:
			if since, ok := p.cfg.Traffic.Since(node.slot); ok && since < p.cfg.BusyFor {
				wanting = append(wanting, wantingPeer{node: node, rank: rankTraffic, since: since})
			} else if since := now.Sub(node.downAt); since < p.cfg.BusyFor {
				wanting = append(wanting, wantingPeer{node: node, rank: rankRecovering, since: since})
			}
		}
	}
	slices.SortFunc(wanting, func(a, b wantingPeer) int {
		return cmp.Or(cmp.Compare(a.rank, b.rank), cmp.Compare(a.since, b.since), strings.Compare(a.node.name, b.node.name))
	})
	budget := MaxBusyPaths
	for _, w := range wanting {
		n := len(w.node.targets)
		if w.rank == rankRecovering {
			n = w.node.downTargets()
		}
		if n > budget {
			w.node.over = true
			continue
		}
		budget -= n
		if w.rank == rankRecovering {
			w.node.recovering = true
		} else {
			w.node.busy = true
		}
	}
	clear(wanting)
	p.wanting = wanting[:0]
}

// earlyDue tells whether one of the node's targets is due for a probe
// before its first echo at tick.
func (node *peerNode) earlyDue(tick uint64) bool {
	return slices.ContainsFunc(node.targets, func(nt nodeTarget) bool { return nt.t.earlyDue(tick) })
}

// earlyDue tells whether the target, which never echoed, is due for a
// probe off its cadence at tick.
func (t *target) earlyDue(tick uint64) bool {
	return t.earlyAt != 0 && t.earlyAt <= tick
}

// nextEarly schedules the target's next early probe after the one at
// tick: twice as far as the last, none once that reaches the idle
// cadence.
func (t *target) nextEarly(tick, idleEvery uint64) {
	t.earlyGap *= 2
	t.earlyAt = tick + t.earlyGap
	if t.earlyGap >= idleEvery {
		t.earlyAt = 0
	}
}

// downTargets counts the node's targets that are Down.
func (node *peerNode) downTargets() int {
	n := 0
	for _, nt := range node.targets {
		if nt.t.state == Down {
			n++
		}
	}
	return n
}

// setCadence has the target probed every ticks from now. A peer Up at the
// idle cadence that becomes busy is held to the interval from now, once in
// graceEvery: its last echo may be an idle interval old, which says nothing
// of a silence yet; a peer made busy and idle again and again (a pod that
// sends to it in short bursts) must not keep a dead path alive by it.
func (t *target) setCadence(every uint64, now time.Time, graceEvery time.Duration) {
	if every < t.every && t.state == Up && t.lastEcho.Before(now) && now.Sub(t.graced) >= graceEvery {
		t.lastEcho, t.graced = now, now
	}
	t.every = every
}

// logChange logs a peer's change of state on a path (from was).
func (p *Prober) logChange(path string, addr netip.Addr, t *target, was State) {
	reason := "echoes"
	switch {
	case t.state == Down && t.byPeer:
		reason = "the peer holds this node down"
	case t.state == Down && t.lossy:
		reason = "lost too many echoes"
	case t.state == Down:
		reason = "silent"
	case t.state == Unknown && t.silentEverywhere:
		reason = "silent on every path: the peer's agent or node, not a path"
	case t.state == Unknown:
		reason = "never echoed since assumed down"
	}
	p.log.Info("liveness: peer changed", "path", path, "peer", t.node, "addr", addr, "from", was.String(), "to", t.state.String(),
		"reason", reason, "lostOfWindow", t.lost, "window", LossWindow)
}

func (p *Prober) notify() {
	if p.changed != nil {
		p.changed()
	}
}

// Silent reports whether no peer is Up on path and at least one is Down:
// the path carries nothing to anyone known to answer. A peer that never
// echoed (Unknown: its agent may not probe, or not yet) counts as neither,
// so that peers without liveness never take a path down, and a new peer
// does not bring back a path whose peers all stopped.
func (p *Prober) Silent(path uint32) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	pp := p.paths[path]
	if pp == nil {
		return false
	}
	down := false
	for _, t := range pp.targets {
		switch t.state {
		case Up:
			return false
		case Down:
			down = true
		}
	}
	return down
}

// States lists every peer of every path, by path index and peer address.
func (p *Prober) States() []PeerState {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []PeerState
	for index, pp := range p.paths {
		for addr, t := range pp.targets {
			out = append(out, PeerState{Path: index, Peer: Peer{Node: t.node, Addr: addr, Slot: t.peer.slot}, State: t.state,
				Lost: t.lost, Downs: t.downs, Busy: t.peer.busy || (t.peer.recovering && t.state == Down), OverBusyLimit: t.peer.over})
		}
	}
	slices.SortFunc(out, func(a, b PeerState) int {
		if a.Path != b.Path {
			return int(a.Path) - int(b.Path)
		}
		return a.Peer.Addr.Compare(b.Peer.Addr)
	})
	return out
}

// Counters are the datagrams since New.
func (p *Prober) Counters() Counters {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.counters
}

// Close stops probing and closes every socket.
func (p *Prober) Close() {
	p.cancel()
	<-p.done
	p.mu.Lock()
	p.closed = true
	paths := p.paths
	p.paths = map[uint32]*pathProbe{}
	p.mu.Unlock()
	for _, pp := range paths {
		pp.close()
	}
}
