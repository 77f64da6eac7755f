package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/linkwatch"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/liveness"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/observe"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/podnet"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/routing"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/shaping"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
)

// Agent enforces one node's plan.
type Agent struct {
	log      *slog.Logger
	settings Settings
	dp       *datapath.Datapath
	// tunnelNICs are the ifindexes the last reconcile declared as tunnel
	// devices (syncTunnels).
	tunnelNICs map[int]bool
	// unenforced are the last reconcile's caps that miss part of the
	// traffic (capsPastOverlay, capsBehindBridge).
	unenforced []Problem
	pms        *podnet.PathManagers
	// closedSeen are the entries the last sweep found without a socket
	// (closed.go): the next one forgets those it finds so again.
	closedSeen map[socketKey]closedSighting
	sweepMu    sync.Mutex // closedSeen's: sweeps may come from two loops
	// liveSubflows counts, by path, the entries whose sockets the last
	// sweep found open (LiveSubflows), published whole at its end.
	liveSubflows atomic.Pointer[map[uint32]int]
	// sweepSpacing is closedSweepSpacing (tests look more often).
	sweepSpacing time.Duration
	// previous is the last plan reconciled (at start: the one a previous
	// process applied, from status.json), so that pods it selected and the
	// next one does not get their settings back.
	previous *Plan
	// rateBudgets are the rate budgets by group the last reconcile chose
	// (rate.go), kept while they stay valid.
	rateBudgets map[string]uint32
	// baselines are the pods' MPTCP settings from before the agent
	// changed them, which releasing or uninstalling restores.
	baselines podnet.Baselines
	// ruleIDs maps rule names to datapath ids (ruleids.go); adopt says
	// it was not found in the state directory: the first reconcile takes
	// the ids the pinned endpoints already use.
	ruleIDs *ruleIDs
	adopt   bool
	// podIDs maps pods to the ids their shaping classes are numbered by
	// (podids.go).
	podIDs *idTable
	// nsIDs maps namespaces to the ids of their perNamespace caps'
	// police buckets and HTB classes (shape.go).
	nsIDs *idTable
	// recounted is when (Unix nanoseconds) the subflow entries of each pod
	// were last counted again from the table (recountPodSubflows), by a
	// reconcile or a sweep.
	recounted atomic.Int64

	// What scrapes and the local API read while a reconcile runs: the
	// names of the paths in force by index, the rules by datapath id
	// (retired ones that live connections still use included) and the
	// pods. The path managers answer for themselves (pms.States).
	paths     atomic.Pointer[map[uint32]string]
	ruleNames atomic.Pointer[map[uint32]string]
	pods      atomic.Pointer[[]podnet.Pod]
	// The path NICs between reconciles (links.go).
	linkState
	// unlistedLog limits the lines about pods' namespaces whose sockets
	// a sweep could not list (sweepview.go).
	unlistedLog unlistedLog
	// The socket program of podMPTCP.transparent kernel (socketmptcp.go).
	socketMPTCP socketMPTCPState
	// node is what the last check of the node found (checks.go): made at
	// start and again at every reconcile, since a CNI can start, change
	// its mode or turn encryption on while the agent runs.
	node atomic.Pointer[nodeChecked]
	// pending is a check that relaxes the last, not yet confirmed, and
	// confirmSpan the time its confirmation takes at least (recheckNode).
	pending     pendingCheck
	confirmSpan time.Duration
	// heldForClash says the datapath was stopped for a mark clash
	// (stopForClash): it marks again once the paths' rules are back.
	heldForClash bool
	// migrationHeld says a map migration waits for a clash to end
	// (FinishMigration), logged once.
	migrationHeld bool
	// lastUnread is the last error of a check that could not read the
	// node whole, logged once.
	lastUnread string
}

// The agent is what its metrics and local API read.
var _ observe.Source = (*Agent)(nil)

// podSubflowsRecount is how often reconciles and sweeps count each pod's subflow
// entries again from the table.
const podSubflowsRecount = time.Minute

