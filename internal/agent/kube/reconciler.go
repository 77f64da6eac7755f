// Package kube runs the agent against the API: it watches the node's own
// MPTCPNodeState, enforces it through agent.Agent, and reports back in the
// state's status, in events and in the pod gate condition of local pods.
package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/nodecheck"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/observe"
	"github.com/mptcp-operator/mptcp-operator/internal/datapath"
	"github.com/mptcp-operator/mptcp-operator/internal/limits"
)

// Condition types of an MPTCPNodeState, and the pod gate.
const (
	ConditionReady             = "Ready"
	ConditionProgressing       = "Progressing"
	ConditionDegraded          = "Degraded"
	ConditionTransparentKernel = mptcpv1alpha1.ConditionTransparentKernel
	// ConditionPeersProbed: whether the node's liveness probes every
	// peer, present while the node has pods under a policy.
	ConditionPeersProbed = "PeersProbed"
	// ConditionNodeSupported sums up status.checks (nodecheck.Summary).
	ConditionNodeSupported = mptcpv1alpha1.ConditionNodeSupported
	// PodReadyCondition is set on each local pod the agent configured.
	PodReadyCondition corev1.PodConditionType = mptcpv1alpha1.PodReadyCondition
)

// Reasons of the conditions: each says what a user can do about it.
const (
	ReasonApplied          = "Applied"                            // the spec is enforced
	ReasonNotYetApplied    = "NotYetApplied"                      // nothing was enforced yet
	ReasonAsExpected       = "AsExpected"                         // not degraded
	ReasonInterfaceMissing = mptcpv1alpha1.ReasonInterfaceMissing // a path's interface is absent or ambiguous on the node: the path is left out, the rest enforced; fix the MPTCPPath's interface selector
	ReasonInvalidSpec      = mptcpv1alpha1.ReasonInvalidSpec      // the spec cannot be enforced (bad index, rule without usable path...): see status.errors
	ReasonApplyFailed      = mptcpv1alpha1.ReasonApplyFailed      // the kernel refused part of the configuration: see status.errors and the agent's log
	ReasonCapsNotEnforced  = mptcpv1alpha1.ReasonCapsNotEnforced  // enforced, but some rules' caps miss traffic an overlay encapsulates: see status.errors
	ReasonStartFailed      = "StartFailed"                        // the agent could not start, for no reason a check names: see the agent's log
	ReasonMarkClash        = mptcpv1alpha1.ReasonMarkClash        // the CNI uses bits of the agent's mark mask: nothing is enforced; set the chart's agent.markMask (the NodeSupported condition says which bits are free)
	ReasonWaitingForPods   = "WaitingForPods"                     // some pods have no address yet or cannot be found on the node
	ReasonSettled          = "Settled"                            // nothing pending
	ReasonPodsSkipped      = "PodsSkipped"                        // not degraded: the node is enforced, some pods are skipped for problems of their own (status.pods)
	ReasonAttached         = "Attached"                           // the socket program of transparent kernel covers every pod that wants it
	ReasonNotCovered       = "NotCovered"                         // the socket program runs, but some pods' namespaces could not be listed (named in the message)
	ReasonObserveOnly      = "ObserveOnly"                        // the node is observe-only: the socket program lists no namespace
	ReasonLoadFailed       = "LoadFailed"                         // loading the socket program failed for a reason that may pass (memory, a busy trampoline): the agent tries again
	ReasonUnsupported      = mptcpv1alpha1.ReasonUnsupported      // the kernel refuses the socket program (lockdown, or older than 6.6): use transparent inject
	ReasonAllPeersProbed   = "AllPeersProbed"                     // liveness probes every peer on the paths it shares with the node
	ReasonPeersBeyondLimit = "PeersBeyondLimit"                   // more peers share a path with the node than it probes (limits.ProbedPeers): it leaves out a draw of its own, which other nodes probe
)

