// Command kubectl-mptcp is the kubectl plugin of mptcp-operator (kubectl
// mptcp): the operator's state across the cluster, why a pod's connections
// have the subflows they have, and a pod's live subflows. It works through
// the API server alone, with the caller's kubeconfig and rights.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/mptcp-operator/mptcp-operator/internal/buildinfo"
	"github.com/mptcp-operator/mptcp-operator/internal/explain"
	"github.com/mptcp-operator/mptcp-operator/internal/kubectlmptcp"
)

const usage = `kubectl mptcp: the operator's state, and why a pod's connections have the subflows they have.

Usage:
  kubectl mptcp status                 paths per node (up or down, and why), node states, agents missing, policies
  kubectl mptcp explain POD [-n NS]    walk what decides POD's subflows and name each step that limits them
  kubectl mptcp subflows POD [-n NS]   POD's live connections and their subflows: path, role, bytes
  kubectl mptcp preflight              per node: kernel, BTF, bpffs, the CNI and its marks, pod CIDRs, paths and peers,
                                       as each node's agent and the API report them (exit 3 when a check failed)
  kubectl mptcp version                the plugin's build

Flags:
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// Exit codes: 0 done (explain: no cause found; preflight: no check
// failed), 1 error, 2 bad usage, 3 explain found a cause or a preflight
// check failed.
const (
	exitError      = 1
	exitUsage      = 2
	exitCauseFound = 3
)

// commandTimeout bounds a whole command, an agent's answer included
// (--request-timeout bounds each request to the API server).
const commandTimeout = time.Minute

func run(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("kubectl-mptcp", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	output := fs.StringP("output", "o", "text", "text or json")
	selector := fs.StringP("selector", "l", kubectlmptcp.DefaultPreflightSelector, "preflight: the nodes to check besides those with an MPTCPNodeState (the chart's agent.nodeSelector)")
	agentNS := fs.String("agent-namespace", "", "namespace of the agent pods (the release's); default: the one the ClusterRoleBinding mptcp-agent names")
	loading := clientcmd.NewDefaultClientConfigLoadingRules()
	fs.StringVar(&loading.ExplicitPath, "kubeconfig", "", "path to the kubeconfig file")
	overrides := &clientcmd.ConfigOverrides{}
	clientcmd.BindOverrideFlags(overrides, fs, clientcmd.RecommendedConfigOverrideFlags(""))
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return exitUsage
	}
	if *output != "text" && *output != "json" {
		fmt.Fprintf(stderr, "kubectl mptcp: -o %q: want text or json\n", *output)
		return exitUsage
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fs.Usage()
		return exitUsage
	}
	if rest[0] == "version" {
		fmt.Fprintln(stdout, buildinfo.String())
		return 0
	}

	kubeconfig := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(loading, overrides)
	config, err := kubeconfig.ClientConfig()
	if err != nil {
		fmt.Fprintf(stderr, "kubectl mptcp: %v\n", err)
		return exitError
	}
	namespace, _, err := kubeconfig.Namespace()
	if err != nil {
		fmt.Fprintf(stderr, "kubectl mptcp: %v\n", err)
		return exitError
	}
	cluster, err := kubectlmptcp.NewCluster(config)
	if err != nil {
		fmt.Fprintf(stderr, "kubectl mptcp: %v\n", err)
		return exitError
	}
	cluster.AgentNamespace = *agentNS
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, commandTimeout)
	defer cancel()

	write := func(v any, text func() error) int {
		var err error
		if *output == "json" {
			err = kubectlmptcp.WriteJSON(stdout, v)
		} else {
			err = text()
		}
		if err != nil {
			fmt.Fprintf(stderr, "kubectl mptcp: %v\n", err)
			return exitError
		}
		return 0
	}
	switch cmd := rest[0]; {
	case cmd == "status" && len(rest) == 1:
		s, err := cluster.Status(ctx)
		if err != nil {
			fmt.Fprintf(stderr, "kubectl mptcp status: %v\n", err)
			return exitError
		}
		return write(s, func() error { return kubectlmptcp.WriteStatus(stdout, s) })
	case cmd == "explain" && len(rest) == 2:
		f, err := cluster.Facts(ctx, namespace, rest[1])
		if err != nil {
			fmt.Fprintf(stderr, "kubectl mptcp explain: %v\n", err)
			return exitError
		}
		e := explain.Explain(f)
		if code := write(e, func() error { return kubectlmptcp.WriteExplanation(stdout, e) }); code != 0 {
			return code
		}
		if len(e.Causes) > 0 {
			return exitCauseFound
		}
		return 0
	case cmd == "subflows" && len(rest) == 2:
		s, err := cluster.Subflows(ctx, namespace, rest[1])
		if err != nil {
			fmt.Fprintf(stderr, "kubectl mptcp subflows: %v\n", err)
			return exitError
		}
		return write(s, func() error { return kubectlmptcp.WriteSubflows(stdout, s) })
	case cmd == "preflight" && len(rest) == 1:
		p, err := cluster.Preflight(ctx, *selector)
		if err != nil {
			fmt.Fprintf(stderr, "kubectl mptcp preflight: %v\n", err)
			return exitError
		}
		if code := write(p, func() error { return kubectlmptcp.WritePreflight(stdout, p) }); code != 0 {
			return code
		}
		if p.Failed > 0 {
			return exitCauseFound
		}
		return 0
	default:
		fs.Usage()
		return exitUsage
	}
}
