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
// the joins to open when each path is back (replacing those, and subflows
// the pod's kernel closed on a path while it was down). mu guards it: the
// agent's goroutines write it (PathDown, LeavePath, PathBack), the path
// manager's reads it.
type leaving struct {
	mu   sync.Mutex
	down map[uint32]bool
	// closing are the subflows closed on a path, by 4-tuple, until their
	// close is heard: their replacement then waits for the path.
	closing map[subflowKey]uint32
	// awaiting are the replacements waiting for their path, by path and
	// connection token.
	awaiting map[uint32]map[uint32]awaitingJoins
}

// awaitingJoins are the replacement joins of one connection waiting for
// their path.
type awaitingJoins struct {
	local  netip.Addr
	remote netip.AddrPort
	n      int
}

// maxLeftPerMove bounds the subflows one path manager closes for one path
// going down: the pod decides how many connections it has, and each close
// is a command the agent sends. The connections past it keep the detour.
const maxLeftPerMove = 256

// maxAwaitingPerPath bounds the replacement joins a path manager holds for
// one path while it is down: a pod that has its kernel close subflows
// without end (ss -K) must not make PathBack open joins without end while
// other pods wait for their turn. A replacement past it is opened at once,
// and the datapath places it on a live path.
const maxAwaitingPerPath = maxLeftPerMove

// SubflowPaths says where the datapath has a pod's subflow (its 4-tuple as
// the pod sends it) as a path goes down: on that path (its own, or the one
// it detours over), or on a path that is up. A subflow the datapath does
// not have is neither.
type SubflowPaths func(local, remote netip.AddrPort) (onPath, onLivePath bool)

// LeavePath closes, in every pod with a path manager, the subflows on path
// (where) that are recovering from losses, of connections the pod opened
// that keep a subflow on a live path, and whose replacement the path
// manager can open; their joins are opened again when PathBack says the
// path is back. Each pod's path manager works on a goroutine of its own,
// so that no pod's listing holds up another's. It returns how many
// subflows it closed.
func (p *PathManagers) LeavePath(path uint32, where SubflowPaths) int {
	p.PathDown(path)
	var mu sync.Mutex
	n := 0
	p.each(func(pm *pathManager) {
		left := pm.leave(path, where)
		mu.Lock()
		n += left
		mu.Unlock()
	})
	return n
}

// PathDown tells every path manager, and those started until PathBack,
// that path is down: the replacement of a subflow closed on it meanwhile
// waits for it. LeavePath does too; the agent tells it first, before it
// reads where the subflows are (which may fail).
func (p *PathManagers) PathDown(path uint32) {
	p.mu.Lock()
	if p.down == nil {
		p.down = map[uint32]bool{}
	}
	p.down[path] = true
	all := slices.Collect(maps.Values(p.m))
	p.mu.Unlock()
	for _, pm := range all {
		pm.markDown(path)
	}
}

// Down says whether path is down for the path managers: PathDown told so,
// and PathBack not since.
func (p *PathManagers) Down(path uint32) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.down[path]
}

// PathBack opens, in every pod with a path manager, the joins that wait
// for path: those that replace the subflows closed on it while it was down.
func (p *PathManagers) PathBack(path uint32) {
	p.mu.Lock()
	delete(p.down, path)
	p.mu.Unlock()
	p.each(func(pm *pathManager) { pm.back(path) })
}

// each runs fn for every path manager, each on a goroutine of its own, and
// waits for them all.
func (p *PathManagers) each(fn func(*pathManager)) {
	p.mu.Lock()
	all := make([]*pathManager, 0, len(p.m))
	for _, pm := range p.m {
		all = append(all, pm)
	}
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, pm := range all {
		wg.Go(func() { fn(pm) })
	}
	wg.Wait()
}

// markDown records that path is down (PathDown).
func (s *pathManager) markDown(path uint32) {
	l := &s.leaving
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.down == nil {
		l.down, l.closing, l.awaiting = map[uint32]bool{}, map[subflowKey]uint32{}, map[uint32]map[uint32]awaitingJoins{}
	}
	l.down[path] = true
}

// isDown says whether path is down, as PathDown and PathBack told.
func (s *pathManager) isDown(path uint32) bool {
	l := &s.leaving
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.down[path]
}

