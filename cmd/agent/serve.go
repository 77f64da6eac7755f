package main

import (
	"context"
	"log/slog"

	"github.com/mptcp-operator/mptcp-operator/internal/agent"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/observe"
)

// serveEndpoints starts what both modes serve: Prometheus metrics, /healthz
// and /readyz on metricsAddr ("" or "0": none), served before the first
// reconcile so /healthz answers while the node is set up and /readyz once it
// is enforced; and the local API, per-connection detail for root on this
// node. It records their addresses in status. wait, deferred by the caller
// after ctx is cancelled, returns once both have stopped, before the
// datapath is closed.
func serveEndpoints(ctx context.Context, a *agent.Agent, metrics *observe.Metrics, metricsAddr string,
	status *agent.Status, log *slog.Logger) (wait func(), err error) {
	var waits []func()
	wait = func() {
		for _, w := range waits {
			w()
		}
	}
	if metricsAddr != "0" && metricsAddr != "" {
		addr, w, err := observe.Serve(ctx, metricsAddr, metrics.Handler(), log)
		if err != nil {
			return wait, err
		}
		waits = append(waits, w)
		status.MetricsAddress = addr.String()
		log.Info("serving metrics and probes", "addr", status.MetricsAddress)
	}
	sock, w, err := a.ServeLocalAPI(ctx)
	if err != nil {
		return wait, err
	}
	waits = append(waits, w)
	status.LocalAPISocket = sock
	return wait, nil
}