// Enforcer is what the reconciler asks of the node's datapath
// (agent.Agent); tests give it a stand-in to run against an API server
// without touching a kernel.
type Enforcer interface {
	// Reconcile enforces a plan; the pods it could not configure are
	// returned as problems and left out of the plan (agent.Agent.Reconcile).
	Reconcile(context.Context, *agent.Plan) ([]mptcpv1alpha1.PodProblem, error)
	// Prior is what the node holds before the next plan (agent.Prior).
	Prior() (agent.Prior, error)
	FinishMigration(reconcileErr error) error
	WriteStatus(agent.Status) error
	Attachments() ([]datapath.Attachment, error)
	// PathLiveness is what the probes to peers say of a path, by index
	// (agent.Agent.PathLiveness).
	PathLiveness(path uint32) mptcpv1alpha1.Liveness
	// SocketMPTCP is what the socket program of transparent kernel did at
	// the last reconcile (agent.Agent.SocketMPTCP).
	SocketMPTCP() agent.SocketMPTCP
	// TCPListeners are a pod's listeners that take TCP only
	// (agent.Agent.TCPListeners).
	TCPListeners(agent.PlanPod) ([]netip.AddrPort, error)
	// Unenforced are the last reconcile's caps that miss part of the
	// traffic (agent.Agent.Unenforced).
	Unenforced() []agent.Problem
	// Checks are the agent's checks of the node at the last reconcile
	// (agent.Agent.Checks); the reconciler adds the pod CIDRs' and
	// reports them all.
	Checks() []mptcpv1alpha1.NodeCheck
}

// Reconciler enforces one node's MPTCPNodeState.
type Reconciler struct {
	Client client.Client
	// APIReader reads what the cache does not hold (the node's pods, once).
	APIReader client.Reader
	Recorder  events.EventRecorder
	Agent     Enforcer
	// Settings are the node-local ones (pin dir, tables...).
	Settings agent.Settings
	Node     string
	Log      *slog.Logger
	Metrics  *observe.Metrics
	// Resync re-reads the node's links this often, so that a link that
	// appears, goes down or comes back shows in status without a spec change.
	Resync time.Duration
	// Links and Locate read the node (agent.Links and agent.LocatePod).
	Links  func() ([]agent.NodeLink, error)
	Locate func([]netip.Addr) (agent.LocatedPod, error)
	// LinkEvents, when set, asks for a reconcile of the node's state
	// between resyncs: a path NIC's link changed.
	LinkEvents <-chan event.TypedGenericEvent[*mptcpv1alpha1.MPTCPNodeState]

	status agent.Status
	// warnedSocket are the reasons of the TransparentKernel condition a
	// warning was given for (once per reason and process).
	warnedSocket map[string]bool
	// noteAt is when each gate's note was last changed on a gate already
	// True, and listErrors the last listing error logged per pod.
	noteAt     map[agent.PodRef]time.Time
	listErrors map[agent.PodRef]string
	// fatal stops the manager with an error.
	fatal   func(error)
	applied *agent.Plan
	// appliedPolicies are the policies of the configuration in force.
	appliedPolicies []mptcpv1alpha1.AppliedPolicy
	// gated are the pods whose gate condition is True: those this process
	// set, and those a previous process left (adopted once, at the first
	// successful apply), so that a pod that left the configuration while
	// no agent ran gets its gate cleared too.
	gated map[agent.PodRef]bool
	// gateNotes are what the True gates say beyond configuredMessage, as
	// written (or adopted): the listeners transparent MPTCP does not reach.
	gateNotes map[agent.PodRef]string
	// skipped are the pods whose gate this process set False for a problem
	// of their own, with the reason and message written, so that each is
	// written once per change.
	skipped map[agent.PodRef]string
	adopted bool
	// unprobed: the peers the last translation left out, joined, to log
	// a change once.
	unprobed string
	// seeded: appliedPolicies and inherited were taken over from the status
	// a previous agent wrote (inherited: it reported Ready).
	seeded, inherited bool
}

