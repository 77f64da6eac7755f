package removal_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/mptcp-operator/mptcp-operator/internal/agent/removal"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

const (
	namespace = "mptcp-system"
	agentName = "mptcp-agent"
)

// agentClient starts an API server with the agent's service account and the
// Role and RoleBinding the chart gives it on its own DaemonSet (config/agent
// is rendered from the chart), and returns a client holding only the
// agent's token.
func agentClient(t *testing.T) (*testenv.Env, kubernetes.Interface) {
	t.Helper()
	env := testenv.Start(t, testenv.ServiceAccountTokens())
	env.Namespace(t, namespace, nil)
	for _, f := range []string{"service_account.yaml", "own_daemonset_role.yaml", "own_daemonset_role_binding.yaml"} {
		raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "agent", f))
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(raw, &u.Object); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if err := env.Client.Create(context.Background(), u); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	cs, err := kubernetes.NewForConfig(env.AsToken(env.UnboundToken(t, namespace, agentName)))
	if err != nil {
		t.Fatal(err)
	}
	return env, cs
}

func daemonSet(name string) *appsv1.DaemonSet {
	labels := map[string]string{"app": name}
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "agent", Image: "registry.invalid/agent:1"}}},
			},
		},
	}
}

// removed asks w with a deadline.
func removed(w *removal.Watch, within time.Duration) (bool, string) {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	return w.Removed(ctx)
}

// waitSeen waits until the watch has seen the DaemonSet: until then, a
// stopping agent keeps its datapath whatever happens.
func waitSeen(t *testing.T, w *removal.Watch) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		gone, why := removed(w, time.Second)
		if !gone && strings.Contains(why, "remains") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the watch never saw the DaemonSet: %v, %s", gone, why)
		}
	}
}

// The agent holds the chart's grant on its own DaemonSet and nothing else in
// its namespace. Replacing its pods (an upgrade changes the template) is no
// removal. Deleting the DaemonSet as `helm uninstall` does, together with
// the agent's Role, RoleBinding and ServiceAccount so that the agent can no
// longer ask anything, is: the watch opened at start has told it.
func TestDeletingTheDaemonSetIsRemovalReplacingItsPodsIsNot(t *testing.T) {
	env, cs := agentClient(t)
	ctx := context.Background()
	for _, name := range []string{agentName, "other"} {
		if err := env.Client.Create(ctx, daemonSet(name)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cs.AppsV1().DaemonSets(namespace).Get(ctx, "other", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the agent reads another DaemonSet: %v", err)
	}
	if _, err := cs.AppsV1().DaemonSets(namespace).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the agent lists every DaemonSet of its namespace: %v", err)
	}
	if _, err := cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the Role grants more than the DaemonSet: listing pods: %v", err)
	}

	w := removal.Start(cs, namespace, agentName)
	defer w.Stop()
	waitSeen(t, w)

	ds := &appsv1.DaemonSet{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: agentName}, ds); err != nil {
		t.Fatal(err)
	}
	ds.Spec.Template.Spec.Containers[0].Image = "registry.invalid/agent:2"
	if err := env.Client.Update(ctx, ds); err != nil {
		t.Fatal(err)
	}
	if gone, why := removed(w, 2*time.Second); gone {
		t.Errorf("an upgrade's new template counts as removal: %s", why)
	}

	// helm uninstall: workloads first, then RBAC, then service accounts,
	// without waiting in between; the pods' SIGTERM comes later.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: agentName}}
	for _, obj := range []client.Object{ds,
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: agentName}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: agentName}}, sa} {
		if err := env.Client.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
			t.Fatal(err)
		}
	}
	gone, why := removed(w, 5*time.Second)
	if !gone || !strings.Contains(why, "was deleted") {
		t.Errorf("after helm uninstall's deletions: removed %v (%s), want removed: the DaemonSet was deleted", gone, why)
	}
	if _, err := cs.AppsV1().DaemonSets(namespace).Get(ctx, agentName, metav1.GetOptions{}); err == nil || apierrors.IsNotFound(err) {
		t.Errorf("the agent's credentials still work after its service account was deleted (%v): the watch was not what told", err)
	}
}

// Foreground deletion keeps the DaemonSet, with a deletion timestamp, until
// its pods are gone: the pods stopping then are being removed.
func TestDaemonSetBeingDeletedIsRemoval(t *testing.T) {
	env, cs := agentClient(t)
	ctx := context.Background()
	ds := daemonSet(agentName)
	if err := env.Client.Create(ctx, ds); err != nil {
		t.Fatal(err)
	}
	w := removal.Start(cs, namespace, agentName)
	defer w.Stop()
	waitSeen(t, w)
	// No garbage collector runs here: the foregroundDeletion finalizer
	// stays, as it does while the pods terminate.
	if err := env.Client.Delete(ctx, ds, client.PropagationPolicy(metav1.DeletePropagationForeground)); err != nil {
		t.Fatal(err)
	}
	if gone, why := removed(w, 5*time.Second); !gone || !strings.Contains(why, "being deleted") {
		t.Errorf("foreground deletion: removed %v (%s), want removed: being deleted", gone, why)
	}
}

// An agent that never saw its DaemonSet (a wrong -daemonset, or one run by
// hand) never uninstalls on SIGTERM.
func TestAnAgentThatNeverSawItsDaemonSetKeepsItsDatapath(t *testing.T) {
	_, cs := agentClient(t)
	w := removal.Start(cs, namespace, agentName)
	defer w.Stop()
	if gone, why := removed(w, 2*time.Second); gone || !strings.Contains(why, "never saw") {
		t.Errorf("removed %v (%s), want kept: it never saw the DaemonSet", gone, why)
	}
}
