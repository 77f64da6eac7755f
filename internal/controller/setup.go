package controller

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/controller/nodestate"
	"github.com/mptcp-operator/mptcp-operator/internal/controller/path"
	"github.com/mptcp-operator/mptcp-operator/internal/controller/peers"
	"github.com/mptcp-operator/mptcp-operator/internal/controller/policystatus"
)

// DefaultAPIQPS and DefaultAPIBurst are the controller's client limits
// towards the API server unless its flags say otherwise: a change every
// node depends on is a node state write per node, so at 1,000 nodes
// controller-runtime's own defaults (20 a second, bursts of 30) would spend
// 50 s on the writes alone (docs/benchmarks.md, "Scale").
const (
	DefaultAPIQPS   = 100
	DefaultAPIBurst = 200
)

// Scheme holds the kinds the controller reads and writes.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := mptcpv1alpha1.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

// CacheOptions trims what the controller keeps of pods: it reads labels,
// annotations, node, phase and addresses, never containers or managed fields,
// and it caches every pod of the cluster.
func CacheOptions() cache.Options {
	return cache.Options{
		DefaultTransform: func(obj any) (any, error) {
			if m, err := meta.Accessor(obj); err == nil {
				m.SetManagedFields(nil)
			}
			if p, ok := obj.(*corev1.Pod); ok {
				p.Spec = corev1.PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork}
				p.Status = corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs}
			}
			return obj, nil
		},
	}
}

// Setup registers every controller of this package with mgr.
func Setup(ctx context.Context, mgr ctrl.Manager) error {
	if err := nodestate.Index(ctx, mgr); err != nil {
		return err
	}
	ns := &nodestate.Reconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Recorder:  mgr.GetEventRecorder(nodestate.ControllerName),
	}
	if err := ns.SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&path.Reconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder(path.ControllerName)}).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&peers.Reconciler{Client: mgr.GetClient()}).SetupWithManager(mgr); err != nil {
		return err
	}
	return (&policystatus.Reconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder(policystatus.ControllerName)}).SetupWithManager(mgr)
}