// recountPodSubflows counts each pod's entries of the subflow table again
// (datapath.RecountPodSubflows), at the first reconcile and then at most
// every podSubflowsRecount, at reconciles and sweeps: the first after every
// program was attached (the programs a previous release left attached until
// then did not count), and then so that a count a race left off does not
// stay off.
func (a *Agent) recountPodSubflows() error {
	last, now := a.recounted.Load(), time.Now()
	if now.Sub(time.Unix(0, last)) < podSubflowsRecount || !a.recounted.CompareAndSwap(last, now.UnixNano()) {
		return nil
	}
	return a.dp.RecountPodSubflows()
}

// New loads (or re-adopts, from pins) the datapath of the node settings
// describe.
func New(settings Settings, log *slog.Logger) (*Agent, error) {
	if err := ensureBPFFS(); err != nil {
		return nil, err
	}
	node := checkNode(settings)
	if err := kernelRefusal(node.checks); err != nil {
		return nil, err
	}
	// Migrate: pinned maps an earlier release laid out differently are
	// converted now and settled by FinishMigration after the first reconcile.
	dp, err := datapath.Load(datapath.Options{PinDir: settings.PinDir, MarkMask: settings.MarkMask, Migrate: true, Log: log})
	if err != nil {
		return nil, err
	}
	a := &Agent{log: log, settings: settings, dp: dp, baselines: podnet.NewBaselines(settings.StateDir), sweepSpacing: closedSweepSpacing,
		confirmSpan: confirmSpan}
	a.noteNode(node)
	if node.refused != nil {
		if err := a.stopForClash(); err != nil {
			return nil, errors.Join(err, dp.Close())
		}
	}
	// A subflow a managed pod's kernel closed gives its path back before
	// the path manager opens a join to replace it (and says which path,
	// for the join to wait for while it is down).
	a.pms = podnet.NewPathManagers(log, podnet.PathManagerOptions{
		SubflowClosed: func(local, remote netip.AddrPort, token uint32, heard time.Time) (uint32, error) {
			path, _, err := dp.SubflowClosed(datapath.ClosedSubflow{Local: local, Remote: remote, Heard: heard, Token: token})
			return path, err
		},
		JoinHoldoff: settings.joinHoldoff(),
	})
	if st, err := readStatus(settings.StateDir); err == nil {
		a.previous = st.Applied
	}
	var found bool
	a.ruleIDs, found = readRuleIDs(settings.StateDir)
	a.adopt = !found
	a.podIDs = readPodIDs(settings.StateDir)
	a.publish(&Plan{Settings: settings})
	a.nics.Store(&map[string]nicInForce{})
	a.damper = linkwatch.NewDamper(settings.FlapDamping.damping())
	if l := settings.Liveness; !l.Off {
		// The datapath's record of what the pods send each peer: the
		// prober probes the peers they send to at the interval, the
		// others slowly.
		if a.peerTraffic, err = dp.PeerTraffic(); err != nil {
			return nil, errors.Join(err, dp.Close())
		}
		a.prober, err = liveness.New(liveness.Config{Port: l.Port, Interval: l.Interval.Duration, Multiplier: l.DetectMultiplier,
			Traffic: a.peerTraffic, IdleInterval: l.IdleInterval.Duration}, log, a.livenessChanged)
		if err != nil {
			return nil, errors.Join(err, dp.Close())
		}
	}
	return a, nil
}

// publish makes plan what scrapes and the local API read.
func (a *Agent) publish(plan *Plan) {
	names := make(map[uint32]string, len(plan.Paths))
	for _, p := range plan.Paths {
		names[p.Index] = p.Name
	}
	a.paths.Store(&names)
	rules := map[uint32]string{}
	if a.ruleIDs != nil {
		rules = a.ruleIDs.names()
	}
	a.ruleNames.Store(&rules)
	pods := make([]podnet.Pod, 0, len(plan.Pods))
	for _, p := range plan.Pods {
		pods = append(pods, podOf(p))
	}
	a.pods.Store(&pods)
}

// PathNames returns the paths in force by index.
func (a *Agent) PathNames() map[uint32]string { return *a.paths.Load() }

