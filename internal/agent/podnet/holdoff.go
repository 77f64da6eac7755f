package podnet

import (
	"maps"
	"net/netip"
	"sync"
	"time"

	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
)

// Joins are held as backup for a while, against a defect of the Linux
// kernel (6.4 and later, docs/testing.md "Root cause"): the host that
// accepts a join, when its application holds the connection's socket as
// the join's handshake completes, takes the join into the connection only
// when the application lets go, and then relabels the data the join has
// already received with the connection's next expected sequence number.
// That data is delivered in the wrong place: the stream keeps its length
// and changes its content. No data, no harm: so the path manager opens
// every join of a connection the pod opened as a backup subflow (the B bit
// of its MP_JOIN), on which neither end sends while the connection has an
// active subflow, and makes it active with an MP_PRIO once it has been
// established for the holdoff, long after the peer has taken it in.
// A connection that loses its active subflows meanwhile still has the
// held joins to send on: backup subflows carry data when nothing else can.

// joinEstablished has the join ev reports, established at heard, made
// active after the holdoff when the path manager opened it held: at once
// when it remembers the join's connection (releaseLater), else by the next
// sweep, which reads from the pod's kernel whether it is a held join of
// the path manager's.
func (s *pathManager) joinEstablished(sess *session, ev mptcpnl.Event, heard time.Time) {
	if s.holdoff <= 0 || !s.owns(ev.Local.Addr()) || ev.LocalID != joinLocalID {
		return
	}
	key := subflowKey{ev.Local, ev.Remote}
	if s.releaseLater(sess, ev) {
		sess.young.add(key, heard, true)
		return
	}
	sess.young.add(key, heard, false)
	s.sweepLater(sess)
}

// releaseLater makes the join ev reports, established just now, active
// after the holdoff, when it is one the path manager opened held, and
// says whether it will. With a holdoff, every join of a connection the
// path manager remembers is opened held (openJoins, subflowClosed), from
// the pod's address with local id 1 to the connection's remote address and
// port; a subflow a process of the pod opened some other way is left alone.
func (s *pathManager) releaseLater(sess *session, ev mptcpnl.Event) bool {
	conn := s.opened[ev.Token]
	if s.holdoff <= 0 || conn == nil || !s.owns(ev.Local.Addr()) || ev.LocalID != joinLocalID || ev.Remote != conn.remote {
		return false
	}
	sess.later(s.holdoff, func() {
		sess.young.remove(subflowKey{ev.Local, ev.Remote})
		s.release(sess, ev.Token, ev.Local, ev.Remote)
	})
	return true
}

// release makes a held join active.
func (s *pathManager) release(sess *session, token uint32, local, remote netip.AddrPort) {
	if err := sess.cmds.SetSubflowBackup(token, local, remote, false); err != nil {
		// The join or its connection closed meanwhile: nothing
		// left to release.
		s.log.Debug("making a held join active", "local", local, "remote", remote, "err", err)
		return
	}
	s.releasedJoins.Add(1)
}

// A held join whose release was never scheduled, or was dropped, would stay
// a backup subflow for as long as it lives: the agent was restarted during
// its hold, the session that scheduled it failed, or its events were lost
// to a full socket. So at each of those moments the path manager sweeps:
// it lists the pod's subflows (sock_diag) and makes active every held join
// of its own it finds established for at least the holdoff. Its own: a
// join from the pod's address with local id 1, opened as a backup by this
// end, to the remote address and port this end opened the connection to
// with MP_CAPABLE, as openJoins opens them. A subflow a process of the pod
// opened or made backup some other way is left alone.

// minSweepInterval bounds how often a path manager sweeps; a pod whose
// processes overrun the event socket on purpose pays for the sweeps it
// causes only this often.
const minSweepInterval = 100 * time.Millisecond

