package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/mptcp-operator/mptcp-operator/internal/agent"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/kube"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/removal"
)

// kubeOptions are kube mode's flags.
type kubeOptions struct {
	kubeconfig, node, configPath, metricsAddr string
	// daemonSet is NAMESPACE/NAME of the DaemonSet the agent runs under.
	daemonSet string
	uninstall bool
}

// removalTimeout bounds how long a stopping agent waits to learn whether
// its DaemonSet is gone: well inside the chart's termination grace period
// (30 s), with the uninstall itself taking under a second.
const removalTimeout = 10 * time.Second

// runKube enforces the node's MPTCPNodeState from the API. A -config file,
// if given, supplies the node-local settings.
func runKube(log *slog.Logger, o kubeOptions) error {
	settings := agent.NodeDefaults(o.node)
	if o.configPath != "" {
		s, err := agent.LoadSettings(o.configPath)
		if err != nil {
			return err
		}
		if s.Node != o.node {
			return fmt.Errorf("%s is node %q's settings, not %q's", o.configPath, s.Node, o.node)
		}
		settings = s
	}
	settings = withFlags(settings)
	log = log.With("node", o.node)
	a, unlock, err := openAgent(log, settings, func(err error) {
		if !o.uninstall {
			reportFailedStart(log, o, settings, err)
		}
	})
	if err != nil {
		return err
	}
	defer unlock()
	if o.uninstall {
		// What the last run applied is in the state directory; uninstall
		// needs no API.
		return uninstallAgent(a, log)
	}
	restCfg, err := restConfig(o.kubeconfig)
	if err != nil {
		a.Close()
		return err
	}
	var owner *removal.Watch
	if o.daemonSet != "" {
		ns, name, ok := strings.Cut(o.daemonSet, "/")
		if !ok || ns == "" || name == "" {
			a.Close()
			return fmt.Errorf("-daemonset %q: want NAMESPACE/NAME", o.daemonSet)
		}
		cs, err := kubernetes.NewForConfig(restCfg)
		if err != nil {
			a.Close()
			return err
		}
		owner = removal.Start(cs, ns, name)
		defer owner.Stop()
	}
	// stopped: by a signal, which is how the kubelet ends the container
	// whatever the reason; err: the manager's, which a signal may come
	// with too.
	stopped, err := enforce(log, a, restCfg, settings, o)
	if !stopped || owner == nil {
		log.Info("stopping; the datapath stays pinned and keeps steering")
		return joinClose(err, a)
	}
	ctx, cancel := context.WithTimeout(context.Background(), removalTimeout)
	defer cancel()
	removed, why := owner.Removed(ctx)
	if !removed {
		log.Info("stopping; the datapath stays pinned and keeps steering", "why", why)
		return joinClose(err, a)
	}
	log.Info("the agent is being removed from the node: uninstalling", "why", why)
	return errors.Join(err, uninstallAgent(a, log))
}

// enforce runs the agent until SIGTERM or SIGINT (stopped) or an error that
// ends it. It serves the metrics, probes and local API meanwhile, and stops
// serving before it returns, so that the datapath may be closed or removed.
func enforce(log *slog.Logger, a *agent.Agent, restCfg *rest.Config, settings agent.Settings, o kubeOptions) (stopped bool, err error) {
	s, done, err := serve(log, a, o.metricsAddr, restCfg)
	defer done()
	if err != nil {
		return false, err
	}
	if err := a.WriteStatus(s.status); err != nil {
		log.Error("writing status", "err", err)
	}
	err = kube.Run(s.ctx, restCfg, kube.Options{Node: o.node, Settings: settings, Agent: a, Metrics: s.metrics, Log: log, Status: s.status})
	return s.ctx.Err() != nil, err
}

func joinClose(err error, a *agent.Agent) error {
	if cerr := a.Close(); err == nil {
		err = cerr
	}
	return err
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "in-cluster" {
		return rest.InClusterConfig()
	}
	return clientcmd.BuildConfigFromFlags("", kubeconfig)
}

// reportFailedStart writes the node checks of an agent that cannot start to
// its node's state, for kubectl mptcp preflight, as far as the API can be
// reached within removalTimeout.
func reportFailedStart(log *slog.Logger, o kubeOptions, settings agent.Settings, startErr error) {
	restCfg, err := restConfig(o.kubeconfig)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), removalTimeout)
		defer cancel()
		err = kube.ReportFailedStart(ctx, restCfg, o.node, agent.CheckNode(settings), startErr)
	}
	if err != nil {
		log.Error("reporting the failed start to the node's state", "err", err)
	}
}
