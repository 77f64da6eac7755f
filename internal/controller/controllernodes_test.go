package controller_test

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
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
	"github.com/mptcp-operator/mptcp-operator/internal/controller/testenv"
)

const controllerNodePolicy = "mptcp-controller-node-annotation"

// TestControllerChangesOnlyItsAnnotationOnNodes applies the controller's
// generated ClusterRole and config/controller's admission policy to a real
// API server and acts with a token bound to a controller pod (no
// impersonation). RBAC lets the controller patch Nodes because it publishes
// the annotation mptcp.io/paths; the policy holds it to that annotation. The
// real controller, run with the same token, still publishes it.
func TestControllerChangesOnlyItsAnnotationOnNodes(t *testing.T) {
	env := testenv.Start(t, testenv.ServiceAccountTokens())
	ctx := context.Background()
	env.Namespace(t, agentNamespace, nil)
	// The ClusterRole bound to the controller's user, as the chart binds it.
	env.AsController(t)
	applyDir(t, env.Client, filepath.Join(testenv.RepoRoot(), "config", "controller"))
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

	patchNode := func(c client.Client, body string) error {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
		return c.Patch(ctx, n, client.RawPatch(types.MergePatchType, []byte(body)))
	}
	// The policy takes effect a moment after it is created.
	deadline := time.Now().Add(20 * time.Second)
	// Each probe sets a new value: a patch that changes nothing passes.
	for i := 0; patchNode(controller, fmt.Sprintf(`{"metadata":{"labels":{"probe":"p%d"}}}`, i)) == nil; i++ {
		if time.Now().After(deadline) {
			t.Fatal("the admission policy never denied the controller a Node label")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// That early write may have gone through: undo it as the admin.
	if err := patchNode(env.Client, `{"metadata":{"labels":{"probe":null}}}`); err != nil {
		t.Fatal(err)
	}

	var before corev1.Node
	if err := env.Client.Get(ctx, types.NamespacedName{Name: "n1"}, &before); err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		write   func() error // what the controller's credentials attempt
		allowed bool         // whether the API server must accept it
		message string       // part of the refusal's message
	}{
		"setting and removing its annotation": {
			write: func() error {
				if err := patchNode(controller, `{"metadata":{"annotations":{"mptcp.io/paths":"{\"paths\":{}}"}}}`); err != nil {
					return err
				}
				return patchNode(controller, `{"metadata":{"annotations":{"mptcp.io/paths":null}}}`)
			},
			allowed: true,
		},
		"a label": {
			write:   func() error { return patchNode(controller, `{"metadata":{"labels":{"mptcp.io/multipath":"false"}}}`) },
			message: "may change only the annotation mptcp.io/paths of a Node",
		},
		"removing a label": {
			write:   func() error { return patchNode(controller, `{"metadata":{"labels":{"mptcp.io/multipath":null}}}`) },
			message: "may change only the annotation mptcp.io/paths of a Node",
		},
		"another annotation": {
			write: func() error {
				return patchNode(controller, `{"metadata":{"annotations":{"admin.example.com/rack":"r2"}}}`)
			},
			message: "may change only the annotation mptcp.io/paths of a Node",
		},
		"removing another annotation": {
			write: func() error {
				return patchNode(controller, `{"metadata":{"annotations":{"admin.example.com/rack":null}}}`)
			},
			message: "may change only the annotation mptcp.io/paths of a Node",
		},
		"its annotation and a taint at once": {
			write: func() error {
				return patchNode(controller, `{"metadata":{"annotations":{"mptcp.io/paths":"{}"}},"spec":{"taints":[{"key":"k","effect":"NoSchedule"}]}}`)
			},
			message: "may change only the annotation mptcp.io/paths of a Node",
		},
		"cordoning": {
			write:   func() error { return patchNode(controller, `{"spec":{"unschedulable":true}}`) },
			message: "may change only the annotation mptcp.io/paths of a Node",
		},
		"a finalizer": {
			write:   func() error { return patchNode(controller, `{"metadata":{"finalizers":["example.com/hold"]}}`) },
			message: "may change only the annotation mptcp.io/paths of a Node",
		},
		"the Node's status": {
			write: func() error {
				n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
				return controller.Status().Patch(ctx, n, client.RawPatch(types.MergePatchType, []byte(`{"status":{"capacity":{"pods":"1"}}}`)))
			},
			message: `cannot patch resource "nodes/status"`,
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
			switch {
			case tc.allowed && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.allowed:
				return
			case err == nil:
				t.Fatal("allowed")
			case !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), tc.message):
				t.Fatalf("want Forbidden saying %q, got %v", tc.message, err)
			case strings.Contains(tc.message, "annotation") && !strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+controllerNodePolicy+"'"):
				t.Fatalf("the refusal does not name the policy %s: %v", controllerNodePolicy, err)
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

	t.Run("the controller publishes the annotation with these credentials", func(t *testing.T) {
		testenv.StartManagerWith(t, env, env.AsToken(token))
		eventually(t, "node state", func() error {
			return env.Client.Get(ctx, types.NamespacedName{Name: "n1"}, &mptcpv1alpha1.MPTCPNodeState{})
		})
		var s mptcpv1alpha1.MPTCPNodeState
		if err := env.Client.Get(ctx, types.NamespacedName{Name: "n1"}, &s); err != nil {
			t.Fatal(err)
		}
		s.Status.Paths = []mptcpv1alpha1.PathState{{Name: "fabric-a", Interface: "nic1", Link: mptcpv1alpha1.LinkUp, Addresses: []string{"192.0.2.11"}}}
		if err := env.Client.Status().Update(ctx, &s); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the annotation", func() error {
			var n corev1.Node
			if err := env.Client.Get(ctx, types.NamespacedName{Name: "n1"}, &n); err != nil {
				return err
			}
			if got := n.Annotations[mptcpv1alpha1.AnnotationNodePaths]; !strings.Contains(got, "192.0.2.11") {
				return fmt.Errorf("annotation %q", got)
			}
			return nil
		})
	})
}
