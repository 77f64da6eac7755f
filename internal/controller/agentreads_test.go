package controller_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/agent/kube"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// TestAgentCredentialsCoverWhatTheAgentDoesOnItsNode runs, with the pod-bound
// token of node n1's agent and config/agent's narrowed RBAC, every API call
// the agent makes (internal/agent/kube): its cache restricted to its own node
// state (kube.CacheOptions) and holding every MPTCPPeer, a status merge patch, the one list of its node's
// pods, the pod gate and an event on its node state. Each must work; what the
// cache holds and the list returns must be n1's only; an event about anything
// else is refused by the policy mptcp-agent-own-node-events.
func TestAgentCredentialsCoverWhatTheAgentDoesOnItsNode(t *testing.T) {
	env := testenv.Start(t, testenv.ServiceAccountTokens())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	env.Namespace(t, agentNamespace, nil)
	env.Namespace(t, "apps", nil)
	applyDir(t, env.Client, filepath.Join(testenv.RepoRoot(), "config", "agent"))
	for _, n := range []string{"n1", "n2"} {
		if err := env.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Create(ctx, &mptcpv1alpha1.MPTCPNodeState{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Create(ctx, &mptcpv1alpha1.MPTCPPeer{ObjectMeta: metav1.ObjectMeta{Name: n},
			Spec: mptcpv1alpha1.MPTCPPeerSpec{Paths: []mptcpv1alpha1.PeerPath{{Name: "fabric-a", Addresses: []string{"192.0.2.1"}}}}}); err != nil {
			t.Fatal(err)
		}
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "web-" + n},
			Spec:       corev1.PodSpec{NodeName: n, Containers: []corev1.Container{{Name: "web", Image: "registry.invalid/web"}}},
		}
		if err := env.Client.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
	token := env.PodToken(t, createAgentPod(t, env, "n1"))
	cfg := env.AsToken(token)

	// The manager as kube.Run builds it: the cache holds n1's node state only.
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 env.Scheme,
		Cache:                  kube.CacheOptions("n1"),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		t.Fatal(err)
	}
	// Informers start on first use; ask for the node state's and the
	// peers' before Start.
	for _, o := range []client.Object{&mptcpv1alpha1.MPTCPNodeState{}, &mptcpv1alpha1.MPTCPPeer{}} {
		if _, err := mgr.GetCache().GetInformer(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	}()
	syncCtx, syncCancel := context.WithTimeout(ctx, 20*time.Second)
	defer syncCancel()
	if !mgr.GetCache().WaitForCacheSync(syncCtx) {
		t.Fatal("the agent's cache never synced with its credentials (list and watch of its node state and of the peers)")
	}
	c := mgr.GetClient()

	t.Run("its cache holds every peer", func(t *testing.T) {
		var peers mptcpv1alpha1.MPTCPPeerList
		if err := c.List(ctx, &peers); err != nil {
			t.Fatal(err)
		}
		if len(peers.Items) != 2 {
			t.Fatalf("the cache holds %d peers, want n1's and n2's", len(peers.Items))
		}
		if err := c.Delete(ctx, &peers.Items[1]); !apierrors.IsForbidden(err) {
			t.Fatalf("deleting a peer: %v, want Forbidden (the controller alone writes them)", err)
		}
	})

	t.Run("its cache holds its own node state and no other", func(t *testing.T) {
		var states mptcpv1alpha1.MPTCPNodeStateList
		if err := c.List(ctx, &states); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, s := range states.Items {
			names = append(names, s.Name)
		}
		if !slices.Equal(names, []string{"n1"}) {
			t.Fatalf("the cache holds node states %v, want [n1]", names)
		}
		if err := c.Get(ctx, types.NamespacedName{Name: "n2"}, &mptcpv1alpha1.MPTCPNodeState{}); !apierrors.IsNotFound(err) {
			t.Fatalf("reading n2's state through the cache: %v, want NotFound", err)
		}
	})
	t.Run("status merge patch of its own node state", func(t *testing.T) {
		var s mptcpv1alpha1.MPTCPNodeState
		if err := c.Get(ctx, types.NamespacedName{Name: "n1"}, &s); err != nil {
			t.Fatal(err)
		}
		before := s.DeepCopy()
		s.Status.Errors = []string{"reported"}
		if err := c.Status().Patch(ctx, &s, client.MergeFrom(before)); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("one list of its node's pods", func(t *testing.T) {
		var pods corev1.PodList
		if err := mgr.GetAPIReader().List(ctx, &pods, client.MatchingFields{"spec.nodeName": "n1"}); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, p := range pods.Items {
			names = append(names, p.Namespace+"/"+p.Name)
		}
		slices.Sort(names)
		if !slices.Equal(names, []string{"apps/web-n1", agentNamespace + "/mptcp-agent-n1"}) {
			t.Fatalf("the node's pods are %v", names)
		}
	})
	t.Run("the pod gate on its node's pod", func(t *testing.T) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "apps", Name: "web-n1"}}
		body := fmt.Sprintf(`{"status":{"conditions":[{"type":%q,"status":"True","lastTransitionTime":%q}]}}`,
			kube.PodReadyCondition, time.Now().UTC().Format(time.RFC3339))
		if err := c.Status().Patch(ctx, p, client.RawPatch(types.StrategicMergePatchType, []byte(body))); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("events about its own node state only", func(t *testing.T) {
		var own mptcpv1alpha1.MPTCPNodeState
		if err := c.Get(ctx, types.NamespacedName{Name: "n1"}, &own); err != nil {
			t.Fatal(err)
		}
		// The recorder the agent uses, as it uses it.
		mgr.GetEventRecorder("mptcp-agent").Eventf(&own, nil, corev1.EventTypeNormal, kube.ReasonApplied, "Apply", "generation %d", own.Generation)
		testutil.Eventually(t, 15*time.Second, 100*time.Millisecond, "the agent's event on its node state", func() error {
			var evs eventsv1.EventList
			if err := env.Client.List(ctx, &evs); err != nil {
				return err
			}
			for _, e := range evs.Items {
				if e.Regarding.Kind == "MPTCPNodeState" && e.Regarding.Name == "n1" && e.Reason == kube.ReasonApplied {
					return nil
				}
			}
			return fmt.Errorf("none among %d events", len(evs.Items))
		})

		agent := tokenClient(t, env, token)
		event := func(ns string, regarding corev1.ObjectReference) *eventsv1.Event {
			return &eventsv1.Event{
				ObjectMeta:          metav1.ObjectMeta{Namespace: ns, GenerateName: "forged-"},
				EventTime:           metav1.NowMicro(),
				ReportingController: "mptcp-agent", ReportingInstance: "mptcp-agent-n1",
				Action: "Apply", Reason: "Applied", Type: corev1.EventTypeNormal, Note: "forged",
				Regarding: regarding,
			}
		}
		// The admission policy takes effect a moment after it is
		// created (a busy API server took more than the cache sync
		// above): wait until it refuses one, then judge each.
		probe := func() *eventsv1.Event {
			return event("default", corev1.ObjectReference{APIVersion: "mptcp.io/v1alpha1", Kind: "MPTCPNodeState", Name: "n2"})
		}
		for deadline := time.Now().Add(20 * time.Second); agent.Create(ctx, probe()) == nil; time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the admission policy never refused an event about another node's state")
			}
		}
		for name, ev := range map[string]*eventsv1.Event{
			"about another node's state": probe(),
			"about a tenant's pod":       event("apps", corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: "apps", Name: "web-n1"}),
			"about its own Node":         event("default", corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: "n1"}),
		} {
			err := agent.Create(ctx, ev)
			if err == nil {
				t.Errorf("an event %s: allowed", name)
				continue
			}
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "events only about the MPTCPNodeState of its own node") {
				t.Errorf("an event %s: want Forbidden by the policy, got %v", name, err)
			}
		}
	})
	t.Run("what RBAC still allows: an unfiltered list", func(t *testing.T) {
		// RBAC ignores field selectors, and admission sees no reads: these
		// credentials can list every pod and every node state. The agent
		// never asks (the cache and the list above carry its node's
		// selectors); docs/security.md says so. If this starts failing,
		// Kubernetes learnt to restrict it: update the docs.
		agent := tokenClient(t, env, token)
		var pods corev1.PodList
		if err := agent.List(ctx, &pods); err != nil {
			t.Fatalf("an unfiltered pod list: %v", err)
		}
		var states mptcpv1alpha1.MPTCPNodeStateList
		if err := agent.List(ctx, &states); err != nil || len(states.Items) != 2 {
			t.Fatalf("an unfiltered node state list: %d items, %v", len(states.Items), err)
		}
	})
}
