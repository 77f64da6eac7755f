// Command controller compiles MPTCPPath and MPTCPPolicy objects into one
// MPTCPNodeState per node, and aggregates their status.
package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/mptcp-operator/mptcp-operator/internal/buildinfo"
	"github.com/mptcp-operator/mptcp-operator/internal/controller"
	controllermetrics "github.com/mptcp-operator/mptcp-operator/internal/controller/metrics"
	"github.com/mptcp-operator/mptcp-operator/internal/controller/podwebhook"
	"github.com/mptcp-operator/mptcp-operator/internal/controller/webhookcert"
)

func main() {
	var (
		metricsAddr = flag.String("metrics-bind-address", ":8080", "address the Prometheus metrics endpoint binds to; 0 disables it")
		metricsAuth = flag.Bool("metrics-auth", true, "serve /metrics over HTTPS, only to callers the API server authenticates and allows to get /metrics")
		metricsCert = flag.String("metrics-cert-dir", "", "with -metrics-auth: directory of tls.crt and tls.key to serve, read again when they change; empty: a self-signed certificate")
		probeAddr   = flag.String("health-probe-bind-address", ":8081", "address the health and readiness probes bind to")
		leaderElect = flag.Bool("leader-elect", false, "elect a leader, so that only one replica writes")
		leaderNS    = flag.String("leader-election-namespace", "", "namespace of the leader election lease (default: the pod's)")
		apiQPS      = flag.Float64("kube-api-qps", controller.DefaultAPIQPS, "requests a second the controller sends the API server, on average")
		apiBurst    = flag.Int("kube-api-burst", controller.DefaultAPIBurst, "requests the controller may send the API server at once, above -kube-api-qps")

		webhookPort    = flag.Int("webhook-port", 0, "serve the pod webhook (podMPTCP.transparent) over TLS on this port; 0: no webhook")
		webhookService = flag.String("webhook-service", "", "with -webhook-port: NAMESPACE/NAME of the webhook's Service (the certificate's names)")
		webhookSecret  = flag.String("webhook-cert-secret", "", "with -webhook-port: NAMESPACE/NAME of the Secret holding the serving certificate")
		webhookIssue   = flag.Bool("webhook-issue-cert", true, "with -webhook-port: issue and renew the certificate and keep the configuration's caBundle; false: cert-manager does")
		webhookConfig  = flag.String("webhook-configuration", "", "with -webhook-port: name of the MutatingWebhookConfiguration")
		preloadImage   = flag.String("preload-image", "", "with -webhook-port: image of the init container that installs the preload library (the agent's)")
		preloadPull    = flag.String("preload-image-pull-policy", string(corev1.PullIfNotPresent), "pull policy of -preload-image")
		clientCA       = flag.String("webhook-client-ca", "", "with -webhook-port: PEM file of the CA whose client certificates (the API server's, from its admission configuration) the webhook requires, refusing other callers at TLS; read at start; empty: no client certificate asked for")
		clientNames    = flag.String("webhook-client-names", "", "with -webhook-client-ca: comma-separated names a client certificate must carry one of, as its CommonName or a DNS name; empty: any certificate of that CA")
	)
	showVersion := flag.Bool("version", false, "print the build (version, source revision, Go version) and exit")
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	if *showVersion {
		fmt.Println(buildinfo.String())
		return
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("setup")
	log.Info("mptcp-operator controller", "version", buildinfo.Version(), "revision", buildinfo.Revision())
	metrics.Registry.MustRegister(buildinfo.Collector("mptcp_controller"), controllermetrics.CompileDuration)

	scheme, err := controller.Scheme()
	if err != nil {
		log.Error(err, "scheme")
		os.Exit(1)
	}
	var hook podwebhook.Options
	var certs *webhookcert.Manager
	var webhookServer webhook.Server
	if *webhookPort != 0 {
		hook = podwebhook.Options{Port: *webhookPort, IssueCert: *webhookIssue, Configuration: *webhookConfig,
			PreloadImage: *preloadImage, PreloadPullPolicy: corev1.PullPolicy(*preloadPull)}
		if hook.Service, err = podwebhook.ParseNamespacedName(*webhookService); err == nil {
			hook.CertSecret, err = podwebhook.ParseNamespacedName(*webhookSecret)
		}
		if err == nil && (hook.Configuration == "" || hook.PreloadImage == "") {
			err = errors.New("-webhook-port needs -webhook-configuration and -preload-image")
		}
		for n := range strings.SplitSeq(*clientNames, ",") {
			if n = strings.TrimSpace(n); n != "" {
				hook.ClientNames = append(hook.ClientNames, n)
			}
		}
		if err == nil && *clientCA != "" {
			hook.ClientCAs, err = podwebhook.LoadClientCAs(*clientCA)
		} else if err == nil && len(hook.ClientNames) > 0 {
			err = errors.New("-webhook-client-names needs -webhook-client-ca")
		}
		if err != nil {
			log.Error(err, "webhook flags")
			os.Exit(2)
		}
		if hook.ClientCAs != nil {
			log.Info("the webhook requires client certificates", "ca", *clientCA, "names", hook.ClientNames)
		}
		webhookServer, certs = podwebhook.Server(hook, slog.New(logr.ToSlogHandler(ctrl.Log.WithName("webhook-certificate"))))
	}
	if *apiQPS <= 0 || *apiBurst < 1 {
		log.Error(errors.New("-kube-api-qps must be above 0 and -kube-api-burst at least 1"), "client flags")
		os.Exit(2)
	}
	cfg := ctrl.GetConfigOrDie()
	cfg.QPS, cfg.Burst = float32(*apiQPS), *apiBurst
	mgr, err := newManager(cfg, ctrl.Options{
		WebhookServer:           webhookServer,
		Scheme:                  scheme,
		HealthProbeBindAddress:  *probeAddr,
		LeaderElection:          *leaderElect,
		LeaderElectionNamespace: *leaderNS,
		// The process exits as soon as the manager stops, so giving the
		// lease up then is safe, and spares a rolled-out controller the
		// lease's duration (15 s) of waiting: agents may be waiting on
		// it (an upgrade that changed the node state's format).
		LeaderElectionReleaseOnCancel: true,
	}, controllermetrics.Serving{BindAddress: *metricsAddr, Auth: *metricsAuth, CertDir: *metricsCert,
		Log: slog.New(logr.ToSlogHandler(ctrl.Log.WithName("metrics")))})
	if err != nil {
		log.Error(err, "manager")
		os.Exit(1)
	}
	ctx := ctrl.SetupSignalHandler()
	if err := controller.Setup(ctx, mgr); err != nil {
		log.Error(err, "controllers")
		os.Exit(1)
	}
	if certs != nil {
		if err := podwebhook.Setup(mgr, hook, certs); err != nil {
			log.Error(err, "webhook")
			os.Exit(1)
		}
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

// leaderElectionID names the lease the replicas elect a leader by.
const leaderElectionID = "mptcp-controller.mptcp.io"

// newManager is the manager with o, the controller's cache, and its metrics
// served as serving says with the controller's collectors registered: what
// main runs, and what the scrape flood test runs.
func newManager(cfg *rest.Config, o ctrl.Options, serving controllermetrics.Serving) (ctrl.Manager, error) {
	var err error
	if o.Metrics, err = controllermetrics.ServerOptions(serving); err != nil {
		return nil, err
	}
	o.Cache = controller.CacheOptions()
	o.LeaderElectionID = leaderElectionID
	mgr, err := ctrl.NewManager(cfg, o)
	if err != nil {
		return nil, err
	}
	objects := controllermetrics.NewObjects(mgr.GetCache(), mgr.Elected()).ReuseFor(controllermetrics.ScrapeTTL)
	if err := metrics.Registry.Register(objects); err != nil {
		return nil, err
	}
	return mgr, nil
}
