package framework

import (
	"path/filepath"
	"strings"

	"github.com/mptcp-operator/mptcp-operator/internal/agent"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/observe"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
)

// ChartAgent is the agent that the Helm chart's DaemonSet runs on a real node
// of the bed (test/testbed/nodes), as the machine sees it: its pins under
// the node's bpffs (the bed's PinDir of the node, which the node sees at
// /sys/fs/bpf), its state under the node's /run/mptcp-operator (stateRoot
// on the machine), its metrics on the node's loopback at the agent's
// default port, which the chart keeps. The readers (Subflows, Endpoints,
// Scrape, Leftovers, ...) work on it; the process is the kubelet's to run,
// so Start, Stop and Kill do not.
func ChartAgent(b *testbed.Bed, node *testbed.Node, stateRoot string) *Agent {
	name := NodeName(node)
	pinRoot := strings.TrimPrefix(agent.DefaultPinRoot, "/sys/fs/bpf/")
	return &Agent{
		Node: node,
		bed:  b,
		Config: &NodeConfig{Settings: agent.Settings{
			Node:     name,
			PinDir:   filepath.Join(b.PinDir(node), pinRoot, name),
			StateDir: filepath.Join(stateRoot, name),
		}},
		MetricsAddr: "127.0.0.1" + observe.DefaultMetricsAddr,
	}
}
