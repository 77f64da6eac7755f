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
	"github.com/mptcp-operator/mptcp-operator/internal/agent/observe"
)

// runKube enforces the node's MPTCPNodeState from the API. A -config file,
// if given, supplies the node-local settings.
func runKube(log *slog.Logger, kubeconfig, node, configPath, metricsAddr string, uninstall bool) error {
	settings := agent.NodeDefaults(node)
	if configPath != "" {
		s, err := agent.LoadSettings(configPath)
		if err != nil {
			return err
		}
		if s.Node != node {
			return fmt.Errorf("%s is node %q's settings, not %q's", configPath, s.Node, node)
		}
		settings = s
	}
	log = log.With("node", node)
	a, err := agent.New(settings, log)
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
	metrics := observe.NewMetrics(a, log)
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
	err = kube.Run(ctx, restCfg, kube.Options{Node: node, Settings: settings, Agent: a, Metrics: metrics, Log: log, Status: status})
	log.Info("stopping; the datapath stays pinned and keeps steering")
	return err
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "in-cluster" {
		return rest.InClusterConfig()
	}
	return clientcmd.BuildConfigFromFlags("", kubeconfig)
}
