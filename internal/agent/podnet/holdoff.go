package podnet

import (
	"maps"
	"net/netip"
	"sync"
	"time"

	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
)

// Joins are held as backup for a while, against a defect of the Linux
// kernel (6.15 to 6.18; 6.4 to 6.14 under receive-buffer pressure; from 6.19
// it resets the join instead: docs/install.md "A known kernel defect"): the
// host that accepts a join, when its application holds the connection's
// socket as the join's handshake completes, takes the join into the
// connection only when the application lets go, and then relabels the data
// the join has already received with the connection's next expected
// sequence number.
// That data is delivered in the wrong place: the stream keeps its length
// and changes its content. No data, no harm: so the path manager opens
// every join of a connection the pod opened as a backup subflow (the B bit
// of its MP_JOIN), on which neither end sends while the connection has an
// active subflow, and makes it active with an MP_PRIO once it has been
// established for the holdoff and the peer has answered its handshake at
// least half a holdoff before. Established is this end's view (the SYN-ACK
// arrived); the peer's kernel answers the third ACK as it arrives, which a
// loaded host can delay past the holdoff, and takes the join into the
// connection as soon as its application lets go of the socket. A join not
// answered at half the holdoff is left to the sweeps, which release it a
// holdoff after they first see it answered. (Before the answer the kernel
// sends nothing on the join, and refuses to make it active.)
// A connection that loses its active subflows meanwhile still has the
// held joins to send on: backup subflows carry data when nothing else can.

// joinEstablished has the join ev reports, established at heard, made
// active after the holdoff when the path manager opened it held: when it
// remembers the join's connection, by a release scheduled now
// (releaseLater); else by sweeps, which read from the pod's kernel whether
// it is a held join of the path manager's.
func (s *pathManager) joinEstablished(sess *session, ev mptcpnl.Event) {
	if s.holdoff <= 0 || !s.owns(ev.Local.Addr()) || ev.LocalID != joinLocalID {
		return
	}
	if !s.releaseLater(sess, ev) {
		s.sweepLater(sess)
	}
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
	key := unmapped(ev)
	sess.sweeps.schedule(key)
	sess.later(s.holdoff/2, func() {
		if answered, ok, err := s.answered(ev.Token, ev.Local, ev.Remote); err == nil && (!ok || !answered) {
			// Gone (nothing to release), or not answered yet: a
			// sweep releases it once it is.
			sess.sweeps.done(key)
			if ok {
				s.sweepLater(sess)
			}
			return
		}
		// Answered, or not known (the lookup failed): released at the
		// holdoff's end, as a join whose state cannot be read is not
		// held for ever.
		sess.later(s.holdoff-s.holdoff/2, func() {
			err := s.release(sess, ev.Token, ev.Local, ev.Remote)
			sess.sweeps.done(key)
			if err != nil {
				// Closed meanwhile, or refused for now: a sweep
				// releases the join if it is still held.
				s.sweepLater(sess)
			}
		})
	})
	return true
}

// answered says whether the pod's kernel lists the join local->remote of
// connection token as fully established (SubflowFullyEstablished); ok is
// false when it lists no such join (closed meanwhile, or the path manager
// stopped).
func (s *pathManager) answered(token uint32, local, remote netip.AddrPort) (answered, ok bool, err error) {
	s.life.RLock()
	defer s.life.RUnlock()
	if s.stopped {
		return false, false, nil
	}
	sf, ok, err := s.joinLister.Subflow(local, remote)
	ok = ok && sf.Token == token
	return ok && sf.Flags&mptcpnl.SubflowFullyEstablished != 0, ok, err
}

// release makes a held join active. An error means the join is not known
// to be active: it closed meanwhile (nothing left to release), or the
// kernel refused the change for now, and the caller sweeps again.
func (s *pathManager) release(sess *session, token uint32, local, remote netip.AddrPort) error {
	if err := sess.cmds.SetSubflowBackup(token, local, remote, false); err != nil {
		s.log.Debug("making a held join active", "local", local, "remote", remote, "err", err)
		return err
	}
	s.releasedJoins.Add(1)
	return nil
}

