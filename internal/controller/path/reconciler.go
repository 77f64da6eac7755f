package path

import (
	"context"
	"fmt"
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
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/controller/compile"
)

// ControllerName names this controller in logs, metrics and events.
const ControllerName = "mptcp-path"

// conflictRetry is when to look again after a write lost a race.
const conflictRetry = 200 * time.Millisecond

// maxListedNodes bounds the node names a status lists.
const maxListedNodes = 16

// Reconciler writes MPTCPPath status.
type Reconciler struct {
	client.Client
	// Recorder reports, on the path, problems only the controller sees
	// across objects (an interface another path already names).
	Recorder events.EventRecorder
}

// Condition reasons of an MPTCPPath.
const (
	ReasonInterfaceConflict = "InterfaceConflict"
	ReasonInterfaceNotFound = "InterfaceNotFound"
)

// +kubebuilder:rbac:groups=mptcp.io,resources=mptcppaths,verbs=get;list;watch
// +kubebuilder:rbac:groups=mptcp.io,resources=mptcppaths/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=mptcp.io,resources=mptcpnodestates,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile computes one path's status.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var path mptcpv1alpha1.MPTCPPath
	if err := r.Get(ctx, types.NamespacedName{Name: req.Name}, &path); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	var paths mptcpv1alpha1.MPTCPPathList
	if err := r.List(ctx, &paths); err != nil {
		return ctrl.Result{}, err
	}
	var nodes corev1.NodeList
	if err := r.List(ctx, &nodes); err != nil {
		return ctrl.Result{}, err
	}
	var states mptcpv1alpha1.MPTCPNodeStateList
	if err := r.List(ctx, &states); err != nil {
		return ctrl.Result{}, err
	}

	status := *path.Status.DeepCopy()
	status.Index = AssignIndexes(paths.Items)[path.Name]
	status.ObservedGeneration = path.Generation
	status.Nodes = 0
	conflict := conflictReport{iface: describeInterface(path.Spec.Interface)}
	for i := range nodes.Items {
		if !compile.PathSelectsNode(&path, &nodes.Items[i]) {
			continue
		}
		status.Nodes++
		if owner := compile.InterfaceConflicts(&nodes.Items[i], paths.Items)[path.Name]; owner != "" {
			conflict.nodes = append(conflict.nodes, nodes.Items[i].Name)
			conflict.owner = owner
		}
	}
	var without []string
	for _, s := range states.Items {
		for _, ps := range s.Status.Paths {
			if ps.Name == path.Name && (ps.Link == mptcpv1alpha1.LinkNotFound || ps.Link == mptcpv1alpha1.LinkAmbiguous) {
				without = append(without, s.Name)
			}
		}
	}
	slices.Sort(without)
	missing := len(without)
	status.NodesWithoutInterface = without[:min(len(without), maxListedNodes)]
	if len(status.NodesWithoutInterface) == 0 {
		status.NodesWithoutInterface = nil
	}

	setConditions(&status, path.Generation, missing, conflict)
	if equality.Semantic.DeepEqual(status, path.Status) {
		return ctrl.Result{}, nil
	}
	// An event when a conflict appears or changes, not on every reconcile.
	if d := meta.FindStatusCondition(status.Conditions, mptcpv1alpha1.ConditionDegraded); d != nil && d.Reason == ReasonInterfaceConflict && r.Recorder != nil {
		if old := meta.FindStatusCondition(path.Status.Conditions, mptcpv1alpha1.ConditionDegraded); old == nil || old.Message != d.Message {
			r.Recorder.Eventf(&path, nil, corev1.EventTypeWarning, ReasonInterfaceConflict, "Compile", "%s", d.Message)
		}
	}
	path.Status = status
	if err := r.Status().Update(ctx, &path); err != nil {
		if apierrors.IsConflict(err) {
			// Our cache was behind; the newer object's event is on its
			// way, and the retry is only a safety net.
			return ctrl.Result{RequeueAfter: conflictRetry}, nil
		}
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, nil
}

// conflictReport: the nodes where another path, owner, keeps the
// interface this one names.
type conflictReport struct {
	iface, owner string
	nodes        []string
}

func describeInterface(i mptcpv1alpha1.InterfaceSelector) string {
	if i.AltName != "" {
		return "with altname " + i.AltName
	}
	return i.Name
}

