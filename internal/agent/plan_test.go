package agent

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
)

// A path's capacity bounds each class of the shaping on its NIC: the rule's
// per-path cap and every pod's cap, though both ask for more, are at most
// the capacity. (That the classes together stay within it is the shaping
// package's: TestShapingStaysWithinThePathsCapacity.)
func TestShapingPlanBoundsEveryClassByThePathsCapacity(t *testing.T) {
	paths := twoPaths()[:1]
	paths[0].Capacity = resource.MustParse("20M")
	perPod, perPath := resource.MustParse("150M"), resource.MustParse("100M")
	shaped := spread(1)
	shaped.Paths = shaped.Paths[:1]
	shaped.RateLimits = &mptcpv1alpha1.CompiledRateLimits{Mode: mptcpv1alpha1.RateModeShape, PerPod: &perPod,
		PerPath: []mptcpv1alpha1.CompiledPathRate{{Path: "fabric-a", Rate: perPath}}}
	tr := FromNodeState(NodeDefaults("n1"), nodeState(paths, podWith("web", "10.244.1.10", shaped)), testLinks, locateAll, Prior{})
	if len(tr.Errors) != 0 {
		t.Fatal(tr.Errors)
	}
	nics := planShaping(tr.Plan, map[string]uint32{nameOf(shaped): 3})
	if len(nics) != 1 || nics[0].Interface != "nic1" || nics[0].Capacity != 20_000_000 || len(nics[0].Classes) != 2 {
		t.Fatalf("plan %+v, want nic1 at 20 Mbit/s with a class for the rule's path cap and one for the pod", nics)
	}
	for _, c := range nics[0].Classes {
		if c.Bps != 20_000_000 {
			t.Errorf("class %#x at %d bit/s, want the path's 20 Mbit/s capacity", c.Minor, c.Bps)
		}
	}
}
