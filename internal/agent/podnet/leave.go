package podnet

import (
	"maps"
	"net/netip"
	"slices"
	"sync"

	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
)

// When a path goes down, the datapath detours its subflows over another
// path at once (docs/datapath.md, "Failover"). That is enough for a subflow
// whose packets were all acknowledged, or whose first retransmission
// timeout has not fired yet: it sends again over the detour. A subflow that
// was already recovering from losses when its path went down (a path losing
// part of its packets is found only after several round trips) waits out
// its backed-off retransmission timer first, and the whole connection
// waits with it: the data it holds is a hole in the stream the peer cannot
// deliver past. So the path manager closes such a subflow
// (MPTCP_PM_CMD_SUBFLOW_DESTROY): the pod's kernel sends all the data the
// peer has not acknowledged again, at once, over the connection's other
// subflows. When the path is back, a join replaces it there, as a join
// replaces any closed subflow (rejoin.go), but not before: opened while the
// path is down it would be placed on a live path and stay there.
// (docs/subflows.md, "Leaving a failed path").

// leaving is what a path manager left on paths that went down: the paths
// still down, the subflows it closed whose close it has not heard yet, and
// the joins to open when each path is back. mu guards it: the agent's
// goroutine writes it (LeavePath, PathBack), the path manager's reads it.
type leaving struct {
	mu   sync.Mutex
	down map[uint32]bool
	// closing are the subflows closed on a path, by 4-tuple, until their
	// close is heard: their replacement then waits for the path.
	closing map[subflowKey]uint32
	// awaiting are the replacements waiting for their path, by path and
	// connection token.
	awaiting map[uint32]map[uint32]awaitingJoin
}

// awaitingJoin is a replacement join waiting for its path.
type awaitingJoin struct {
	local  netip.Addr
	remote netip.AddrPort
}

// maxClosing bounds the subflows one path manager closes for one path
// going down: the pod decides how many connections it has.
const maxClosing = maxTrackedConns

// LeavePath closes, in every pod with a path manager, the subflows that
// onPath says are on path (their own path in the datapath, detoured or
// not) and that are recovering from losses, of connections the pod opened
// that keep a subflow on another path; their joins are opened again when
// PathBack says the path is back. It returns how many it closed.
func (p *PathManagers) LeavePath(path uint32, onPath func(local, remote netip.AddrPort) bool) int {
	n := 0
	for _, pm := range p.all() {
		n += pm.leave(path, onPath)
	}
	return n
}

// PathBack opens, in every pod with a path manager, the joins that replace
// the subflows LeavePath closed on path.
func (p *PathManagers) PathBack(path uint32) {
	for _, pm := range p.all() {
		pm.back(path)
	}
}

func (p *PathManagers) all() []*pathManager {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Collect(maps.Values(p.m))
}

// leave closes the pod's subflows LeavePath describes, and returns how many.
func (s *pathManager) leave(path uint32, onPath func(local, remote netip.AddrPort) bool) int {
	l := &s.leaving
	l.mu.Lock()
	if l.down == nil {
		l.down, l.closing, l.awaiting = map[uint32]bool{}, map[subflowKey]uint32{}, map[uint32]map[uint32]awaitingJoin{}
	}
	l.down[path] = true
	l.mu.Unlock()
	sess := s.current.Load()
	if sess == nil {
		return 0 // restarting: its pod's connections are not followed meanwhile
	}
	sfs, err := mptcpnl.ListSubflows(s.nsFD)
	if err != nil {
		s.log.Warn("listing the pod's subflows on a path that went down: they wait for their own retransmissions", "path", path, "err", err)
		return 0
	}
	n := 0
	for _, sf := range s.toLeave(sfs, onPath) {
		k := subflowKey{sf.Local, sf.Remote}
		l.mu.Lock()
		full := len(l.closing) >= maxClosing
		if !full {
			l.closing[k] = path
		}
		l.mu.Unlock()
		if full {
			break
		}
		// Recorded before the command: the pod's kernel reports the
		// close while it runs.
		if err := sess.cmds.DestroySubflow(sf.Token, sf.Local, sf.Remote); err != nil {
			l.mu.Lock()
			delete(l.closing, k)
			l.mu.Unlock()
			s.log.Debug("closing a subflow on a path that went down", "local", sf.Local, "remote", sf.Remote, "err", err)
			continue
		}
		n++
		s.leftSubflows.Add(1)
		s.log.Info("closed a subflow recovering from losses on a path that went down; its data goes again over the connection's other subflows",
			"path", path, "local", sf.Local, "remote", sf.Remote, "caState", sf.Loss.CAState, "backoff", sf.Loss.Backoff, "lost", sf.Loss.Lost, "retrans", sf.Loss.Retrans)
	}
	return n
}

