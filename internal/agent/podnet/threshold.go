package podnet

import (
	"math"
	"time"

	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
)

// Most connections are short (RPCs, health checks, small objects), and
// joins cost such a connection more than they give: a handshake each, a
// window that starts small, reordering at the receiver. So a connection
// the pod opens waits for its joins until it has carried the rule's
// threshold of bytes, both ways together (docs/subflows.md, "Small
// flows"). The path manager reads what each waiting connection carried
// from the pod's kernel (sock_diag, the subflows' tcp_info) while any
// waits: often while they are young, when the bulk flows among them pass
// the threshold, then more and more rarely, so that a pod's idle
// long-lived connections cost little.

// The pace of the readings: a connection younger than watchSlowAfter is
// read every watchInterval (a 200 Mbit/s flow carries 500 KB meanwhile,
// and a join opened then is held for the 20 ms after: holdoff.go); an older
// one every tenth of its age, at most every maxWatchInterval.
const (
	watchInterval    = 20 * time.Millisecond
	watchSlowAfter   = 200 * time.Millisecond
	maxWatchInterval = time.Second
)

// waitingJoins is a connection whose joins wait for its threshold.
type waitingJoins struct {
	// threshold is the rule's when the connection was established: a
	// changed rule reaches the pod's next connections.
	threshold uint64
	since     time.Time
	// first is the connection's first subflow, which the readings look
	// up.
	first subflowKey
	// unseen counts the readings in a row that did not list the
	// connection: closed, its close event not heard (lost to a full
	// socket).
	unseen int
}

// maxUnseen is how many readings in a row may miss a waiting connection
// before the path manager forgets it: one may run before the connection's
// first subflow is listed.
const maxUnseen = 2

// nextWatch is how long to wait before reading a connection that has
// waited for age.
func nextWatch(age time.Duration) time.Duration {
	if age < watchSlowAfter {
		return watchInterval
	}
	return min(age/10, maxWatchInterval)
}

// established opens the joins of conn, a connection the pod opened that
// was just established, or has them wait for the rule's threshold. Only
// the path manager's goroutine calls it, under openedMu.
func (s *pathManager) established(sess *session, conn *openedConn, ev mptcpnl.Event) {
	threshold := s.joinAfter.Load()
	// A connection the path manager does not remember cannot wait: it
	// gets its joins at once, as it would with no threshold.
	if threshold == 0 || conn == nil || int(s.joins.Load()) == 0 {
		s.openJoins(sess.cmds, conn, ev.Token, ev.Local.Addr(), ev.Remote)
		return
	}
	conn.waiting = &waitingJoins{threshold: threshold, since: time.Now(), first: unmapped(ev)}
	s.watchLater(sess, watchInterval)
}

// watchLater reads the waiting connections after delay, unless a reading
// is due already.
func (s *pathManager) watchLater(sess *session, delay time.Duration) {
	if sess.watchDue.Swap(true) {
		return
	}
	sess.later(delay, func() { s.watch(sess) })
}

