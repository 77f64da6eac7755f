package nodestate

import (
	"context"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/controller/compile"
	"github.com/mptcp-operator/mptcp-operator/internal/transparent"
)

// Index registers the indexes this controller lists by: pods by node,
// node states by the addresses they claim.
func Index(ctx context.Context, mgr ctrl.Manager) error {
	err := mgr.GetFieldIndexer().IndexField(ctx, &corev1.Pod{}, PodNodeNameField, func(o client.Object) []string {
		if n := o.(*corev1.Pod).Spec.NodeName; n != "" {
			return []string{n}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return mgr.GetFieldIndexer().IndexField(ctx, &mptcpv1alpha1.MPTCPNodeState{}, ClaimedAddressField, func(o client.Object) []string {
		return compile.ClaimedAddresses(o.(*mptcpv1alpha1.MPTCPNodeState))
	})
}

// SetupWithManager watches everything a node's spec depends on. Changes that
// can affect any node (paths, policies, namespace labels) enqueue every node;
// a pod or a node state enqueues only its own node, and a node state's
// claims the nodes that claim one of the same addresses (whose addresses
// it may take or give back). No change of one node's addresses or pods
// reaches the other nodes' specs: what peers see of a node is its
// MPTCPPeer (package peers).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	allNodes := handler.EnqueueRequestsFromMapFunc(r.allNodes)
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		// Nodes compile independently (the work queue never hands one
		// node to two workers): a change every node depends on is
		// written by several at once, each waiting on the API server.
		WithOptions(controller.Options{MaxConcurrentReconciles: Workers}).
		For(&corev1.Node{}, builder.WithPredicates(nodeChanged())).
		Watches(&mptcpv1alpha1.MPTCPNodeState{}, handler.EnqueueRequestsFromMapFunc(byName)).
		Watches(&mptcpv1alpha1.MPTCPNodeState{}, handler.Funcs{
			CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				r.enqueueClaimants(ctx, q, e.Object)
			},
			UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				o, n := e.ObjectOld.(*mptcpv1alpha1.MPTCPNodeState), e.ObjectNew.(*mptcpv1alpha1.MPTCPNodeState)
				// Which claims count depends on the paths of the spec
				// too (a path the node lost claims nothing).
				if !slices.Equal(compile.ClaimedAddresses(o), compile.ClaimedAddresses(n)) || !slices.EqualFunc(o.Spec.Paths, n.Spec.Paths, sameName) {
					r.enqueueClaimants(ctx, q, o, n)
				}
			},
			DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				r.enqueueClaimants(ctx, q, e.Object)
			},
		}).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(podNode), builder.WithPredicates(podChanged())).
		Watches(&corev1.Namespace{}, allNodes, builder.WithPredicates(predicate.LabelChangedPredicate{})).
		Watches(&mptcpv1alpha1.MPTCPPolicy{}, allNodes, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&mptcpv1alpha1.MPTCPPath{}, allNodes, builder.WithPredicates(pathChanged())).
		Complete(r)
}

// Workers is how many nodes the controller compiles at once.
const Workers = 4

// enqueueClaimants enqueues the nodes of the node states that claim an
// address one of objs claims.
func (r *Reconciler) enqueueClaimants(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request], objs ...client.Object) {
	var addrs []string
	for _, o := range objs {
		addrs = append(addrs, compile.ClaimedAddresses(o.(*mptcpv1alpha1.MPTCPNodeState))...)
	}
	states, err := r.claimants(ctx, addrs)
	if err != nil {
		logf.FromContext(ctx).Error(err, "listing the node states that claim an address")
		return
	}
	for i := range states {
		q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: states[i].Name}})
	}
}

// claimants are the node states that claim one of addrs
// (ClaimedAddressField), each once, sorted by name: the cache's own
// objects, to read and never change.
func (r *Reconciler) claimants(ctx context.Context, addrs []string) ([]mptcpv1alpha1.MPTCPNodeState, error) {
	var out []mptcpv1alpha1.MPTCPNodeState
	for _, a := range addrs {
		var states mptcpv1alpha1.MPTCPNodeStateList
		if err := r.List(ctx, &states, client.MatchingFields{ClaimedAddressField: a}, client.UnsafeDisableDeepCopy); err != nil {
			return nil, err
		}
		out = append(out, states.Items...)
	}
	slices.SortFunc(out, func(a, b mptcpv1alpha1.MPTCPNodeState) int { return strings.Compare(a.Name, b.Name) })
	return slices.CompactFunc(out, func(a, b mptcpv1alpha1.MPTCPNodeState) bool { return a.Name == b.Name }), nil
}

func (r *Reconciler) allNodes(ctx context.Context, _ client.Object) []reconcile.Request {
	var nodes corev1.NodeList
	if err := r.List(ctx, &nodes); err != nil {
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(nodes.Items))
	for _, n := range nodes.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: n.Name}})
	}
	return reqs
}

func byName(_ context.Context, o client.Object) []reconcile.Request {
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: o.GetName()}}}
}

func podNode(_ context.Context, o client.Object) []reconcile.Request {
	n := o.(*corev1.Pod).Spec.NodeName
	if n == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: n}}}
}

// nodeChanged ignores the kubelet's status heartbeats: only labels (paths
// select nodes by label) and pod CIDRs matter.
func nodeChanged() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*corev1.Node), e.ObjectNew.(*corev1.Node)
		return !equality.Semantic.DeepEqual(o.Labels, n.Labels) ||
			!slices.Equal(o.Spec.PodCIDRs, n.Spec.PodCIDRs)
	}}
}

// podChanged passes only changes that reach a compiled rule.
func podChanged() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*corev1.Pod), e.ObjectNew.(*corev1.Pod)
		return o.Spec.NodeName != n.Spec.NodeName ||
			!equality.Semantic.DeepEqual(o.Labels, n.Labels) ||
			o.Annotations[mptcpv1alpha1.AnnotationPreferredPaths] != n.Annotations[mptcpv1alpha1.AnnotationPreferredPaths] ||
			// Opting out of transparent kernel is the agent's to apply.
			o.Annotations[transparent.AnnotationMode] != n.Annotations[transparent.AnnotationMode] ||
			!equality.Semantic.DeepEqual(o.Status.PodIPs, n.Status.PodIPs) ||
			o.Status.PodIP != n.Status.PodIP ||
			o.Status.Phase != n.Status.Phase
	}}
}

// pathChanged passes spec changes and the assignment of an index.
func pathChanged() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*mptcpv1alpha1.MPTCPPath), e.ObjectNew.(*mptcpv1alpha1.MPTCPPath)
		return o.Generation != n.Generation || o.Status.Index != n.Status.Index ||
			!o.DeletionTimestamp.Equal(n.DeletionTimestamp)
	}}
}

func sameName(a, b mptcpv1alpha1.NodePath) bool { return a.Name == b.Name }