// RuleNames returns the rules by datapath id, retired ones that live
// connections still use included.
func (a *Agent) RuleNames() map[uint32]string { return *a.ruleNames.Load() }

// Pods returns the selected pods.
func (a *Agent) Pods() []podnet.Pod { return *a.pods.Load() }

// PathManagers are the states of the userspace path managers, up or
// waiting to restart, read when asked: one can fail between reconciles.
func (a *Agent) PathManagers() []podnet.PathManagerState { return a.pms.States() }

// ServeLocalAPI serves the local API on <stateDir>/agent.sock until ctx
// ends (observe.ServeLocalAPI).
func (a *Agent) ServeLocalAPI(ctx context.Context) (string, func(), error) {
	return observe.ServeLocalAPI(ctx, a, a.settings.StateDir, a.log)
}

// Close stops the agent's path managers and releases file descriptors. What
// is pinned stays: the datapath keeps steering while no agent runs. The
// socket program is not pinned: it goes with the agent.
func (a *Agent) Close() error {
	a.pms.Stop()
	if a.prober != nil {
		a.prober.Close()
	}
	return errors.Join(a.closeSocketMPTCP(), a.dp.Close())
}

// Datapath exposes the loaded datapath (stats, tables).
func (a *Agent) Datapath() *datapath.Datapath { return a.dp }

// Attachments are the datapath's pinned attachments.
func (a *Agent) Attachments() ([]datapath.Attachment, error) { return a.dp.Attachments() }

// Reconcile makes the node match plan, one job after the other. On error
// the parts that succeeded stay applied; the caller reports the error and
// keeps running. The pods it could not configure are the pods' own
// problems, not the node's: they are returned (PodConfigureFailed, by
// namespace and name) and left out of plan.Pods, which then holds the pods
// enforced; the error is only for what fails the node as a whole.
func (a *Agent) Reconcile(ctx context.Context, plan *Plan) ([]mptcpv1alpha1.PodProblem, error) {
	node := a.recheckNode()
	if node.refused != nil {
		return nil, errors.Join(node.refused, a.stopForClash())
	}
	// The switch first: a node set up in observe-only mode never marks a
	// packet, not even between the first attach and the end of this
	// reconcile. Switching it off marks again at once, with the programs
	// in place; after a clash, only once routing has put the paths' rules
	// back.
	if err := a.dp.SetObserveOnly(plan.Settings.ObserveOnly || a.heldForClash); err != nil {
		return nil, fmt.Errorf("observe-only: %w", err)
	}
	if err := a.dp.SetLivenessPort(a.livenessPort()); err != nil {
		return nil, fmt.Errorf("liveness port: %w", err)
	}
	var errs []error
	keep := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	hooks := map[datapath.Attachment]bool{}
	// An overlay's tunnel devices, as the main table routes through them.
	var tunnels []routing.Tunnel
	if len(plan.Paths) > 0 {
		var err error
		tunnels, err = routing.Tunnels()
		keep(err)
	}
	// Routing first: a mark without its rule would send packets nowhere.
	keep(a.syncRouting(plan, tunnels))
	if a.heldForClash && len(errs) == 0 {
		if err := a.dp.SetObserveOnly(plan.Settings.ObserveOnly); err != nil {
			return nil, fmt.Errorf("observe-only: %w", err)
		}
		a.heldForClash = false
	}
	keep(a.syncReversePathFilter(plan))
	// Probing before the NICs: a path the last agent left down for
	// its probes stays down while syncNICs writes the paths' states.
	a.syncLiveness(plan)
	a.awaitingLinks.Store(len(plan.Awaiting) > 0)
	keep(a.syncNICs(plan, hooks, node.network.MayRouteInBPF()))
	tunnels = a.steerableTunnels(tunnels, node.network.Name == "cilium")
	tunnelHooks(tunnels, hooks)
	ids, err := a.assignRuleIDs(plan)
	keep(err)
	podIDs, err := a.assignPodIDs(plan)
	keep(err)
	keep(a.syncRules(plan, ids))
	budgets, err := a.syncRates(plan, ids)
	keep(err)
	keep(a.syncShaping(plan, ids, podIDs, budgets, hooks))
	policeHooks(plan, hooks)
	problems, err := a.syncPods(ctx, plan, ids, hooks)
	keep(err)
	a.noteUnenforced(append(capsPastOverlay(plan.Rules, tunnels), capsBehindBridge(plan.Rules, plan.Pods, bridgePort)...))
	keep(a.syncSocketMPTCP(plan))
	keep(a.syncPodInterfaces(plan))
	keep(a.syncHooks(hooks))
	// The tunnels once their hooks are on: a tunnel declared with none
	// would pass decapsulated joins as on a path, never staged.
	keep(a.syncTunnels(plan, tunnels))
	// The sweeps read the subflow table and the pods' sockets once.
	view := newSweepView(a.dp)
	_, err = a.sweepClosedSubflows(plan, time.Now().Add(-closedSubflowGrace), view)
	keep(err)
	// Then what no plan wants any more.
	keep(a.releasePods(plan))
	keep(a.sweepReleased(plan, view))
	keep(a.retireRules(plan, ids, view))
	keep(a.retirePodIDs(podIDs))
	a.reportUnlisted(view)
	keep(a.recountPodSubflows())
	a.previous = plan
	a.publish(plan)
	return problems, errors.Join(errs...)
}

