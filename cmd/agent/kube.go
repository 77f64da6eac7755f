package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/mptcp-operator/mptcp-operator/internal/agent"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/kube"
)

// runKube enforces the node's MPTCPNodeState. A -config file, if given,
// supplies the node-local settings; what it says of paths, rules and pods is
// replaced by the API's.
func runKube(log *slog.Logger, kubeconfig, node, configPath, metricsAddr string, uninstall bool) error {
	base := agent.NodeDefaults(node)
	if configPath != "" {
		cfg, err := agent.LoadConfig(configPath)
		if err != nil {
			return err
		}
		if cfg.Node != node {
			return fmt.Errorf("%s is node %q's configuration, not %q's", configPath, cfg.Node, node)
		}
		base = *cfg
	}
	log = log.With("node", node)
	a, err := agent.New(&base, log)
	if err != nil {
		return err
	}
	if uninstall {
		// What the last run applied is in the state directory; uninstall
		// needs no API.
		if err := a.Uninstall(); err != nil {
			return fmt.Errorf("uninstall: %w", err)
		}
		log.Info("uninstalled")
		return nil
	}
	defer a.Close()
	restCfg, err := restConfig(kubeconfig)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	status := agent.Status{PID: os.Getpid()}
	metrics := agent.NewMetrics(a)
	wait, err := serveEndpoints(ctx, a, metrics, metricsAddr, restCfg, &status, log)
	// Stop serving before the datapath is closed (deferred earlier).
	defer wait()
	defer stop()
	if err != nil {
		return err
	}
	if err := a.WriteStatus(status); err != nil {
		log.Error("writing status", "err", err)
	}
	err = kube.Run(ctx, restCfg, kube.Options{Node: node, Base: base, Agent: a, Metrics: metrics, Log: log, Status: status})
	log.Info("stopping; the datapath stays pinned and keeps steering")
	return err
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "in-cluster" {
		return rest.InClusterConfig()
	}
	return clientcmd.BuildConfigFromFlags("", kubeconfig)
}
