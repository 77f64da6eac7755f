package agent

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/linkwatch"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/liveness"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
)

// nicInForce is a path NIC as the last reconcile found it.
type nicInForce struct {
	index   int
	paths   []uint32
	down    bool
	gateway netip.Addr
}

// WatchLinks follows the links of the agent's namespace until ctx ends
// (linkwatch.Watch) and calls kick whenever a reconcile should follow: a
// path NIC is no longer as the last reconcile found it, events may have
// been lost, or a flapping NIC's hold ends. kick must not block (coalesce:
// one pending reconcile is enough).
func (a *Agent) WatchLinks(ctx context.Context, kick func()) {
	a.kick.Store(&kick)
	linkwatch.Watch(ctx, a.log, func(c linkwatch.Change, resync bool) {
		if resync || a.linkChanged(c) {
			kick()
		}
	})
}

// linkChanged applies a path NIC's carrier change to the datapath at once,
// between reconciles: its paths go down when the NIC loses its carrier or
// goes away (new subflows avoid them, existing ones detour over another
// path of their rule: bpf/include/detour.h), and up again when it comes
// back under the index the last reconcile programmed, unless it flaps
// (settings' flapDamping holds it down a while). A NIC that came back under
// another index (deleted and created again) stays down until the next
// reconcile has programmed it. It returns whether the NIC of a path in
// force is no longer as the last reconcile found it: the caller then
// reconciles soon, which also reports the link in status.
func (a *Agent) linkChanged(c linkwatch.Change) bool {
	a.linkMu.Lock()
	defer a.linkMu.Unlock()
	n, ok := (*a.nics.Load())[c.Name]
	if !ok {
		// Not a path NIC in force; but while a path waits for its
		// link, a link that appears (a NIC plugged in, or created
		// again after it was removed) or goes may be the one.
		if a.awaitingLinks.Load() {
			a.log.Info("link event while a path has no link", "interface", c.Name, "gone", c.Gone)
			return true
		}
		return false
	}
	// The name now belongs to a link the last reconcile did not program
	// (index 0: it found none).
	other := !c.Gone && c.Index != n.index
	usable := a.usable(c.Name, !c.Gone && c.Running)
	down := !usable || other
	if !down && n.down {
		// Before subflows come home: a gateway whose resolution failed
		// while the carrier was away would hold their packets until its
		// next retry, up to a second later.
		a.resolveAgain(c.Index, n.gateway)
	}
	for _, p := range n.paths {
		if err := a.setPathDown(p, down); err != nil {
			a.log.Error("link event: marking the path", "interface", c.Name, "path", p, "down", down, "err", err)
		}
	}
	if down == n.down && !other {
		return false
	}
	a.log.Info("path link changed", "interface", c.Name, "paths", n.paths, "running", c.Running, "gone", c.Gone, "down", down)
	return true
}

// resolveAgain deletes the gateway's neighbour entry on the NIC when its
// resolution is pending or failed, so that the next packet asks at once:
// the kernel retries an INCOMPLETE entry only every retrans_time (1 s), and
// does not ask again when the carrier comes back.
func (a *Agent) resolveAgain(index int, gw netip.Addr) {
	if !gw.IsValid() {
		return
	}
	family := netlink.FAMILY_V4
	if gw.Is6() {
		family = netlink.FAMILY_V6
	}
	neighs, err := netlink.NeighList(index, family)
	if err != nil {
		a.log.Warn("link event: reading the gateway's neighbour entry", "gateway", gw, "err", err)
		return
	}
	for _, n := range neighs {
		if ip, ok := netip.AddrFromSlice(n.IP); !ok || ip.Unmap() != gw || n.State&(netlink.NUD_INCOMPLETE|netlink.NUD_FAILED) == 0 {
			continue
		}
		if err := netlink.NeighDel(&n); err != nil {
			a.log.Warn("link event: deleting the gateway's unresolved neighbour entry", "gateway", gw, "err", err)
		}
	}
}

