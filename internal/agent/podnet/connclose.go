package podnet

import (
	"net/netip"
	"time"

	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
)

// When a whole connection closes, the pod's kernel reports the connection
// (MPTCP_EVENT_CLOSED), not its subflows one by one: a subflow is reported
// closed only while its connection lives. Each subflow still holds an entry
// of the node's subflow table, in the pod's share of it, until the agent's
// sweep finds its socket gone, a minute or two later; a pod that opens
// thousands of short connections a minute would fill its share, and its
// next connections would go unplaced, their joins refused. So the path
// manager remembers the subflows of the pod's connections, opened and
// accepted, while they live, and after a connection's close tells the
// datapath that each of them closed, as it does for a subflow closed alone.
//
// Not at the close itself: the kernel reports it when the application lets
// go of the socket, and the subflows go on sending what it wrote, and
// retransmitting, until the peer has it all. Their entries keep placing and
// capping those packets. So the closed connection's subflows queue, and a
// check every closeCheckInterval lists the pod's open TCP sockets and gives
// back those of the queue that are gone (TIME_WAIT counts as gone: it sends
// nothing but a last ACK), once the close is ClosedEntryGrace old: what the
// tables say of a connection that just ended stays readable a while (the
// agent's local API, `kubectl mptcp`, tests), and a pod still gets through
// its share of the table thousands of connections a second no sooner.

// liveConn is a connection's established subflows, as the events report
// them.
type liveConn struct {
	accepted bool
	subflows map[subflowKey]bool
}

// liveConns are the pod's connections by token, and how many of them the
// pod accepted. Only the path manager's goroutine uses it, under openedMu.
type liveConns struct {
	m        map[uint32]*liveConn
	accepted int
}

// maxLiveSubflows bounds the subflows remembered per connection: a
// connection whose peer keeps opening joins is remembered up to it, and
// the sweep finds the rest.
const maxLiveSubflows = 2 * maxReplacedJoins

// established remembers the first subflow of a connection just established.
// The pod's own connections and those it accepted each count against
// maxTrackedConns, so that a peer holding many connections open to a server
// pod takes nothing from the pod's own; past it, the sweep finds their
// closes.
func (c *liveConns) established(ev mptcpnl.Event) {
	if c.m == nil {
		c.m = map[uint32]*liveConn{}
	}
	c.forget(ev.Token)
	if c.count(ev.ServerSide) >= maxTrackedConns {
		return
	}
	c.m[ev.Token] = &liveConn{accepted: ev.ServerSide, subflows: map[subflowKey]bool{unmapped(ev): true}}
	if ev.ServerSide {
		c.accepted++
	}
}

func (c *liveConns) count(accepted bool) int {
	if accepted {
		return c.accepted
	}
	return len(c.m) - c.accepted
}

func (c *liveConns) subflowEstablished(ev mptcpnl.Event) {
	if conn := c.m[ev.Token]; conn != nil && len(conn.subflows) < maxLiveSubflows {
		conn.subflows[unmapped(ev)] = true
	}
}

func (c *liveConns) subflowClosed(ev mptcpnl.Event) {
	if conn := c.m[ev.Token]; conn != nil {
		delete(conn.subflows, unmapped(ev))
	}
}

// forget forgets the connection token and returns its subflows.
func (c *liveConns) forget(token uint32) map[subflowKey]bool {
	conn := c.m[token]
	if conn == nil {
		return nil
	}
	delete(c.m, token)
	if conn.accepted {
		c.accepted--
	}
	return conn.subflows
}

func (c *liveConns) clear() {
	clear(c.m)
	c.accepted = 0
}

// closingSubflow is a subflow of a closed connection whose entry waits for
// its socket to go.
type closingSubflow struct {
	key   subflowKey
	token uint32
	// heard is when the connection's close was heard: an entry the
	// datapath placed after it is a new subflow of the same 4-tuple, and
	// stays.
	heard time.Time
}

// The pace and bounds of the closed connections' checks: one listing of
// the pod's open sockets per closeCheckInterval while subflows wait, at
// most maxClosing of them queued per pod (past it, the sweep finds the
// rest), each waiting at most maxCloseWait (a socket that lives longer, the
// sweep finds too).
const (
	closeCheckInterval = time.Second
	maxClosing         = 1 << 14
	maxCloseWait       = 2 * time.Minute
)

// connectionClosedSubflows queues the subflows the connection token still
// had, closed at heard, for their entries to go once their sockets have.
// Under openedMu.
func (s *pathManager) connectionClosedSubflows(sess *session, token uint32, heard time.Time) {
	sfs := s.live.forget(token)
	if s.closed == nil || len(sfs) == 0 {
		return
	}
	for k := range sfs {
		if s.owns(k.local.Addr()) && len(s.closing) < maxClosing {
			s.closing = append(s.closing, closingSubflow{key: k, token: token, heard: heard})
		}
	}
	s.checkClosingLater(sess)
}

// checkClosingLater checks the queue after closeCheckInterval, unless a
// check is due already.
func (s *pathManager) checkClosingLater(sess *session) {
	if len(s.closing) == 0 || sess.closingDue.Swap(true) {
		return
	}
	sess.later(closeCheckInterval, func() { s.checkClosing(sess) })
}

// checkClosing gives back the entries of queued subflows whose sockets are
// gone, and checks again later while some wait.
func (s *pathManager) checkClosing(sess *session) {
	open := map[subflowKey]bool{}
	socks, err := s.listOpenSockets()
	s.openedMu.Lock()
	sess.closingDue.Store(false)
	if err != nil {
		// The sweep finds them.
		s.log.Debug("listing the pod's open sockets: closed connections' entries wait for the sweep", "err", err)
		s.closing = nil
		s.openedMu.Unlock()
		return
	}
	for _, e := range socks {
		open[subflowKey{unmap(e.Local), unmap(e.Remote)}] = true
	}
	now := time.Now()
	var gone []closingSubflow
	waiting := s.closing[:0]
	for _, c := range s.closing {
		switch {
		case !open[c.key] && now.Sub(c.heard) >= s.closedGrace:
			gone = append(gone, c)
		case now.Sub(c.heard) < maxCloseWait:
			waiting = append(waiting, c)
		}
	}
	s.closing = waiting
	s.checkClosingLater(sess)
	s.openedMu.Unlock()
	// Outside the lock: the pod's events wait for none of it.
	for _, c := range gone {
		if _, err := s.closed(c.key.local, c.key.remote, c.token, c.heard); err != nil {
			s.log.Debug("giving a closed connection's subflow back", "local", c.key.local, "remote", c.key.remote, "err", err)
		}
	}
}

func unmap(a netip.AddrPort) netip.AddrPort { return netip.AddrPortFrom(a.Addr().Unmap(), a.Port()) }
