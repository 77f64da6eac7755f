package kubectlmptcp

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/nodecheck"
)

// DefaultPreflightSelector selects the nodes the chart's agents run on by
// default (agent.nodeSelector).
const DefaultPreflightSelector = "mptcp.io/multipath=true"

// TroubleshootingDoc is where each failed check's entry is, by reason.
const TroubleshootingDoc = "docs/troubleshooting.md"

// Checks kubectl mptcp preflight adds to the agents' own.
const (
	checkAgent = "Agent"
	checkPaths = "Paths"
	checkPeers = "Peers"
)

// Reasons of the checks preflight makes itself.
const (
	ReasonNoNodeState      = "NoNodeState"
	ReasonNoAgentReport    = "NoAgentReport"
	ReasonPathDown         = "PathDown"
	ReasonPeersUnreachable = "PeersUnreachable"
)

// Preflight is every checked node's checks.
type Preflight struct {
	Nodes []NodePreflight `json:"nodes"`
	// Failed counts the failed checks of all nodes.
	Failed int `json:"failed"`
}

// NodePreflight is one node's checks: the agent's (status.checks of its
// MPTCPNodeState), the Node's pod CIDRs, and its paths' links and peers.
type NodePreflight struct {
	Name   string           `json:"name"`
	Checks []PreflightCheck `json:"checks"`
}

// PreflightCheck is one check, with the troubleshooting entry of a failed
// or warning one.
type PreflightCheck struct {
	mptcpv1alpha1.NodeCheck
	Help string `json:"help,omitempty"`
}

