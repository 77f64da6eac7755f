// Package nodestate compiles every node's MPTCPNodeState spec.
package nodestate

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/controller/compile"
	"github.com/mptcp-operator/mptcp-operator/internal/controller/metrics"
)

// ControllerName names this controller in logs, metrics and events.
const ControllerName = "mptcp-nodestate"

// PodNodeNameField indexes pods by the node they are bound to, so a node's
// reconcile reads only its own pods from the cache.
const PodNodeNameField = "spec.nodeName"

// ClaimedAddressField indexes node states by the addresses they claim
// (compile.ClaimedAddresses), so a node's reconcile reads only the node
// states its addresses depend on, whatever the size of the cluster.
const ClaimedAddressField = "mptcp.io/claimedAddress"

// Event reasons.
const (
	ReasonSpecCreated = "SpecCreated"
)

// Reconciler keeps MPTCPNodeState <node> equal to what compile.Node makes of
// the cluster for that node, writing only when the result changed.
type Reconciler struct {
	client.Client
	// APIReader reads around the cache, to confirm a node state is really
	// missing before creating it (the cache lags behind our own creates).
	APIReader client.Reader
	Recorder  events.EventRecorder

	// refused remembers, per node, the tenant refusals already reported, so a
	// reconcile that changes nothing emits no event (events are writes too).
	mu      sync.Mutex
	refused map[string]map[string]bool
}

// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods;namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups=mptcp.io,resources=mptcppaths;mptcppolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=mptcp.io,resources=mptcpnodestates,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=list

// Reconcile compiles one node; the request's name is the node's name.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := logf.FromContext(ctx)
	var node corev1.Node
	if err := r.Get(ctx, types.NamespacedName{Name: req.Name}, &node); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		// The owner reference lets the garbage collector do this too, but
		// a cluster's GC can lag or be absent; an agent must not keep
		// enforcing a dead node's state meanwhile.
		r.forget(req.Name)
		return ctrl.Result{}, r.deleteState(ctx, req.Name)
	}

	in, err := r.inputs(ctx, &node)
	if err != nil {
		return ctrl.Result{}, err
	}
	start := time.Now()
	res := compile.Node(in)
	metrics.CompileDuration.Observe(time.Since(start).Seconds())

	state, err := r.ensureSpec(ctx, &node, res.Spec)
	if err != nil {
		return ctrl.Result{}, err
	}
	notices := make([]podNotice, 0, len(res.Refusals))
	for _, ref := range res.Refusals {
		action := "ApplyPreferences"
		switch ref.Reason {
		case compile.ReasonVMGuestMode:
			action = "Compile"
		case compile.ReasonTransparentNotApplied:
			action = "Admit"
		}
		notices = append(notices, podNotice{Refusal: ref, action: action})
	}
	notices = append(notices, skippedPods(state, in.Pods)...)
	r.reportRefusals(ctx, node.Name, notices)
	log.V(1).Info("node compiled", "pods", len(res.Spec.Pods), "paths", len(res.Spec.Paths))
	return ctrl.Result{}, nil
}

func (r *Reconciler) inputs(ctx context.Context, node *corev1.Node) (compile.Input, error) {
	in := compile.Input{Node: node, NamespaceLabels: map[string]map[string]string{}}
	var paths mptcpv1alpha1.MPTCPPathList
	if err := r.List(ctx, &paths); err != nil {
		return in, err
	}
	var policies mptcpv1alpha1.MPTCPPolicyList
	if err := r.List(ctx, &policies); err != nil {
		return in, err
	}
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.MatchingFields{PodNodeNameField: node.Name}); err != nil {
		return in, err
	}
	states, err := r.contenders(ctx, node.Name)
	if err != nil {
		return in, err
	}
	in.Paths, in.Policies, in.Pods, in.NodeStates = paths.Items, policies.Items, pods.Items, states
	for i := range pods.Items {
		ns := pods.Items[i].Namespace
		if _, done := in.NamespaceLabels[ns]; done {
			continue
		}
		var n corev1.Namespace
		if err := r.Get(ctx, types.NamespacedName{Name: ns}, &n); err != nil {
			if apierrors.IsNotFound(err) {
				in.NamespaceLabels[ns] = nil
				continue
			}
			return in, err
		}
		in.NamespaceLabels[ns] = n.Labels
	}
	return in, nil
}

// contenders are the node states compile.Node reads for node: its own and
// those that claim an address its own claims (compile.Node only reads
// them).
func (r *Reconciler) contenders(ctx context.Context, node string) ([]mptcpv1alpha1.MPTCPNodeState, error) {
	var own mptcpv1alpha1.MPTCPNodeState
	if err := r.Get(ctx, types.NamespacedName{Name: node}, &own); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	others, err := r.claimants(ctx, compile.ClaimedAddresses(&own))
	if err != nil {
		return nil, err
	}
	others = slices.DeleteFunc(others, func(s mptcpv1alpha1.MPTCPNodeState) bool { return s.Name == node })
	return append([]mptcpv1alpha1.MPTCPNodeState{own}, others...), nil
}

