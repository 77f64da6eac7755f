package agent

import (
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
)

// sweepView is what the sweeps of one reconcile (closed subflows, released
// pods, retired rules) read of the node, read once for all of them: the
// subflow table, and each pod namespace's open TCP sockets. A sweep decides
// that an entry's subflow closed when its socket is missing, so a listing is
// only ever compared with a table read before it: a socket that closes in
// between is swept next time, one opened in between (its entry written
// after the read) is not in the read. A sweep that changed the table calls
// changed, and the next reader reads both again.
type sweepView struct {
	dp       *datapath.Datapath
	subflows []datapath.Subflow
	read     bool
	sockets  map[string]socketListing
}

type socketListing struct {
	open map[socketKey]bool
	err  error
}

func newSweepView(dp *datapath.Datapath) *sweepView { return &sweepView{dp: dp} }

// Subflows is the subflow table as read once since the last change.
func (v *sweepView) Subflows() ([]datapath.Subflow, error) {
	if v.read {
		return v.subflows, nil
	}
	sfs, err := v.dp.Subflows()
	if err != nil {
		return nil, err
	}
	v.subflows, v.read, v.sockets = sfs, true, map[string]socketListing{}
	return sfs, nil
}

// Sockets is the open TCP sockets of the namespace at ns (openTCPSockets),
// listed once, after the table was read.
func (v *sweepView) Sockets(ns string) (map[socketKey]bool, error) {
	if _, err := v.Subflows(); err != nil {
		return nil, err
	}
	l, ok := v.sockets[ns]
	if !ok {
		l.open, l.err = openTCPSockets(ns)
		v.sockets[ns] = l
	}
	return l.open, l.err
}

// changed says a sweep removed entries: the next reader reads the table,
// and then the sockets, again.
func (v *sweepView) changed() { v.read, v.subflows, v.sockets = false, nil, nil }