// SetupWithManager watches the node's own state only; the manager's cache is
// restricted to it (see CacheOptions).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.gated = map[agent.PodRef]bool{}
	r.gateNotes = map[agent.PodRef]string{}
	r.noteAt = map[agent.PodRef]time.Time{}
	r.listErrors = map[agent.PodRef]string{}
	r.warnedSocket = map[string]bool{}
	r.skipped = map[agent.PodRef]string{}
	r.status.PID = currentPID()
	b := ctrl.NewControllerManagedBy(mgr).
		Named("mptcp-agent").
		// Its own status writes change no generation: no reconcile for
		// them. The periodic requeue still re-reads the links.
		For(&mptcpv1alpha1.MPTCPNodeState{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// The other nodes as liveness probes them: a peer that comes,
		// goes or changes an address replans the node.
		Watches(&mptcpv1alpha1.MPTCPPeer{}, handler.EnqueueRequestsFromMapFunc(r.ownNode),
			builder.WithPredicates(predicate.GenerationChangedPredicate{}))
	if r.LinkEvents != nil {
		// A path NIC's carrier changed: the datapath already knows
		// (Agent.WatchLinks); the reconcile reprograms a NIC that
		// came back and reports the link.
		b = b.WatchesRawSource(source.Channel(r.LinkEvents, &handler.TypedEnqueueRequestForObject[*mptcpv1alpha1.MPTCPNodeState]{}))
	}
	return b.Complete(r)
}

// ownNode is the request for the node's own state, whatever the object.
func (r *Reconciler) ownNode(context.Context, client.Object) []reconcile.Request {
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: r.Node}}}
}

// Reconcile enforces the state and reports: it reads the state and what its
// translation needs, enforces the plan, computes the status, records the
// events and writes the status.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if req.Name != r.Node {
		return ctrl.Result{}, nil
	}
	state, tr, err := r.read(ctx, req.NamespacedName)
	if err != nil || state == nil {
		return ctrl.Result{}, err
	}
	out, stop := r.enforce(ctx, state, tr)
	if stop {
		return ctrl.Result{}, nil
	}
	next := r.nextStatus(state, out)
	r.recordEvents(state, next.Status.Conditions, out)
	r.observePeers(tr.Plan)
	if !reflect.DeepEqual(state.Status, next.Status) {
		// Locked to the state read: a cache that has not seen this
		// agent's last status write yet gives a base the patch would
		// leave out what that write changed (equal in the base and the
		// new status, not on the server), and status changes trigger
		// no reconcile, so nothing would correct it before the resync.
		// The API server refuses such a patch; the reconcile runs again
		// on the cache's next copy.
		lock := client.MergeFromWithOptions(state, client.MergeFromWithOptimisticLock{})
		if err := r.Client.Status().Patch(ctx, next, lock); apierrors.IsConflict(err) {
			r.Log.Debug("status written from a stale copy of the node state; again", "generation", state.Generation)
			return ctrl.Result{RequeueAfter: staleStatusRetry}, nil
		} else if err != nil {
			return ctrl.Result{}, fmt.Errorf("status of %s: %w", state.Name, err)
		}
	}
	return ctrl.Result{RequeueAfter: r.Resync}, nil
}

// staleStatusRetry is how soon a status refused for a stale base is
// written again: the cache has the newer copy within milliseconds.
const staleStatusRetry = 100 * time.Millisecond

