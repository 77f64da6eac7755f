package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/internal/mptcpnl"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
)

// A pod the agent stops selecting (its policy went, its labels changed, it
// was deleted) takes plain routing at once, but its open subflows may still
// arrive on the NICs they were placed on: the peer's node releases its own
// pod a moment later, or keeps it selected. The datapath lets their packets
// through reverse-path filtering while it has a record of them, so the agent
// keeps the records of a released pod's open subflows and forgets the rest
// (connections, rate state, closed subflows) at once; each reconcile forgets
// the subflows whose sockets closed since. A pod whose network namespace is
// gone has no open subflow. The addresses still to sweep are kept in the
// state directory, so a restarted agent finishes the job.

// SweepInterval is how often an agent without other reason to reconcile
// sweeps the released pods' records and the selected pods' closed subflows
// (kube mode resyncs as often, and every reconcile sweeps).
const SweepInterval = 30 * time.Second

// Sweep forgets what closed since the last reconcile: the records of
// released pods' subflows, and the entries of selected pods' subflows
// (closed.go).
func (a *Agent) Sweep() error {
	plan := a.previous
	if plan == nil {
		plan = &Plan{}
	}
	view := newSweepView(a.dp)
	_, err := a.sweepClosedSubflows(plan, time.Now().Add(-closedSubflowGrace), view)
	err = errors.Join(err, a.sweepReleased(plan, view))
	a.reportUnlisted(view)
	return errors.Join(err, a.recountPodSubflows())
}

// releasedPods maps a released pod address to its network namespace path.
type releasedPods map[netip.Addr]string

func (a *Agent) releasedPath() string { return filepath.Join(a.settings.StateDir, "released.json") }

func (a *Agent) readReleased() releasedPods {
	out := releasedPods{}
	if b, err := os.ReadFile(a.releasedPath()); err == nil {
		// A damaged file loses only the sweep of old records: the LRU
		// evicts them in time.
		_ = json.Unmarshal(b, &out)
	}
	return out
}

// sweepReleased records the addresses of the pods that the previous plan
// selected and plan does not, and forgets what the datapath holds of each
// released address but its open subflows. Call it after the endpoints plan
// does not select are deleted.
func (a *Agent) sweepReleased(plan *Plan, view *sweepView) error {
	released := a.readReleased()
	before := len(released)
	if a.previous != nil {
		for _, pod := range a.previous.Pods {
			for _, ip := range pod.IPs {
				released[ip.Unmap()] = pod.NetNS
			}
		}
	}
	for _, pod := range plan.Pods {
		for _, ip := range pod.IPs {
			delete(released, ip.Unmap())
		}
	}
	var errs []error
	open := map[socketKey]bool{}
	var sweep []netip.Addr
	if _, err := view.Subflows(); err != nil {
		return err
	}
	for addr, ns := range released {
		socks, err := view.Sockets(ns)
		if err != nil {
			// Keep every record of the pod until its sockets can be
			// read: the pod's problem (sweepView), not the node's.
			continue
		}
		maps.Copy(open, socks)
		sweep = append(sweep, addr)
	}
	if len(sweep) > 0 {
		left, err := a.dp.ForgetLocal(sweep, func(sf datapath.Subflow) bool { return open[socketKey{sf.Local, sf.Remote}] })
		view.changed()
		if err != nil {
			errs = append(errs, err)
		}
		for addr, n := range left {
			if n == 0 {
				delete(released, addr)
			}
		}
	}
	if len(released) == 0 && before == 0 {
		return errors.Join(errs...)
	}
	if err := a.writeReleased(released); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (a *Agent) writeReleased(r releasedPods) error {
	if len(r) == 0 {
		if err := os.Remove(a.releasedPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	if err := os.MkdirAll(a.settings.StateDir, 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return os.WriteFile(a.releasedPath(), b, 0o600)
}

// socketKey is a TCP socket's two ends, as its namespace sees them.
type socketKey struct{ local, remote netip.AddrPort }

// openTCPSockets lists the TCP sockets of the network namespace at nsPath
// that can still receive a peer's packets: every state but TIME_WAIT and
// CLOSE. A namespace that no longer exists has none. The namespace is the
// pod's, whose processes decide how many sockets it has, and with
// CAP_NET_ADMIN could send to an unconnected netlink socket of it: the
// listing is bounded, timed and connected to the kernel
// (mptcpnl.ListOpenTCPSockets), and its failure is the pod's (sweepView).
func openTCPSockets(nsPath string) (map[socketKey]bool, error) {
	open := map[socketKey]bool{}
	if _, err := os.Stat(nsPath); errors.Is(err, os.ErrNotExist) {
		return open, nil
	}
	fd, err := netnsutil.Open(nsPath)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	socks, err := mptcpnl.ListOpenTCPSockets(fd)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", nsPath, err)
	}
	for _, s := range socks {
		open[socketKey{s.Local, s.Remote}] = true // addresses unmapped
	}
	return open, nil
}
