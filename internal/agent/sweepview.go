package agent

import (
	"maps"
	"slices"
	"sync"
	"time"

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
//
// A pod's namespace is its tenant's: its processes decide how many sockets
// it has, and with CAP_NET_ADMIN what it answers. A listing that fails is
// the pod's: the sweeps leave what they would have decided from it as it
// is, and it is no error of theirs (which would fail the node's reconcile,
// and with it every pod's gate). The view keeps the failures (unlisted),
// tries a namespace once, and the agent logs them (reportUnlisted).
type sweepView struct {
	dp       *datapath.Datapath
	subflows []datapath.Subflow
	read     bool
	sockets  map[string]socketListing
	unlisted map[string]error
	// list lists a namespace's open TCP sockets (openTCPSockets).
	list func(ns string) (map[socketKey]bool, error)
}

type socketListing struct {
	open map[socketKey]bool
	err  error
}

func newSweepView(dp *datapath.Datapath) *sweepView {
	return &sweepView{dp: dp, unlisted: map[string]error{}, list: openTCPSockets}
}

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
// listed once, after the table was read. An error is the namespace's
// listing's (the pod's, not the sweep's), or the table's.
func (v *sweepView) Sockets(ns string) (map[socketKey]bool, error) {
	if _, err := v.Subflows(); err != nil {
		return nil, err
	}
	if err, failed := v.unlisted[ns]; failed {
		return nil, err
	}
	l, ok := v.sockets[ns]
	if !ok {
		l.open, l.err = v.list(ns)
		v.sockets[ns] = l
		if l.err != nil {
			v.unlisted[ns] = l.err
		}
	}
	return l.open, l.err
}

// changed says a sweep removed entries: the next reader reads the table,
// and then the sockets, again.
func (v *sweepView) changed() { v.read, v.subflows, v.sockets = false, nil, nil }

// unlistedLog limits the agent's lines about namespaces it could not
// list: their tenants decide how often that happens.
type unlistedLog struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int
}

// reportUnlisted logs the namespaces view could not list, at most one line
// per SweepInterval, with the count of those held back.
func (a *Agent) reportUnlisted(view *sweepView) {
	if len(view.unlisted) == 0 {
		return
	}
	l := &a.unlistedLog
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if !l.last.IsZero() && now.Sub(l.last) < SweepInterval {
		l.suppressed += len(view.unlisted)
		return
	}
	names := slices.Sorted(maps.Keys(view.unlisted))
	a.log.Warn("the TCP sockets of pods' namespaces could not be listed: those pods' closed subflows, released records and retired rules stay until a listing works; the node's other pods are not held",
		"namespaces", len(names), "first", names[0], "err", view.unlisted[names[0]], "suppressed", l.suppressed)
	l.last, l.suppressed = now, 0
}