// usable passes a NIC's state through the flap damper; a NIC held down
// gets a reconcile when its hold ends.
func (a *Agent) usable(nic string, up bool) bool {
	ok, until := a.damper.Observe(nic, up, time.Now())
	if !until.IsZero() {
		a.log.Warn("path NIC flaps: held down", "interface", nic, "until", until)
		a.recheckAt(until)
	}
	return ok
}

// recheckAt asks for a reconcile at t (WatchLinks' kick), once per moment.
func (a *Agent) recheckAt(t time.Time) {
	kick := a.kick.Load()
	if kick == nil {
		return
	}
	a.recheckMu.Lock()
	defer a.recheckMu.Unlock()
	if a.rechecks == nil {
		a.rechecks = map[time.Time]bool{}
	}
	if a.rechecks[t] {
		return
	}
	a.rechecks[t] = true
	time.AfterFunc(time.Until(t)+10*time.Millisecond, func() {
		a.recheckMu.Lock()
		delete(a.rechecks, t)
		a.recheckMu.Unlock()
		(*kick)()
	})
}

// linkState is what the agent keeps about its path NICs between reconciles.
type linkState struct {
	// linkMu makes a link event and a reconcile's syncNICs take turns:
	// a reconcile that read a NIC as running must not write "up" after
	// an event marked it down.
	linkMu sync.Mutex
	// nics are the path NICs in force by interface name, as the last
	// reconcile found them.
	nics   atomic.Pointer[map[string]nicInForce]
	damper *linkwatch.Damper
	// awaitingLinks: the plan in force left a path out for want of a
	// single link matching it (Plan.Awaiting).
	awaitingLinks atomic.Bool
	// kick asks for a reconcile (WatchLinks'); rechecks are the moments
	// a reconcile is already due at.
	kick      atomic.Pointer[func()]
	recheckMu sync.Mutex
	rechecks  map[time.Time]bool
	// prober probes the paths to their peers (nil: liveness is off);
	// probedOnce: it has been given paths since the agent started.
	prober         *liveness.Prober
	probedOnce     bool
	reportLiveness atomic.Pointer[func()]
	// downMu guards, per path, whether its NIC is down (linkDown), what
	// was last written to the datapath (down) and how often the path
	// went from up to down (the metric).
	downMu   sync.Mutex
	linkDown map[uint32]bool
	down     map[uint32]bool
	downs    map[uint32]uint64
	// peerCIDRs are the plan's (Plan.PeerCIDRs); peersDown what was last
	// written of the paths down towards one peer alone (nil: nothing yet).
	// downMu guards both.
	peerCIDRs map[string][]netip.Prefix
	peersDown map[netip.Prefix]datapath.PathMask
	// peerSlots: each probed peer's slot in the datapath's traffic
	// record (syncPeerSlots), which peerTraffic reads; only syncLiveness
	// uses them.
	peerSlots   peerSlots
	peerTraffic *datapath.PeerTraffic
	// pathMoves tells the path managers, in order, of paths going down
	// and coming back (leave.go).
	pathMoves pathMoves
}

// setPathDown records whether path's NIC is down (no carrier, gone, or
// held by the damper) and writes the path's state to the datapath.
func (a *Agent) setPathDown(path uint32, linkDown bool) error {
	a.downMu.Lock()
	defer a.downMu.Unlock()
	if a.linkDown == nil {
		a.linkDown, a.down, a.downs = map[uint32]bool{}, map[uint32]bool{}, map[uint32]uint64{}
	}
	a.linkDown[path] = linkDown
	return a.writePathDown(path)
}

// writePathDown marks path down in the datapath when its NIC is down or
// its probes reach none of its peers, up otherwise, counting each time it
// goes down after having been up. downMu is held.
func (a *Agent) writePathDown(path uint32) error {
	down := a.linkDown[path] || a.silent(path)
	if err := a.dp.SetPathDown(path, down); err != nil {
		return err
	}
	// A path first seen down (the agent restarted during a failure) is a
	// move too; only one that was up counts in the metric.
	was, known := a.down[path]
	if was != down {
		if known && down {
			a.downs[path]++
		}
		a.pathMoves.push(pathMove{path: path, down: down}, a.movePathManagers)
	}
	a.down[path] = down
	return nil
}

