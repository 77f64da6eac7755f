// Package policystatus aggregates each MPTCPPolicy's status from the node
// states: how many pods it governs, on how many nodes, how many of those
// enforce its current generation, and what keeps it from being whole.
package policystatus

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
)

// ControllerName names this controller in logs, metrics and events.
const ControllerName = "mptcp-policystatus"

// conflictRetry is when to look again after a write lost a race.
const conflictRetry = 200 * time.Millisecond

// maxNamed bounds how many node or path names a condition message lists.
const maxNamed = 5

// Reconciler writes MPTCPPolicy status, and records an event when the
// policy becomes Degraded, stops being so, or becomes Ready: what
// `kubectl describe mptcppolicy` shows.
type Reconciler struct {
	client.Client
	Recorder events.EventRecorder
}

// +kubebuilder:rbac:groups=mptcp.io,resources=mptcppolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=mptcp.io,resources=mptcppolicies/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=mptcp.io,resources=mptcpnodestates,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile aggregates one policy.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var pol mptcpv1alpha1.MPTCPPolicy
	if err := r.Get(ctx, types.NamespacedName{Name: req.Name}, &pol); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	var states mptcpv1alpha1.MPTCPNodeStateList
	if err := r.List(ctx, &states); err != nil {
		return ctrl.Result{}, err
	}
	status := Aggregate(&pol, states.Items)
	if equality.Semantic.DeepEqual(status, pol.Status) {
		return ctrl.Result{}, nil
	}
	before := pol.Status.Conditions
	pol.Status = status
	if err := r.Status().Update(ctx, &pol); err != nil {
		if apierrors.IsConflict(err) {
			// Our cache was behind; the newer object's event is on its
			// way, and the retry is only a safety net.
			return ctrl.Result{RequeueAfter: conflictRetry}, nil
		}
		return ctrl.Result{}, err
	}
	r.recordTransitions(&pol, before)
	return ctrl.Result{}, nil
}

// recordTransitions records an event for each change of the policy's
// Degraded and Ready conditions that an admin acts on, once the status
// that says it is written: a Warning when it becomes Degraded (the
// condition's reason and message), a Normal one when it stops being
// Degraded, and a Normal one when it becomes Ready.
func (r *Reconciler) recordTransitions(pol *mptcpv1alpha1.MPTCPPolicy, before []metav1.Condition) {
	if r.Recorder == nil {
		return
	}
	was := func(t string) bool { return meta.IsStatusConditionTrue(before, t) }
	if d := meta.FindStatusCondition(pol.Status.Conditions, mptcpv1alpha1.ConditionDegraded); d != nil {
		switch {
		case d.Status == metav1.ConditionTrue && !was(mptcpv1alpha1.ConditionDegraded):
			r.Recorder.Eventf(pol, nil, corev1.EventTypeWarning, d.Reason, "Aggregate", "%s", d.Message)
		case d.Status == metav1.ConditionFalse && was(mptcpv1alpha1.ConditionDegraded):
			r.Recorder.Eventf(pol, nil, corev1.EventTypeNormal, d.Reason, "Aggregate", "%s", d.Message)
		}
	}
	if c := meta.FindStatusCondition(pol.Status.Conditions, mptcpv1alpha1.ConditionReady); c != nil &&
		c.Status == metav1.ConditionTrue && !was(mptcpv1alpha1.ConditionReady) {
		r.Recorder.Eventf(pol, nil, corev1.EventTypeNormal, c.Reason, "Aggregate", "generation %d: %s", pol.Generation, c.Message)
	}
}

// Aggregate computes a policy's status from all node states. A node counts
// when its spec holds a pod governed by the policy (first rule), and is ready
// when its agent reports the policy's current generation applied and no
// error.
func Aggregate(pol *mptcpv1alpha1.MPTCPPolicy, states []mptcpv1alpha1.MPTCPNodeState) mptcpv1alpha1.MPTCPPolicyStatus {
	st := *pol.Status.DeepCopy()
	st.ObservedGeneration = pol.Generation
	st.MatchedPods, st.Nodes, st.NodesReady = 0, 0, 0
	t := tallyNodes(pol, states, &st)
	ready, progressing := rolloutConditions(&st, pol.Generation, t.pending)
	meta.SetStatusCondition(&st.Conditions, ready)
	meta.SetStatusCondition(&st.Conditions, progressing)
	meta.SetStatusCondition(&st.Conditions, t.degraded(pol.Generation))
	return st
}

