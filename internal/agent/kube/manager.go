package kube

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/observe"
)

func currentPID() int { return os.Getpid() }

// CacheOptions restrict the agent's cache to its own node's MPTCPNodeState:
// the list and the watch carry a field selector on the name, so the API
// server sends nothing about other nodes. Pods are not cached at all: the
// spec already lists the node's governed pods with their addresses, and the
// pod gate is written with patches.
//
// The peers are all cached, without their managed fields: every agent
// holds every node with pods.
func CacheOptions(node string) cache.Options {
	return cache.Options{
		ByObject: map[client.Object]cache.ByObject{
			&mptcpv1alpha1.MPTCPNodeState{}: {Field: fields.OneTermEqualSelector("metadata.name", node)},
			&mptcpv1alpha1.MPTCPPeer{}:      {Transform: cache.TransformStripManagedFields()},
		},
	}
}

// Options configure Run.
type Options struct {
	Node     string
	Settings agent.Settings
	Agent    *agent.Agent
	Metrics  *observe.Metrics
	Log      *slog.Logger
	// Status is what the agent writes to its status file (PID, metrics
	// address); Run keeps it up to date.
	Status agent.Status
	Resync time.Duration
}

// Run enforces the node's MPTCPNodeState until ctx ends.
func Run(ctx context.Context, cfg *rest.Config, o Options) error {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := mptcpv1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	ctrl.SetLogger(logr.FromSlogHandler(o.Log.Handler()))
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: scheme,
		Cache:  CacheOptions(o.Node),
		// The agent serves its own metrics and probes (observe.Serve).
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// One writer per node state: every node runs its own agent.
		LeaderElection: false,
	})
	if err != nil {
		return err
	}
	if o.Resync == 0 {
		o.Resync = 30 * time.Second
	}
	// A reconciler that cannot go on (a map migration rolled back) ends the
	// manager with its error, as the file-mode agent exits.
	ctx, fatal := context.WithCancelCause(ctx)
	defer fatal(nil)
	r := &Reconciler{
		Client:    mgr.GetClient(),
		APIReader: mgr.GetAPIReader(),
		Recorder:  mgr.GetEventRecorder("mptcp-agent"),
		Agent:     o.Agent,
		Settings:  o.Settings,
		Node:      o.Node,
		Log:       o.Log,
		Metrics:   o.Metrics,
		Resync:    o.Resync,
		Links:     agent.Links,
		Locate:    agent.LocatePod,
		status:    o.Status,
		fatal:     fatal,
	}
	// Link events of the path NICs act on the datapath at once and ask
	// for a reconcile (coalesced: one pending is enough).
	linkEvents := make(chan event.TypedGenericEvent[*mptcpv1alpha1.MPTCPNodeState], 1)
	r.LinkEvents = linkEvents
	node := &mptcpv1alpha1.MPTCPNodeState{ObjectMeta: metav1.ObjectMeta{Name: o.Node}}
	reconcileSoon := func() {
		select {
		case linkEvents <- event.TypedGenericEvent[*mptcpv1alpha1.MPTCPNodeState]{Object: node}:
		default:
		}
	}
	go o.Agent.WatchLinks(ctx, reconcileSoon)
	// A path's liveness changed: the datapath has it; the reconcile
	// writes it into status.paths.
	o.Agent.OnLivenessChange(reconcileSoon)
	if err := r.SetupWithManager(mgr); err != nil {
		return err
	}
	err = mgr.Start(ctx)
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return err
}
