package policystatus

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
)

// A policy that says transparent kernel is Degraded, Unsupported, on the
// nodes whose agent reports the kernel refuses the socket program and
// that run its pods; the same nodes do not make a policy without it
// degraded, nor does a refusing node without the policy's pods.
func TestKernelTransparentRefusedByANodeDegradesItsPolicy(t *testing.T) {
	refused := metav1.Condition{Type: mptcpv1alpha1.ConditionTransparentKernel, Status: metav1.ConditionFalse,
		Reason: mptcpv1alpha1.ReasonUnsupported, Message: "this kernel refuses tracing programs"}
	state := func(name, policy string, conds ...metav1.Condition) mptcpv1alpha1.MPTCPNodeState {
		s := mptcpv1alpha1.MPTCPNodeState{ObjectMeta: metav1.ObjectMeta{Name: name}}
		s.Spec.Rules = []mptcpv1alpha1.CompiledRule{{Name: policy, Policy: policy}}
		s.Spec.Pods = []mptcpv1alpha1.NodePod{{Namespace: "apps", Name: "web-" + name, Rules: mptcpv1alpha1.RuleNames{policy},
			Transparent: mptcpv1alpha1.PodTransparencyKernel}}
		s.Status.Conditions = conds
		return s
	}
	states := []mptcpv1alpha1.MPTCPNodeState{
		state("node-a", "kernel", refused),
		state("node-b", "kernel"),
		state("node-c", "other", refused),
	}
	for _, c := range []struct {
		name     string
		mode     mptcpv1alpha1.TransparentMPTCP
		degraded bool
	}{
		{"kernel", mptcpv1alpha1.TransparentKernel, true},
		{"other", mptcpv1alpha1.TransparentInject, false},
	} {
		pol := &mptcpv1alpha1.MPTCPPolicy{ObjectMeta: metav1.ObjectMeta{Name: c.name, Generation: 1}}
		pol.Spec.PodMPTCP.Transparent = c.mode
		st := Aggregate(pol, states)
		d := meta.FindStatusCondition(st.Conditions, mptcpv1alpha1.ConditionDegraded)
		if got := d.Status == metav1.ConditionTrue; got != c.degraded {
			t.Errorf("policy %s: Degraded %s (%s: %s), want degraded %v", c.name, d.Status, d.Reason, d.Message, c.degraded)
			continue
		}
		if c.degraded && (d.Reason != mptcpv1alpha1.ReasonUnsupported || !strings.Contains(d.Message, "nodes node-a (") ||
			strings.Contains(d.Message, refused.Message)) {
			t.Errorf("policy %s: Degraded %s: %q, want Unsupported naming node-a alone, without the node's own words", c.name, d.Reason, d.Message)
		}
	}
}
