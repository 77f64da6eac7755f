package controlplane

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/mptcp-operator/mptcp-operator/hack/testbed"
)

// ErrNoKubeMode says the agent binary cannot read its node's state from the
// API server: it lacks the -kubeconfig and -node flags.
var ErrNoKubeMode = errors.New("the agent binary has no kube mode (-kubeconfig FILE -node NAME): build it from a branch where cmd/agent reads its MPTCPNodeState from the API server (issue 5)")

// AgentKubeMode checks that bin has the flags of the agent's kube mode.
func AgentKubeMode(bin string) error {
	// -h prints the flags and exits 0 or 2 depending on the flag package's
	// mood; only the text matters.
	out, _ := exec.Command(bin, "-h").CombinedOutput()
	if !strings.Contains(string(out), "-kubeconfig") || !strings.Contains(string(out), "-node") {
		return ErrNoKubeMode
	}
	return nil
}

// Agent is an agent process in a node namespace, talking to the API server.
type Agent struct {
	Node *testbed.Node
	// Name is the Node name the agent runs for.
	Name string
	Proc *testbed.Process
}

// StartAgents starts bin in every bed node's namespace as
// `bin -kubeconfig FILE -node NAME -metrics-addr 127.0.0.1:0 [extra(node)...]`,
// each with a relay to the API server in its namespace. nodeName gives the
// Node name of a bed node (the kubelet stand-in's); extra (may be nil) adds
// per-node flags, e.g. where the agent pins. An agent that exits
// within its first second is an error, with its stderr.
func (cp *ControlPlane) StartAgents(ctx context.Context, bed *testbed.Bed, bin string, nodeName func(*testbed.Node) string, extra func(*testbed.Node) []string) ([]*Agent, error) {
	if err := AgentKubeMode(bin); err != nil {
		return nil, err
	}
	var agents []*Agent
	for _, n := range bed.Nodes {
		if _, err := cp.RelayInto(n.NetNS); err != nil {
			return agents, err
		}
		args := []string{bin, "-kubeconfig", cp.Kubeconfig, "-node", nodeName(n), "-metrics-addr", "127.0.0.1:0"}
		if extra != nil {
			args = append(args, extra(n)...)
		}
		p, err := bed.Start(n.NetNS, args...)
		if err != nil {
			return agents, err
		}
		agents = append(agents, &Agent{Node: n, Name: nodeName(n), Proc: p})
	}
	for _, a := range agents {
		select {
		case <-a.Proc.Done():
			return agents, fmt.Errorf("agent on %s exited at start; stderr:\n%s", a.Name, a.Proc.ErrOutput())
		case <-time.After(time.Second):
		case <-ctx.Done():
			return agents, ctx.Err()
		}
	}
	return agents, nil
}

// StopAgents ends the agents with SIGTERM (their datapath stays pinned until
// the bed is torn down).
func StopAgents(agents []*Agent) error {
	var errs []error
	for _, a := range agents {
		errs = append(errs, a.Proc.Stop(5*time.Second))
	}
	return errors.Join(errs...)
}
