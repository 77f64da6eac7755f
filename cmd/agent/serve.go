package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

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

// openAgent takes the node's lock and loads the datapath with settings, as
// both modes start; unlock releases the lock once the agent is closed or
// removed. failed, when set, is told why the agent could not be loaded,
// while the lock is held.
func openAgent(log *slog.Logger, settings agent.Settings, failed func(error)) (a *agent.Agent, unlock func(), err error) {
	lock, err := agent.LockNode(settings.StateDir, log)
	if err != nil {
		return nil, nil, err
	}
	a, err = agent.New(settings, log)
	if err != nil {
		if failed != nil {
			failed(err)
		}
		lock.Unlock()
		return nil, nil, err
	}
	return a, lock.Unlock, nil
}

// uninstallAgent removes everything the agent created on the node (the
// same code as -uninstall).
func uninstallAgent(a *agent.Agent, log *slog.Logger) error {
	if err := a.Uninstall(); err != nil {
		return fmt.Errorf("uninstall: %w", err)
	}
	log.Info("uninstalled")
	return nil
}

// serving is what both modes enforce under: a context that SIGTERM or
// SIGINT ends, what the status file says, and the metrics.
type serving struct {
	ctx     context.Context
	status  agent.Status
	metrics *observe.Metrics
}

// serve starts serving the agent's endpoints (serveEndpoints) under a
// context that SIGTERM or SIGINT ends. done, deferred by the caller even on
// error, ends the context and returns once nothing is served, before the
// datapath is closed.
func serve(log *slog.Logger, a *agent.Agent, metricsAddr string, restCfg *rest.Config) (s *serving, done func(), err error) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	s = &serving{ctx: ctx, status: agent.Status{PID: os.Getpid()}, metrics: observe.NewMetrics(a, log)}
	wait, err := serveEndpoints(ctx, a, s.metrics, metricsAddr, restCfg, &s.status, log)
	return s, func() { stop(); wait() }, err
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