// read gets the node's state and translates it with what the node has (its
// links, what it holds, the peers), each path's liveness read into the
// translation's paths. A nil state: there is none, and whatever is in force
// stays.
func (r *Reconciler) read(ctx context.Context, name types.NamespacedName) (*mptcpv1alpha1.MPTCPNodeState, *agent.Translation, error) {
	var state mptcpv1alpha1.MPTCPNodeState
	if err := r.Client.Get(ctx, name, &state); err != nil {
		if apierrors.IsNotFound(err) {
			// No state (yet, or deleted): whatever is in force stays,
			// as when the API is unreachable.
			r.Log.Info("no MPTCPNodeState for this node; the configuration in force stays")
			return nil, nil, nil
		}
		return nil, nil, err
	}
	if !r.seeded {
		// A restarted agent: the datapath pinned by its predecessor
		// still enforces what that one reported, until this one applies.
		r.seeded = true
		r.appliedPolicies = state.Status.AppliedPolicies
		r.inherited = meta.IsStatusConditionTrue(state.Status.Conditions, ConditionReady)
	}
	links, err := r.Links()
	if err != nil {
		return nil, nil, err
	}
	prior, err := r.Agent.Prior()
	if err != nil {
		return nil, nil, err
	}
	// Read only, and only while the node has pods (without them it
	// probes nobody): a copy of every peer per reconcile is what would
	// grow with the cluster.
	var peers mptcpv1alpha1.MPTCPPeerList
	if len(state.Spec.Pods) > 0 {
		if err := r.Client.List(ctx, &peers, client.UnsafeDisableDeepCopy); err != nil {
			return nil, nil, err
		}
	}
	tr := agent.FromNodeState(r.Settings, &state, peers.Items, links, r.Locate, prior)
	for i := range tr.Paths {
		if index, ok := tr.PathIndex(tr.Paths[i].Name); ok {
			tr.Paths[i].Liveness = r.Agent.PathLiveness(index)
		}
	}
	return &state, tr, nil
}

// outcome is what one reconcile found and did: what its status reports.
type outcome struct {
	tr *agent.Translation
	// problems are the node's, in the order status.errors lists them:
	// the paths left out, then the spec's errors or the enforcing's.
	problems []agent.Problem
	// changed: a plan other than the last was enforced.
	changed bool
}

// enforce enforces the translation's plan unless the translation has errors
// (the last good plan stays in force), gates the pods of a plan enforced,
// and writes the status file. stop: a map migration was rolled back and the
// manager is being stopped.
func (r *Reconciler) enforce(ctx context.Context, state *mptcpv1alpha1.MPTCPNodeState, tr *agent.Translation) (out outcome, stop bool) {
	r.status.Reconciles++
	out.tr = tr
	if len(tr.Errors) > 0 {
		out.problems = append(slices.Clone(tr.PathProblems), tr.Errors...)
		r.Metrics.ObserveRejected()
		r.status.Error = strings.Join(agent.Messages(out.problems), "; ")
		r.Log.Error("node state rejected; the last good configuration stays in force", "generation", state.Generation,
			"errors", agent.Messages(out.problems))
		r.writeStatusFile()
		return out, false
	}
	start := time.Now()
	failed, err := r.Agent.Reconcile(ctx, tr.Plan)
	r.Metrics.ObserveReconcile(start, err)
	if len(failed) > 0 {
		// Pods the agent could not configure are skipped and
		// reported as the translation's are: gated False, listed
		// in status.pods.
		tr.PodProblems = append(tr.PodProblems, failed...)
		slices.SortStableFunc(tr.PodProblems, func(a, b mptcpv1alpha1.PodProblem) int {
			return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
		})
	}
	// A map migration started at load is committed once the new programs
	// enforce a whole node, else rolled back and the agent stops
	// (docs/agent.md, "Upgrade"); a mark clash defers it.
	if ferr := r.Agent.FinishMigration(err); ferr != nil {
		r.Log.Error("map migration rolled back; stopping", "err", ferr)
		r.fatal(ferr)
		return out, true
	}
	if err != nil {
		out.problems = append(slices.Concat(tr.PathProblems, r.Agent.Unenforced()), agent.ApplyProblem(err))
		r.status.Error = err.Error()
		r.Log.Error("reconcile failed; the last good configuration stays in force", "err", err)
		r.writeStatusFile()
		return out, false
	}
	if out.problems = slices.Concat(tr.PathProblems, r.Agent.Unenforced()); len(tr.PathProblems) > 0 {
		// Enforced without the paths this node cannot carry: each
		// is reported on its path, and aggregated by the controller.
		r.Log.Warn("paths left out", "problems", agent.Messages(tr.PathProblems))
	}
	out.changed = !reflect.DeepEqual(r.applied, tr.Plan)
	r.applied, r.appliedPolicies = tr.Plan, tr.Applied
	r.status.Error, r.status.Applied = "", tr.Plan
	if out.changed {
		r.Log.Info("reconciled", "generation", state.Generation, "paths", len(tr.Plan.Paths), "pods", len(tr.Plan.Pods))
	}
	r.gatePods(ctx, state, tr)
	r.writeStatusFile()
	return out, false
}

