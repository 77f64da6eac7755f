// Package podwebhook is the mutating admission webhook for pods: a pod
// being created gets the podMPTCP.transparent of the policy of highest
// precedence that selects it and sets it (internal/transparent does the
// change). It is registered with failurePolicy Ignore: a webhook that is
// down leaves pods as they were, never unadmitted, and the controller
// reports the pods that missed it.
package podwebhook

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
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

// AnnotationPolicy names, on a changed pod, the policy whose
// podMPTCP.transparent it got.
const AnnotationPolicy = "mptcp.io/transparent-policy"

// Mutator answers admission reviews of pods.
type Mutator struct {
	// Client reads namespaces and policies (the manager's cache).
	Client   client.Reader
	Decoder  admission.Decoder
	Injector transparent.Injector
}

// Handle changes a pod being created, or admits it as it is with the reason.
func (m *Mutator) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create {
		return admission.Allowed("only pods being created are changed")
	}
	pod := &corev1.Pod{}
	if err := m.Decoder.Decode(req, pod); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if pod.Namespace == "" {
		pod.Namespace = req.Namespace
	}
	mode, policy, why, err := m.modeFor(ctx, pod)
	if err != nil {
		// Admitted as it is, as a webhook that is down would; the
		// controller reports the pod as not covered.
		return admission.Allowed("").WithWarnings(fmt.Sprintf("mptcp.io: podMPTCP.transparent not applied: %v", err))
	}
	if mode == "" {
		return admission.Allowed(why)
	}
	changed := pod.DeepCopy()
	res := m.Injector.Apply(changed, mode)
	if !res.Changed {
		return admission.Allowed("already changed")
	}
	changed.Annotations[AnnotationPolicy] = policy
	raw, err := json.Marshal(changed)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	resp := admission.PatchResponseFromRaw(req.Object.Raw, raw)
	for _, name := range slices.Sorted(maps.Keys(res.NotCovered)) {
		resp.Warnings = append(resp.Warnings, fmt.Sprintf("mptcp.io: policy %s's transparent %s left container %s as it is: %s", policy, mode, name, res.NotCovered[name]))
	}
	return resp
}

// modeFor returns the transparent mode pod gets and the policy it comes
// from, or no mode and why.
func (m *Mutator) modeFor(ctx context.Context, pod *corev1.Pod) (mptcpv1alpha1.TransparentMPTCP, string, string, error) {
	switch {
	case pod.Spec.HostNetwork:
		return "", "", "host-network pods are never selected", nil
	case pod.Labels[compile.LabelVirtLauncher] == compile.LabelVirtLauncherValue:
		return "", "", "the pod runs a VM, whose programs the webhook cannot reach", nil
	}
	if v, ok := pod.Annotations[transparent.AnnotationMode]; ok {
		return "", "", fmt.Sprintf("the pod carries %s=%q already", transparent.AnnotationMode, v), nil
	}
	var ns corev1.Namespace
	if err := m.Client.Get(ctx, client.ObjectKey{Name: pod.Namespace}, &ns); err != nil {
		return "", "", "", fmt.Errorf("reading namespace %s: %w", pod.Namespace, err)
	}
	var policies mptcpv1alpha1.MPTCPPolicyList
	if err := m.Client.List(ctx, &policies); err != nil {
		return "", "", "", fmt.Errorf("listing MPTCPPolicies: %w", err)
	}
	for _, p := range compile.SelectingPolicies(policies.Items, ns.Labels, pod) {
		if p.Spec.PodMPTCP.Transparent != "" {
			return p.Spec.PodMPTCP.Transparent, p.Name, "", nil
		}
	}
	return "", "", "no policy that selects the pod sets podMPTCP.transparent", nil
}