// nodeTally is what the nodes that carry a policy's pods say of it, node
// names sorted.
type nodeTally struct {
	// pending have not applied the policy's generation; missingOn lack
	// some of its paths (missingPaths); noIface are node/path pairs whose
	// interface is not found or ambiguous; unsupportedOn refuse its
	// transparent kernel.
	pending, missingOn, noIface, unsupportedOn []string
	missingPaths                               map[string]bool
}

// tallyNodes counts in st the pods and nodes the policy governs and the
// nodes that applied it, and tallies what the nodes lack.
func tallyNodes(pol *mptcpv1alpha1.MPTCPPolicy, states []mptcpv1alpha1.MPTCPNodeState, st *mptcpv1alpha1.MPTCPPolicyStatus) nodeTally {
	wanted := map[string]bool{}
	for _, wp := range pol.Spec.Spread.Paths {
		wanted[wp.Name] = true
	}
	for _, b := range pol.Spec.BackupPaths {
		wanted[b] = true
	}
	t := nodeTally{missingPaths: map[string]bool{}}
	slices.SortFunc(states, func(a, b mptcpv1alpha1.MPTCPNodeState) int { return strings.Compare(a.Name, b.Name) })
	for i := range states {
		s := &states[i]
		pods := governedPods(s, pol)
		if pods == 0 {
			continue
		}
		st.MatchedPods += int32(pods)
		st.Nodes++
		if applied(s, pol) {
			st.NodesReady++
		} else {
			t.pending = append(t.pending, s.Name)
		}
		lacks := false
		for name := range wanted {
			if !slices.ContainsFunc(s.Spec.Paths, func(p mptcpv1alpha1.NodePath) bool { return p.Name == name }) {
				t.missingPaths[name] = true
				lacks = true
			}
		}
		if lacks {
			t.missingOn = append(t.missingOn, s.Name)
		}
		if kernelRefused(s, pol) {
			t.unsupportedOn = append(t.unsupportedOn, s.Name)
		}
		for _, ps := range s.Status.Paths {
			if wanted[ps.Name] && (ps.Link == mptcpv1alpha1.LinkNotFound || ps.Link == mptcpv1alpha1.LinkAmbiguous) {
				t.noIface = append(t.noIface, s.Name+"/"+ps.Name)
			}
		}
	}
	return t
}

// governedPods counts the pods of node state s whose first rule is pol's.
func governedPods(s *mptcpv1alpha1.MPTCPNodeState, pol *mptcpv1alpha1.MPTCPPolicy) int {
	pods := 0
	for _, p := range s.Spec.Pods {
		if len(p.Rules) > 0 {
			if r := s.Spec.Rule(p.Rules[0]); r != nil && r.Policy == pol.Name {
				pods++
			}
		}
	}
	return pods
}

// rolloutConditions are Ready and Progressing of generation gen, from the
// counts in st and the nodes still pending.
func rolloutConditions(st *mptcpv1alpha1.MPTCPPolicyStatus, gen int64, pending []string) (ready, progressing metav1.Condition) {
	ready = metav1.Condition{Type: mptcpv1alpha1.ConditionReady, ObservedGeneration: gen}
	progressing = metav1.Condition{Type: mptcpv1alpha1.ConditionProgressing, ObservedGeneration: gen}
	switch {
	case st.Nodes == 0:
		ready.Status, ready.Reason, ready.Message = metav1.ConditionTrue, "NoPods", "the policy governs no pod"
		progressing.Status, progressing.Reason, progressing.Message = metav1.ConditionFalse, "NoPods", "nothing to roll out"
	case st.NodesReady == st.Nodes:
		ready.Status, ready.Reason = metav1.ConditionTrue, "Applied"
		ready.Message = fmt.Sprintf("generation %d applied on all %d nodes", gen, st.Nodes)
		progressing.Status, progressing.Reason, progressing.Message = metav1.ConditionFalse, "Applied", "rollout complete"
	default:
		ready.Status, ready.Reason = metav1.ConditionFalse, "Pending"
		ready.Message = fmt.Sprintf("generation %d applied on %d of %d nodes", gen, st.NodesReady, st.Nodes)
		progressing.Status, progressing.Reason = metav1.ConditionTrue, "RollingOut"
		progressing.Message = "waiting for " + list(pending)
	}
	return ready, progressing
}