func (r *Reconciler) writeStatusFile() {
	if err := r.Agent.WriteStatus(r.status); err != nil {
		r.Log.Error("writing status file", "err", err)
	}
}

// nextStatus is the state with the status the outcome makes.
func (r *Reconciler) nextStatus(state *mptcpv1alpha1.MPTCPNodeState, out outcome) *mptcpv1alpha1.MPTCPNodeState {
	tr := out.tr
	next := state.DeepCopy()
	st := &next.Status
	st.Paths = tr.Paths
	st.Pods, st.SkippedPods = capPodProblems(tr.PodProblems)
	if len(tr.PodProblems) > 0 {
		r.Log.Warn("pods skipped for problems of their own", "count", len(tr.PodProblems), "first", st.Pods[0])
	}
	st.ObservedGeneration = state.Generation
	st.AppliedPolicies = r.appliedPolicies
	st.CongestionControls = nil
	if r.applied != nil {
		st.CongestionControls = r.applied.CongestionControls()
	}
	if attached, err := r.attached(); err != nil {
		r.Log.Error("listing the datapath's attachments", "err", err)
	} else {
		st.Attached = attached
	}
	st.Errors = capErrors(agent.Messages(out.problems))
	st.Checks = append(r.Agent.Checks(), nodecheck.NodePodCIDRs(state.Spec.PodCIDRs))
	st.Conditions = nodeConditions(state.Status.Conditions, conditionInputs{
		Generation:    state.Generation,
		Now:           metav1.Now(),
		Problems:      out.problems,
		SkippedPods:   len(tr.PodProblems),
		Applied:       r.applied,
		Inherited:     r.inherited,
		Waiting:       waitingPods(state),
		Checks:        st.Checks,
		Socket:        r.Agent.SocketMPTCP(),
		HasPods:       len(state.Spec.Pods) > 0,
		UnprobedPeers: len(tr.Plan.UnprobedPeers),
	})
	return next
}

// recordEvents records what changed: a new plan enforced; a Degraded
// condition that is new or says a problem it did not (one warning per
// distinct problem, not one per resync); a TransparentKernel condition
// False for a reason not warned of yet in this process.
func (r *Reconciler) recordEvents(state *mptcpv1alpha1.MPTCPNodeState, conds []metav1.Condition, out outcome) {
	if plan := out.tr.Plan; out.changed {
		r.Recorder.Eventf(state, nil, corev1.EventTypeNormal, ReasonApplied, "Apply",
			"generation %d: %d paths, %d rules, %d pods enforced", state.Generation, len(plan.Paths), len(plan.Rules), len(plan.Pods))
	}
	if d := meta.FindStatusCondition(conds, ConditionDegraded); d != nil && d.Status == metav1.ConditionTrue {
		msg := conditionMessage(agent.Messages(out.problems))
		if prev := meta.FindStatusCondition(state.Status.Conditions, ConditionDegraded); prev == nil ||
			prev.Status != metav1.ConditionTrue || !strings.HasPrefix(prev.Message, msg) {
			r.Recorder.Eventf(state, nil, corev1.EventTypeWarning, d.Reason, "Apply", "%s", msg)
		}
	}
	if tk := meta.FindStatusCondition(conds, ConditionTransparentKernel); tk != nil && tk.Status == metav1.ConditionFalse &&
		!r.warnedSocket[tk.Reason] {
		r.warnedSocket[tk.Reason] = true
		r.Recorder.Eventf(state, nil, corev1.EventTypeWarning, tk.Reason, "LoadSocketProgram", "%s", tk.Message)
	}
}

