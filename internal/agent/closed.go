package agent

import (
	"errors"
	"maps"
	"net/netip"
	"os"
	"time"

	"github.com/mptcp-operator/mptcp-operator/internal/agent/podnet"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
)

// A selected pod's subflow entry outlives its socket unless someone says it
// closed: the agent as the pod's path manager hears its own subflows close,
// but not the subflows of pods in signal mode, nor the peer's joins it never
// opened after a restart, nor a join the pod's kernel reset after its third
// ACK wrote the entry (a bad HMAC). Such an entry keeps its path's bit and
// its place in its connection's count, so the connection cannot join again
// on that path, and it holds a slot of the subflow table until an insert
// evicts it. The sweep below finds them from the pod's own sockets, as the
// released pods' sweep does.

// closedSubflowGrace is how old an entry must be before a sweep may call
// it closed: the pod places its own subflows at their SYN, before its
// kernel has a socket that a listing shows, and the datapath writes a
// peer's at the third ACK, a moment before the pod's kernel accepts it.
// Far longer than a handshake takes; and long enough that what the
// tables say of a connection that just ended stays readable for a while
// (the local API, tests), since the sweep is a backstop: the agent as path
// manager hears its pods' closes at once.
const closedSubflowGrace = time.Minute

// sweepClosedSubflows gives back and forgets the entries of plan's pods
// that a sweep at least a.sweepSpacing before this one already found
// closed, and that still are: placed before placedBefore, with no socket of
// their 4-tuple in the pod's namespace, and nothing sent by the pod since
// (or closedSweepLooks such looks, whatever it sent). The datapath
// returns to each connection what the subflow held, as when the pod's path
// manager hears a close. The second look, and the packets, are for pods
// whose sockets do not show the 4-tuple their packets carry (a service
// mesh's sidecar redirects what it accepts to its own port): a subflow that
// still carries packets is swept only after minutes. Left alone: pods whose sockets the
// agent cannot see (guests, mode none: their stack is in the VM), pods
// whose namespace is gone or cannot be listed (the released pods' sweep
// deals with pods that went), and addresses more than one pod claims. It
// returns how many entries it forgot.
func (a *Agent) sweepClosedSubflows(plan *Plan, placedBefore time.Time, view *sweepView) (int, error) {
	a.sweepMu.Lock()
	defer a.sweepMu.Unlock()
	netnsOf := sweepableNetNS(plan)
	seen := a.closedSeen
	a.closedSeen = map[socketKey]closedSighting{}
	now := time.Now()
	live := map[uint32]int{}
	defer func() { a.liveSubflows.Store(&live) }()
	if len(netnsOf) == 0 {
		return 0, nil
	}
	sfs, err := view.Subflows()
	if err != nil {
		if last := a.liveSubflows.Load(); last != nil {
			live = *last // nothing known: the last count stands
		}
		return 0, err
	}
	var errs []error
	closed := 0
	defer func() {
		if closed > 0 {
			view.changed()
		}
	}()
	for _, sf := range sfs {
		ns, ours := netnsOf[sf.Local.Addr().Unmap()]
		if !ours {
			continue
		}
		socks, err := view.Sockets(ns)
		if err != nil {
			continue // the pod's problem (sweepView), not the node's
		}
		if socks[socketKey{sf.Local, sf.Remote}] {
			live[sf.Path]++
			continue
		}
		if !a.closedLongEnough(sf, placedBefore, seen, now) {
			continue
		}
		// Named by its placement time: a subflow placed on the
		// 4-tuple since the table was read is not this one.
		_, gone, err := a.dp.SubflowClosed(datapath.ClosedSubflow{Local: sf.Local, Remote: sf.Remote, Heard: time.Now(), CreatedNs: sf.CreatedNs})
		if err != nil {
			errs = append(errs, err)
		}
		if gone {
			closed++
		}
	}
	return closed, errors.Join(errs...)
}

// sweepableNetNS maps each address of plan's pods whose sockets the agent
// can list (a rule that is not mode none, a namespace that still exists)
// to the pod's network namespace; an address more than one pod claims is
// left out, as its subflows cannot be told apart.
func sweepableNetNS(plan *Plan) map[netip.Addr]string {
	netnsOf := map[netip.Addr]string{}
	claimed := map[netip.Addr]int{}
	for _, pod := range plan.Pods {
		ips := map[netip.Addr]bool{}
		for _, ip := range pod.IPs {
			ips[ip.Unmap()] = true
		}
		for ip := range ips {
			claimed[ip]++
		}
		if r := plan.firstRule(pod); r == nil || r.Subflows == podnet.None {
			continue
		}
		if _, err := os.Stat(pod.NetNS); err != nil {
			continue
		}
		for _, ip := range pod.IPs {
			netnsOf[ip.Unmap()] = pod.NetNS
		}
	}
	for ip, n := range claimed {
		if n > 1 {
			delete(netnsOf, ip)
		}
	}
	return netnsOf
}

// closedLongEnough says whether sf, an entry with no socket in its pod, has
// been seen so by enough sweeps, far enough apart, to be given back; it
// records in a.closedSeen this sweep's sighting of an entry not yet due.
// seen holds the last sweep's sightings.
func (a *Agent) closedLongEnough(sf datapath.Subflow, placedBefore time.Time, seen map[socketKey]closedSighting, now time.Time) bool {
	if datapath.KtimeToTime(sf.CreatedNs).After(placedBefore) {
		return false
	}
	k := socketKey{sf.Local, sf.Remote}
	last, ok := seen[k]
	if !ok || last.createdNs != sf.CreatedNs {
		// The first look: later sweeps decide.
		a.closedSeen[k] = closedSighting{createdNs: sf.CreatedNs, sent: sf.Counters.TxPackets, first: now, looks: 1}
		return false
	}
	if now.Sub(last.first) < a.sweepSpacing*time.Duration(last.looks) {
		a.closedSeen[k] = last // too soon after the last look to count
		return false
	}
	// What the pod sent: a forger can make it receive, and what
	// its kernel answers a forged packet on a closed 4-tuple is a
	// reset each time, so after closedSweepLooks looks the entry
	// goes whatever it counted.
	quiet := sf.Counters.TxPackets == last.sent
	if !quiet && last.looks+1 < closedSweepLooks {
		a.closedSeen[k] = closedSighting{createdNs: sf.CreatedNs, sent: sf.Counters.TxPackets, first: last.first, looks: last.looks + 1}
		return false
	}
	return true
}

// LiveSubflows counts, by path index, the subflow table's entries whose
// sockets were open in their pods at the last sweep of closed subflows
// (every SweepInterval and at reconciles): the subflows that exist, where
// mptcp_agent_subflows counts entries, closed ones until swept.
func (a *Agent) LiveSubflows() map[uint32]int {
	// Not under sweepMu: a sweep lists sockets in every pod, which pods can
	// make slow, and a scrape must not wait for it.
	if live := a.liveSubflows.Load(); live != nil {
		return maps.Clone(*live)
	}
	return nil
}

// closedSighting is an entry sweeps found without a socket: which entry (its
// placement time), how many packets the pod had sent on it at the last
// look, when the first look was, and how many looks there were.
type closedSighting struct {
	createdNs, sent uint64
	first           time.Time
	looks           int
}

// closedSweepSpacing is the least time between two looks that count (the
// agent's sweepSpacing): a reconcile right after a sweep is no second look.
// closedSweepLooks is the most looks an entry without a socket survives
// while its pod still sends on it (a pod whose sockets do not show the
// 4-tuple: see above).
const (
	closedSweepSpacing = SweepInterval / 2
	closedSweepLooks   = 4
)
