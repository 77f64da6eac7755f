package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/mptcp-operator/mptcp-operator/internal/agent/podnet"
)

// A selected pod's subflow entry outlives its socket unless someone says it
// closed: the agent as the pod's path manager hears its own subflows close,
// but not the subflows of pods in signal mode, the peer's joins it never
// opened after a restart, nor the entries the datapath mirrored for SYNs the
// pod refused (a closed port, or a forged SYN: anyone can send one). Such
// an entry keeps its path's bit and its place in its connection's count, so
// the connection cannot join again on that path, and it holds a slot of the
// subflow table until an insert evicts it. The sweep below finds them from
// the pod's own sockets, as the released pods' sweep does.

// closedSubflowGrace is how old an entry must be before a sweep may call
// it closed: the datapath mirrors a subflow at its SYN, before the pod's
// kernel has a socket for it, and a SYN may wait in queues or be answered
// late. Far longer than a handshake takes; and long enough that what the
// tables say of a connection that just ended stays readable for a while
// (the local API, tests), since the sweep is a backstop: the agent as path
// manager hears its pods' closes at once.
const closedSubflowGrace = time.Minute

// sweepClosedSubflows gives back and forgets the entries of plan's pods
// whose 4-tuple has no socket in the pod's namespace and that were placed
// before placedBefore: the datapath returns to each connection what the
// subflow held, as when the pod's path manager hears a close. Pods whose
// sockets the agent cannot see (guests: their stack is in the VM, mode
// none) are left alone, as is every pod whose sockets cannot be listed.
// It returns how many entries it forgot.
func (a *Agent) sweepClosedSubflows(plan *Plan, placedBefore time.Time) (int, error) {
	netnsOf := map[netip.Addr]string{}
	for _, pod := range plan.Pods {
		if r := plan.firstRule(pod); r == nil || r.Subflows == podnet.None {
			continue
		}
		for _, ip := range pod.IPs {
			netnsOf[ip.Unmap()] = pod.NetNS
		}
	}
	if len(netnsOf) == 0 {
		return 0, nil
	}
	sfs, err := a.dp.Subflows()
	if err != nil {
		return 0, err
	}
	var errs []error
	open := map[string]map[socketKey]bool{} // nil: not listed
	closed := 0
	for _, sf := range sfs {
		ns, ours := netnsOf[sf.Local.Addr().Unmap()]
		if !ours {
			continue
		}
		socks, listed := open[ns]
		if !listed {
			// Listed after the entries were read: a socket that
			// closes in between is swept next time, never one that
			// is open.
			if socks, err = openTCPSockets(ns); err != nil {
				errs = append(errs, fmt.Errorf("closed subflows of %s: %w", ns, err))
				socks = nil
			}
			open[ns] = socks
		}
		if socks == nil || socks[socketKey{sf.Local, sf.Remote}] {
			continue
		}
		gone, err := a.dp.SubflowClosed(sf.Local, sf.Remote, placedBefore)
		if err != nil {
			errs = append(errs, err)
		}
		if gone {
			closed++
		}
	}
	return closed, errors.Join(errs...)
}
