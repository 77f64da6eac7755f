// Package kubelet is a kubelet stand-in for the test bed: it registers one
// Node per bed node, runs the pods bound to them in the bed's pre-built pod
// namespaces and starts each pod's workload from its Pod spec as admitted, as
// a process inside the pod's network namespace. There is no container engine
// on the development machines (DESIGN.md, "Where it runs in tests"); this is
// the part of a kubelet the operator's tests depend on. See docs/testbed.md.
package kubelet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/mptcp-operator/mptcp-operator/hack/testbed"
	"github.com/mptcp-operator/mptcp-operator/internal/controller/testenv"
)

// Annotations the stand-in writes on every pod it runs: where the pod lives
// in the bed. A real node agent finds these from the CRI and the routes; in
// the bed they are recorded so that the agent and tests need not guess.
const (
	// AnnotationNetNS is the path of the pod's network namespace.
	AnnotationNetNS = "testbed.mptcp.io/netns"
	// AnnotationHostInterface is the node-side veth of the pod.
	AnnotationHostInterface = "testbed.mptcp.io/host-interface"
	// AnnotationSlot is the bed pod the Pod was given, "n<i>p<j>".
	AnnotationSlot = "testbed.mptcp.io/slot"
)

// LabelMultipath is the label every registered node carries, so that the
// MPTCPPaths of examples/ (nodeSelector mptcp.io/multipath=true) select them.
const LabelMultipath = "mptcp.io/multipath"

// Options configure a Kubelet.
type Options struct {
	// Bed is the test bed whose nodes and pod namespaces the stand-in runs.
	Bed *testbed.Bed
	// Config reaches the API server.
	Config *rest.Config
	// NodeName names the Node of a bed node; the node's namespace name when nil.
	NodeName func(*testbed.Node) string
	// NodeLabels are added to every Node (besides kubernetes.io/hostname,
	// kubernetes.io/os and mptcp.io/multipath=true).
	NodeLabels map[string]string
	// Log receives what the stand-in does (discarded when nil).
	Log *slog.Logger
}

// Kubelet is a running stand-in. Stop it with Stop.
type Kubelet struct {
	opts   Options
	c      client.Client
	nodes  map[string]*testbed.Node // by Node name
	names  map[*testbed.Node]string
	exits  chan event.GenericEvent
	cancel context.CancelFunc
	done   chan error
	log    *slog.Logger

	mu    sync.Mutex
	pods  map[types.NamespacedName]*podState
	slots map[*testbed.Pod]types.NamespacedName // bed pods in use
}

// podState is what the stand-in runs for one pod.
type podState struct {
	uid   types.UID
	slot  *testbed.Pod
	procs []*testbed.Process // one per container, once started
	// exited is set when every process has exited; code is the first
	// non-zero exit code.
	exited bool
	code   int
}

// Start registers the bed's nodes and starts running the pods bound to them,
// until Stop.
func Start(ctx context.Context, o Options) (*Kubelet, error) {
	if o.Bed == nil || o.Config == nil {
		return nil, errors.New("kubelet: Bed and Config are required")
	}
	if o.NodeName == nil {
		o.NodeName = func(n *testbed.Node) string { return n.NetNS }
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	k := &Kubelet{
		opts: o, log: o.Log,
		nodes: map[string]*testbed.Node{}, names: map[*testbed.Node]string{},
		exits: make(chan event.GenericEvent, 64),
		pods:  map[types.NamespacedName]*podState{}, slots: map[*testbed.Pod]types.NamespacedName{},
		done: make(chan error, 1),
	}
	for _, n := range o.Bed.Nodes {
		name := o.NodeName(n)
		k.nodes[name], k.names[n] = n, name
	}
	mgr, err := ctrl.NewManager(o.Config, ctrl.Options{
		Scheme:                 testenv.Scheme(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// Tests start several stand-ins in one process, one after the other.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
		Logger:     logrFrom(o.Log),
	})
	if err != nil {
		return nil, fmt.Errorf("kubelet: manager: %w", err)
	}
	k.c = mgr.GetClient()
	direct, err := client.New(o.Config, client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		return nil, err
	}
	for _, n := range o.Bed.Nodes {
		if err := k.register(ctx, direct, n); err != nil {
			return nil, err
		}
	}
	// One worker: slots are handed out in a single place, one pod at a time.
	err = ctrl.NewControllerManagedBy(mgr).
		Named("testbed-kubelet").
		For(&corev1.Pod{}).
		WatchesRawSource(source.Channel(k.exits, &handler.EnqueueRequestForObject{})).
		WithOptions(controllerOptions()).
		Complete(k)
	if err != nil {
		return nil, fmt.Errorf("kubelet: controller: %w", err)
	}
	mctx, cancel := context.WithCancel(context.Background())
	k.cancel = cancel
	go func() { k.done <- mgr.Start(mctx) }()
	syncCtx, scancel := context.WithTimeout(ctx, 30*time.Second)
	defer scancel()
	if !mgr.GetCache().WaitForCacheSync(syncCtx) {
		return nil, errors.Join(errors.New("kubelet: pod cache did not sync"), k.Stop())
	}
	return k, nil
}

// Stop stops running pods (their workloads by PID) and the stand-in. The
// Pods stay in the API; the bed's pod namespaces stay for Bed.Down.
func (k *Kubelet) Stop() error {
	var errs []error
	if k.cancel != nil {
		k.cancel()
		if err := <-k.done; err != nil {
			errs = append(errs, err)
		}
		k.cancel = nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for key, st := range k.pods {
		errs = append(errs, stopProcs(st.procs, 3*time.Second))
		delete(k.pods, key)
	}
	clear(k.slots)
	return errors.Join(errs...)
}

// NodeName is the Node name of bed node n.
func (k *Kubelet) NodeName(n *testbed.Node) string { return k.names[n] }

// Slot returns the bed pod a Pod runs in, or nil.
func (k *Kubelet) Slot(key types.NamespacedName) *testbed.Pod {
	k.mu.Lock()
	defer k.mu.Unlock()
	if st := k.pods[key]; st != nil {
		return st.slot
	}
	return nil
}

// Processes returns the workload processes of a Pod, one per container, or
// nil while they have not started.
func (k *Kubelet) Processes(key types.NamespacedName) []*testbed.Process {
	k.mu.Lock()
	defer k.mu.Unlock()
	if st := k.pods[key]; st != nil {
		return append([]*testbed.Process(nil), st.procs...)
	}
	return nil
}

// FreeSlots counts the bed pods of node n that no Pod uses.
func (k *Kubelet) FreeSlots(n *testbed.Node) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	free := 0
	for _, p := range n.Pods {
		if _, used := k.slots[p]; !used {
			free++
		}
	}
	return free
}

func stopProcs(procs []*testbed.Process, grace time.Duration) error {
	var errs []error
	for _, p := range procs {
		errs = append(errs, p.Stop(grace))
	}
	return errors.Join(errs...)
}
