package agent

import (
	"maps"
	"net/netip"
	"sync"
)

// A path that goes down has its subflows detoured by the datapath; those
// of them that were recovering from losses are closed by their pods' path
// managers so that their data goes again at once over the connections'
// other subflows, and joins replace them when the path is back
// (podnet/leave.go, docs/subflows.md "Leaving a failed path").

// pathMove is a path going down or coming back, as the datapath has it.
type pathMove struct {
	path uint32
	down bool
}

// pathMoves runs the path managers' part of each move on a goroutine of
// its own, one move after the other in the order they came: a path that
// comes back must not be told before it was told it went down. Moves come
// from link events, probes and reconciles, under downMu, which must not
// wait for a listing of every pod's subflows.
type pathMoves struct {
	mu      sync.Mutex
	queue   []pathMove
	running bool
}

// push queues m for run, and starts the goroutine that runs the queue when
// none does.
func (q *pathMoves) push(m pathMove, run func(pathMove)) {
	q.mu.Lock()
	q.queue = append(q.queue, m)
	if q.running {
		q.mu.Unlock()
		return
	}
	q.running = true
	q.mu.Unlock()
	go func() {
		for {
			q.mu.Lock()
			if len(q.queue) == 0 {
				q.running = false
				q.mu.Unlock()
				return
			}
			m := q.queue[0]
			q.queue = q.queue[1:]
			q.mu.Unlock()
			run(m)
		}
	}()
}

// movePathManagers has the path managers leave a path that went down, or
// replace on it what they left when it is back.
func (a *Agent) movePathManagers(m pathMove) {
	if !m.down {
		a.pms.PathBack(m.path)
		return
	}
	// First, so that a subflow the pod's kernel closes on the path from
	// now on has its replacement wait for it, whatever follows.
	a.pms.PathDown(m.path)
	if a.pms.Len() == 0 {
		return
	}
	sfs, err := a.dp.Subflows()
	if err != nil {
		a.log.Warn("a path went down: reading the subflow table; its subflows wait for their own retransmissions", "path", m.path, "err", err)
		return
	}
	a.downMu.Lock()
	down := maps.Clone(a.down)
	a.downMu.Unlock()
	down[m.path] = true
	// Where each subflow travels: its detour while it has one, else its
	// own path.
	type fourTuple struct{ local, remote netip.AddrPort }
	travels := make(map[fourTuple]uint32, len(sfs))
	for _, sf := range sfs {
		p := sf.Path
		if sf.Detour != 0 {
			p = sf.Detour
		}
		travels[fourTuple{sf.Local, sf.Remote}] = p
	}
	if n := a.pms.LeavePath(m.path, func(local, remote netip.AddrPort) (onPath, onLivePath bool) {
		p, ok := travels[fourTuple{local, remote}]
		if !ok {
			return false, false
		}
		return p == m.path, !down[p]
	}); n > 0 {
		a.log.Info("a path went down: closed the subflows recovering from losses on it", "path", m.path, "subflows", n)
	}
}
