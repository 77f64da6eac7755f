// Command controller compiles MPTCPPath and MPTCPPolicy objects into one
// MPTCPNodeState per node, and aggregates their status.
package main

import (
	"flag"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/mptcp-operator/mptcp-operator/internal/controller"
)

func main() {
	var (
		metricsAddr = flag.String("metrics-bind-address", ":8080", "address the Prometheus metrics endpoint binds to; 0 disables it")
		probeAddr   = flag.String("health-probe-bind-address", ":8081", "address the health and readiness probes bind to")
		leaderElect = flag.Bool("leader-elect", false, "elect a leader, so that only one replica writes")
		leaderNS    = flag.String("leader-election-namespace", "", "namespace of the leader election lease (default: the pod's)")
	)
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("setup")

	scheme, err := controller.Scheme()
	if err != nil {
		log.Error(err, "scheme")
		os.Exit(1)
	}
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                  scheme,
		Cache:                   controller.CacheOptions(),
		Metrics:                 metricsserver.Options{BindAddress: *metricsAddr},
		HealthProbeBindAddress:  *probeAddr,
		LeaderElection:          *leaderElect,
		LeaderElectionID:        "mptcp-controller.mptcp.io",
		LeaderElectionNamespace: *leaderNS,
		// The process exits as soon as the manager stops, so giving the
		// lease up then is safe, and spares a rolled-out controller the
		// lease's duration (15 s) of waiting: agents may be waiting on
		// it (an upgrade that changed the node state's format).
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		log.Error(err, "manager")
		os.Exit(1)
	}
	ctx := ctrl.SetupSignalHandler()
	if err := controller.Setup(ctx, mgr); err != nil {
		log.Error(err, "controllers")
		os.Exit(1)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		log.Error(err, "health check")
		os.Exit(1)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		log.Error(err, "ready check")
		os.Exit(1)
	}
	log.Info("starting")
	if err := mgr.Start(ctx); err != nil {
		log.Error(err, "manager stopped")
		os.Exit(1)
	}
}
