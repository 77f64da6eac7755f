package controlplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

// ApplyFiles creates the objects of multi-document YAML files, in order, and
// updates those that exist (what `kubectl apply` does for a fresh cluster).
func (cp *ControlPlane) ApplyFiles(ctx context.Context, files ...string) error {
	return eachObject(files, func(u *unstructured.Unstructured) error { return cp.apply(ctx, u) })
}

// ServerSideApply applies the objects of multi-document YAML files, in
// order, as `kubectl apply --server-side` does: an apply patch with the
// field manager "kubectl", which takes fields another manager owns only
// with force (--force-conflicts).
func (cp *ControlPlane) ServerSideApply(ctx context.Context, force bool, files ...string) error {
	opts := []client.ApplyOption{client.FieldOwner("kubectl")}
	if force {
		opts = append(opts, client.ForceOwnership)
	}
	return eachObject(files, func(u *unstructured.Unstructured) error {
		return cp.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), opts...)
	})
}

// eachObject calls fn with each object of multi-document YAML files, in
// order.
func eachObject(files []string, fn func(*unstructured.Unstructured) error) error {
	for _, f := range files {
		objs, err := testenv.ReadObjects(f)
		if err != nil {
			return err
		}
		for i, u := range objs {
			if err := fn(u); err != nil {
				return fmt.Errorf("%s, object %d (%s %s): %w", f, i+1, u.GetKind(), u.GetName(), err)
			}
		}
	}
	return nil
}

func (cp *ControlPlane) apply(ctx context.Context, u *unstructured.Unstructured) error {
	err := cp.Client.Create(ctx, u)
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	cur := &unstructured.Unstructured{}
	cur.SetGroupVersionKind(u.GroupVersionKind())
	if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(u), cur); err != nil {
		return err
	}
	u.SetResourceVersion(cur.GetResourceVersion())
	return cp.Client.Update(ctx, u)
}

// ApplyKustomization applies the resources a kustomization.yaml in dir lists
// (plain resource files only: no patches or generators, which config/agent
// does not use).
func (cp *ControlPlane) ApplyKustomization(ctx context.Context, dir string) error {
	raw, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return err
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(raw, &k); err != nil {
		return fmt.Errorf("%s/kustomization.yaml: %w", dir, err)
	}
	if len(k.Resources) == 0 {
		return errors.New(dir + "/kustomization.yaml lists no resources")
	}
	var files []string
	for _, r := range k.Resources {
		files = append(files, filepath.Join(dir, r))
	}
	return cp.ApplyFiles(ctx, files...)
}
