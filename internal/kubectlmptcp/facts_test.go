package kubectlmptcp

import (
	"bytes"
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/explain"
)

// A user who may read the pod but not node states, policies, events or the
// binding that says where the agents run (a tenant with view in its
// namespace) gets an explanation, not an error: each fact it could not read
// is kept with the API server's refusal, and the explanation names those
// steps as not checked.
func TestFactsKeepWhatTheUserMayNotReadAndExplainGoesOn(t *testing.T) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, mptcpv1alpha1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "web", UID: "u1"},
		Spec:       corev1.PodSpec{NodeName: "n1"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.1.10", Conditions: []corev1.PodCondition{
			{Type: mptcpv1alpha1.PodReadyCondition, Status: corev1.ConditionTrue, Reason: "Configured"}}},
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "apps"}}
	state := &mptcpv1alpha1.MPTCPNodeState{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	forbid := func(obj any) error {
		var gr schema.GroupResource
		switch obj.(type) {
		case *mptcpv1alpha1.MPTCPNodeState:
			gr = mptcpv1alpha1.GroupVersion.WithResource("mptcpnodestates").GroupResource()
		case *mptcpv1alpha1.MPTCPPolicyList:
			gr = mptcpv1alpha1.GroupVersion.WithResource("mptcppolicies").GroupResource()
		case *eventsv1.EventList:
			gr = eventsv1.SchemeGroupVersion.WithResource("events").GroupResource()
		case *rbacv1.ClusterRoleBinding:
			gr = rbacv1.SchemeGroupVersion.WithResource("clusterrolebindings").GroupResource()
		default:
			return nil
		}
		return apierrors.NewForbidden(gr, "", nil)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(pod, ns, state).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if err := forbid(obj); err != nil {
				return err
			}
			return c.Get(ctx, key, obj, opts...)
		},
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if err := forbid(list); err != nil {
				return err
			}
			return c.List(ctx, list, opts...)
		},
	}).Build()
	k := &Cluster{c: c}

	f, err := k.Facts(context.Background(), "apps", "web")
	if err != nil {
		t.Fatalf("explain fails where the user may not read node states: %v", err)
	}
	for what, got := range map[string]string{"node state": f.NodeStateError, "policies": f.PoliciesError, "events": f.EventsError, "agent": f.AgentError} {
		if !strings.Contains(got, "forbidden") {
			t.Errorf("why the %s was not read: %q, want the API server's refusal", what, got)
		}
	}
	if f.NamespaceError != "" || f.Namespace == nil {
		t.Errorf("the namespace, which the user may read, was not read: %q", f.NamespaceError)
	}

	e := explain.Explain(f)
	if e.Has(explain.CauseNotSelected) || len(e.Unread) != 2 || e.Unread[0] != "selection" || e.Unread[1] != "agent data" {
		t.Errorf("causes %v, unread %v; want no cause made up and the selection and agent data named unread; steps %+v", e.Causes, e.Unread, e.Steps)
	}
	var b bytes.Buffer
	if err := WriteExplanation(&b, e); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"not read", "Not checked: selection, agent data", "No cause found in the steps checked."} {
		if !strings.Contains(out, want) {
			t.Errorf("explanation text lacks %q:\n%s", want, out)
		}
	}
}