// ensureSpec creates or updates the node state when, and only when, its
// serialized spec differs from the compiled one. Comparing bytes rather than
// structs makes "nothing changed" mean exactly what the API server would
// store.
func (r *Reconciler) ensureSpec(ctx context.Context, node *corev1.Node, spec mptcpv1alpha1.MPTCPNodeStateSpec) (*mptcpv1alpha1.MPTCPNodeState, error) {
	want, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	var state mptcpv1alpha1.MPTCPNodeState
	err = r.Get(ctx, types.NamespacedName{Name: node.Name}, &state)
	if apierrors.IsNotFound(err) && r.APIReader != nil {
		err = r.APIReader.Get(ctx, types.NamespacedName{Name: node.Name}, &state)
	}
	switch {
	case apierrors.IsNotFound(err):
		state = mptcpv1alpha1.MPTCPNodeState{
			ObjectMeta: metav1.ObjectMeta{
				Name: node.Name,
				// Not a controller reference with blockOwnerDeletion: that
				// would need update on nodes/finalizers for nothing.
				OwnerReferences: []metav1.OwnerReference{{
					APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID,
				}},
			},
			Spec: spec,
		}
		if err := r.Create(ctx, &state); err != nil {
			return nil, err
		}
		r.Recorder.Eventf(&state, node, corev1.EventTypeNormal, ReasonSpecCreated, "Compile",
			"compiled %d pods over %d paths", len(spec.Pods), len(spec.Paths))
		return &state, nil
	case err != nil:
		return nil, err
	}
	have, err := json.Marshal(state.Spec)
	if err != nil {
		return nil, err
	}
	// An earlier release's spec is rewritten whatever it compares to.
	if bytes.Equal(have, want) && !state.Spec.Outdated() {
		return &state, nil
	}
	// No event for an update: a change every node depends on would be
	// one more write per node, and the node's agent reports the generation
	// it applies with an event of its own (Applied).
	state.Spec = spec
	if err := r.Update(ctx, &state); err != nil {
		return nil, err
	}
	return &state, nil
}

func (r *Reconciler) deleteState(ctx context.Context, name string) error {
	state := &mptcpv1alpha1.MPTCPNodeState{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := r.Delete(ctx, state); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}

// podNotice is a Warning event for a pod, and the action it is about.
type podNotice struct {
	compile.Refusal
	action string
}

// skippedPods are the events for the pods the node's agent skipped for
// problems of their own (status.pods). The agent cannot write them: the
// admission policies can tie an event to the agent's node only when it is
// about its node state, not about a pod (docs/security.md). Only a status
// about the current spec counts (a fixed problem is not reported again),
// and only a pod that is still the one the spec named (same uid).
func skippedPods(state *mptcpv1alpha1.MPTCPNodeState, pods []corev1.Pod) []podNotice {
	if state == nil || state.Status.ObservedGeneration != state.Generation || len(state.Status.Pods) == 0 {
		return nil
	}
	uids := map[string]string{}
	for _, p := range state.Spec.Pods {
		uids[p.Namespace+"/"+p.Name] = p.UID
	}
	var out []podNotice
	for _, sp := range state.Status.Pods {
		i := slices.IndexFunc(pods, func(p corev1.Pod) bool {
			return p.Namespace == sp.Namespace && p.Name == sp.Name && string(p.UID) == uids[sp.Namespace+"/"+sp.Name]
		})
		if i < 0 {
			continue
		}
		out = append(out, podNotice{action: "Enforce", Refusal: compile.Refusal{Pod: &pods[i], Reason: string(sp.Reason),
			Message: fmt.Sprintf("the agent of node %s skipped the pod, which is not configured for MPTCP; the node's other pods are: %s",
				state.Name, sp.Message)}})
	}
	return out
}

// reportRefusals emits a Warning event on the pod for every refusal not yet
// reported.
func (r *Reconciler) reportRefusals(ctx context.Context, node string, refusals []podNotice) {
	now := make(map[string]bool, len(refusals))
	r.mu.Lock()
	if r.refused == nil {
		r.refused = map[string]map[string]bool{}
	}
	before := r.refused[node]
	r.refused[node] = now
	r.mu.Unlock()
	for _, ref := range refusals {
		key := fmt.Sprintf("%s|%s|%s|%s", ref.Pod.UID, ref.Policy, ref.Reason, ref.Message)
		now[key] = true
		if before[key] || r.alreadyReported(ctx, ref.Refusal) {
			continue
		}
		r.Recorder.Eventf(ref.Pod, nil, corev1.EventTypeWarning, ref.Reason, ref.action, "%s", ref.Message)
	}
}

// alreadyReported asks the API server whether the pod already carries this
// refusal's event, which is what a restarted controller has forgotten. It
// reads; it never writes.
func (r *Reconciler) alreadyReported(ctx context.Context, ref compile.Refusal) bool {
	if r.APIReader == nil {
		return false
	}
	var evs corev1.EventList
	// From the API server's watch cache (resourceVersion 0), not a quorum
	// read: a cold start asks once per refusal, and the cache answers
	// without reading every event of the namespace from etcd. An event a
	// moment old missing from the cache is reported twice at worst.
	err := r.APIReader.List(ctx, &evs, client.InNamespace(ref.Pod.Namespace), client.MatchingFields{
		"involvedObject.uid": string(ref.Pod.UID),
		"reason":             ref.Reason,
	}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: "0"}})
	if err != nil {
		return false
	}
	for _, e := range evs.Items {
		if e.Message == ref.Message {
			return true
		}
	}
	return false
}

func (r *Reconciler) forget(node string) {
	r.mu.Lock()
	delete(r.refused, node)
	r.mu.Unlock()
}