// leave closes the pod's subflows LeavePath describes, and returns how many.
func (s *pathManager) leave(path uint32, where SubflowPaths) int {
	s.markDown(path) // and its maps made
	l := &s.leaving
	sess := s.current.Load()
	if sess == nil {
		return 0 // restarting: its pod's connections are not followed meanwhile
	}
	sfs, err := s.listSubflows()
	if err != nil {
		s.log.Warn("listing the pod's subflows on a path that went down: they wait for their own retransmissions", "path", path, "err", err)
		return 0
	}
	var left []mptcpnl.Subflow
	for _, sf := range s.toLeave(sfs, where) {
		if len(left) == maxLeftPerMove {
			s.log.Warn("a path went down: more subflows recover from losses on it than a path manager closes at once; the rest keep the detour",
				"path", path, "closed", maxLeftPerMove)
			break
		}
		k := subflowKey{sf.Local, sf.Remote}
		// Recorded before the command: the pod's kernel reports the
		// close while it runs.
		l.mu.Lock()
		l.closing[k] = path
		l.mu.Unlock()
		if err := sess.cmds.DestroySubflow(sf.Token, sf.Local, sf.Remote); err != nil {
			l.mu.Lock()
			delete(l.closing, k)
			l.mu.Unlock()
			s.log.Debug("closing a subflow on a path that went down", "local", sf.Local, "remote", sf.Remote, "err", err)
			continue
		}
		left = append(left, sf)
		s.log.Debug("closed a subflow recovering from losses on a path that went down", "path", path, "local", sf.Local, "remote", sf.Remote,
			"caState", sf.Loss.CAState, "backoff", sf.Loss.Backoff, "lost", sf.Loss.Lost, "retrans", sf.Loss.Retrans)
	}
	if len(left) > 0 {
		s.leftSubflows.Add(uint64(len(left)))
		s.log.Info("a path went down: closed the subflows recovering from losses on it; their data goes again over their connections' other subflows",
			"path", path, "subflows", len(left))
	}
	return len(left)
}

// listSubflows lists the pod's subflows, unless the path manager stopped
// (its namespace's descriptor is closed then, and its number may be
// another's).
func (s *pathManager) listSubflows() ([]mptcpnl.Subflow, error) {
	s.life.RLock()
	defer s.life.RUnlock()
	if s.stopped {
		return nil, nil
	}
	return mptcpnl.ListSubflows(s.nsFD)
}

// toLeave picks, among the pod's subflows sfs, those leave closes: on the
// path (where), recovering from losses, from the pod's own address, of a
// connection that keeps a subflow on a live path, and that the path manager
// replaces when it closes (a connection the pod opened and the path manager
// remembers, with replacements left: rejoin.go). Others keep the detour.
func (s *pathManager) toLeave(sfs []mptcpnl.Subflow, where SubflowPaths) []mptcpnl.Subflow {
	elsewhere := map[uint32]bool{}
	var candidates []mptcpnl.Subflow
	for _, sf := range sfs {
		onPath, live := where(sf.Local, sf.Remote)
		if live {
			elsewhere[sf.Token] = true
		}
		if onPath && sf.Loss.Recovering() && s.owns(sf.Local.Addr()) {
			candidates = append(candidates, sf)
		}
	}
	s.openedMu.Lock()
	defer s.openedMu.Unlock()
	return slices.DeleteFunc(candidates, func(sf mptcpnl.Subflow) bool {
		return !elsewhere[sf.Token] || !s.opened.replaceable(sf.Token, subflowKey{sf.Local, sf.Remote})
	})
}

// closeHeard forgets the closed subflow ev reports among those leave
// closed, and says whether it was one (waits) and on which path. Only the
// path manager's goroutine calls it.
func (s *pathManager) closeHeard(ev mptcpnl.Event) (path uint32, waits bool) {
	l := &s.leaving
	l.mu.Lock()
	defer l.mu.Unlock()
	k := unmapped(ev)
	path, waits = l.closing[k]
	delete(l.closing, k)
	return path, waits
}

// awaitPath records a join that replaces the subflow ev reports closed, to
// remote, for when path is back, and says so; false when the path is back
// already, or holds maxAwaitingPerPath joins (the join is opened now).
// Only the path manager's goroutine calls it.
func (s *pathManager) awaitPath(path uint32, ev mptcpnl.Event, remote netip.AddrPort) bool {
	l := &s.leaving
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.down[path] {
		return false
	}
	held := 0
	for _, j := range l.awaiting[path] {
		held += j.n
	}
	if held >= maxAwaitingPerPath {
		return false
	}
	if l.awaiting[path] == nil {
		l.awaiting[path] = map[uint32]awaitingJoins{}
	}
	j := l.awaiting[path][ev.Token]
	l.awaiting[path][ev.Token] = awaitingJoins{local: ev.Local.Addr(), remote: remote, n: j.n + 1}
	return true
}

// unmapped is the 4-tuple of ev as sock_diag lists it: an IPv4 subflow of
// an IPv6 socket is reported with mapped addresses in events.
func unmapped(ev mptcpnl.Event) subflowKey {
	return subflowKey{netip.AddrPortFrom(ev.Local.Addr().Unmap(), ev.Local.Port()), netip.AddrPortFrom(ev.Remote.Addr().Unmap(), ev.Remote.Port())}
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

// forgetClosing forgets the closes not heard yet, when a session starts:
// the last one's events, those among them, are gone.
func (s *pathManager) forgetClosing() {
	l := &s.leaving
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.closing)
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
		s.log.Warn("a path is back while the path manager restarts: the subflows closed on it are not replaced", "path", path, "connections", len(joins))
		return
	}
	opened := 0
	for token, j := range joins {
		for range j.n {
			if err := openJoin(sess.cmds, token, j.local, j.remote, s.holdoff > 0); err != nil {
				s.log.Debug("opening a join to replace a subflow closed on a path that went down", "path", path, "remote", j.remote, "err", err)
				break
			}
			opened++
		}
	}
	s.replacedJoins.Add(uint64(opened))
	s.log.Info("a path is back: opened the joins that replace the subflows closed on it", "path", path, "joins", opened)
}