// A held join whose release was never scheduled, or was dropped, would stay
// a backup subflow for as long as it lives: the agent was restarted during
// its hold, the session that scheduled it failed, or its events were lost
// to a full socket. So at each of those moments the path manager sweeps:
// it lists the pod's subflows (sock_diag) and makes active every held join
// of its own that an earlier sweep, at least the holdoff before, found held
// already, and sweeps again for the others. Its own: a join from the pod's
// address with local id 1, opened as a backup by this end, to the remote
// address and port this end opened the connection to with MP_CAPABLE, as
// openJoins opens them. A subflow a process of the pod opened or made
// backup some other way is left alone. Two sightings, not the join's age:
// sock_diag does not say when a subflow was established, and its event may
// still be queued, or lost.

// minSweepInterval bounds how often a path manager sweeps; a pod whose
// processes overrun the event socket on purpose pays for the sweeps it
// causes only this often.
const minSweepInterval = 100 * time.Millisecond

// sweepLater sweeps the pod's subflows once the holdoff has passed, unless
// a sweep is due already.
func (s *pathManager) sweepLater(sess *session) {
	if !sess.sweeps.due() {
		return
	}
	sess.later(max(s.holdoff, minSweepInterval), func() { s.sweep(sess) })
}

// sweep makes active the held joins of the path manager's own that no
// scheduled release covers and that an earlier sweep, at least the holdoff
// before, saw held; it sweeps again later when it saw others.
func (s *pathManager) sweep(sess *session) {
	sw := &sess.sweeps
	sw.running.Lock()
	defer sw.running.Unlock()
	sw.mu.Lock()
	sw.isDue = false
	sw.mu.Unlock()
	sfs, err := mptcpnl.ListSubflows(s.nsFD)
	if err != nil {
		if ok, held := sw.failLog.allow(time.Now()); ok {
			s.log.Warn("listing the pod's subflows: its held joins stay backup until the next sweep", "err", err, "suppressed", held)
		}
		return
	}
	if sw.seen == nil {
		sw.seen = map[subflowKey]time.Time{}
	}
	now := time.Now()
	held := map[subflowKey]bool{}
	var release []mptcpnl.Subflow
	again := false
	sw.mu.Lock()
	for _, sf := range s.heldJoins(sfs) {
		k := subflowKey{sf.Local, sf.Remote}
		if sw.scheduled[k] {
			continue // its own release is on the way
		}
		held[k] = true
		if sf.Flags&mptcpnl.SubflowFullyEstablished == 0 {
			// Its peer has not answered the handshake: the
			// holdoff counts from the first sweep that sees it
			// answered.
			delete(sw.seen, k)
			again = true
			continue
		}
		first, ok := sw.seen[k]
		switch {
		case !ok:
			sw.seen[k] = now
			again = true
		case now.Sub(first) >= s.holdoff:
			release = append(release, sf)
		default:
			again = true
		}
	}
	sw.mu.Unlock()
	// Forget what is no longer held: released, closed.
	maps.DeleteFunc(sw.seen, func(k subflowKey, _ time.Time) bool { return !held[k] })
	for _, sf := range release {
		if s.release(sess, sf.Token, sf.Local, sf.Remote) != nil {
			again = true // still held, or gone: the next sweep tells
		}
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

// sweeps is a session's bookkeeping of held joins: the releases it
// scheduled (a sweep leaves those joins alone) and when a sweep first saw
// each held join it may release. Both hold at most the pod's held joins.
// Its methods are safe for concurrent use, and never wait for a sweep.
type sweeps struct {
	mu        sync.Mutex
	scheduled map[subflowKey]bool
	// isDue says a sweep is scheduled and has not started.
	isDue bool

	// running is held by the sweep that runs: one at a time. Only it
	// uses seen and failLog.
	running sync.Mutex
	seen    map[subflowKey]time.Time
	failLog logLimiter
}

func (w *sweeps) schedule(k subflowKey) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.scheduled == nil {
		w.scheduled = map[subflowKey]bool{}
	}
	w.scheduled[k] = true
}

func (w *sweeps) done(k subflowKey) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.scheduled, k)
}

// due says whether the caller is to schedule a sweep: none is due yet.
func (w *sweeps) due() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.isDue {
		return false
	}
	w.isDue = true
	return true
}
