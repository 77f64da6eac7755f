package main

import (
	"context"
	"crypto/tls"
	"log/slog"

	"k8s.io/client-go/rest"

	"github.com/mptcp-operator/mptcp-operator/internal/agent"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/observe"
	"github.com/mptcp-operator/mptcp-operator/internal/metricsauth"
)

// metricsServing is how /metrics is served, from the -metrics-auth and
// -metrics-cert-dir flags.
var metricsServing struct {
	// auth serves over TLS and lets only callers the API server
	// authenticates and authorizes read /metrics (kube mode only).
	auth bool
	// certDir holds tls.crt and tls.key; empty: a self-signed certificate.
	certDir string
}

// serveEndpoints starts what both modes serve: Prometheus metrics, /healthz
// and /readyz on metricsAddr ("" or "0": none), served before the first
// reconcile so /healthz answers while the node is set up and /readyz once it
// is enforced; and the local API, per-connection detail for root on this
// node. It records their addresses in status. restCfg (kube mode; nil in
// file mode) makes the reviews of -metrics-auth. wait, deferred by the
// caller after ctx is cancelled, returns once both have stopped, before the
// datapath is closed.
func serveEndpoints(ctx context.Context, a *agent.Agent, metrics *observe.Metrics, metricsAddr string, restCfg *rest.Config,
	status *agent.Status, log *slog.Logger) (wait func(), err error) {
	var waits []func()
	wait = func() {
		for _, w := range waits {
			w()
		}
	}
	if metricsAddr != "0" && metricsAddr != "" {
		h := metrics.Handler()
		var tlsConfig *tls.Config
		if metricsServing.auth {
			guard, err := metricsauth.NewGuard(restCfg, log)
			if err != nil {
				return wait, err
			}
			h = guard.Handler(h)
			if tlsConfig, err = metricsauth.TLSConfig(ctx, metricsServing.certDir, "mptcp-agent", log); err != nil {
				return wait, err
			}
		}
		addr, w, err := observe.ServeTLS(ctx, metricsAddr, h, tlsConfig, log)
		if err != nil {
			return wait, err
		}
		waits = append(waits, w)
		status.MetricsAddress = addr.String()
		log.Info("serving metrics and probes", "addr", status.MetricsAddress, "authenticated", metricsServing.auth)
	}
	sock, w, err := a.ServeLocalAPI(ctx)
	if err != nil {
		return wait, err
	}
	waits = append(waits, w)
	status.LocalAPISocket = sock
	return wait, nil
}
