package kubectlmptcp

import (
	"bytes"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/explain"
)

// The text of an explanation names each step with its cause or ok, ends
// with the causes, and carries no control character of what others wrote
// (a pod's gate message, an event's note) to the reader's terminal.
func TestExplanationTextNamesTheCausesAndEscapesNothing(t *testing.T) {
	e := explain.Explanation{Namespace: "apps", Name: "web", Node: "n1",
		Steps: []explain.Step{
			{Name: "selection", Detail: "policy spread governs the pod"},
			{Name: "gate", Cause: explain.CauseGateNotReady, Detail: "NotConfigured: \x1b]52;c;evil\x07 bad \u202egnp.exe"},
		},
		Causes: []explain.Cause{explain.CauseGateNotReady},
	}
	var b bytes.Buffer
	if err := WriteExplanation(&b, e); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"Pod apps/web on node n1\n", "selection", "ok", "GateNotReady", "Causes: GateNotReady"} {
		if !strings.Contains(out, want) {
			t.Errorf("explanation text lacks %q:\n%s", want, out)
		}
	}
	if strings.ContainsAny(out, "\x1b\x07\u202e") {
		t.Errorf("explanation text carries control characters: %q", out)
	}
	b.Reset()
	if err := WriteExplanation(&b, explain.Explanation{Namespace: "apps", Name: "web"}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "No cause found.") {
		t.Errorf("an explanation without cause says %q", b.String())
	}
}

// Status prints a row per node with its agent and each path's state, and a
// row per policy and path.
func TestStatusTextHasARowPerObject(t *testing.T) {
	s := &Status{
		Nodes: []NodeStatus{{Name: "n1", Agent: "missing", Ready: "Unknown", Degraded: "Unknown",
			Paths: []NodePathState{{Name: "fabric-a", Interface: "nic1", Link: "Down", Liveness: "Unknown"}}}},
		Policies: []PolicyStatus{{Name: "spread", Ready: "False", Degraded: "True", Reason: "PathNotOnNode", Message: "fabric-b not on n1"}},
		Paths:    []PathStatus{{Name: "fabric-a", Index: 1, Ready: "True"}},
	}
	var b bytes.Buffer
	if err := WriteStatus(&b, s); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	has := func(fields ...string) bool {
		for _, l := range lines {
			f := strings.Fields(l)
			ok := len(f) >= len(fields)
			for i := 0; ok && i < len(fields); i++ {
				ok = f[i] == fields[i]
			}
			if ok {
				return true
			}
		}
		return false
	}
	for _, row := range [][]string{
		{"n1", "missing", "Unknown", "Unknown", "0", "0", "fabric-a(nic1)=Down/Unknown"},
		{"spread", "False", "True", "0", "0/0", "PathNotOnNode:"},
		{"fabric-a", "1", "True"},
	} {
		if !has(row...) {
			t.Errorf("status text has no row %v:\n%s", row, b.String())
		}
	}
}

// A node's agent column says whether an agent ever reported, runs there
// now, and applied the current generation; a node not ready gives the
// Ready condition's reason, a degraded one the Degraded's.
func TestNodeStatusSaysWhereAgentsAreMissing(t *testing.T) {
	state := func(gen, observed int64, conds ...metav1.Condition) *mptcpv1alpha1.MPTCPNodeState {
		return &mptcpv1alpha1.MPTCPNodeState{ObjectMeta: metav1.ObjectMeta{Name: "n1", Generation: gen},
			Status: mptcpv1alpha1.MPTCPNodeStateStatus{ObservedGeneration: observed, Conditions: conds}}
	}
	ready := metav1.Condition{Type: mptcpv1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Applied"}
	degraded := metav1.Condition{Type: mptcpv1alpha1.ConditionDegraded, Status: metav1.ConditionTrue, Reason: "InterfaceMissing", Message: "nic2"}
	running := map[string]bool{"n1": true}
	for _, tc := range []struct {
		name          string
		s             *mptcpv1alpha1.MPTCPNodeState
		agents        map[string]bool
		known         bool
		agent, reason string
	}{
		{"never reported", state(1, 0), nil, true, "missing", ""},
		{"reported, no pod now", state(2, 2, ready), nil, true, "no pod", ""},
		{"pods not readable", state(2, 2, ready), nil, false, "applied", ""},
		{"behind", state(3, 2, ready), running, true, "behind", ""},
		{"degraded", state(2, 2, ready, degraded), running, true, "applied", "InterfaceMissing"},
		{"not ready", state(2, 2, metav1.Condition{Type: mptcpv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: "NotYetApplied"}, degraded), running, true, "applied", "NotYetApplied"},
	} {
		n := nodeStatus(tc.s, tc.agents, tc.known)
		if n.Agent != tc.agent || n.Reason != tc.reason {
			t.Errorf("%s: agent %q reason %q, want %q and %q", tc.name, n.Agent, n.Reason, tc.agent, tc.reason)
		}
	}
}

// An agent's answer past its bound fails the stream instead of growing the
// plugin's memory.
func TestAgentAnswersAreBounded(t *testing.T) {
	b := &limitedBuffer{max: 8}
	if n, err := b.Write([]byte("12345678")); n != 8 || err != nil {
		t.Fatalf("a write within the bound: %d, %v", n, err)
	}
	if _, err := b.Write([]byte("9")); err == nil || b.Len() != 8 {
		t.Fatalf("a write past the bound: %v, %d bytes held", err, b.Len())
	}
}