// bridgePort says whether the interface named is a port of a bridge (a
// Linux bridge or OVS; not a bond's or a VRF's member).
func bridgePort(name string) bool {
	l, err := netlink.LinkByName(name)
	if err != nil || l.Attrs().MasterIndex == 0 {
		return false
	}
	m, err := netlink.LinkByIndex(l.Attrs().MasterIndex)
	return err == nil && (m.Type() == "bridge" || m.Type() == "openvswitch")
}

func (a *Agent) ranges() routing.Ranges {
	return routing.Ranges{TableBase: a.settings.TableBase, RulePriority: a.settings.RulePriority, MarkMask: a.settings.MarkMask}
}

// syncRouting gives each path its table and fwmark rule (routing), the
// table holding the tunnels' routes and the direct routes to the peers' pod
// CIDRs, by the addresses liveness probes them at on each path.
func (a *Agent) syncRouting(plan *Plan, tunnels []routing.Tunnel) error {
	paths := make([]routing.Path, 0, len(plan.Paths))
	for _, p := range plan.Paths {
		paths = append(paths, p.Path)
	}
	byNode := map[string]routing.Peer{}
	for _, lp := range plan.Liveness {
		for _, peer := range lp.Peers {
			if _, ok := byNode[peer.Node]; !ok {
				byNode[peer.Node] = routing.Peer{Addresses: map[uint32]netip.Addr{}, PodCIDRs: plan.PeerCIDRs[peer.Node]}
			}
			byNode[peer.Node].Addresses[lp.Index] = peer.Addr
		}
	}
	return routing.Sync(a.ranges(), routing.Want{PodCIDRs: plan.PodCIDRs, Paths: paths, Tunnels: tunnels,
		Peers: slices.Collect(maps.Values(byNode))}, a.dp.Mark)
}

// steerableTunnels are the tunnels whose arrivals the datapath can judge:
// those on the first tunnel's port (the datapath knows one port; flannel
// has one device) with an address of their own, or flow-based where the
// CNI is Cilium (its cilium_vxlan: what arrives between the nodes' path
// addresses is its), and none that is a path's NIC (syncNICs declared it as
// one).
func (a *Agent) steerableTunnels(tunnels []routing.Tunnel, cilium bool) []routing.Tunnel {
	paths := a.pathNICIndexes()
	var out []routing.Tunnel
	for _, tn := range tunnels {
		ok := tn.Local.IsValid() || (tn.FlowBased && cilium)
		if paths[tn.Index] || !ok || (len(out) > 0 && tn.Port != out[0].Port) {
			continue
		}
		out = append(out, tn)
	}
	return out
}