func setConditions(s *mptcpv1alpha1.MPTCPPathStatus, gen int64, missing int, conflict conflictReport) {
	ready := metav1.Condition{Type: mptcpv1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "IndexAssigned",
		Message: fmt.Sprintf("index %d on %d nodes", s.Index, s.Nodes), ObservedGeneration: gen}
	degraded := metav1.Condition{Type: mptcpv1alpha1.ConditionDegraded, Status: metav1.ConditionFalse, Reason: "AsExpected",
		Message: "every agent found the interface", ObservedGeneration: gen}
	switch {
	case s.Index == 0:
		ready.Status, ready.Reason = metav1.ConditionFalse, "NoFreeIndex"
		ready.Message = fmt.Sprintf("all %d path indexes are in use", mptcpv1alpha1.MaxPathIndex)
	case missing > 0:
		ready.Status, ready.Reason = metav1.ConditionFalse, "InterfaceNotFound"
		ready.Message = fmt.Sprintf("%d nodes have no interface for this path", missing)
	}
	if missing > 0 {
		degraded.Status, degraded.Reason = metav1.ConditionTrue, ReasonInterfaceNotFound
		degraded.Message = fmt.Sprintf("no matching interface on %d nodes: %s", missing, strings.Join(s.NodesWithoutInterface, ", "))
	}
	if n := len(conflict.nodes); n > 0 && s.Index != 0 {
		// A conflict outranks a missing interface: the admin must rename
		// one of the two paths' interfaces before anything else helps.
		slices.Sort(conflict.nodes)
		listed := conflict.nodes[:min(n, maxListedNodes)]
		msg := fmt.Sprintf("interface %s is also path %s's, which is older and keeps it: this path is left out on %d nodes: %s",
			conflict.iface, conflict.owner, n, strings.Join(listed, ", "))
		ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, ReasonInterfaceConflict, msg
		degraded.Status, degraded.Reason, degraded.Message = metav1.ConditionTrue, ReasonInterfaceConflict, msg
	}
	meta.SetStatusCondition(&s.Conditions, ready)
	meta.SetStatusCondition(&s.Conditions, degraded)
}

// SetupWithManager watches paths (any path's index affects the others'),
// node labels and node states' path reports.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	all := handler.EnqueueRequestsFromMapFunc(r.allPaths)
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&mptcpv1alpha1.MPTCPPath{}).
		Watches(&mptcpv1alpha1.MPTCPPath{}, all, builder.WithPredicates(predicate.Funcs{
			// Another path's index or interface decides this one's
			// index and interface conflicts.
			UpdateFunc: func(e event.UpdateEvent) bool {
				return e.ObjectOld.(*mptcpv1alpha1.MPTCPPath).Status.Index != e.ObjectNew.(*mptcpv1alpha1.MPTCPPath).Status.Index ||
					e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration()
			},
		})).
		Watches(&corev1.Node{}, all, builder.WithPredicates(predicate.LabelChangedPredicate{})).
		Watches(&mptcpv1alpha1.MPTCPNodeState{}, handler.EnqueueRequestsFromMapFunc(reportedPaths), builder.WithPredicates(predicate.Funcs{
			UpdateFunc: func(e event.UpdateEvent) bool {
				return !equality.Semantic.DeepEqual(e.ObjectOld.(*mptcpv1alpha1.MPTCPNodeState).Status.Paths,
					e.ObjectNew.(*mptcpv1alpha1.MPTCPNodeState).Status.Paths)
			},
		})).
		Complete(r)
}

func (r *Reconciler) allPaths(ctx context.Context, _ client.Object) []reconcile.Request {
	var paths mptcpv1alpha1.MPTCPPathList
	if err := r.List(ctx, &paths); err != nil {
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(paths.Items))
	for _, p := range paths.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: p.Name}})
	}
	return reqs
}

// reportedPaths maps a node state to the paths its agent reports on and
// those its spec names, which covers a report that was just removed.
func reportedPaths(_ context.Context, o client.Object) []reconcile.Request {
	s := o.(*mptcpv1alpha1.MPTCPNodeState)
	seen := map[string]bool{}
	var reqs []reconcile.Request
	add := func(n string) {
		if !seen[n] {
			seen[n] = true
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: n}})
		}
	}
	for _, p := range s.Status.Paths {
		add(p.Name)
	}
	for _, p := range s.Spec.Paths {
		add(p.Name)
	}
	return reqs
}