// Preflight checks the nodes selector selects and every node with an
// MPTCPNodeState.
func (k *Cluster) Preflight(ctx context.Context, selector string) (*Preflight, error) {
	sel, err := labels.Parse(selector)
	if err != nil {
		return nil, fmt.Errorf("selector %q: %w", selector, err)
	}
	var nodes corev1.NodeList
	if err := k.c.List(ctx, &nodes); err != nil {
		return nil, err
	}
	var states mptcpv1alpha1.MPTCPNodeStateList
	if err := k.c.List(ctx, &states); err != nil {
		return nil, err
	}
	stateOf := map[string]*mptcpv1alpha1.MPTCPNodeState{}
	for i := range states.Items {
		stateOf[states.Items[i].Name] = &states.Items[i]
	}
	out := &Preflight{Nodes: []NodePreflight{}}
	for i := range nodes.Items {
		n := &nodes.Items[i]
		state := stateOf[n.Name]
		if state == nil && !sel.Matches(labels.Set(n.Labels)) {
			continue
		}
		np := NodePreflight{Name: n.Name, Checks: nodePreflight(n, state)}
		for _, c := range np.Checks {
			if c.Result == mptcpv1alpha1.CheckFailed {
				out.Failed++
			}
		}
		out.Nodes = append(out.Nodes, np)
	}
	slices.SortFunc(out.Nodes, func(a, b NodePreflight) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// nodePreflight is the checks of node, whose state may be nil.
func nodePreflight(node *corev1.Node, state *mptcpv1alpha1.MPTCPNodeState) []PreflightCheck {
	var checks []mptcpv1alpha1.NodeCheck
	switch {
	case state == nil:
		checks = append(checks, mptcpv1alpha1.NodeCheck{Name: checkAgent, Result: mptcpv1alpha1.CheckFailed, Reason: ReasonNoNodeState,
			Message: "the node has no MPTCPNodeState: no MPTCPPath selects it, or the controller is not running"})
	case len(state.Status.Checks) == 0:
		checks = append(checks, mptcpv1alpha1.NodeCheck{Name: checkAgent, Result: mptcpv1alpha1.CheckFailed, Reason: ReasonNoAgentReport,
			Message: "no agent has reported its checks of the node: its pod is not running there (kubectl mptcp status), or is of a release that makes none"})
	default:
		checks = append(checks, mptcpv1alpha1.NodeCheck{Name: checkAgent, Result: mptcpv1alpha1.CheckPassed, Message: "the agent reports its checks"})
		for _, c := range state.Status.Checks {
			// The pod CIDRs are read from the Node below: current,
			// and there before any agent.
			if c.Name != nodecheck.PodCIDRs {
				checks = append(checks, c)
			}
		}
	}
	cidrs := node.Spec.PodCIDRs
	if len(cidrs) == 0 && node.Spec.PodCIDR != "" {
		cidrs = []string{node.Spec.PodCIDR}
	}
	checks = append(checks, nodecheck.NodePodCIDRs(cidrs))
	if state != nil && len(state.Status.Paths) > 0 {
		checks = append(checks, pathChecks(state.Status.Paths)...)
	}
	out := make([]PreflightCheck, 0, len(checks))
	for _, c := range checks {
		pc := PreflightCheck{NodeCheck: c}
		if c.Reason != "" {
			pc.Help = TroubleshootingDoc + "#" + strings.ToLower(c.Reason)
		}
		out = append(out, pc)
	}
	return out
}

// pathChecks are the links of the node's paths and what liveness says of
// their peers.
func pathChecks(paths []mptcpv1alpha1.PathState) []mptcpv1alpha1.NodeCheck {
	links := mptcpv1alpha1.NodeCheck{Name: checkPaths, Result: mptcpv1alpha1.CheckPassed}
	peers := mptcpv1alpha1.NodeCheck{Name: checkPeers, Result: mptcpv1alpha1.CheckPassed}
	var up, down, reached, unreached, unprobed []string
	for _, p := range paths {
		switch p.Link {
		case mptcpv1alpha1.LinkUp:
			up = append(up, fmt.Sprintf("%s on %s", p.Name, p.Interface))
		case mptcpv1alpha1.LinkNotFound, mptcpv1alpha1.LinkAmbiguous:
			down = append(down, fmt.Sprintf("%s: interface %s", p.Name, p.Link))
			links.Result, links.Reason = mptcpv1alpha1.CheckFailed, mptcpv1alpha1.ReasonInterfaceMissing
		default:
			down = append(down, fmt.Sprintf("%s on %s: link %s", p.Name, p.Interface, p.Link))
			if links.Reason == "" {
				links.Result, links.Reason = mptcpv1alpha1.CheckFailed, ReasonPathDown
			}
		}
		switch p.Liveness {
		case mptcpv1alpha1.LivenessAlive:
			reached = append(reached, p.Name)
		case mptcpv1alpha1.LivenessFailing:
			unreached = append(unreached, p.Name)
		default:
			unprobed = append(unprobed, p.Name)
		}
	}
	links.Message = strings.Join(append(down, up...), "; ")
	if len(down) == 0 {
		links.Message = "up: " + links.Message
	}
	var msg []string
	if len(unreached) > 0 {
		peers.Result, peers.Reason = mptcpv1alpha1.CheckFailed, ReasonPeersUnreachable
		msg = append(msg, "no peer answers over "+strings.Join(unreached, ", "))
	}
	if len(reached) > 0 {
		msg = append(msg, "peers answer over "+strings.Join(reached, ", "))
	}
	if len(unprobed) > 0 {
		msg = append(msg, "not probed over "+strings.Join(unprobed, ", ")+" (probes start once the node has pods under a policy, and need liveness on)")
	}
	peers.Message = strings.Join(msg, "; ")
	return []mptcpv1alpha1.NodeCheck{links, peers}
}

// WritePreflight prints p as a table, then the entries to read.
func WritePreflight(w io.Writer, p *Preflight) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tCHECK\tRESULT\tREASON\tMESSAGE")
	var help []string
	for _, n := range p.Nodes {
		for _, c := range n.Checks {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", printable(n.Name), printable(c.Name), printable(string(c.Result)), printable(c.Reason), oneLine(c.Message))
			if c.Help != "" && !slices.Contains(help, c.Help) {
				help = append(help, c.Help)
			}
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	switch {
	case len(p.Nodes) == 0:
		fmt.Fprintln(w, "no node to check: none is selected and none has an MPTCPNodeState")
	case p.Failed == 0:
		fmt.Fprintf(w, "%d nodes: no check failed\n", len(p.Nodes))
	case p.Failed == 1:
		fmt.Fprintln(w, "1 check failed")
	default:
		fmt.Fprintf(w, "%d checks failed\n", p.Failed)
	}
	for _, h := range help {
		fmt.Fprintln(w, "see "+h)
	}
	return nil
}
