package nodestate

import (
	"context"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/transparent"
)

// IndexPods registers the pod index this controller lists by.
func IndexPods(ctx context.Context, mgr ctrl.Manager) error {
	return mgr.GetFieldIndexer().IndexField(ctx, &corev1.Pod{}, PodNodeNameField, func(o client.Object) []string {
		if n := o.(*corev1.Pod).Spec.NodeName; n != "" {
			return []string{n}
		}
		return nil
	})
}

// SetupWithManager watches everything a node's spec depends on. Changes that
// can affect any node (paths, policies, namespace labels) enqueue every node;
// a pod or a node state enqueues only its own node.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	allNodes := handler.EnqueueRequestsFromMapFunc(r.allNodes)
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&corev1.Node{}, builder.WithPredicates(nodeChanged())).
		Watches(&mptcpv1alpha1.MPTCPNodeState{}, handler.EnqueueRequestsFromMapFunc(byName)).
		// What a node state tells its peers: every node lists it.
		Watches(&mptcpv1alpha1.MPTCPNodeState{}, allNodes, builder.WithPredicates(peerChanged())).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(podNode), builder.WithPredicates(podChanged())).
		Watches(&corev1.Namespace{}, allNodes, builder.WithPredicates(predicate.LabelChangedPredicate{})).
		Watches(&mptcpv1alpha1.MPTCPPolicy{}, allNodes, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&mptcpv1alpha1.MPTCPPath{}, allNodes, builder.WithPredicates(pathChanged())).
		Complete(r)
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

// peerChanged passes the changes of a node state that its peers' specs
// list (compile.Peers): whether it has pods, its paths' addresses; its pod
// CIDRs, with pods or not (every node's count against overlapping claims:
// compile.peerPodCIDRs); and
// a change of the addresses its spec gives it, which decides who has an
// address two nodes claim, peers or not.
func peerChanged() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc: func(e event.CreateEvent) bool { return isPeer(e.Object.(*mptcpv1alpha1.MPTCPNodeState)) },
		DeleteFunc: func(e event.DeleteEvent) bool {
			s := e.Object.(*mptcpv1alpha1.MPTCPNodeState)
			return isPeer(s) || hasAddresses(s) || len(s.Spec.PodCIDRs) > 0
		},
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld.(*mptcpv1alpha1.MPTCPNodeState), e.ObjectNew.(*mptcpv1alpha1.MPTCPNodeState)
			return isPeer(o) != isPeer(n) || (isPeer(n) && !slices.EqualFunc(o.Status.Paths, n.Status.Paths, samePeerPath)) ||
				!slices.Equal(o.Spec.PodCIDRs, n.Spec.PodCIDRs) ||
				!slices.EqualFunc(o.Spec.Paths, n.Spec.Paths, sameGiven)
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

func isPeer(s *mptcpv1alpha1.MPTCPNodeState) bool { return len(s.Spec.Pods) > 0 }

func hasAddresses(s *mptcpv1alpha1.MPTCPNodeState) bool {
	return slices.ContainsFunc(s.Spec.Paths, func(p mptcpv1alpha1.NodePath) bool { return len(p.Addresses) > 0 })
}

func sameGiven(a, b mptcpv1alpha1.NodePath) bool {
	return a.Name == b.Name && slices.Equal(a.Addresses, b.Addresses)
}

func samePeerPath(a, b mptcpv1alpha1.PathState) bool {
	return a.Name == b.Name && slices.Equal(a.Addresses, b.Addresses)
}

// pathChanged passes spec changes and the assignment of an index.
func pathChanged() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*mptcpv1alpha1.MPTCPPath), e.ObjectNew.(*mptcpv1alpha1.MPTCPPath)
		return o.Generation != n.Generation || o.Status.Index != n.Status.Index ||
			!o.DeletionTimestamp.Equal(n.DeletionTimestamp)
	}}
}