// forgetPathsLeft forgets the paths the plan no longer has. One that was
// down comes back for the path managers: the joins waiting for it are
// opened now, and the datapath places them on the plan's paths, rather
// than never. A path away from its link (a NIC removed, to be created
// again) has not left: it stays down, and its joins wait for the link.
func (a *Agent) forgetPathsLeft(plan *Plan) {
	a.downMu.Lock()
	defer a.downMu.Unlock()
	for path, down := range a.down {
		if slices.ContainsFunc(plan.Paths, func(p PlanPath) bool { return p.Index == path }) ||
			slices.ContainsFunc(plan.Awaiting, func(p AwaitingPath) bool { return p.Away && p.Index == path }) {
			continue
		}
		delete(a.down, path)
		delete(a.linkDown, path)
		if down {
			a.pathMoves.push(pathMove{path: path}, a.movePathManagers)
		}
	}
}

// silent reports whether path's probes reach none of its peers, through
// the flap damper: a path whose probes keep failing and coming back is
// held silent for the damper's hold.
func (a *Agent) silent(path uint32) bool {
	if a.prober == nil {
		return false
	}
	return !a.usable(fmt.Sprintf("path %d probes", path), !a.prober.Silent(path))
}

// livenessChanged applies the prober's news to the datapath at once, and
// calls the function OnLivenessChange gave: a reconcile, which in kube
// mode reports it in status.
func (a *Agent) livenessChanged() {
	a.downMu.Lock()
	for path := range a.linkDown {
		if err := a.writePathDown(path); err != nil {
			a.log.Error("liveness: marking the path", "path", path, "err", err)
		}
	}
	a.writePeersDown()
	a.downMu.Unlock()
	if report := a.reportLiveness.Load(); report != nil {
		(*report)()
	}
}

// OnLivenessChange has report called whenever a peer's liveness changes on
// a path, after the datapath has it; report must not block.
func (a *Agent) OnLivenessChange(report func()) { a.reportLiveness.Store(&report) }

// livenessPort is the probes' port nic_ingress marks, 0 with liveness off.
func (a *Agent) livenessPort() uint16 {
	if a.prober == nil {
		return 0
	}
	return uint16(a.settings.Liveness.Port)
}

// syncLiveness has the prober probe the plan's paths, with their marks.
// A path it cannot probe is logged and reported Unknown; it never fails
// the reconcile: without probes a path is still down when its NIC is.
func (a *Agent) syncLiveness(plan *Plan) {
	// Last, once the prober knows the plan's peers.
	defer a.syncPeersDown(plan.PeerCIDRs)
	if a.prober == nil {
		a.filterLiveness(nil)
		return
	}
	paths := slices.Clone(plan.Liveness)
	a.syncPeerSlots(paths, plan.PeerCIDRs)
	for i := range paths {
		paths[i].Mark = a.dp.Mark(paths[i].Index)
		// The first time: a path the pinned datapath has down (this
		// agent restarted during a failure) stays down until its
		// probes bring it up.
		if !a.probedOnce {
			paths[i].AssumeDown, _ = a.dp.PathDown(paths[i].Index)
		}
	}
	a.probedOnce = true
	if err := a.prober.Sync(paths); err != nil {
		a.log.Warn("liveness: probing", "err", err)
	}
	a.filterLiveness(paths)
}

// syncPeersDown takes the plan's peer CIDRs and writes the paths down
// towards each peer.
func (a *Agent) syncPeersDown(cidrs map[string][]netip.Prefix) {
	a.downMu.Lock()
	defer a.downMu.Unlock()
	a.peerCIDRs = cidrs
	a.writePeersDown()
}