// observePeers counts the peers the plan probes and logs a change of those
// it leaves out beyond the limit.
func (r *Reconciler) observePeers(plan *agent.Plan) {
	r.Metrics.ObservePeers(plan.ProbedPeers, len(plan.UnprobedPeers))
	if left := strings.Join(plan.UnprobedPeers, ","); left != r.unprobed {
		r.unprobed = left
		if left != "" {
			r.Log.Info("peers beyond the most a node probes are left out", "limit", limits.ProbedPeers,
				"count", len(plan.UnprobedPeers), "peers", plan.UnprobedPeers)
		}
	}
}

// capErrors keeps the first errors the API accepts (status.errors holds 32).
func capErrors(errs []string) []string {
	if len(errs) > 32 {
		errs = append(errs[:31:31], fmt.Sprintf("and %d more", len(errs)-31))
	}
	return errs
}

// capPodProblems is what status.pods holds of problems (sorted by
// namespace/name) and their count: at most MaxPodProblemsPerNamespace of a
// namespace and MaxPodProblems in all, so that a node's tenants cannot make
// its status grow with their pods, and one tenant's many cannot hide the
// others'.
func capPodProblems(problems []mptcpv1alpha1.PodProblem) ([]mptcpv1alpha1.PodProblem, int32) {
	var out []mptcpv1alpha1.PodProblem
	perNamespace := map[string]int{}
	for _, p := range problems {
		if len(out) == mptcpv1alpha1.MaxPodProblems {
			break
		}
		if perNamespace[p.Namespace] == mptcpv1alpha1.MaxPodProblemsPerNamespace {
			continue
		}
		perNamespace[p.Namespace]++
		p.Message = truncate(p.Message, maxPodProblemMessage)
		out = append(out, p)
	}
	return out, int32(len(problems))
}

// maxPodProblemMessage is the schema's bound on status.pods[].message.
const maxPodProblemMessage = 1024

func truncate(s string, n int) string {
	const ellipsis = "..."
	if len(s) <= n {
		return s
	}
	cut := n - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}

// waitingPods are the spec's governed pods that have no address yet.
func waitingPods(state *mptcpv1alpha1.MPTCPNodeState) []string {
	var out []string
	for _, p := range state.Spec.Pods {
		if len(p.Rules) > 0 && len(p.IPs) == 0 {
			out = append(out, p.Namespace+"/"+p.Name)
		}
	}
	return out
}

