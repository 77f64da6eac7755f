package compile

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// A pod on the host's network shares the node's namespace: steering it would
// steer the node, so no policy compiles it, whatever its labels; finished
// pods have no traffic left.
func TestHostNetworkAndFinishedPodsAreNeverCompiled(t *testing.T) {
	in := boundsInput(fast, pol("all", 0, nil, nil, "a"))
	host, done := in.Pods[0], in.Pods[0]
	host.Name, host.Spec.HostNetwork = "host", true
	done.Name, done.Status.Phase = "done", corev1.PodSucceeded
	in.Pods = append(in.Pods, host, done)
	res := Node(in)
	if len(res.Spec.Pods) != 1 || res.Spec.Pods[0].Name != "p" {
		t.Fatalf("compiled pods %+v, want only t1/p", res.Spec.Pods)
	}
}
