package podnet

import (
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
)

// A connection the pod opened keeps its joins. When the pod's kernel closes
// one of its established subflows while the connection lives (the peer or
// a middlebox reset it, a DSS checksum failed on it, its path stayed
// down), the path manager tells the datapath, which gives the subflow's
// path and count back to the connection, and then opens a join to replace
// it, which the datapath places on a free path again. Without this a
// connection that lost a subflow ran on fewer paths until it ended
// (docs/failover.md).

// maxReplacedJoins bounds the joins a path manager opens to replace closed
// ones, per connection: a peer that resets every join it accepts gets a
// few, not a loop.
const maxReplacedJoins = 8

// maxTrackedConns bounds the connections a path manager remembers: a pod
// that opens connections without end, or events lost to a full socket
// (their closes never heard), cannot grow the agent without bound. A
// connection past it gets its joins but no replacements.
const maxTrackedConns = 1 << 13

// subflowKey is a subflow's 4-tuple as the pod sends it.
type subflowKey struct{ local, remote netip.AddrPort }

// openedConn is a connection the pod opened.
type openedConn struct {
	remote netip.AddrPort
	// live are its established subflows: only those are replaced, so a
	// join that never completed its handshake is not tried again.
	live     map[subflowKey]bool
	replaced int
}

// openedConns are the pod's open connections by token. Only the path
// manager's goroutine uses it.
type openedConns map[uint32]*openedConn

func (c openedConns) established(ev mptcpnl.Event) {
	if _, reused := c[ev.Token]; !reused && len(c) >= maxTrackedConns {
		return
	}
	c[ev.Token] = &openedConn{remote: ev.Remote,
		live: map[subflowKey]bool{{ev.Local, ev.Remote}: true}}
}

func (c openedConns) subflowEstablished(ev mptcpnl.Event) {
	if conn := c[ev.Token]; conn != nil && len(conn.live) < 2*maxReplacedJoins {
		conn.live[subflowKey{ev.Local, ev.Remote}] = true
	}
}

// subflowClosed forgets the subflow and returns its connection when a join
// should replace it.
func (c openedConns) subflowClosed(ev mptcpnl.Event) *openedConn {
	conn := c[ev.Token]
	k := subflowKey{ev.Local, ev.Remote}
	if conn == nil || !conn.live[k] {
		return nil
	}
	delete(conn.live, k)
	if conn.replaced >= maxReplacedJoins {
		return nil
	}
	conn.replaced++
	return conn
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

// monotonicNs is CLOCK_MONOTONIC now, the clock of the datapath's
// bpf_ktime_get_ns.
func monotonicNs() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) // cannot fail on Linux
	return uint64(ts.Nano())
}

// handle acts on one event of the pod's kernel, read at heardNs
// (monotonicNs).
func (s *pathManager) handle(cmds *mptcpnl.Conn, ev mptcpnl.Event, heardNs uint64) {
	switch ev.Type {
	case mptcpnl.EventEstablished:
		if ev.ServerSide {
			return
		}
		s.opened.established(ev)
		s.openJoins(cmds, ev.Token, ev.Local.Addr(), ev.Remote)
	case mptcpnl.EventSubEstablished:
		s.opened.subflowEstablished(ev)
	case mptcpnl.EventSubClosed:
		s.subflowClosed(cmds, ev, heardNs)
	case mptcpnl.EventClosed:
		delete(s.opened, ev.Token)
	}
}

// subflowClosed gives the closed subflow's path back to its connection in
// the datapath, then opens a join to replace it when it was an established
// subflow of a connection the pod opened.
func (s *pathManager) subflowClosed(cmds *mptcpnl.Conn, ev mptcpnl.Event, heardNs uint64) {
	if !s.owns(ev.Local.Addr()) {
		return
	}
	if s.closed != nil {
		if err := s.closed(ev.Local, ev.Remote, heardNs); err != nil {
			s.log.Warn("giving a closed subflow's path back", "local", ev.Local, "remote", ev.Remote, "err", err)
		}
	}
	conn := s.opened.subflowClosed(ev)
	if conn == nil {
		return
	}
	if err := cmds.CreateSubflow(ev.Token, ev.Local.Addr(), 1, conn.remote); err != nil {
		s.log.Warn("opening a join to replace a closed subflow", "remote", conn.remote, "err", err)
		return
	}
	s.replacedJoins.Add(1)
	s.log.Info("a subflow closed; opened a join to replace it", "local", ev.Local, "remote", ev.Remote, "error", ev.Error, "replaced", conn.replaced)
}
