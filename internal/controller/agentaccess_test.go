package controller_test

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/controller/testenv"
)

const (
	agentUser     = "system:serviceaccount:mptcp-system:mptcp-agent"
	nodeNameExtra = "authentication.kubernetes.io/node-name"
)

// TestAgentWritesOnlyItsOwnNodeState applies config/agent (RBAC and the
// admission policy) to a real API server and acts as the agent of node n1,
// with the node name a pod-bound service-account token carries.
func TestAgentWritesOnlyItsOwnNodeState(t *testing.T) {
	env := testenv.Start(t)
	ctx := context.Background()
	env.Namespace(t, "mptcp-system", nil)
	applyDir(t, env.Client, filepath.Join(testenv.RepoRoot(), "config", "agent"))
	for _, n := range []string{"n1", "n2"} {
		if err := env.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Create(ctx, &mptcpv1alpha1.MPTCPNodeState{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	agentOf := func(node string) client.Client {
		cfg := rest.CopyConfig(env.Config)
		cfg.Impersonate = rest.ImpersonationConfig{
			UserName: agentUser,
			Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:mptcp-system", "system:authenticated"},
		}
		if node != "" {
			cfg.Impersonate.Extra = map[string][]string{nodeNameExtra: {node}}
		}
		c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	reportOn := func(c client.Client, node string) error {
		var s mptcpv1alpha1.MPTCPNodeState
		if err := env.Client.Get(ctx, types.NamespacedName{Name: node}, &s); err != nil {
			return err
		}
		s.Status.Errors = []string{"reported at " + time.Now().Format(time.RFC3339Nano)}
		return c.Status().Update(ctx, &s)
	}

	// The admission policy takes effect a moment after it is created.
	deadline := time.Now().Add(20 * time.Second)
	for reportOn(agentOf("n1"), "n2") == nil {
		if time.Now().After(deadline) {
			t.Fatal("the admission policy never denied a write to another node's state")
		}
		time.Sleep(100 * time.Millisecond)
	}

	cases := map[string]struct {
		write   func() error // what the agent attempts
		allowed bool         // whether the API server must accept it
		message string       // part of the refusal's message
	}{
		"status of its own node state": {
			write:   func() error { return reportOn(agentOf("n1"), "n1") },
			allowed: true,
		},
		"status of another node's state": {
			write:   func() error { return reportOn(agentOf("n1"), "n2") },
			message: "only the MPTCPNodeState of its own node, not n2",
		},
		"status without a node name in its token": {
			write:   func() error { return reportOn(agentOf(""), "n1") },
			message: "only the MPTCPNodeState of its own node",
		},
		"spec of its own node state": {
			write: func() error {
				var s mptcpv1alpha1.MPTCPNodeState
				if err := env.Client.Get(ctx, types.NamespacedName{Name: "n1"}, &s); err != nil {
					return err
				}
				s.Spec.PodCIDRs = []string{"10.9.9.0/24"}
				return agentOf("n1").Update(ctx, &s)
			},
			message: "cannot update resource \"mptcpnodestates\"",
		},
		"creating a node state": {
			write: func() error {
				return agentOf("n3").Create(ctx, &mptcpv1alpha1.MPTCPNodeState{ObjectMeta: metav1.ObjectMeta{Name: "n3"}})
			},
			message: "cannot create resource \"mptcpnodestates\"",
		},
		"deleting its own node state": {
			write: func() error {
				return agentOf("n1").Delete(ctx, &mptcpv1alpha1.MPTCPNodeState{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
			},
			message: "cannot delete resource \"mptcpnodestates\"",
		},
		"annotating its Node": {
			write: func() error {
				n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
				patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"mptcp.io/paths":"{}"}}}`))
				return agentOf("n1").Patch(ctx, n, patch)
			},
			message: "cannot patch resource \"nodes\"",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := tc.write()
			switch {
			case tc.allowed && err != nil:
				t.Fatalf("refused: %v", err)
			case !tc.allowed && err == nil:
				t.Fatal("allowed")
			case !tc.allowed && !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err):
				t.Fatalf("want Forbidden, got %v", err)
			case !tc.allowed && !strings.Contains(err.Error(), tc.message):
				t.Fatalf("message %q does not say %q", err, tc.message)
			}
		})
	}
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
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(fh, 4096)
		for {
			obj := &unstructured.Unstructured{}
			if err := dec.Decode(&obj.Object); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				t.Fatalf("%s: %v", f, err)
			}
			if len(obj.Object) == 0 {
				continue
			}
			if err := c.Create(context.Background(), obj); err != nil {
				t.Fatalf("%s: create %s %s: %v", f, obj.GetKind(), obj.GetName(), err)
			}
		}
		_ = fh.Close()
	}
}
