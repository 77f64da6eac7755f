package kube

import (
	"fmt"
	"testing"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
)

// TestOneTenantsSkippedPodsDoNotHideTheOthers: a tenant whose namespace
// sorts first has 40 skipped pods, two other tenants one each. status.pods
// lists 4 of the first tenant's and both others' (the controller's events
// are made from it), and skippedPods counts all 42.
func TestOneTenantsSkippedPodsDoNotHideTheOthers(t *testing.T) {
	var problems []mptcpv1alpha1.PodProblem
	for i := range 40 {
		problems = append(problems, mptcpv1alpha1.PodProblem{Namespace: "aaa-noisy", Name: fmt.Sprintf("bad-%02d", i), Reason: mptcpv1alpha1.PodRuleUnusable})
	}
	problems = append(problems,
		mptcpv1alpha1.PodProblem{Namespace: "tenant-b", Name: "web", Reason: mptcpv1alpha1.PodRuleTableFull},
		mptcpv1alpha1.PodProblem{Namespace: "tenant-c", Name: "api", Reason: mptcpv1alpha1.PodNotFound})
	listed, n := capPodProblems(problems)
	if n != 42 {
		t.Errorf("skippedPods %d, want 42", n)
	}
	per := map[string]int{}
	for _, p := range listed {
		per[p.Namespace]++
	}
	if per["aaa-noisy"] != mptcpv1alpha1.MaxPodProblemsPerNamespace || per["tenant-b"] != 1 || per["tenant-c"] != 1 || len(listed) != 6 {
		t.Errorf("listed per namespace %v (%d entries), want 4 of aaa-noisy and tenant-b's and tenant-c's", per, len(listed))
	}
	// And never more than the schema's bound, whatever the namespaces.
	problems = nil
	for i := range 100 {
		problems = append(problems, mptcpv1alpha1.PodProblem{Namespace: fmt.Sprintf("ns-%03d", i), Name: "p"})
	}
	if listed, _ := capPodProblems(problems); len(listed) != mptcpv1alpha1.MaxPodProblems {
		t.Errorf("%d listed, want %d", len(listed), mptcpv1alpha1.MaxPodProblems)
	}
}
