// Package podwebhook is the mutating admission webhook for pods: a pod
// being created gets the podMPTCP.transparent of the policy of highest
// precedence that selects it and sets it (internal/transparent does the
// change). It is registered with failurePolicy Ignore: a webhook that is
// down leaves pods as they were, never unadmitted, and the controller
// reports the pods that missed it.
package podwebhook

import (
	"context"
	"fmt"
	"maps"
	"slices"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/controller/compile"
	"github.com/mptcp-operator/mptcp-operator/internal/transparent"
)

// Path is where the webhook server serves the webhook.
const Path = "/mutate-v1-pod"

// MaxPodBytes is the largest pod, as sent for review, that the webhook
// reads; a larger one is admitted as it is. Pods are a few kilobytes.
const MaxPodBytes = 256 << 10

// Mutator answers admission reviews of pods. Make it with NewMutator.
type Mutator struct {
	client   client.Reader
	decoder  admission.Decoder
	injector transparent.Injector
}

// NewMutator answers reviews reading namespaces and policies through c
// (the manager's cache), and changes pods with injector.
func NewMutator(c client.Reader, decoder admission.Decoder, injector transparent.Injector) *Mutator {
	return &Mutator{client: c, decoder: decoder, injector: injector}
}

// Handle changes a pod being created, or admits it as it is with the
// reason. It never refuses a pod: whatever goes wrong admits it as it is,
// with a warning, as a webhook that is down would.
func (m *Mutator) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create {
		return admission.Allowed("only pods being created are changed")
	}
	if n := len(req.Object.Raw); n > MaxPodBytes {
		return unchanged(fmt.Sprintf("the pod is %d bytes, more than the %d the webhook reads", n, MaxPodBytes))
	}
	pod := &corev1.Pod{}
	if err := m.decoder.Decode(req, pod); err != nil {
		return unchanged(fmt.Sprintf("the pod could not be decoded: %v", err))
	}
	if pod.Namespace == "" {
		pod.Namespace = req.Namespace
	}
	mode, policy, why, err := m.modeFor(ctx, pod)
	if err != nil {
		return unchanged(err.Error())
	}
	if mode == "" {
		return admission.Allowed(why)
	}
	if mode == mptcpv1alpha1.TransparentKernel {
		return admission.Allowed(fmt.Sprintf("policy %s's transparent kernel is the node agent's socket program: the pod is not changed", policy))
	}
	ch := m.injector.Plan(pod, mode, policy)
	if ch.Skipped != "" {
		return unchanged(fmt.Sprintf("policy %s's transparent %s: %s", policy, mode, ch.Skipped))
	}
	resp := admission.Patched("", ch.Patch...)
	for _, name := range slices.Sorted(maps.Keys(ch.NotCovered)) {
		resp.Warnings = append(resp.Warnings, fmt.Sprintf("mptcp.io: policy %s's transparent %s left container %s as it is: %s", policy, mode, name, ch.NotCovered[name]))
	}
	return resp
}

// unchanged admits a pod as it is and says why to its creator.
func unchanged(why string) admission.Response {
	return admission.Allowed("").WithWarnings("mptcp.io: podMPTCP.transparent not applied: " + why)
}

// modeFor returns the transparent mode pod gets and the policy it comes
// from, or no mode and why.
func (m *Mutator) modeFor(ctx context.Context, pod *corev1.Pod) (mptcpv1alpha1.TransparentMPTCP, string, string, error) {
	switch {
	case pod.Spec.HostNetwork:
		return "", "", "host-network pods are never selected", nil
	case compile.RunsVM(pod):
		return "", "", "the pod runs a VM, whose programs the webhook cannot reach", nil
	}
	var ns corev1.Namespace
	if err := m.client.Get(ctx, client.ObjectKey{Name: pod.Namespace}, &ns); err != nil {
		return "", "", "", fmt.Errorf("reading namespace %s: %w", pod.Namespace, err)
	}
	var policies mptcpv1alpha1.MPTCPPolicyList
	if err := m.client.List(ctx, &policies); err != nil {
		return "", "", "", fmt.Errorf("listing MPTCPPolicies: %w", err)
	}
	if p := compile.TransparentPolicy(policies.Items, ns.Labels, pod); p != nil {
		return p.Spec.PodMPTCP.Transparent, p.Name, "", nil
	}
	return "", "", "no policy that selects the pod sets podMPTCP.transparent", nil
}
