// Package charts tests the Helm chart charts/mptcp-operator as an admin
// meets it: rendered by the pinned helm binary (HELM, set by make), decoded
// strictly into the Kubernetes API's own types, checked against what the
// agent and the controller declare, and applied to a real API server.
package charts

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

const (
	release   = "mptcp"
	namespace = "mptcp-system"
)

func chartDir() string { return filepath.Join(testenv.RepoRoot(), "charts", "mptcp-operator") }

// readChartFile reads a file of the chart.
func readChartFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir(), name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// everythingValues switches every optional part of the chart on.
func everythingValues() string { return filepath.Join(chartDir(), "ci", "everything-values.yaml") }

// helmTemplate runs `helm template` on the chart into namespace with args;
// it returns stdout, stderr and the error of a failed run.
func helmTemplate(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	helm := testutil.BuiltTool(t, "HELM", "helm")
	cmd := exec.Command(helm, append([]string{"template", release, chartDir(), "--namespace", namespace}, args...)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// rendered is a rendered chart: every object decoded strictly into its
// API type (unknown or misspelt fields fail), by kind and name.
type rendered struct {
	objects map[string]any
	// order is the objects' keys as rendered.
	order []string
	// raw holds each object's YAML document.
	raw map[string][]byte
}

func key(kind, name string) string { return kind + "/" + name }

// typedObject returns an empty object of the Go type of kind.
func typedObject(kind string) any {
	switch kind {
	case "Namespace":
		return &corev1.Namespace{}
	case "NetworkPolicy":
		return &networkingv1.NetworkPolicy{}
	case "ServiceAccount":
		return &corev1.ServiceAccount{}
	case "Service":
		return &corev1.Service{}
	case "Secret":
		return &corev1.Secret{}
	case "ConfigMap":
		return &corev1.ConfigMap{}
	case "Pod":
		return &corev1.Pod{}
	case "MutatingWebhookConfiguration":
		return &admissionregistrationv1.MutatingWebhookConfiguration{}
	case "ClusterRole":
		return &rbacv1.ClusterRole{}
	case "ClusterRoleBinding":
		return &rbacv1.ClusterRoleBinding{}
	case "Role":
		return &rbacv1.Role{}
	case "RoleBinding":
		return &rbacv1.RoleBinding{}
	case "Deployment":
		return &appsv1.Deployment{}
	case "DaemonSet":
		return &appsv1.DaemonSet{}
	case "PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}
	case "ValidatingAdmissionPolicy":
		return &admissionregistrationv1.ValidatingAdmissionPolicy{}
	case "ValidatingAdmissionPolicyBinding":
		return &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
	case "CustomResourceDefinition":
		return &apiextensionsv1.CustomResourceDefinition{}
	case "MPTCPPath":
		return &mptcpv1alpha1.MPTCPPath{}
	case "MPTCPPolicy":
		return &mptcpv1alpha1.MPTCPPolicy{}
	case "ServiceMonitor", "PrometheusRule", "Certificate", "Issuer":
		// The Prometheus Operator's and cert-manager's types are not a
		// dependency: checked as unstructured.
		return &unstructured.Unstructured{}
	}
	return nil
}

// render renders the chart (CRDs included) and decodes every object.
func render(t *testing.T, args ...string) *rendered {
	t.Helper()
	out, stderr, err := helmTemplate(t, append([]string{"--include-crds"}, args...)...)
	if err != nil {
		t.Fatalf("helm template %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	r := &rendered{objects: map[string]any{}, raw: map[string][]byte{}}
	for _, doc := range testutil.YAMLDocuments(t, []byte(out)) {
		var meta struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatalf("not YAML: %v\n%s", err, doc)
		}
		if meta.Kind == "" {
			continue // a document holding only comments
		}
		obj := typedObject(meta.Kind)
		if obj == nil {
			t.Fatalf("the chart renders a %s, which this test does not know: add its type", meta.Kind)
		}
		if u, ok := obj.(*unstructured.Unstructured); ok {
			err = yaml.Unmarshal(doc, &u.Object)
		} else {
			err = yaml.UnmarshalStrict(doc, obj)
		}
		if err != nil {
			t.Fatalf("%s %s does not decode strictly into its API type: %v", meta.Kind, meta.Metadata.Name, err)
		}
		k := key(meta.Kind, meta.Metadata.Name)
		if _, dup := r.objects[k]; dup {
			t.Fatalf("%s is rendered twice", k)
		}
		r.objects[k], r.raw[k] = obj, doc
		r.order = append(r.order, k)
	}
	return r
}

// get returns the object kind/name as T, failing the test if it is missing.
func get[T any](t *testing.T, r *rendered, kind, name string) T {
	t.Helper()
	obj, ok := r.objects[key(kind, name)]
	if !ok {
		t.Fatalf("the chart renders no %s %s (it renders %v)", kind, name, r.order)
	}
	typed, ok := obj.(T)
	if !ok {
		t.Fatalf("%s %s is a %T", kind, name, obj)
	}
	return typed
}

func (r *rendered) has(kind, name string) bool {
	_, ok := r.objects[key(kind, name)]
	return ok
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func container(t *testing.T, spec corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range spec.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q", name)
	return corev1.Container{}
}

func envValue(c corev1.Container, name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

func mount(c corev1.Container, name string) (corev1.VolumeMount, bool) {
	for _, m := range c.VolumeMounts {
		if m.Name == name {
			return m, true
		}
	}
	return corev1.VolumeMount{}, false
}

func volume(spec corev1.PodSpec, name string) (corev1.Volume, bool) {
	for _, v := range spec.Volumes {
		if v.Name == name {
			return v, true
		}
	}
	return corev1.Volume{}, false
}

// flagValue returns the value of -name=value among args.
func flagValue(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v, true
		}
	}
	return "", false
}

func must(t *testing.T, ok bool, format string, args ...any) {
	t.Helper()
	if !ok {
		t.Errorf(format, args...)
	}
}