// gatePods sets the pod gate of every pod of the configuration just enforced,
// sets it False with the problem's reason on every pod skipped for a problem
// of its own (the one write about a pod that admission ties to the agent's
// node: see docs/security.md), and clears it on pods this process gated that
// the configuration no longer holds. A pod's condition is written only when
// it changes.
func (r *Reconciler) gatePods(ctx context.Context, state *mptcpv1alpha1.MPTCPNodeState, tr *agent.Translation) {
	if !r.adopted {
		if err := r.adoptGates(ctx); err != nil {
			r.Log.Error("reading the pod gates a previous agent set", "err", err)
		} else {
			r.adopted = true
		}
	}
	now := map[agent.PodRef]bool{}
	for _, p := range tr.Plan.Pods {
		now[p.Ref] = true
	}
	notes := r.transparencyNotes(tr.Plan)
	// New gates first; a changed note on a gate already True (a pod's
	// processes decide it) waits for every transition of this reconcile,
	// and changes at most once per noteEvery.
	defer r.updateNotes(ctx, now, notes)
	for _, ref := range slices.SortedFunc(maps.Keys(now), cmpRef) {
		if r.gated[ref] {
			continue
		}
		if err := r.setGate(ctx, ref, corev1.ConditionTrue, "Configured", configuredMessage+notes[ref], true); err != nil {
			r.Log.Error("pod gate", "pod", ref.Namespace+"/"+ref.Name, "err", err)
			continue
		}
		r.gated[ref] = true
		r.gateNotes[ref] = notes[ref]
	}
	uids := map[string]string{}
	for _, p := range state.Spec.Pods {
		uids[p.Namespace+"/"+p.Name] = p.UID
	}
	skipped := map[agent.PodRef]bool{}
	for _, p := range tr.PodProblems {
		ref := agent.PodRef{Namespace: p.Namespace, Name: p.Name, UID: uids[p.Namespace+"/"+p.Name]}
		skipped[ref] = true
		written := string(p.Reason) + ": " + p.Message
		if r.skipped[ref] == written {
			continue
		}
		err := r.setGate(ctx, ref, corev1.ConditionFalse, string(p.Reason), "not configured: "+truncate(p.Message, maxPodProblemMessage), true)
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			r.Log.Error("pod gate", "pod", ref.Namespace+"/"+ref.Name, "err", err)
			continue
		}
		r.skipped[ref] = written
		delete(r.gated, ref)
	}
	for _, ref := range slices.SortedFunc(maps.Keys(r.skipped), cmpRef) {
		switch {
		case skipped[ref]:
		case now[ref]:
			// Configured now: its gate was set True above.
			delete(r.skipped, ref)
		default:
			// No longer governed: the problem's reason would be
			// stale, so the loop below writes NotConfigured.
			r.gated[ref] = true
			delete(r.skipped, ref)
		}
	}
	for _, ref := range slices.SortedFunc(maps.Keys(r.gated), cmpRef) {
		if now[ref] {
			continue
		}
		err := r.setGate(ctx, ref, corev1.ConditionFalse, "NotConfigured", "no MPTCP policy governs the pod on this node any more", true)
		// Gone, or replaced by a new pod of the same name (the uid
		// precondition fails): nothing left to clear.
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			r.Log.Error("pod gate", "pod", ref.Namespace+"/"+ref.Name, "err", err)
			continue
		}
		delete(r.gated, ref)
		delete(r.gateNotes, ref)
		delete(r.noteAt, ref)
		delete(r.listErrors, ref)
	}
}

// noteEvery bounds how often one pod's note changes on a gate already True.
const noteEvery = time.Minute

// updateNotes writes the notes that changed on gates already True, each
// at most once per noteEvery, keeping the gate's transition time.
func (r *Reconciler) updateNotes(ctx context.Context, now map[agent.PodRef]bool, notes map[agent.PodRef]string) {
	for _, ref := range slices.SortedFunc(maps.Keys(now), cmpRef) {
		note := notes[ref]
		if !r.gated[ref] || note == r.gateNotes[ref] || time.Since(r.noteAt[ref]) < noteEvery {
			continue
		}
		if err := r.setGate(ctx, ref, corev1.ConditionTrue, "Configured", configuredMessage+note, false); err != nil {
			if !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				r.Log.Error("pod gate", "pod", ref.Namespace+"/"+ref.Name, "err", err)
			}
			continue
		}
		r.gateNotes[ref], r.noteAt[ref] = note, time.Now()
	}
}

// configuredMessage is what a True gate says first.
const configuredMessage = "MPTCP settings and datapath entries are in place"

// maxListedListeners bounds the listeners a gate names.
const maxListedListeners = 4

