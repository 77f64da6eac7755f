package podnet

import (
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
		if err := sess.cmds.SetSubflowBackup(ev.Token, ev.Local, ev.Remote, false); err != nil {
			// The join or its connection closed meanwhile: nothing
			// left to release.
			s.log.Debug("making a held join active", "local", ev.Local, "remote", ev.Remote, "err", err)
			return
		}
		s.releasedJoins.Add(1)
	})
	return true
}
