package kubectlmptcp

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
)

// Status is the operator's state in the cluster: paths, each node's state
// as its agent reports it, and policies.
type Status struct {
	Paths    []PathStatus   `json:"paths"`
	Nodes    []NodeStatus   `json:"nodes"`
	Policies []PolicyStatus `json:"policies"`
}

// PathStatus is one MPTCPPath.
type PathStatus struct {
	Name    string `json:"name"`
	Index   int32  `json:"index,omitempty"`
	Ready   string `json:"ready"`
	Message string `json:"message,omitempty"`
}

// NodeStatus is one node with an MPTCPNodeState.
type NodeStatus struct {
	Name string `json:"name"`
	// Agent says whether an agent reports for the node: "applied" (the
	// current generation), "behind" (an older one), "missing" (none ever
	// did) or "no pod" (the agent has reported, but no agent pod runs
	// there now).
	Agent    string          `json:"agent"`
	Ready    string          `json:"ready"`
	Degraded string          `json:"degraded"`
	Reason   string          `json:"reason,omitempty"`
	Message  string          `json:"message,omitempty"`
	Pods     int             `json:"pods"`
	Skipped  int32           `json:"skippedPods"`
	Paths    []NodePathState `json:"paths"`
}

// NodePathState is one path on one node.
type NodePathState struct {
	Name      string `json:"name"`
	Interface string `json:"interface,omitempty"`
	Link      string `json:"link"`
	Liveness  string `json:"liveness,omitempty"`
	Message   string `json:"message,omitempty"`
}

// Up says whether the path carries new subflows.
func (p NodePathState) Up() bool {
	return p.Link == string(mptcpv1alpha1.LinkUp) && p.Liveness != string(mptcpv1alpha1.LivenessFailing)
}

// PolicyStatus is one MPTCPPolicy.
type PolicyStatus struct {
	Name       string `json:"name"`
	Ready      string `json:"ready"`
	Degraded   string `json:"degraded"`
	Reason     string `json:"reason,omitempty"`
	Message    string `json:"message,omitempty"`
	Pods       int32  `json:"pods"`
	Nodes      int32  `json:"nodes"`
	NodesReady int32  `json:"nodesReady"`
}

// Status reads the operator's objects and the agent pods.
func (k *Cluster) Status(ctx context.Context) (*Status, error) {
	var paths mptcpv1alpha1.MPTCPPathList
	var states mptcpv1alpha1.MPTCPNodeStateList
	var policies mptcpv1alpha1.MPTCPPolicyList
	for _, l := range []client.ObjectList{&paths, &states, &policies} {
		if err := k.c.List(ctx, l); err != nil {
			return nil, err
		}
	}
	agentNodes, agentsErr := k.agentNodes(ctx)
	out := &Status{Paths: []PathStatus{}, Nodes: []NodeStatus{}, Policies: []PolicyStatus{}}
	for _, p := range paths.Items {
		ready, _, msg := condition(p.Status.Conditions, mptcpv1alpha1.ConditionReady)
		out.Paths = append(out.Paths, PathStatus{Name: p.Name, Index: p.Status.Index, Ready: ready, Message: msg})
	}
	for i := range states.Items {
		out.Nodes = append(out.Nodes, nodeStatus(&states.Items[i], agentNodes, agentsErr == nil))
	}
	for _, p := range policies.Items {
		ps := PolicyStatus{Name: p.Name, Pods: p.Status.MatchedPods, Nodes: p.Status.Nodes, NodesReady: p.Status.NodesReady}
		ps.Ready, _, _ = condition(p.Status.Conditions, mptcpv1alpha1.ConditionReady)
		var reason, msg string
		ps.Degraded, reason, msg = condition(p.Status.Conditions, mptcpv1alpha1.ConditionDegraded)
		if ps.Degraded == string(metav1.ConditionTrue) {
			ps.Reason, ps.Message = reason, msg
		} else if ps.Ready != string(metav1.ConditionTrue) {
			_, ps.Reason, ps.Message = condition(p.Status.Conditions, mptcpv1alpha1.ConditionReady)
		}
		out.Policies = append(out.Policies, ps)
	}
	slices.SortFunc(out.Nodes, func(a, b NodeStatus) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// nodeStatus is the row of one node state. agentNodes are the nodes that
// run an agent pod, when known.
func nodeStatus(s *mptcpv1alpha1.MPTCPNodeState, agentNodes map[string]bool, known bool) NodeStatus {
	n := NodeStatus{Name: s.Name, Pods: len(s.Spec.Pods), Skipped: s.Status.SkippedPods, Paths: []NodePathState{}}
	n.Ready, _, _ = condition(s.Status.Conditions, mptcpv1alpha1.ConditionReady)
	var reason, msg string
	n.Degraded, reason, msg = condition(s.Status.Conditions, mptcpv1alpha1.ConditionDegraded)
	switch {
	case n.Ready != string(metav1.ConditionTrue):
		_, n.Reason, n.Message = condition(s.Status.Conditions, mptcpv1alpha1.ConditionReady)
	case n.Degraded == string(metav1.ConditionTrue):
		n.Reason, n.Message = reason, msg
	}
	switch {
	case s.Status.ObservedGeneration == 0:
		n.Agent = "missing"
	case known && !agentNodes[s.Name]:
		n.Agent = "no pod"
	case s.Status.ObservedGeneration != s.Generation:
		n.Agent = "behind"
	default:
		n.Agent = "applied"
	}
	for _, p := range s.Status.Paths {
		n.Paths = append(n.Paths, NodePathState{Name: p.Name, Interface: p.Interface, Link: string(p.Link), Liveness: string(p.Liveness), Message: p.Message})
	}
	return n
}

// agentNodes are the nodes that run an agent pod.
func (k *Cluster) agentNodes(ctx context.Context) (map[string]bool, error) {
	pods, err := k.agentPods(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, p := range pods {
		out[p.Spec.NodeName] = true
	}
	return out, nil
}

// condition is the status, reason and message of condition t, "Unknown"
// when absent.
func condition(conds []metav1.Condition, t string) (status, reason, message string) {
	c := meta.FindStatusCondition(conds, t)
	if c == nil {
		return string(metav1.ConditionUnknown), "", ""
	}
	return string(c.Status), c.Reason, c.Message
}

// Subflows are one pod's connections and their subflows, as the agent of
// its node reports them.
func (k *Cluster) Subflows(ctx context.Context, namespace, name string) (*PodSubflows, error) {
	pod := &corev1.Pod{}
	if err := k.c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, pod); err != nil {
		return nil, err
	}
	if pod.Spec.NodeName == "" {
		return nil, fmt.Errorf("pod %s/%s is not bound to a node", namespace, name)
	}
	report, err := k.AgentReport(ctx, pod.Spec.NodeName, namespace, name)
	if err != nil {
		return nil, err
	}
	if !report.Configured {
		return nil, fmt.Errorf("the agent of node %s does not configure pod %s/%s (kubectl mptcp explain says why)", pod.Spec.NodeName, namespace, name)
	}
	return &PodSubflows{Namespace: namespace, Name: name, Node: pod.Spec.NodeName, Connections: report.Connections}, nil
}
