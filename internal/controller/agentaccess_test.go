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

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

const (
	agentNamespace = "mptcp-system"
	agentAccount   = "mptcp-agent"
	agentUser      = "system:serviceaccount:" + agentNamespace + ":" + agentAccount
	nodeNameExtra  = "authentication.kubernetes.io/node-name"
	agentPolicy    = "mptcp-agent-own-node-state"
)

// TestAgentWritesOnlyItsOwnNodeState applies config/agent (RBAC and the
// admission policy) to a real API server and acts as the agents of nodes n1
// and n2 with real service-account tokens: each bound by the TokenRequest API
// to an agent pod on its node, exactly as kubelet obtains the token of a
// projected volume. The clients carry nothing but the token (no impersonation,
// no client certificate), so the node name the policy checks comes from the
// API server's own authentication of the token.
func TestAgentWritesOnlyItsOwnNodeState(t *testing.T) {
	env := testenv.Start(t, testenv.ServiceAccountTokens())
	ctx := context.Background()
	env.Namespace(t, agentNamespace, nil)
	applyDir(t, env.Client, filepath.Join(testenv.RepoRoot(), "config", "agent"))
	nodes := map[string]*corev1.Node{}
	for _, n := range []string{"n1", "n2"} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}
		if err := env.Client.Create(ctx, node); err != nil {
			t.Fatal(err)
		}
		nodes[n] = node
		if err := env.Client.Create(ctx, &mptcpv1alpha1.MPTCPNodeState{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}

	agentPod := func(node string) *corev1.Pod { return createAgentPod(t, env, node) }
	clientFor := func(token string) client.Client { return tokenClient(t, env, token) }
	agents := map[string]client.Client{}
	tokens := map[string]string{}
	for _, n := range []string{"n1", "n2"} {
		pod := agentPod(n)
		token := env.PodToken(t, pod)
		tokens[n] = token

		// The API server signed the token with the test's key and put the
		// pod and its node into the claims...
		claims := env.TokenClaims(t, token)
		if claims.Subject != agentUser {
			t.Fatalf("token subject %q, want %q", claims.Subject, agentUser)
		}
		if p := claims.Kubernetes.Pod; p == nil || p.Name != pod.Name || p.UID != string(pod.UID) {
			t.Fatalf("token of %s names pod %+v, want %s %s", n, p, pod.Name, pod.UID)
		}
		if nd := claims.Kubernetes.Node; nd == nil || nd.Name != n || nd.UID != string(nodes[n].UID) {
			t.Fatalf("token of %s names node %+v, want %s %s", n, nd, n, nodes[n].UID)
		}
		agents[n] = clientFor(token)

		// ...and authenticates it as the agent with the node name in the
		// user's extra, which is what the admission policy reads.
		review := &authenticationv1.SelfSubjectReview{}
		if err := agents[n].Create(ctx, review); err != nil {
			t.Fatalf("self subject review with the token of %s: %v", n, err)
		}
		user := review.Status.UserInfo
		if user.Username != agentUser || !slices.Equal(user.Extra[nodeNameExtra], authenticationv1.ExtraValue{n}) {
			t.Fatalf("the token of %s authenticates as %s with extra %v", n, user.Username, user.Extra)
		}
	}
	// A token of the same service account bound to no pod carries no node.
	unbound := env.UnboundToken(t, agentNamespace, agentAccount)
	if nd := env.TokenClaims(t, unbound).Kubernetes.Node; nd != nil {
		t.Fatalf("an unbound token names node %+v", nd)
	}
	noNode := clientFor(unbound)

	reportOn := func(c client.Client, node string) error {
		var s mptcpv1alpha1.MPTCPNodeState
		if err := env.Client.Get(ctx, types.NamespacedName{Name: node}, &s); err != nil {
			return err
		}
		// A merge patch of the status, as the agent writes it.
		before := s.DeepCopy()
		s.Status.Errors = []string{"reported at " + time.Now().Format(time.RFC3339Nano)}
		if err := c.Status().Patch(ctx, &s, client.MergeFrom(before)); err != nil {
			return err
		}
		// Accepted: the report must be what is stored.
		var stored mptcpv1alpha1.MPTCPNodeState
		if err := env.Client.Get(ctx, types.NamespacedName{Name: node}, &stored); err != nil {
			return err
		}
		if !slices.Equal(stored.Status.Errors, s.Status.Errors) {
			return fmt.Errorf("stored status %v, not the report %v", stored.Status.Errors, s.Status.Errors)
		}
		return nil
	}
	updateSpec := func(c client.Client, node string) error {
		var s mptcpv1alpha1.MPTCPNodeState
		if err := env.Client.Get(ctx, types.NamespacedName{Name: node}, &s); err != nil {
			return err
		}
		s.Spec.PodCIDRs = []string{"10.9.9.0/24"}
		return c.Update(ctx, &s)
	}

	// The admission policy takes effect a moment after it is created.
	deadline := time.Now().Add(20 * time.Second)
	for reportOn(agents["n1"], "n2") == nil {
		if time.Now().After(deadline) {
			t.Fatal("the admission policy never denied a write to another node's state")
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The policy's refusal names the policy and says why.
	refusedBy := func(node string) []string {
		return []string{
			"ValidatingAdmissionPolicy '" + agentPolicy + "'",
			"the agent may write only the MPTCPNodeState of its own node, not " + node,
		}
	}
	cases := map[string]struct {
		write   func() error // what the agent attempts
		allowed bool         // whether the API server must accept it
		message []string     // parts of the refusal's message
	}{
		"status of its own node state": {
			write:   func() error { return reportOn(agents["n1"], "n1") },
			allowed: true,
		},
		"status of its own node state, other agent": {
			write:   func() error { return reportOn(agents["n2"], "n2") },
			allowed: true,
		},
		"status of another node's state": {
			write:   func() error { return reportOn(agents["n1"], "n2") },
			message: refusedBy("n2"),
		},
		"status of another node's state, other agent": {
			write:   func() error { return reportOn(agents["n2"], "n1") },
			message: refusedBy("n1"),
		},
		"status with a token bound to no pod": {
			write:   func() error { return reportOn(noNode, "n1") },
			message: refusedBy("n1"),
		},
		"spec of its own node state": {
			write:   func() error { return updateSpec(agents["n1"], "n1") },
			message: []string{`cannot update resource "mptcpnodestates"`},
		},
		"spec of another node's state": {
			write:   func() error { return updateSpec(agents["n1"], "n2") },
			message: []string{`cannot update resource "mptcpnodestates"`},
		},
		"spec patch of its own node state": {
			write: func() error {
				s := &mptcpv1alpha1.MPTCPNodeState{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
				patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"podCIDRs":["10.9.9.0/24"]}}`))
				return agents["n1"].Patch(ctx, s, patch)
			},
			message: []string{`cannot patch resource "mptcpnodestates"`},
		},
		"creating a node state": {
			write: func() error {
				return agents["n1"].Create(ctx, &mptcpv1alpha1.MPTCPNodeState{ObjectMeta: metav1.ObjectMeta{Name: "n3"}})
			},
			message: []string{`cannot create resource "mptcpnodestates"`},
		},
		"deleting its own node state": {
			write: func() error {
				return agents["n1"].Delete(ctx, &mptcpv1alpha1.MPTCPNodeState{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
			},
			message: []string{`cannot delete resource "mptcpnodestates"`},
		},
		"replacing its own node state's status (PUT)": {
			write: func() error {
				var s mptcpv1alpha1.MPTCPNodeState
				if err := env.Client.Get(ctx, types.NamespacedName{Name: "n1"}, &s); err != nil {
					return err
				}
				return agents["n1"].Status().Update(ctx, &s)
			},
			message: []string{`cannot update resource "mptcpnodestates/status"`},
		},
		"reading a node state by name": {
			write: func() error {
				return agents["n1"].Get(ctx, types.NamespacedName{Name: "n1"}, &mptcpv1alpha1.MPTCPNodeState{})
			},
			message: []string{`cannot get resource "mptcpnodestates"`},
		},
		"reading a pod by name": {
			write: func() error {
				return agents["n1"].Get(ctx, types.NamespacedName{Namespace: agentNamespace, Name: "mptcp-agent-n2"}, &corev1.Pod{})
			},
			message: []string{`cannot get resource "pods"`},
		},
		"watching pods": {
			write: func() error {
				c, err := client.NewWithWatch(env.AsToken(tokens["n1"]), client.Options{Scheme: env.Scheme})
				if err != nil {
					return err
				}
				w, err := c.Watch(ctx, &corev1.PodList{}, client.MatchingFields{"spec.nodeName": "n1"})
				if err == nil {
					w.Stop()
				}
				return err
			},
			message: []string{`cannot watch resource "pods"`},
		},
		"reading Nodes": {
			write: func() error {
				return agents["n1"].Get(ctx, types.NamespacedName{Name: "n1"}, &corev1.Node{})
			},
			message: []string{`cannot get resource "nodes"`},
		},
		"listing Nodes": {
			write:   func() error { return agents["n1"].List(ctx, &corev1.NodeList{}) },
			message: []string{`cannot list resource "nodes"`},
		},
		"annotating its Node": {
			write: func() error {
				n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
				patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"mptcp.io/paths":"{}"}}}`))
				return agents["n1"].Patch(ctx, n, patch)
			},
			message: []string{`cannot patch resource "nodes"`},
		},
	}
	names := slices.Sorted(maps.Keys(cases))
	for _, name := range names {
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
			case !apierrors.IsForbidden(err):
				t.Fatalf("want Forbidden, got %v", err)
			}
			for _, m := range tc.message {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("message %q does not say %q", err, m)
				}
			}
		})
	}

	// The token is bound to the pod: once the pod is gone, it no longer
	// authenticates anyone.
	gone := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: agentNamespace, Name: "mptcp-agent-n1"}}
	if err := env.Client.Delete(ctx, gone, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(20 * time.Second)
	for {
		err := reportOn(agents["n1"], "n1")
		if apierrors.IsUnauthorized(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the token of a deleted pod still works: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// createAgentPod creates the agent's pod on node. It need not run: a
// pod-bound token needs only the pod object (its uid) and, for the node
// claims, its spec.nodeName.
func createAgentPod(t *testing.T, env *testenv.Env, node string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: agentNamespace, Name: "mptcp-agent-" + node},
		Spec: corev1.PodSpec{
			NodeName:           node,
			ServiceAccountName: agentAccount,
			Containers:         []corev1.Container{{Name: "agent", Image: "registry.invalid/mptcp-agent"}},
		},
	}
	if err := env.Client.Create(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	return p
}

// tokenClient is a client whose credentials are the bearer token alone.
func tokenClient(t *testing.T, env *testenv.Env, token string) client.Client {
	t.Helper()
	cfg := env.AsToken(token)
	if cfg.CertData != nil || cfg.KeyData != nil || cfg.CertFile != "" || cfg.Username != "" || cfg.Impersonate.UserName != "" {
		t.Fatal("token credentials carry more than the token")
	}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// applyDir creates every object of the YAML files in dir except the
// kustomization itself.
func applyDir(t *testing.T, c client.Client, dir string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		testenv.CreateObjects(t, c, f)
	}
}
