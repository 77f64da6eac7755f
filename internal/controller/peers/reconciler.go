// Package peers writes the MPTCPPeers: one per node with pods under a
// policy, which every agent watches to probe its paths' liveness. A node's
// new address is one write here, not one per node state.
package peers

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/controller/compile"
)

// ControllerName names this controller in logs and metrics.
const ControllerName = "mptcp-peers"

// all is the controller's one request. Which node has an address two nodes
// claim, and which pod CIDRs overlap, are questions about every node at
// once (compile.PeerSpecs): each run answers them for all, and the work
// queue merges the changes of a burst (a cold start, a policy rewriting
// every node state) into few runs. A run writes only the peers that
// changed.
var all = reconcile.Request{NamespacedName: types.NamespacedName{Name: "all"}}

// writers bounds the writes a run has in flight.
const writers = 8

// MinInterval is the least time between two runs' starts. A run reads
// every node state, and an agent writes its own status as often as it
// likes: changes that come faster than this are answered together.
const MinInterval = 200 * time.Millisecond

// Reconciler keeps the MPTCPPeers equal to compile.PeerSpecs of the node
// states.
type Reconciler struct {
	client.Client

	mu      sync.Mutex
	lastRun time.Time
}

// +kubebuilder:rbac:groups=mptcp.io,resources=mptcppeers,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=mptcp.io,resources=mptcpnodestates,verbs=get;list;watch

// Reconcile writes every peer that differs from what the node states make.
func (r *Reconciler) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	r.mu.Lock()
	wait := time.Until(r.lastRun.Add(MinInterval))
	if wait <= 0 {
		r.lastRun = time.Now()
	}
	r.mu.Unlock()
	if wait > 0 {
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	var states mptcpv1alpha1.MPTCPNodeStateList
	// Read only: a copy of every node state per run is what would grow
	// with the cluster.
	if err := r.List(ctx, &states, client.UnsafeDisableDeepCopy); err != nil {
		return ctrl.Result{}, err
	}
	want := compile.PeerSpecs(states.Items)
	owner := map[string]metav1.OwnerReference{}
	for i := range states.Items {
		st := &states.Items[i]
		owner[st.Name] = metav1.OwnerReference{APIVersion: mptcpv1alpha1.GroupVersion.String(), Kind: "MPTCPNodeState", Name: st.Name, UID: st.UID}
	}
	var have mptcpv1alpha1.MPTCPPeerList
	if err := r.List(ctx, &have); err != nil {
		return ctrl.Result{}, err
	}
	var writes []func(context.Context) error
	for i := range have.Items {
		p := &have.Items[i]
		spec, ok := want[p.Name]
		delete(want, p.Name)
		switch {
		case !ok:
			writes = append(writes, func(ctx context.Context) error {
				return r.Delete(ctx, p, client.Preconditions{UID: &p.UID})
			})
		case !equality.Semantic.DeepEqual(p.Spec, spec) || !slices.Equal(p.OwnerReferences, []metav1.OwnerReference{owner[p.Name]}):
			p.Spec, p.OwnerReferences = spec, []metav1.OwnerReference{owner[p.Name]}
			writes = append(writes, func(ctx context.Context) error { return r.Update(ctx, p) })
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		p := &mptcpv1alpha1.MPTCPPeer{
			// Owned by the node state: gone with it even while this
			// controller does not run.
			ObjectMeta: metav1.ObjectMeta{Name: name, OwnerReferences: []metav1.OwnerReference{owner[name]}},
			Spec:       want[name],
		}
		writes = append(writes, func(ctx context.Context) error { return r.Create(ctx, p) })
	}
	stale, err := run(ctx, writes)
	if err != nil {
		return ctrl.Result{}, err
	}
	if len(writes) > 0 {
		logf.FromContext(ctx).V(1).Info("peers written", "writes", len(writes), "stale", stale)
	}
	if stale > 0 {
		// Written from a cache a moment behind (a conflict, an object
		// that exists already): the next run reads them again.
		return ctrl.Result{RequeueAfter: MinInterval}, nil
	}
	return ctrl.Result{}, nil
}

// run does writes, at most writers at once, and joins their errors; it
// counts apart those a cache a moment behind explains (a conflict, an
// object that exists already, one gone).
func run(ctx context.Context, writes []func(context.Context) error) (stale int, err error) {
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	work := make(chan func(context.Context) error)
	for range min(writers, len(writes)) {
		wg.Go(func() {
			for w := range work {
				err := w(ctx)
				mu.Lock()
				switch {
				case err == nil:
				case apierrors.IsConflict(err), apierrors.IsAlreadyExists(err), apierrors.IsNotFound(err):
					stale++
				default:
					errs = append(errs, err)
				}
				mu.Unlock()
			}
		})
	}
	for _, w := range writes {
		work <- w
	}
	close(work)
	wg.Wait()
	return stale, errors.Join(errs...)
}

// SetupWithManager runs the controller on every change of what a peer is
// made of, and on every change of a peer (someone else's edit is undone).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	toAll := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{all}
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		Watches(&mptcpv1alpha1.MPTCPNodeState{}, toAll, builder.WithPredicates(peerInputsChanged())).
		Watches(&mptcpv1alpha1.MPTCPPeer{}, toAll).
		Complete(r)
}

// peerInputsChanged passes the node state changes that compile.PeerSpecs
// reads: whether it has pods, its claims (status.paths) and the addresses
// its spec gives it, its pod CIDRs and its pods' addresses (which a pod
// CIDR of another node must not hold).
func peerInputsChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld.(*mptcpv1alpha1.MPTCPNodeState), e.ObjectNew.(*mptcpv1alpha1.MPTCPNodeState)
			return !equality.Semantic.DeepEqual(peerInputs(o), peerInputs(n))
		},
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// inputs are what compile.PeerSpecs reads of a node state (exported
// fields: equality.Semantic compares no others).
type inputs struct {
	HasPods, Outdated bool
	Claims            []mptcpv1alpha1.PathState
	Given             []mptcpv1alpha1.NodePath
	PodCIDRs          []string
	PodIPs            [][]string
}

func peerInputs(s *mptcpv1alpha1.MPTCPNodeState) inputs {
	in := inputs{HasPods: len(s.Spec.Pods) > 0, Outdated: s.Spec.Outdated(), PodCIDRs: s.Spec.PodCIDRs}
	for _, p := range s.Status.Paths {
		in.Claims = append(in.Claims, mptcpv1alpha1.PathState{Name: p.Name, Addresses: p.Addresses})
	}
	for _, p := range s.Spec.Paths {
		in.Given = append(in.Given, mptcpv1alpha1.NodePath{Name: p.Name, Addresses: p.Addresses})
	}
	for _, p := range s.Spec.Pods {
		in.PodIPs = append(in.PodIPs, p.IPs)
	}
	return in
}
