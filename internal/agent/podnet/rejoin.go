package podnet

import (
	"net/netip"
	"time"

	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
)

// A connection the pod opened keeps its joins. When the pod's kernel closes
// one of its established subflows while the connection lives (the peer or
// a middlebox reset it, a DSS checksum failed on it), the path manager
// tells the datapath, which gives the subflow's path and count back to the
// connection, and then opens a join to replace it, which the datapath
// places on a free path again; if the subflow's path is down, when it is
// back (leave.go). Without this a connection that lost a subflow ran on
// fewer paths until it ended (docs/subflows.md, "Replacing closed
// subflows").

// maxReplacedJoins bounds the joins a path manager opens to replace closed
// ones, per connection: a peer that resets every join it accepts gets a
// few, not a loop.
const maxReplacedJoins = 8

// maxTrackedConns bounds the connections a path manager remembers: a pod
// that opens connections without end, or events lost to a full socket
// (their closes never heard), cannot grow the agent without bound. A
// connection past it gets its joins but no replacements.
const maxTrackedConns = 1 << 13

// subflowKey is a subflow's 4-tuple as the pod sends it, IPv4 addresses
// unmapped (as sock_diag lists them: unmapped(ev) for an event's).
type subflowKey struct{ local, remote netip.AddrPort }

// firstReplaceDelay is how long a path manager waits before it opens the
// join replacing a closed subflow: long enough for the peer's node to have
// heard the close too (its agent gives the subflow's count back there, and
// under a rule's maximum would refuse the replacement before). A
// replacement that fails to establish is tried again after twice as long,
// up to maxReplaceDelay, within maxReplacedJoins.
const (
	firstReplaceDelay = 20 * time.Millisecond
	maxReplaceDelay   = 2 * time.Second
)

// openedConn is a connection the pod opened.
type openedConn struct {
	local  netip.Addr
	remote netip.AddrPort
	// waiting is set while its joins wait for the rule's threshold
	// (threshold.go).
	waiting *waitingJoins
	// live are its established subflows: only those are replaced, so a
	// join that never completed its handshake is not tried again, unless
	// it was a replacement (pending).
	live map[subflowKey]bool
	// replaced counts the replacements opened; pending those not yet
	// established or failed; delay is the wait before the next one.
	replaced, pending int
	delay             time.Duration
}

// openedConns are the pod's open connections by token. Only the path
// manager's goroutine uses it.
type openedConns map[uint32]*openedConn

// established remembers a connection the pod opened, and returns it; nil
// when there are too many already.
func (c openedConns) established(ev mptcpnl.Event) *openedConn {
	if _, reused := c[ev.Token]; !reused && len(c) >= maxTrackedConns {
		return nil
	}
	conn := &openedConn{local: ev.Local.Addr(), remote: ev.Remote, delay: firstReplaceDelay,
		live: map[subflowKey]bool{unmapped(ev): true}}
	c[ev.Token] = conn
	return conn
}

func (c openedConns) subflowEstablished(ev mptcpnl.Event) {
	conn := c[ev.Token]
	if conn == nil || len(conn.live) >= 2*maxReplacedJoins {
		return
	}
	conn.live[unmapped(ev)] = true
	if conn.pending > 0 {
		// A replacement made it: the next one waits the shortest again.
		conn.pending--
		conn.delay = firstReplaceDelay
	}
}

// replaceable says whether a join would replace the subflow k of the
// connection token if it closed now (subflowClosed): an established subflow
// of a connection the pod opened and the path manager remembers, with
// replacements left.
func (c openedConns) replaceable(token uint32, k subflowKey) bool {
	conn := c[token]
	return conn != nil && conn.live[k] && conn.replaced < maxReplacedJoins
}

// subflowClosed forgets the subflow; when a join should replace it (it was
// established, or it was a replacement that failed), it returns how long
// to wait before opening one, and ok.
func (c openedConns) subflowClosed(ev mptcpnl.Event) (delay time.Duration, ok bool) {
	conn := c[ev.Token]
	if conn == nil {
		return 0, false
	}
	k := unmapped(ev)
	switch {
	case conn.live[k]:
		delete(conn.live, k)
	case conn.pending > 0:
		conn.pending--
		conn.delay = min(2*conn.delay, maxReplaceDelay)
	default:
		return 0, false
	}
	if conn.replaced >= maxReplacedJoins {
		return 0, false
	}
	conn.replaced++
	conn.pending++
	return conn.delay, true
}

// owns says whether addr is one of the pod's: an event about another
// address is not the pod's to report.
func (s *pathManager) owns(addr netip.Addr) bool {
	for _, ip := range s.pod.IPs {
		if ip.Unmap() == addr.Unmap() {
			return true
		}
	}
	return false
}

// handle acts on one event of the pod's kernel, read at heard.
func (s *pathManager) handle(sess *session, ev mptcpnl.Event, heard time.Time) {
	s.openedMu.Lock()
	defer s.openedMu.Unlock()
	switch ev.Type {
	case mptcpnl.EventEstablished:
		s.live.established(ev)
		if ev.ServerSide {
			return
		}
		s.established(sess, s.opened.established(ev), ev)
	case mptcpnl.EventSubEstablished:
		s.live.subflowEstablished(ev)
		s.opened.subflowEstablished(ev)
		s.joinEstablished(sess, ev)
	case mptcpnl.EventSubClosed:
		s.live.subflowClosed(ev)
		s.subflowClosed(sess, ev, heard)
	case mptcpnl.EventClosed:
		delete(s.opened, ev.Token)
		s.connectionClosed(ev.Token)
		s.connectionClosedSubflows(sess, ev.Token, heard)
	}
}

// subflowClosed gives the closed subflow's path back to its connection in
// the datapath, then, when it was an established subflow of a connection
// the pod opened (or a replacement that failed), opens a join to replace
// it after a short wait, or when its path is back if that is down, without
// holding up the pod's other events.
func (s *pathManager) subflowClosed(sess *session, ev mptcpnl.Event, heard time.Time) {
	if !s.owns(ev.Local.Addr()) {
		return
	}
	var placed uint32
	if s.closed != nil {
		p, err := s.closed(ev.Local, ev.Remote, ev.Token, heard)
		if err != nil {
			s.log.Warn("giving a closed subflow's path back", "local", ev.Local, "remote", ev.Remote, "err", err)
		}
		placed = p
	}
	// Closed by leave, or by the kernel while its own path is down (a
	// reset, a checksum failure on the detour): its replacement waits for
	// the path, its own if that is down, else the one leave named. Opened
	// now, the datapath would place it on a live path for good.
	path, waits := s.closeHeard(ev)
	if placed != 0 && s.isDown(placed) {
		path, waits = placed, true
	}
	delay, ok := s.opened.subflowClosed(ev)
	if !ok {
		return
	}
	remote := s.opened[ev.Token].remote
	if waits && s.awaitPath(path, ev, remote) {
		s.log.Debug("a subflow closed on a path that is down; a join replaces it when the path is back", "path", path, "local", ev.Local, "remote", remote)
		return
	}
	// The replacement is held like any join of a remembered connection.
	sess.later(delay, func() {
		if err := openJoin(sess.cmds, ev.Token, ev.Local.Addr(), remote, s.holdoff > 0); err != nil {
			s.log.Warn("opening a join to replace a closed subflow", "remote", remote, "err", err)
			return
		}
		s.replacedJoins.Add(1)
		s.log.Info("a subflow closed; opened a join to replace it", "local", ev.Local, "remote", remote, "error", ev.Error)
	})
}