// transparencyNotes are, for each pod of plan with transparent MPTCP, what
// its gate adds: that the socket program is not in force for it, or the
// listeners that take TCP only, which the library or the socket program
// did not reach. A pod's processes decide what is listed, so at most
// maxListedListeners are named, and a listing that fails keeps the note
// the gate has.
func (r *Reconciler) transparencyNotes(plan *agent.Plan) map[agent.PodRef]string {
	sm := r.Agent.SocketMPTCP()
	notes := map[agent.PodRef]string{}
	for _, p := range plan.Pods {
		if p.Transparent == "" {
			continue
		}
		if p.Transparent == agent.TransparencyKernel && sm.Uncovered[p.Name] {
			why := "its network namespace could not be read"
			switch {
			case sm.ObserveOnly:
				why = "the node is observe-only"
			case sm.Unsupported != "":
				why = "the node cannot load the socket program (the node state's TransparentKernel condition says why)"
			}
			notes[p.Ref] = "; podMPTCP.transparent kernel is not in force for this pod: " + why +
				"; its programs get the sockets they ask for (docs/transparent.md)"
			continue
		}
		ls, err := r.Agent.TCPListeners(p)
		if err != nil {
			notes[p.Ref] = r.gateNotes[p.Ref]
			if msg := err.Error(); r.listErrors[p.Ref] != msg {
				r.listErrors[p.Ref] = msg
				r.Log.Warn("listing a pod's listeners", "pod", p.Name, "err", err)
			}
			continue
		}
		delete(r.listErrors, p.Ref)
		if len(ls) == 0 {
			continue
		}
		names := make([]string, 0, maxListedListeners+1)
		for _, l := range ls[:min(len(ls), maxListedListeners)] {
			names = append(names, l.String())
		}
		if len(ls) > maxListedListeners {
			names = append(names, "and more")
		}
		why := "static and not Go, built against musl, using io_uring, or asking for TCP themselves"
		if p.Transparent == agent.TransparencyKernel {
			why = "opened before the agent configured the pod: such a program waits for the mptcp.io/ready condition"
		}
		notes[p.Ref] = fmt.Sprintf("; podMPTCP.transparent %s does not reach the programs listening with TCP only on %s (%s): "+
			"connections to them are single-path (docs/transparent.md)", p.Transparent, strings.Join(names, ", "), why)
	}
	return notes
}

// adoptGates lists the node's pods once (a field selector on spec.nodeName,
// not a watch) and counts those whose gate is True as gated.
func (r *Reconciler) adoptGates(ctx context.Context) error {
	var pods corev1.PodList
	if err := r.APIReader.List(ctx, &pods, client.MatchingFields{"spec.nodeName": r.Node}); err != nil {
		return err
	}
	for _, p := range pods.Items {
		for _, c := range p.Status.Conditions {
			if c.Type == PodReadyCondition && c.Status == corev1.ConditionTrue {
				ref := agent.PodRef{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID)}
				r.gated[ref] = true
				r.gateNotes[ref] = strings.TrimPrefix(c.Message, configuredMessage)
			}
		}
	}
	return nil
}

func cmpRef(a, b agent.PodRef) int {
	return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
}

// setGate patches one pod condition with a strategic merge patch: conditions
// merge by type, so the kubelet's own conditions stay untouched. The uid
// precondition keeps a patch from reaching a new pod of the same name.
func (r *Reconciler) setGate(ctx context.Context, ref agent.PodRef, status corev1.ConditionStatus, reason, message string, transition bool) error {
	cond := map[string]any{"type": PodReadyCondition, "status": status, "reason": reason, "message": message}
	if transition {
		cond["lastTransitionTime"] = metav1.Now()
	}
	patch := map[string]any{
		"metadata": map[string]any{"uid": ref.UID},
		"status":   map[string]any{"conditions": []any{cond}},
	}
	b, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: ref.Name}}
	return r.Client.Status().Patch(ctx, pod, client.RawPatch(types.StrategicMergePatchType, b))
}

// attached groups the datapath's pinned attachments by program, the order of
// datapath.Hooks, interfaces sorted.
func (r *Reconciler) attached() ([]mptcpv1alpha1.AttachedProgram, error) {
	atts, err := r.Agent.Attachments()
	if err != nil {
		return nil, err
	}
	var out []mptcpv1alpha1.AttachedProgram
	for _, h := range datapath.Hooks {
		ap := mptcpv1alpha1.AttachedProgram{Hook: string(h)}
		for _, a := range atts {
			if a.Hook == h {
				ap.Interfaces = append(ap.Interfaces, a.Interface)
			}
		}
		if len(ap.Interfaces) > 0 {
			slices.Sort(ap.Interfaces)
			out = append(out, ap)
		}
	}
	return out, nil
}