// watch reads what the waiting connections carried and opens the joins of
// those past their threshold; it reads again later while any waits, never
// sooner than minWatchCostFactor times what this reading took. One reading
// of a pod at a time: the next is scheduled only once this one is over.
func (s *pathManager) watch(sess *session) {
	began := time.Now()
	s.openedMu.Lock()
	firsts := map[uint32]subflowKey{}
	for token, conn := range s.opened {
		if conn.waiting != nil {
			firsts[token] = conn.waiting.first
		}
	}
	s.openedMu.Unlock()
	carried, err := s.readCarried(firsts)
	now := time.Now()
	s.openedMu.Lock()
	defer s.openedMu.Unlock()
	sess.watchDue.Store(false)
	if err != nil {
		// A namespace that cannot be listed (more sockets than a
		// listing reads, a listing too slow) cannot hold joins back:
		// they are opened, as with no threshold.
		if ok, held := sess.watchFailLog.allow(now); ok {
			s.log.Warn("reading what the pod's connections carried: their joins are opened now", "err", err, "suppressed", held)
		}
		s.openWaiting(sess)
		return
	}
	next, waiting := maxWatchInterval, false
	for token, conn := range s.opened {
		w := conn.waiting
		if w == nil {
			continue
		}
		b, listed := carried[token]
		switch {
		case listed && b >= w.threshold:
			conn.waiting = nil
			s.openJoins(sess.cmds, conn, token, conn.local, conn.remote)
			continue
		case listed:
			w.unseen = 0
		case w.since.After(began):
			// Established after the listing began: it may not be
			// in it.
		default:
			if w.unseen++; w.unseen > maxUnseen {
				// Closed, its close lost; or its subflows are
				// not listed for another reason: the joins are
				// opened (on a closed connection they fail),
				// not held back for ever.
				conn.waiting = nil
				s.openJoins(sess.cmds, conn, token, conn.local, conn.remote)
				continue
			}
		}
		next, waiting = min(next, nextWatch(now.Sub(w.since))), true
	}
	if waiting {
		s.watchLater(sess, max(next, minWatchCostFactor*now.Sub(began)))
	}
}

// MaxLookups is how many waiting connections a reading looks up one by
// one; past it, a reading lists the pod's subflows at once. A lookup costs
// tens of microseconds; a listing walks the kernel's whole table of
// connections, about a millisecond however few sockets the pod holds
// (docs/benchmarks.md, "Small flows: watching the waiting connections").
const MaxLookups = 16

// readCarried says what each connection of firsts (its first subflow, by
// token) carried; a connection missing from the answer is not listed. A
// subflow whose tcp_info does not say counts as past any threshold: the
// joins are not held back for ever.
func (s *pathManager) readCarried(firsts map[uint32]subflowKey) (map[uint32]uint64, error) {
	carried := map[uint32]uint64{}
	count := func(sf mptcpnl.Subflow) {
		if !sf.CarriedKnown {
			carried[sf.Token] = math.MaxUint64
			return
		}
		carried[sf.Token] = satAdd(carried[sf.Token], sf.Carried)
	}
	if len(firsts) > MaxLookups {
		// Every subflow of a connection counts, whatever its
		// address: the tokens are the namespace's.
		sfs, err := s.readSubflows()
		for _, sf := range sfs {
			count(sf)
		}
		return carried, err
	}
	var err error
	s.listing(func() {
		s.life.RLock()
		defer s.life.RUnlock()
		if s.stopped {
			return
		}
		for token, k := range firsts {
			sf, ok, lerr := s.lister.Subflow(k.local, k.remote)
			if lerr != nil {
				err = lerr
				return
			}
			// The 4-tuple's socket now may be another
			// connection's: only the same token counts.
			if ok && sf.Token == token {
				count(sf)
			}
		}
	})
	return carried, err
}

// minWatchCostFactor spaces a pod's readings by at least this many times
// what the last one took: a pod whose sockets make its readings slow gets
// them less often, and spends at most a tenth of a listing slot's time.
const minWatchCostFactor = 10

// satAdd adds without wrapping.
func satAdd(a, b uint64) uint64 {
	if c := a + b; c >= a {
		return c
	}
	return math.MaxUint64
}

// openWaiting opens the joins of every waiting connection now. Under
// openedMu.
func (s *pathManager) openWaiting(sess *session) {
	for token, conn := range s.opened {
		if conn.waiting != nil {
			conn.waiting = nil
			s.openJoins(sess.cmds, conn, token, conn.local, conn.remote)
		}
	}
}

// watchAgain has a new session read the connections that waited in the
// last one. Under openedMu.
func (s *pathManager) watchAgain(sess *session) {
	for _, conn := range s.opened {
		if conn.waiting != nil {
			s.watchLater(sess, watchInterval)
			return
		}
	}
}
