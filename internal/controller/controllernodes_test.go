package controller_test

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// TestControllerCannotChangeNodes acts with a token bound to a controller
// pod (no impersonation) under the controller's generated ClusterRole on a
// real API server: the controller reads Nodes and writes none (earlier
// releases published the annotation mptcp.io/paths, which no component
// read), so RBAC refuses every change to a Node, annotations included, and
// no admission policy is needed to narrow a patch permission. The real
// controller, run with the same token, still compiles the Node's state.
func TestControllerCannotChangeNodes(t *testing.T) {
	env := testenv.Start(t, testenv.ServiceAccountTokens())
	ctx := context.Background()
	env.Namespace(t, agentNamespace, nil)
	// The ClusterRole bound to the controller's user, as the chart binds it.
	env.AsController(t)
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: agentNamespace, Name: "mptcp-controller"}}
	if err := env.Client.Create(ctx, sa); err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"mptcp.io/multipath": "true"},
		Annotations: map[string]string{"admin.example.com/rack": "r1"}}}
	if err := env.Client.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: agentNamespace, Name: "mptcp-controller-0"},
		Spec: corev1.PodSpec{NodeName: "n1", ServiceAccountName: sa.Name,
			Containers: []corev1.Container{{Name: "controller", Image: "registry.invalid/mptcp-controller"}}},
	}
	if err := env.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	token := env.PodToken(t, pod)
	if sub := env.TokenClaims(t, token).Subject; sub != testenv.ControllerUser {
		t.Fatalf("token subject %q, want %q", sub, testenv.ControllerUser)
	}
	controller := tokenClient(t, env, token)

	patchNode := func(body string) error {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
		return controller.Patch(ctx, n, client.RawPatch(types.MergePatchType, []byte(body)))
	}
	var before corev1.Node
	if err := controller.Get(ctx, types.NamespacedName{Name: "n1"}, &before); err != nil {
		t.Fatalf("the controller cannot read a Node: %v", err)
	}
	const patchRefused = `cannot patch resource "nodes"`
	cases := map[string]struct {
		write   func() error // what the controller's credentials attempt
		message string       // part of the refusal's message
	}{
		"the annotation it once published": {
			write:   func() error { return patchNode(`{"metadata":{"annotations":{"mptcp.io/paths":"{}"}}}`) },
			message: patchRefused,
		},
		"a label":            {write: func() error { return patchNode(`{"metadata":{"labels":{"mptcp.io/multipath":"false"}}}`) }, message: patchRefused},
		"another annotation": {write: func() error { return patchNode(`{"metadata":{"annotations":{"admin.example.com/rack":null}}}`) }, message: patchRefused},
		"a taint": {
			write:   func() error { return patchNode(`{"spec":{"taints":[{"key":"k","effect":"NoSchedule"}]}}`) },
			message: patchRefused,
		},
		"cordoning":   {write: func() error { return patchNode(`{"spec":{"unschedulable":true}}`) }, message: patchRefused},
		"a finalizer": {write: func() error { return patchNode(`{"metadata":{"finalizers":["example.com/hold"]}}`) }, message: patchRefused},
		"an update": {
			write: func() error {
				n := before.DeepCopy()
				n.Labels["probe"] = "p"
				return controller.Update(ctx, n)
			},
			message: `cannot update resource "nodes"`,
		},
		"the Node's status": {
			write: func() error {
				n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
				return controller.Status().Patch(ctx, n, client.RawPatch(types.MergePatchType, []byte(`{"status":{"capacity":{"pods":"1"}}}`)))
			},
			message: `cannot patch resource "nodes/status"`,
		},
		"creating a Node": {
			write:   func() error { return controller.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2"}}) },
			message: `cannot create resource "nodes"`,
		},
		"deleting a Node": {
			write:   func() error { return controller.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}) },
			message: `cannot delete resource "nodes"`,
		},
	}
	for _, name := range slices.Sorted(maps.Keys(cases)) {
		tc := cases[name]
		t.Run(name, func(t *testing.T) {
			err := tc.write()
			if err == nil {
				t.Fatal("allowed")
			}
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), tc.message) {
				t.Fatalf("want Forbidden saying %q, got %v", tc.message, err)
			}
		})
	}
	var stored corev1.Node
	if err := env.Client.Get(ctx, types.NamespacedName{Name: "n1"}, &stored); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(stored.Labels, before.Labels) || !maps.Equal(stored.Annotations, before.Annotations) ||
		!equality.Semantic.DeepEqual(stored.Spec, before.Spec) || len(stored.Finalizers) > 0 {
		t.Fatalf("the Node changed: labels %v annotations %v spec %+v finalizers %v", stored.Labels, stored.Annotations, stored.Spec, stored.Finalizers)
	}

	t.Run("the controller compiles the Node's state with these credentials", func(t *testing.T) {
		testenv.StartManagerWith(t, env, env.AsToken(token))
		testutil.Eventually(t, 15*time.Second, 100*time.Millisecond, "node state", func() error {
			return env.Client.Get(ctx, types.NamespacedName{Name: "n1"}, &mptcpv1alpha1.MPTCPNodeState{})
		})
		var n corev1.Node
		if err := env.Client.Get(ctx, types.NamespacedName{Name: "n1"}, &n); err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(n.Annotations, before.Annotations) || !maps.Equal(n.Labels, before.Labels) {
			t.Errorf("the Node's labels %v and annotations %v changed while the controller ran", n.Labels, n.Annotations)
		}
	})
}