// pathNICIndexes are the ifindexes syncNICs declared as paths' NICs.
func (a *Agent) pathNICIndexes() map[int]bool {
	paths := map[int]bool{}
	if nics := a.nics.Load(); nics != nil {
		for _, n := range *nics {
			paths[n.index] = true
		}
	}
	return paths
}

// tunnelHooks asks for nic_ingress on each tunnel device.
func tunnelHooks(tunnels []routing.Tunnel, hooks map[datapath.Attachment]bool) {
	for _, tn := range tunnels {
		hooks[datapath.Attachment{Interface: tn.Name, Hook: datapath.HookNICIngress}] = true
	}
}

// syncTunnels steers an overlay's arrivals: nic_ingress marks the outer
// packets to the tunnel's port and address with their path NIC's path, and
// runs on each tunnel device too, where it judges the decapsulated packets
// on that path (docs/datapath.md, "Overlays"); nic_egress readdresses an
// outer packet carrying another path's subflow to the peer's address on that
// path (tunnelHops). A tunnel is declared only once nic_ingress runs on it,
// and the port only once a tunnel is.
func (a *Agent) syncTunnels(plan *Plan, tunnels []routing.Tunnel) error {
	var errs []error
	attached := map[string]bool{}
	atts, err := a.dp.Attachments()
	if err != nil {
		errs = append(errs, err)
	}
	for _, att := range atts {
		if att.Hook == datapath.HookNICIngress {
			attached[att.Interface] = true
		}
	}
	var port uint16
	var local netip.Addr
	now := map[int]bool{}
	for _, tn := range tunnels {
		if !attached[tn.Name] {
			continue // its attach failed: reported by syncHooks
		}
		if err := a.dp.SetTunnelNIC(tn.Index); err != nil {
			errs = append(errs, fmt.Errorf("tunnel %s: %w", tn.Name, err))
			continue
		}
		now[tn.Index] = true
		if port == 0 {
			port, local = tn.Port, tn.Local
		}
	}
	if err := a.dp.SetTunnel(port, local); err != nil {
		errs = append(errs, fmt.Errorf("tunnel port: %w", err))
	}
	var arrivals []datapath.TunnelArrival
	var hops []datapath.TunnelHop
	if port != 0 {
		arrivals, hops = tunnelHops(plan.Liveness, a.peerSlots.byNode)
	}
	if err := a.dp.SyncTunnelHops(arrivals, hops); err != nil {
		errs = append(errs, fmt.Errorf("tunnel hops: %w", err))
	}
	paths := a.pathNICIndexes()
	for index := range a.tunnelNICs {
		// Gone, or its index reused by a path NIC syncNICs declared.
		if !now[index] && !paths[index] {
			if err := a.dp.DeleteNIC(index); err != nil {
				errs = append(errs, err)
				now[index] = true // tried again next time
			}
		}
	}
	a.tunnelNICs = now
	return errors.Join(errs...)
}

