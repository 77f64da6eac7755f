package agent

import (
	"context"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/mptcp-operator/mptcp-operator/internal/agent/linkwatch"
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
	// kick asks for a reconcile (WatchLinks'); rechecks are the moments
	// a reconcile is already due at.
	kick      atomic.Pointer[func()]
	recheckMu sync.Mutex
	rechecks  map[time.Time]bool
	// downMu guards what setPathDown last wrote per path and how often a
	// path went from up to down (the metric).
	downMu sync.Mutex
	down   map[uint32]bool
	downs  map[uint32]uint64
}

// setPathDown marks path down or up in the datapath, counting each time
// it goes down after having been up.
func (a *Agent) setPathDown(path uint32, down bool) error {
	if err := a.dp.SetPathDown(path, down); err != nil {
		return err
	}
	a.downMu.Lock()
	defer a.downMu.Unlock()
	if a.down == nil {
		a.down, a.downs = map[uint32]bool{}, map[uint32]uint64{}
	}
	if was, known := a.down[path]; known && !was && down {
		a.downs[path]++
	}
	a.down[path] = down
	return nil
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
