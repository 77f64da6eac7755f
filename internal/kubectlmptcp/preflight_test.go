package kubectlmptcp

import (
	"bytes"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
)

func reasons(checks []PreflightCheck) map[string]string {
	out := map[string]string{}
	for _, c := range checks {
		out[c.Name] = string(c.Result) + "/" + c.Reason
	}
	return out
}

// A node's checks: the agent's as it reported them, the pod CIDRs from the
// Node itself (not the agent's copy), and its paths' links and peers; a
// node without state or without an agent's report fails the Agent check.
func TestPreflightOfANodeReadsTheAgentTheNodeAndThePaths(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	state := &mptcpv1alpha1.MPTCPNodeState{Status: mptcpv1alpha1.MPTCPNodeStateStatus{
		Checks: []mptcpv1alpha1.NodeCheck{
			{Name: "Kernel", Result: mptcpv1alpha1.CheckPassed, Message: "Linux 6.18"},
			{Name: "Marks", Result: mptcpv1alpha1.CheckFailed, Reason: "MarkClash", Message: "calico uses 0xffff0000"},
			{Name: "PodCIDRs", Result: mptcpv1alpha1.CheckPassed, Message: "stale"},
		},
		Paths: []mptcpv1alpha1.PathState{
			{Name: "fabric-a", Interface: "nic1", Link: mptcpv1alpha1.LinkUp, Liveness: mptcpv1alpha1.LivenessAlive},
			{Name: "fabric-b", Interface: "nic2", Link: mptcpv1alpha1.LinkDown, Liveness: mptcpv1alpha1.LivenessFailing},
		},
	}}
	got := reasons(nodePreflight(node, state))
	want := map[string]string{"Agent": "Passed/", "Kernel": "Passed/", "Marks": "Failed/MarkClash", "PodCIDRs": "Failed/NoPodCIDRs",
		"Paths": "Failed/PathDown", "Peers": "Failed/PeersUnreachable"}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("check %s: %q, want %q (all: %v)", name, got[name], w, got)
		}
	}
	node.Spec.PodCIDRs = []string{"10.244.1.0/24"}
	if got := reasons(nodePreflight(node, nil)); got["Agent"] != "Failed/NoNodeState" || got["PodCIDRs"] != "Passed/" || len(got) != 2 {
		t.Errorf("a node without state: %v", got)
	}
	if got := reasons(nodePreflight(node, &mptcpv1alpha1.MPTCPNodeState{})); got["Agent"] != "Failed/NoAgentReport" {
		t.Errorf("a node state no agent reported to: %v", got)
	}
}

// The text has a row per check and ends with the entries of the failed
// checks to read; what nodes and agents wrote reaches the terminal
// without control characters.
func TestPreflightTextNamesTheFailedChecksEntries(t *testing.T) {
	p := &Preflight{Failed: 1, Nodes: []NodePreflight{{Name: "n1", Checks: []PreflightCheck{
		{NodeCheck: mptcpv1alpha1.NodeCheck{Name: "Kernel", Result: mptcpv1alpha1.CheckPassed, Message: "Linux 6.18"}},
		{NodeCheck: mptcpv1alpha1.NodeCheck{Name: "Marks", Result: mptcpv1alpha1.CheckFailed, Reason: "MarkClash", Message: "calico \x1b[2J uses 0xffff0000"},
			Help: "docs/troubleshooting.md#markclash"},
	}}}}
	var b bytes.Buffer
	if err := WritePreflight(&b, p); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"NODE", "n1", "Kernel", "Passed", "Marks", "Failed", "MarkClash", "1 check failed", "see docs/troubleshooting.md#markclash"} {
		if !strings.Contains(out, want) {
			t.Errorf("preflight text lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\x1b") {
		t.Errorf("preflight text carries control characters: %q", out)
	}
}