// sweepLater sweeps the pod's subflows once the holdoff has passed, unless
// a sweep is due already.
func (s *pathManager) sweepLater(sess *session) {
	if !sess.young.scheduleSweep() {
		return
	}
	sess.later(max(s.holdoff, minSweepInterval), func() {
		sess.young.sweepStarts()
		s.sweep(sess)
	})
}

// sweep makes active the held joins of the path manager's own that no
// scheduled release covers and that were established at least the holdoff
// ago; it sweeps again later when it had to leave younger ones.
func (s *pathManager) sweep(sess *session) {
	sfs, err := mptcpnl.ListSubflows(s.nsFD)
	if err != nil {
		s.log.Warn("listing the pod's subflows: held joins stay backup until the next sweep", "err", err)
		return
	}
	sess.young.forgetOlder(time.Now().Add(-s.holdoff))
	again := false
	for _, sf := range s.heldJoins(sfs) {
		if sess.young.has(subflowKey{sf.Local, sf.Remote}) {
			again = true
			continue
		}
		s.release(sess, sf.Token, sf.Local, sf.Remote)
	}
	if again {
		s.sweepLater(sess)
	}
}

// heldJoins are the held joins of the path manager's own among a pod's
// established subflows.
func (s *pathManager) heldJoins(sfs []mptcpnl.Subflow) []mptcpnl.Subflow {
	opened := map[uint32]netip.AddrPort{}
	for _, sf := range sfs {
		if sf.Flags&mptcpnl.SubflowCapableLocal != 0 {
			opened[sf.Token] = sf.Remote
		}
	}
	var out []mptcpnl.Subflow
	for _, sf := range sfs {
		const held = mptcpnl.SubflowJoinLocal | mptcpnl.SubflowBackupLocal
		if sf.Flags&held != held || sf.LocalID != joinLocalID || !s.owns(sf.Local.Addr()) {
			continue
		}
		if remote, ok := opened[sf.Token]; ok && remote == sf.Remote {
			out = append(out, sf)
		}
	}
	return out
}

// youngJoins are the joins of the path manager's own whose establishment a
// session heard less than the holdoff ago, and those whose release it has
// scheduled: a sweep leaves them alone. Its methods are safe for concurrent
// use.
type youngJoins struct {
	mu sync.Mutex
	m  map[subflowKey]youngJoin
	// sweepDue says a sweep is scheduled and has not started.
	sweepDue bool
}

type youngJoin struct {
	established time.Time
	// scheduled: its own release is scheduled, and removes it.
	scheduled bool
}

func (y *youngJoins) add(k subflowKey, established time.Time, scheduled bool) {
	y.mu.Lock()
	defer y.mu.Unlock()
	if y.m == nil {
		y.m = map[subflowKey]youngJoin{}
	}
	y.m[k] = youngJoin{established: established, scheduled: scheduled}
}

func (y *youngJoins) remove(k subflowKey) {
	y.mu.Lock()
	defer y.mu.Unlock()
	delete(y.m, k)
}

func (y *youngJoins) has(k subflowKey) bool {
	y.mu.Lock()
	defer y.mu.Unlock()
	_, ok := y.m[k]
	return ok
}

// forgetOlder forgets the joins established before t whose release no one
// scheduled: they are old enough to be swept.
func (y *youngJoins) forgetOlder(t time.Time) {
	y.mu.Lock()
	defer y.mu.Unlock()
	maps.DeleteFunc(y.m, func(_ subflowKey, j youngJoin) bool { return !j.scheduled && j.established.Before(t) })
}

// scheduleSweep says whether the caller is to schedule a sweep: no other is
// due.
func (y *youngJoins) scheduleSweep() bool {
	y.mu.Lock()
	defer y.mu.Unlock()
	if y.sweepDue {
		return false
	}
	y.sweepDue = true
	return true
}

func (y *youngJoins) sweepStarts() {
	y.mu.Lock()
	defer y.mu.Unlock()
	y.sweepDue = false
}
