package controller_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/kube"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

// An agent that cannot start writes, with its own node's token and the
// chart's RBAC and admission policies, its checks and why to its node's
// state, for kubectl mptcp preflight: NodeSupported False with the failed
// check's reason; the conditions it does not own stay.
func TestAnAgentThatCannotStartReportsItsChecks(t *testing.T) {
	env := testenv.Start(t, testenv.ServiceAccountTokens())
	ctx := context.Background()
	env.Namespace(t, agentNamespace, nil)
	applyDir(t, env.Client, filepath.Join(testenv.RepoRoot(), "config", "agent"))
	if err := env.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}); err != nil {
		t.Fatal(err)
	}
	state := &mptcpv1alpha1.MPTCPNodeState{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	if err := env.Client.Create(ctx, state); err != nil {
		t.Fatal(err)
	}
	state.Status.Conditions = []metav1.Condition{{Type: kube.ConditionReady, Status: metav1.ConditionTrue, Reason: kube.ReasonApplied,
		Message: "a previous agent's", LastTransitionTime: metav1.Now()}}
	if err := env.Client.Status().Update(ctx, state); err != nil {
		t.Fatal(err)
	}
	token := env.PodToken(t, createAgentPod(t, env, "n1"))
	checks := []mptcpv1alpha1.NodeCheck{
		{Name: "Kernel", Result: mptcpv1alpha1.CheckPassed, Message: "Linux 6.18, with MPTCP"},
		{Name: "BTF", Result: mptcpv1alpha1.CheckFailed, Reason: "NoBTF", Message: "no /sys/kernel/btf/vmlinux"},
	}
	if err := kube.ReportFailedStart(ctx, env.AsToken(token), "n1", checks, errors.New("loading the datapath: no BTF")); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx, types.NamespacedName{Name: "n1"}, state); err != nil {
		t.Fatal(err)
	}
	if len(state.Status.Checks) != 2 || state.Status.Checks[1] != checks[1] {
		t.Errorf("checks %+v, want the agent's", state.Status.Checks)
	}
	s := meta.FindStatusCondition(state.Status.Conditions, kube.ConditionNodeSupported)
	if s == nil || s.Status != metav1.ConditionFalse || s.Reason != "NoBTF" || !strings.Contains(s.Message, "the agent cannot start: loading the datapath: no BTF") {
		t.Errorf("NodeSupported %+v, want False NoBTF saying the agent cannot start", s)
	}
	if !meta.IsStatusConditionTrue(state.Status.Conditions, kube.ConditionReady) {
		t.Errorf("Ready %+v, want the previous agent's left as it was", state.Status.Conditions)
	}
	// No node state yet (no path selects the node): nothing to write, no error.
	if err := kube.ReportFailedStart(ctx, env.AsToken(token), "n2", checks, errors.New("x")); err != nil {
		t.Errorf("a node without state: %v", err)
	}
}