// degraded is the Degraded condition of generation gen: what the nodes
// lack, the last problem's reason.
func (t nodeTally) degraded(gen int64) metav1.Condition {
	degraded := metav1.Condition{Type: mptcpv1alpha1.ConditionDegraded, ObservedGeneration: gen,
		Status: metav1.ConditionFalse, Reason: "AsExpected", Message: "every node has every path of the policy"}
	var problems []string
	if len(t.missingOn) > 0 {
		names := slices.Sorted(maps.Keys(t.missingPaths))
		problems = append(problems, fmt.Sprintf("paths %s do not exist on nodes %s", list(names), list(t.missingOn)))
		degraded.Reason = "PathNotOnNode"
	}
	if len(t.noIface) > 0 {
		problems = append(problems, "no matching interface for "+list(t.noIface))
		degraded.Reason = "InterfaceNotFound"
	}
	if len(t.unsupportedOn) > 0 {
		// The node's own words stay on the node: a node's agent writes
		// them, and no node may write into a policy.
		problems = append(problems, fmt.Sprintf("podMPTCP.transparent kernel is unsupported on nodes %s "+
			"(their TransparentKernel condition says why)", list(t.unsupportedOn)))
		degraded.Reason = mptcpv1alpha1.ReasonUnsupported
	}
	if len(problems) > 0 {
		degraded.Status = metav1.ConditionTrue
		degraded.Message = strings.Join(problems, "; ")
	}
	return degraded
}

// kernelRefused says whether pol says transparent kernel and node state s
// reports the kernel refuses it while a pod that pol selects has it there.
func kernelRefused(s *mptcpv1alpha1.MPTCPNodeState, pol *mptcpv1alpha1.MPTCPPolicy) bool {
	if pol.Spec.PodMPTCP.Transparent != mptcpv1alpha1.TransparentKernel {
		return false
	}
	if c := meta.FindStatusCondition(s.Status.Conditions, mptcpv1alpha1.ConditionTransparentKernel); c == nil || c.Reason != mptcpv1alpha1.ReasonUnsupported {
		return false
	}
	for _, p := range s.Spec.Pods {
		if p.Transparent != mptcpv1alpha1.PodTransparencyKernel {
			continue
		}
		for _, name := range p.Rules {
			if r := s.Spec.Rule(name); r != nil && r.Policy == pol.Name {
				return true
			}
		}
	}
	return false
}

func applied(s *mptcpv1alpha1.MPTCPNodeState, pol *mptcpv1alpha1.MPTCPPolicy) bool {
	if len(s.Status.Errors) > 0 {
		return false
	}
	for _, a := range s.Status.AppliedPolicies {
		if a.Name == pol.Name {
			return a.Generation == pol.Generation
		}
	}
	return false
}

func list(names []string) string {
	if len(names) <= maxNamed {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:maxNamed], ", "), len(names)-maxNamed)
}

// Coalesce is how long a policy's recount waits after a node state changes,
// so that a rollout touching every node costs one status write per policy,
// not one per node.
const Coalesce = 500 * time.Millisecond

// SetupWithManager watches policies and node states. A node state event is
// mapped to the policies named in its old and new versions, so a policy
// that leaves a node is recounted too.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&mptcpv1alpha1.MPTCPPolicy{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&mptcpv1alpha1.MPTCPNodeState{}, handler.Funcs{
			CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				enqueueLater(q, e.Object)
			},
			UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				enqueueLater(q, e.ObjectOld, e.ObjectNew)
			},
			DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				enqueueLater(q, e.Object)
			},
		}).
		Complete(r)
}

// enqueueLater adds the policies named by node states after Coalesce; the
// queue keeps one pending entry per policy, however many events arrive.
func enqueueLater(q workqueue.TypedRateLimitingInterface[reconcile.Request], objs ...client.Object) {
	for _, o := range objs {
		for _, req := range namedPolicies(context.Background(), o) {
			q.AddAfter(req, Coalesce)
		}
	}
}

func namedPolicies(_ context.Context, o client.Object) []reconcile.Request {
	s := o.(*mptcpv1alpha1.MPTCPNodeState)
	seen := map[string]bool{}
	var reqs []reconcile.Request
	add := func(n string) {
		if !seen[n] {
			seen[n] = true
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: n}})
		}
	}
	for _, r := range s.Spec.Rules {
		add(r.Policy)
	}
	for _, a := range s.Status.AppliedPolicies {
		add(a.Name)
	}
	return reqs
}