// writePeersDown has the datapath send a peer's traffic round the paths
// its probes find it Down on, while the path stays up for the peers that
// answer (Silent takes a path down only when none does): one peer that
// fails, or forges its answers, moves no other peer's traffic, and keeps
// no path up for a peer it cannot reach. It needs the peer's pod CIDRs; a
// peer without them (nodes without spec.podCIDRs) is reached over the path
// until the path is down for everyone. A failed write is logged, and
// tried again at the next change. downMu is held.
func (a *Agent) writePeersDown() {
	down := map[netip.Prefix]datapath.PathMask{}
	if a.prober != nil {
		byPeer := map[string]datapath.PathMask{}
		for _, s := range a.prober.States() {
			if s.State == liveness.Down {
				byPeer[s.Peer.Node] = byPeer[s.Peer.Node].With(s.Path)
			}
		}
		for node, mask := range byPeer {
			for _, cidr := range a.peerCIDRs[node] {
				down[cidr] |= mask
			}
		}
	}
	// nil: not written since the agent started (the map is not pinned
	// and starts empty at each load; writing it once costs nothing).
	if a.peersDown != nil && maps.Equal(down, a.peersDown) {
		return
	}
	if err := a.dp.SetPeersDown(down); err != nil {
		a.log.Error("liveness: marking paths down towards peers", "err", err)
		a.peersDown = nil
		return
	}
	if len(down) > 0 || len(a.peersDown) > 0 {
		a.log.Info("liveness: paths down towards peers", "down", peersDownString(down))
	}
	a.peersDown = down
}

// peersDownString lists down for a log line, sorted: "10.244.2.0/24: 1,3".
func peersDownString(down map[netip.Prefix]datapath.PathMask) string {
	var out []string
	for cidr, mask := range down {
		var paths []string
		for path := uint32(1); path <= datapath.MaxPaths; path++ {
			if mask.Has(path) {
				paths = append(paths, strconv.FormatUint(uint64(path), 10))
			}
		}
		out = append(out, cidr.String()+": "+strings.Join(paths, ","))
	}
	slices.Sort(out)
	return strings.Join(out, "; ")
}

// filterLiveness has nic_ingress drop what arrives at the liveness port of
// the paths' addresses from anyone but their peers' probers, before the
// prober's sockets read it, and what a peer's address sends past its budget
// (nil paths: nothing filtered). A failure is logged: the prober reads and
// ignores such datagrams itself, at a cost.
func (a *Agent) filterLiveness(paths []liveness.Path) {
	peers := map[netip.Addr][]datapath.LivenessPeer{}
	for _, p := range paths {
		ps := peers[p.Local] // a path without peers is filtered all the same
		for _, peer := range p.Peers {
			ps = append(ps, datapath.LivenessPeer{Addr: peer.Addr, Nonce: a.prober.Nonce(p.Local, peer)})
		}
		peers[p.Local] = ps
	}
	// The budgets fit a peer probing at the shortest interval allowed:
	// during a rolling change of the interval, peers probe faster than
	// this node.
	if err := a.dp.SetLivenessPeers(peers, MinLivenessInterval, a.settings.Liveness.Interval.Duration); err != nil {
		a.log.Warn("liveness: filtering datagrams from others than peers", "err", err)
	}
}

// PathLiveness is what the probes say of a path: Alive when every peer
// that ever answered answers, Failing when one of them stopped (while it
// answered on another path), Unknown with no peers, none answered yet,
// each silent on every path, or liveness off.
func (a *Agent) PathLiveness(path uint32) mptcpv1alpha1.Liveness {
	if a.prober == nil {
		return mptcpv1alpha1.LivenessUnknown
	}
	out := mptcpv1alpha1.LivenessUnknown
	for _, s := range a.prober.States() {
		switch {
		case s.Path != path:
		case s.State == liveness.Down:
			return mptcpv1alpha1.LivenessFailing
		case s.State == liveness.Up:
			out = mptcpv1alpha1.LivenessAlive
		}
	}
	return out
}

// Liveness lists every peer of every probed path (nil when off).
func (a *Agent) Liveness() ([]liveness.PeerState, liveness.Counters) {
	if a.prober == nil {
		return nil, liveness.Counters{}
	}
	return a.prober.States(), a.prober.Counters()
}

// PathDownTransitions counts, per path index, the times the path went down
// after having been up, since the agent started.
func (a *Agent) PathDownTransitions() map[uint32]uint64 {
	a.downMu.Lock()
	defer a.downMu.Unlock()
	out := make(map[uint32]uint64, len(a.downs))
	for p, n := range a.downs {
		out[p] = n
	}
	return out
}