// toLeave picks, among the pod's subflows sfs, those leave closes: on the path (onPath),
// recovering from losses, from the pod's own address, of a connection this
// end opened subflows of (the initial one or joins: only the opening end
// can join again) that keeps a subflow elsewhere.
func (s *pathManager) toLeave(sfs []mptcpnl.Subflow, onPath func(local, remote netip.AddrPort) bool) []mptcpnl.Subflow {
	opener := map[uint32]bool{}
	elsewhere := map[uint32]bool{}
	for _, sf := range sfs {
		if sf.Flags&(mptcpnl.SubflowCapableLocal|mptcpnl.SubflowJoinLocal) != 0 {
			opener[sf.Token] = true
		}
		if !onPath(sf.Local, sf.Remote) {
			elsewhere[sf.Token] = true
		}
	}
	var out []mptcpnl.Subflow
	for _, sf := range sfs {
		if opener[sf.Token] && elsewhere[sf.Token] && sf.Loss.Recovering() && s.owns(sf.Local.Addr()) && onPath(sf.Local, sf.Remote) {
			out = append(out, sf)
		}
	}
	return out
}

// closeHeard forgets the closed subflow ev reports among those leave
// closed, and says whether it was one (waits) and on which path. Only the
// path manager's goroutine calls it.
func (s *pathManager) closeHeard(ev mptcpnl.Event) (path uint32, waits bool) {
	l := &s.leaving
	l.mu.Lock()
	defer l.mu.Unlock()
	k := subflowKey{ev.Local, ev.Remote}
	path, waits = l.closing[k]
	delete(l.closing, k)
	return path, waits
}

// awaitPath records the join that replaces the subflow ev reports closed,
// to remote, for when path is back, and says so; false when the path is
// back already (the join is opened now). Only the path manager's goroutine
// calls it.
func (s *pathManager) awaitPath(path uint32, ev mptcpnl.Event, remote netip.AddrPort) bool {
	l := &s.leaving
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.down[path] {
		return false
	}
	if l.awaiting[path] == nil {
		l.awaiting[path] = map[uint32]awaitingJoin{}
	}
	l.awaiting[path][ev.Token] = awaitingJoin{local: ev.Local.Addr(), remote: remote}
	return true
}

// connectionClosed forgets the replacements the closed connection token
// awaits. Only the path manager's goroutine calls it.
func (s *pathManager) connectionClosed(token uint32) {
	l := &s.leaving
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, joins := range l.awaiting {
		delete(joins, token)
	}
}

// forgetLeaving forgets the closes not heard yet and the replacements
// awaited, when events were lost: the connections they name may be gone.
func (s *pathManager) forgetLeaving() {
	l := &s.leaving
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.closing)
	clear(l.awaiting)
}

// back opens the joins awaiting path.
func (s *pathManager) back(path uint32) {
	l := &s.leaving
	l.mu.Lock()
	delete(l.down, path)
	joins := l.awaiting[path]
	delete(l.awaiting, path)
	l.mu.Unlock()
	if len(joins) == 0 {
		return
	}
	sess := s.current.Load()
	if sess == nil {
		return
	}
	for token, j := range joins {
		if err := openJoin(sess.cmds, token, j.local, j.remote, s.holdoff > 0); err != nil {
			s.log.Warn("opening a join to replace a subflow closed on a path that went down", "path", path, "remote", j.remote, "err", err)
			continue
		}
		s.replacedJoins.Add(1)
		s.log.Info("a path is back; opened a join to replace the subflow closed on it", "path", path, "local", j.local, "remote", j.remote)
	}
}
