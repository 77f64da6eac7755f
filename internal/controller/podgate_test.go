package controller_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/kube"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

// TestAgentSetsThePodGateOnlyOnItsOwnNodesPods applies config/agent to a real
// API server and, with pod-bound service-account tokens of agents on n1 and
// n2 (no impersonation), patches the pod gate condition as the agent does: a
// strategic merge patch of pods/status. An agent may set mptcp.io/ready on
// the pods of its own node and nothing else of their status.
func TestAgentSetsThePodGateOnlyOnItsOwnNodesPods(t *testing.T) {
	env := testenv.Start(t, testenv.ServiceAccountTokens())
	ctx := context.Background()
	env.Namespace(t, agentNamespace, nil)
	env.Namespace(t, "apps", nil)
	applyDir(t, env.Client, testenv.RepoRoot()+"/config/agent")
	agents := map[string]client.Client{}
	for _, n := range []string{"n1", "n2"} {
		if err := env.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
		agents[n] = tokenClient(t, env, env.PodToken(t, createAgentPod(t, env, n)))
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "web-" + n},
			Spec: corev1.PodSpec{NodeName: n,
				InitContainers: []corev1.Container{{Name: "init", Image: "registry.invalid/init"}},
				Containers:     []corev1.Container{{Name: "web", Image: "registry.invalid/web"}}},
		}
		if err := env.Client.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.1.10", PodIPs: []corev1.PodIP{{IP: "10.244.1.10"}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}}
		if err := env.Client.Status().Update(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}

	gate := func(c client.Client, pod string, status corev1.ConditionStatus) error {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: pod}}
		body := fmt.Sprintf(`{"status":{"conditions":[{"type":%q,"status":%q,"reason":"Configured","lastTransitionTime":%q}]}}`,
			kube.PodReadyCondition, status, time.Now().UTC().Format(time.RFC3339))
		return c.Status().Patch(ctx, p, client.RawPatch(types.StrategicMergePatchType, []byte(body)))
	}
	condition := func(pod string, typ corev1.PodConditionType) corev1.ConditionStatus {
		var p corev1.Pod
		if err := env.Client.Get(ctx, types.NamespacedName{Namespace: "apps", Name: pod}, &p); err != nil {
			t.Fatal(err)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == typ {
				return c.Status
			}
		}
		return ""
	}

	// The policy takes effect a moment after it is created.
	deadline := time.Now().Add(20 * time.Second)
	for gate(agents["n1"], "web-n2", corev1.ConditionTrue) == nil {
		if time.Now().After(deadline) {
			t.Fatal("the admission policy never denied the gate of another node's pod")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// That early write may have gone through: reset what it set.
	if err := gate(agents["n2"], "web-n2", corev1.ConditionFalse); err != nil {
		t.Fatal(err)
	}

	refused := func(err error, want string) {
		t.Helper()
		if err == nil {
			t.Fatal("allowed")
		}
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
			t.Fatalf("want Forbidden saying %q, got %v", want, err)
		}
	}

	t.Run("own node's pod", func(t *testing.T) {
		if err := gate(agents["n1"], "web-n1", corev1.ConditionTrue); err != nil {
			t.Fatal(err)
		}
		if got := condition("web-n1", kube.PodReadyCondition); got != corev1.ConditionTrue {
			t.Fatalf("gate is %q after the patch", got)
		}
		// The kubelet's conditions stay as they were: conditions merge by type.
		if got := condition("web-n1", corev1.PodReady); got != corev1.ConditionTrue {
			t.Fatalf("Ready became %q", got)
		}
		if err := gate(agents["n1"], "web-n1", corev1.ConditionFalse); err != nil {
			t.Fatal(err)
		}
		if got := condition("web-n1", kube.PodReadyCondition); got != corev1.ConditionFalse {
			t.Fatalf("gate is %q after clearing it", got)
		}
	})
	t.Run("another node's pod", func(t *testing.T) {
		refused(gate(agents["n1"], "web-n2", corev1.ConditionTrue), "only on pods of its own node, not on apps/web-n2")
		refused(gate(agents["n2"], "web-n1", corev1.ConditionTrue), "only on pods of its own node, not on apps/web-n1")
		if got := condition("web-n2", kube.PodReadyCondition); got != corev1.ConditionFalse {
			t.Fatalf("gate of web-n2 is %q", got)
		}
	})
	t.Run("other status fields of its own pod", func(t *testing.T) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "web-n1"}}
		// Each is a change the API server's own validation accepts (an
		// admin makes it below), so a refusal is the policy's.
		for name, body := range map[string]string{
			"phase":                        `{"status":{"phase":"Failed"}}`,
			"Ready condition":              `{"status":{"conditions":[{"type":"Ready","status":"False"}]}}`,
			"host IPs":                     `{"status":{"hostIPs":[{"ip":"10.9.9.9"}],"hostIP":"10.9.9.9"}}`,
			"init container statuses":      `{"status":{"initContainerStatuses":[{"name":"init","image":"registry.invalid/init","imageID":"","ready":true,"restartCount":3,"state":{"running":{}}}]}}`,
			"container statuses":           `{"status":{"containerStatuses":[{"name":"web","image":"registry.invalid/web","imageID":"","ready":true,"restartCount":0,"state":{"running":{}}}]}}`,
			"message":                      `{"status":{"message":"evicted"}}`,
			"reason":                       `{"status":{"reason":"Evicted"}}`,
			"start time":                   `{"status":{"startTime":"2020-01-01T00:00:00Z"}}`,
			"a field removed":              `{"status":{"podIPs":null,"podIP":null}}`,
			"the gate and another at once": `{"status":{"reason":"Evicted","conditions":[{"type":"mptcp.io/ready","status":"True"}]}}`,
		} {
			err := agents["n1"].Status().Patch(ctx, p, client.RawPatch(types.StrategicMergePatchType, []byte(body)))
			if err == nil {
				t.Errorf("%s: allowed", name)
				continue
			}
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "only the condition mptcp.io/ready") {
				t.Errorf("%s: want Forbidden, got %v", name, err)
			}
		}
		// The same changes from an admin pass validation: the refusals
		// above are the policy's, not the API server's.
		probe := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "web-n2"}}
		for _, body := range []string{
			`{"status":{"initContainerStatuses":[{"name":"init","image":"registry.invalid/init","imageID":"","ready":true,"restartCount":3,"state":{"running":{}}}]}}`,
			`{"status":{"message":"evicted","reason":"Evicted","startTime":"2020-01-01T00:00:00Z"}}`,
		} {
			if err := env.Client.Status().Patch(ctx, probe, client.RawPatch(types.StrategicMergePatchType, []byte(body))); err != nil {
				t.Errorf("an admin's %s: %v", body, err)
			}
		}
	})
	t.Run("labels, annotations and finalizers through pods/status", func(t *testing.T) {
		// pods/status writes metadata too; a pod's labels choose its
		// policies and its annotation its path preferences.
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "web-n1"}}
		for name, body := range map[string]string{
			"labels":      `{"metadata":{"labels":{"app":"db"}}}`,
			"annotations": `{"metadata":{"annotations":{"mptcp.io/preferred-paths":"fabric-b"}}}`,
			"finalizers":  `{"metadata":{"finalizers":["example.com/hold"]}}`,
		} {
			err := agents["n1"].Status().Patch(ctx, p, client.RawPatch(types.MergePatchType, []byte(body)))
			if err == nil {
				t.Errorf("%s: allowed", name)
				continue
			}
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "may not change a pod's labels, annotations or finalizers") {
				t.Errorf("%s: want Forbidden, got %v", name, err)
			}
		}
		var stored corev1.Pod
		if err := env.Client.Get(ctx, types.NamespacedName{Namespace: "apps", Name: "web-n1"}, &stored); err != nil {
			t.Fatal(err)
		}
		if len(stored.Labels) != 0 || len(stored.Annotations) != 0 || len(stored.Finalizers) != 0 {
			t.Fatalf("metadata changed: labels %v annotations %v finalizers %v", stored.Labels, stored.Annotations, stored.Finalizers)
		}
	})
	t.Run("pod spec", func(t *testing.T) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "web-n1"}}
		err := agents["n1"].Patch(ctx, p, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`)))
		refused(err, `cannot patch resource "pods"`)
	})
	t.Run("node state status still its own only", func(t *testing.T) {
		// The new policy leaves the node-state one whole.
		for _, n := range []string{"n1", "n2"} {
			if err := env.Client.Create(ctx, &mptcpv1alpha1.MPTCPNodeState{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
				t.Fatal(err)
			}
		}
		s := &mptcpv1alpha1.MPTCPNodeState{ObjectMeta: metav1.ObjectMeta{Name: "n2"}}
		err := agents["n1"].Status().Patch(ctx, s, client.RawPatch(types.MergePatchType, []byte(`{"status":{"errors":["x"]}}`)))
		refused(err, "only the MPTCPNodeState of its own node")
	})
}