// syncPods sets each selected pod's MPTCP up as its first rule asks and runs
// its path manager (podnet), and gives each of its addresses its selector
// chain; addresses no pod has any more stop being selected. A pod that
// cannot be configured (its namespace vanished between the translation and
// now, a setting or an entry refused) is its own problem, not the node's:
// it is returned as a problem and left out of plan.Pods, its entries are
// removed and the settings it got back, and the other pods are configured.
// The error is the node's (the datapath's endpoints).
func (a *Agent) syncPods(ctx context.Context, plan *Plan, ids map[string]uint32, hooks map[datapath.Attachment]bool) ([]mptcpv1alpha1.PodProblem, error) {
	var errs []error
	failed := map[string]error{}
	configured := map[string]bool{} // pods whose MPTCP settings it changed
	var managed []podnet.Want
	for _, pod := range plan.Pods {
		rule, changed, err := a.syncPod(plan, pod, ids)
		configured[pod.Name] = changed
		if err != nil {
			failed[pod.Name] = err
			continue
		}
		if rule.Subflows == podnet.Userspace && rule.Joins > 0 {
			managed = append(managed, podnet.Want{Pod: podOf(pod), Joins: rule.Joins, JoinAfterBytes: rule.JoinAfterBytes})
		}
	}
	for name, err := range a.pms.Sync(ctx, managed) {
		failed[name] = err
	}
	endpoints := map[netip.Addr]bool{}
	var problems []mptcpv1alpha1.PodProblem
	kept := make([]PlanPod, 0, len(plan.Pods))
	for _, pod := range plan.Pods {
		if err := failed[pod.Name]; err != nil {
			problems = append(problems, mptcpv1alpha1.PodProblem{Namespace: pod.Ref.Namespace, Name: pod.Ref.Name,
				Reason: mptcpv1alpha1.PodConfigureFailed, Message: err.Error()})
			// A pod the previous plan had gets its settings back
			// with releasePods; one it did not, here (best effort:
			// its namespace may be gone).
			if configured[pod.Name] && !a.inPrevious(pod) {
				_ = a.releasePodMPTCP(pod)
			}
			continue
		}
		kept = append(kept, pod)
		for _, ip := range pod.IPs {
			endpoints[ip.Unmap()] = true
		}
		hooks[datapath.Attachment{Interface: pod.HostInterface, Hook: datapath.HookPodEgress}] = true
		hooks[datapath.Attachment{Interface: pod.HostInterface, Hook: datapath.HookPodIngress}] = true
	}
	plan.Pods = kept
	current, err := a.dp.Endpoints()
	if err != nil {
		errs = append(errs, err)
	}
	for addr := range current {
		if !endpoints[addr.Unmap()] {
			if err := a.dp.DeleteEndpoint(addr); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return problems, errors.Join(errs...)
}

// syncPod configures one pod: its MPTCP settings (after recording their
// baseline) and its addresses' selector chains. It returns the pod's first
// rule, which its path manager follows, and whether it changed the pod's
// MPTCP settings (so that a pod that fails after is given them back).
func (a *Agent) syncPod(plan *Plan, pod PlanPod, ids map[string]uint32) (*PlanRule, bool, error) {
	chain := make([]uint32, 0, len(pod.Rules))
	for _, name := range pod.Rules {
		if id, ok := ids[name]; ok {
			chain = append(chain, id)
		}
	}
	rule := plan.firstRule(pod)
	if rule == nil || len(chain) != len(pod.Rules) {
		return nil, false, errors.New("a rule of its chain has no id")
	}
	// The pod's MPTCP settings and subflow creation follow its first
	// (highest priority) rule; the datapath selects per subflow.
	if err := a.recordBaseline(pod, rule.MPTCP); err != nil {
		return rule, false, err
	}
	if err := a.configurePod(pod, rule.MPTCP); err != nil {
		return rule, false, err
	}
	changed := rule.Subflows != podnet.None
	for _, ip := range pod.IPs {
		if err := a.dp.SetEndpointRules(ip, chain...); err != nil {
			return rule, changed, err
		}
	}
	return rule, changed, nil
}

// inPrevious says whether the previous plan had pod (the same namespace).
func (a *Agent) inPrevious(pod PlanPod) bool {
	return a.previous != nil && slices.ContainsFunc(a.previous.Pods, func(p PlanPod) bool { return p.NetNS == pod.NetNS })
}

// configurePod sets the pod's MPTCP up as m asks, at every reconcile, so a
// changed rule reaches a running pod. A pod whose rule now leaves its stack
// alone (subflows none: a guest's own path manager) after the agent set it
// up gets its own settings back, as a released pod does.
func (a *Agent) configurePod(pod PlanPod, m podnet.MPTCP) error {
	if m.Subflows == podnet.None && a.configuredBefore(pod) {
		return a.releasePodMPTCP(pod)
	}
	return podnet.Configure(podOf(pod), m)
}

// recordBaseline keeps what pod's namespace holds before the agent first
// changes it (podnet.Baselines). A pod that the previous plan already
// configured and that has no baseline was configured by a release that
// kept none: its namespace now holds that release's settings, which are no
// baseline; it gets the kernel's defaults back when released.
func (a *Agent) recordBaseline(pod PlanPod, m podnet.MPTCP) error {
	if m.Subflows == podnet.None || a.baselines.Has(podOf(pod)) || a.configuredBefore(pod) {
		return nil
	}
	return a.baselines.Record(podOf(pod))
}

// configuredBefore says whether the previous plan had pod (the same
// namespace) with a first rule that configures its MPTCP settings.
func (a *Agent) configuredBefore(pod PlanPod) bool {
	if a.previous == nil {
		return false
	}
	for _, p := range a.previous.Pods {
		if p.NetNS == pod.NetNS {
			prev := a.previous.firstRule(p)
			return prev != nil && prev.Subflows != podnet.None
		}
	}
	return false
}

// releasePodMPTCP undoes configurePod: the pod's baseline back, or, for a
// pod configured by a release that kept none, the kernel's path manager
// and default limits.
func (a *Agent) releasePodMPTCP(pod PlanPod) error {
	restored, err := a.baselines.Restore(podOf(pod))
	if restored || err != nil {
		return err
	}
	return podnet.Reset(podOf(pod))
}

// releasePods gives the pods that the previous plan selected and plan does
// not their MPTCP settings from before (releasePodMPTCP), as uninstall does.
// A pod whose namespace is gone (deleted) needs nothing.
func (a *Agent) releasePods(plan *Plan) error {
	if a.previous == nil {
		return nil
	}
	// By namespace: a pod's name may read differently in the plan of an
	// earlier release (status.json), its namespace does not.
	keep := map[string]bool{}
	for _, p := range plan.Pods {
		keep[p.NetNS] = true
	}
	var errs []error
	for _, pod := range a.previous.Pods {
		rule := a.previous.firstRule(pod)
		if keep[pod.NetNS] || (rule != nil && rule.Subflows == podnet.None) {
			continue
		}
		if _, err := os.Stat(pod.NetNS); err != nil {
			errs = append(errs, a.baselines.Forget(pod.Name))
			continue
		}
		// The pod's namespace is its tenant's: what fails there is the
		// pod's, and the node's other pods are not held for it.
		if err := a.releasePodMPTCP(pod); err != nil {
			a.log.Warn("a pod no longer selected did not get its MPTCP settings back", "pod", pod.Name, "err", err)
		}
	}
	return errors.Join(errs...)
}

// sysctlState records the values the agent changed, so uninstall can put
// them back.
type sysctlState struct {
	Original map[string]string `json:"original"`
}

func (a *Agent) statePath() string { return filepath.Join(a.settings.StateDir, "sysctl.json") }

// syncReversePathFilter enables src_valid_mark on every path NIC: with
// strict reverse-path filtering, the check for a packet arriving on NIC k
// then uses the mark its NIC gave it, finds path k's table and accepts the
// packet. The original values are kept for uninstall.
func (a *Agent) syncReversePathFilter(plan *Plan) error {
	st := sysctlState{Original: map[string]string{}}
	if b, err := os.ReadFile(a.statePath()); err == nil {
		_ = json.Unmarshal(b, &st)
	}
	var errs []error
	for _, p := range plan.Paths {
		key := "net.ipv4.conf." + p.Interface + ".src_valid_mark"
		if _, saved := st.Original[key]; !saved {
			v, err := netnsutil.ReadSysctl("", key)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			st.Original[key] = v
		}
		if err := netnsutil.WriteSysctl("", key, "1"); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.MkdirAll(a.settings.StateDir, 0o700); err != nil {
		return err
	}
	b, _ := json.Marshal(st)
	if err := os.WriteFile(a.statePath(), b, 0o600); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Uninstall removes everything the agent created on this node: links, maps,
// pins, rules, tables, qdiscs, sysctls and the pods' MPTCP settings. What to
// undo of paths and pods is the plan last applied (status.json): neither
// mode needs its source for it.
func (a *Agent) Uninstall() error {
	a.pms.Stop()
	var errs []error
	atts, err := a.dp.Attachments()
	if err != nil {
		errs = append(errs, err)
	}
	for _, att := range atts {
		if err := a.dp.Detach(att); err != nil {
			errs = append(errs, err)
		}
	}
	if err := routing.Remove(a.ranges()); err != nil {
		errs = append(errs, err)
	}
	last := a.previous
	if last == nil {
		last = &Plan{}
	}
	for _, p := range last.Paths {
		if err := shaping.RemoveFrom(p.Interface); err != nil {
			errs = append(errs, fmt.Errorf("path %q: %w", p.Name, err))
		}
	}
	if err := shaping.RemoveDevice(); err != nil {
		errs = append(errs, err)
	}
	for _, pod := range last.Pods {
		if _, err := os.Stat(pod.NetNS); err != nil {
			continue
		}
		// A pod whose rule never configured its namespace (subflows
		// none) keeps what it has.
		if rule := last.firstRule(pod); !a.baselines.Has(podOf(pod)) && (rule == nil || rule.Subflows == podnet.None) {
			continue
		}
		if err := a.releasePodMPTCP(pod); err != nil {
			errs = append(errs, fmt.Errorf("pod %s: %w", pod.Name, err))
		}
	}
	if b, err := os.ReadFile(a.statePath()); err == nil {
		var st sysctlState
		if json.Unmarshal(b, &st) == nil {
			keys := make([]string, 0, len(st.Original))
			for k := range st.Original {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			for _, k := range keys {
				// The interface may be gone; nothing to restore then.
				_ = netnsutil.WriteSysctl("", k, st.Original[k])
			}
		}
	}
	if err := os.RemoveAll(a.settings.StateDir); err != nil {
		errs = append(errs, err)
	}
	if err := a.dp.Unpin(); err != nil {
		errs = append(errs, err)
	}
	if err := a.dp.Close(); err != nil {
		errs = append(errs, err)
	}
	if err := os.Remove(a.settings.PinDir); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	// The default pin root holds every node's pin directory on a shared
	// bpffs; the agent made it, and removes it once no node's is left
	// (any error means it is not empty, or not the agent's to remove).
	if filepath.Dir(filepath.Clean(a.settings.PinDir)) == DefaultPinRoot {
		_ = os.Remove(DefaultPinRoot)
	}
	return errors.Join(errs...)
}

// ensureBPFFS mounts bpffs at /sys/fs/bpf if nothing is mounted there, as
// Cilium's agent does: pins need it.
func ensureBPFFS() error {
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/bpf", &st); err == nil && st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := os.MkdirAll("/sys/fs/bpf", 0o755); err != nil {
		return err
	}
	if err := unix.Mount("bpf", "/sys/fs/bpf", "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mounting bpffs at /sys/fs/bpf: %w", err)
	}
	return nil
}

// Status is what the agent last did, written to <StateDir>/status.json for
// tools, tests and the next process.
type Status struct {
	// PID is the agent process that wrote the status; Reconciles counts
	// that process's reconciles.
	PID        int    `json:"pid"`
	Reconciles int    `json:"reconciles"`
	Error      string `json:"error,omitempty"`
	// Applied is the plan in force (the last good one).
	Applied *Plan `json:"applied,omitempty"`
	// MetricsAddress is where /metrics, /healthz and /readyz are served
	// (the address actually bound, when the flag asked for port 0).
	MetricsAddress string `json:"metricsAddress,omitempty"`
	// LocalAPISocket is the unix socket of the local API (root only).
	LocalAPISocket string `json:"localAPISocket,omitempty"`
}

func readStatus(stateDir string) (Status, error) {
	var st Status
	b, err := os.ReadFile(filepath.Join(stateDir, "status.json"))
	if err != nil {
		return st, err
	}
	err = json.Unmarshal(b, &st)
	// An earlier release wrote its own configuration format: what fits the
	// plan (its paths' interfaces, its pods' namespaces and addresses,
	// their subflow modes) is read, the rest is left out.
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		err = nil
	}
	return st, err
}

// WriteStatus records the outcome of a reconcile.
func (a *Agent) WriteStatus(st Status) error {
	if err := os.MkdirAll(a.settings.StateDir, 0o700); err != nil {
		return err
	}
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(a.settings.StateDir, ".status.json")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(a.settings.StateDir, "status.json"))
}
