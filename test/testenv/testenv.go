// Package testenv starts a real control plane (kube-apiserver and etcd from
// KUBEBUILDER_ASSETS) with this project's CRDs for tests and benchmarks, and
// counts writes at the API server from its own request metrics.
package testenv

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rsa"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
)

// Env is a running control plane.
type Env struct {
	Config *rest.Config
	Client client.Client
	Scheme *runtime.Scheme
	env    *envtest.Environment
	// tokenKey verifies service-account tokens; set by ServiceAccountTokens.
	tokenKey *rsa.PublicKey
	issuer   string
}

// Option changes the control plane before Start starts it.
type Option func(tb testing.TB, env *Env, e *envtest.Environment)

// RepoRoot is the module's root directory, found from this file's location so
// that tests in any package find config/crd/bases.
func RepoRoot() string {
	_, file, _, _ := goruntime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Scheme holds the core kinds and ours.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := mptcpv1alpha1.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}

// Assets returns KUBEBUILDER_ASSETS, or skips the test with the reason when it
// is unset (and fails instead under CI=true, where a skip would hide a
// missing control plane).
func Assets(tb testing.TB) string {
	tb.Helper()
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir != "" {
		return dir
	}
	const reason = "KUBEBUILDER_ASSETS is not set: run `make envtest-assets` and export KUBEBUILDER_ASSETS=$(make -s print-envtest-assets), or use `make test-api`"
	if os.Getenv("CI") == "true" {
		tb.Fatal(reason)
	}
	tb.Skip(reason)
	return ""
}

// Start starts kube-apiserver and etcd with the CRDs of config/crd/bases and
// the given options, and stops them when tb ends.
func Start(tb testing.TB, opts ...Option) *Env {
	tb.Helper()
	assets := Assets(tb)
	env := newEnv(assets)
	for _, o := range opts {
		o(tb, env, env.env)
	}
	if err := env.start(); err != nil {
		tb.Fatalf("start control plane from %s: %v", assets, err)
	}
	tb.Cleanup(func() {
		if err := env.Stop(); err != nil {
			tb.Logf("stop control plane: %v", err)
		}
	})
	return env
}

// Launch is Start for programs that are not tests (the demo, the test bed's
// control plane): no options, errors returned, and the caller calls Stop.
func Launch(assets string) (*Env, error) {
	return LaunchWith(assets, nil)
}

// LaunchWith is Launch with configure called on the envtest environment
// before the API server starts, to change its flags or certificates (the test
// bed's cluster mode does).
func LaunchWith(assets string, configure func(*envtest.Environment) error) (*Env, error) {
	if assets == "" {
		return nil, errors.New("no kube-apiserver and etcd: set KUBEBUILDER_ASSETS (make envtest-assets; make -s print-envtest-assets)")
	}
	env := newEnv(assets)
	if configure != nil {
		if err := configure(env.env); err != nil {
			return nil, err
		}
	}
	if err := env.start(); err != nil {
		return nil, fmt.Errorf("start control plane from %s: %w", assets, err)
	}
	return env, nil
}

func newEnv(assets string) *Env {
	return &Env{env: &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(RepoRoot(), "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}}
}

func (env *Env) start() error {
	cfg, err := env.env.Start()
	if err != nil {
		return err
	}
	// Tests create many objects quickly; the default client-side rate limit
	// would measure the limiter, not the controller.
	cfg.QPS = 500
	cfg.Burst = 1000
	s := Scheme()
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		_ = env.env.Stop()
		return fmt.Errorf("client: %w", err)
	}
	env.Config, env.Client, env.Scheme = cfg, c, s
	return nil
}

// ClientCAFile is the API server's client CA (--client-ca-file): the CA of
// the client certificates of WriteUserKubeconfig, which a kubelet trusts to
// authenticate callers of its own API.
func (env *Env) ClientCAFile() string {
	if v := env.env.ControlPlane.GetAPIServer().Configure().Get("client-ca-file").Get(nil); len(v) > 0 {
		return v[0]
	}
	return ""
}

// Stop stops kube-apiserver and etcd.
func (env *Env) Stop() error { return env.env.Stop() }

// Namespace creates a namespace with labels and returns its name.
func (e *Env) Namespace(tb testing.TB, name string, labels map[string]string) string {
	tb.Helper()
	ns := &corev1.Namespace{}
	ns.Name = name
	ns.Labels = labels
	if err := e.Client.Create(context.Background(), ns); err != nil {
		tb.Fatalf("create namespace %s: %v", name, err)
	}
	return name
}

// WriteVerbs are the request verbs that change state.
var WriteVerbs = map[string]bool{
	"POST": true, "PUT": true, "PATCH": true, "DELETE": true, "DELETECOLLECTION": true, "APPLY": true,
}

// Writes is a count of writes per "group/resource[/subresource]" as seen by the
// API server.
type Writes map[string]float64

// Total sums the writes to the given resources ("mptcp.io/mptcpnodestates",
// "/nodes", "events.k8s.io/events"; a trailing "/status" names a
// subresource); all resources when none is given.
func (w Writes) Total(resources ...string) float64 {
	var sum float64
	for k, v := range w {
		if len(resources) == 0 {
			sum += v
			continue
		}
		for _, r := range resources {
			if k == r {
				sum += v
			}
		}
	}
	return sum
}

// Sub returns w minus before, dropping zeroes.
func (w Writes) Sub(before Writes) Writes {
	d := Writes{}
	for k, v := range w {
		if x := v - before[k]; x != 0 {
			d[k] = x
		}
	}
	return d
}

// CountWrites scrapes the API server's /metrics and sums
// apiserver_request_total over write verbs per resource, but for
// conflicts. Counting at the
// server, not in our client, catches writes from any client in the process.
func (e *Env) CountWrites(tb testing.TB) Writes {
	tb.Helper()
	rc, err := rest.RESTClientFor(restConfigForRaw(e.Config))
	if err != nil {
		tb.Fatalf("rest client: %v", err)
	}
	raw, err := rc.Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		tb.Fatalf("scrape /metrics: %v", err)
	}
	return parseWrites(raw)
}

func restConfigForRaw(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &corev1.SchemeGroupVersion
	c.APIPath = "/api"
	c.NegotiatedSerializer = clientgoscheme.Codecs.WithoutConversion()
	return c
}

// parseWrites reads the Prometheus text format line by line; only one metric
// family is needed, so a full parser would add nothing.
func parseWrites(raw []byte) Writes {
	w := Writes{}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		end := strings.LastIndexByte(line, '}')
		if end < 0 {
			continue
		}
		labels := parseLabels(line[len("apiserver_request_total{"):end])
		// A conflict (409) changes nothing: a controller writing from a
		// cache a moment behind meets one now and then, and reads again.
		if !WriteVerbs[labels["verb"]] || labels["code"] == "409" {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(line[end+1:]), 64)
		if err != nil {
			continue
		}
		key := labels["group"] + "/" + labels["resource"]
		if sub := labels["subresource"]; sub != "" {
			key += "/" + sub
		}
		w[key] += v
	}
	return w
}

func parseLabels(s string) map[string]string {
	out := map[string]string{}
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq < 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			break
		}
		key := s[:eq]
		rest := s[eq+2:]
		var val strings.Builder
		i := 0
		for ; i < len(rest) && rest[i] != '"'; i++ {
			if rest[i] == '\\' && i+1 < len(rest) {
				i++
			}
			val.WriteByte(rest[i])
		}
		out[key] = val.String()
		s = strings.TrimPrefix(rest[min(i+1, len(rest)):], ",")
	}
	return out
}

// ControllerUser is the controller's service account as the chart
// (charts/mptcp-operator) deploys it with its default values.
const ControllerUser = "system:serviceaccount:mptcp-system:mptcp-controller"

// AsController returns credentials of the controller's service account bound
// to the ClusterRole generated into config/rbac/role.yaml, and nothing else:
// a controller run with them fails if an RBAC marker is missing.
func (e *Env) AsController(tb testing.TB) *rest.Config {
	tb.Helper()
	ctx := context.Background()
	raw, err := os.ReadFile(filepath.Join(RepoRoot(), "config", "rbac", "role.yaml"))
	if err != nil {
		tb.Fatal(err)
	}
	role := &rbacv1.ClusterRole{}
	if err := yaml.UnmarshalStrict(raw, role); err != nil {
		tb.Fatalf("config/rbac/role.yaml: %v", err)
	}
	role.Name = "test-mptcp-controller"
	if err := e.Client.Create(ctx, role); err != nil {
		tb.Fatalf("create controller role: %v", err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: ControllerUser}},
	}
	if err := e.Client.Create(ctx, binding); err != nil {
		tb.Fatalf("bind controller role: %v", err)
	}
	cfg := rest.CopyConfig(e.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: ControllerUser, Groups: []string{"system:authenticated"}}
	return cfg
}

// Kubeconfig writes a kubeconfig for a new user in group system:masters and
// returns its path, for running real binaries against the control plane.
func (e *Env) Kubeconfig(tb testing.TB) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "kubeconfig")
	if err := e.WriteKubeconfig(path, "binary"); err != nil {
		tb.Fatal(err)
	}
	return path
}

// WriteKubeconfig writes to path a kubeconfig of a new user named user in
// group system:masters.
func (e *Env) WriteKubeconfig(path, user string) error {
	return e.WriteUserKubeconfig(path, user, "system:masters")
}

// WriteUserKubeconfig writes to path a kubeconfig with a client certificate
// for user in groups, signed by the API server's client CA: how a kubelet
// (system:node:NAME in system:nodes) or kube-controller-manager
// (system:kube-controller-manager) authenticates in a real cluster.
func (e *Env) WriteUserKubeconfig(path, user string, groups ...string) error {
	u, err := e.env.AddUser(envtest.User{Name: user, Groups: groups}, nil)
	if err != nil {
		return fmt.Errorf("add user: %w", err)
	}
	raw, err := u.KubeConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	return os.WriteFile(path, raw, 0o600)
}

// ApplyFile creates every object of a YAML file (several documents allowed),
// as the cluster's admin.
func (e *Env) ApplyFile(tb testing.TB, path string) {
	tb.Helper()
	CreateObjects(tb, e.Client, path)
}

// CreateObjects creates every object of a YAML file (several documents
// allowed) with c, in the file's order.
func CreateObjects(tb testing.TB, c client.Client, path string) {
	tb.Helper()
	for _, obj := range Objects(tb, path) {
		if err := c.Create(context.Background(), obj); err != nil {
			tb.Fatalf("%s: create %s %s: %v", path, obj.GetKind(), obj.GetName(), err)
		}
	}
}

// Objects decodes every object of a YAML (or JSON) file, several documents
// allowed, leaving out empty documents; an unreadable file fails tb.
func Objects(tb testing.TB, path string) []*unstructured.Unstructured {
	tb.Helper()
	objs, err := ReadObjects(path)
	if err != nil {
		tb.Fatal(err)
	}
	return objs
}

// ReadObjects is DecodeObjects of a file, its errors naming the file. It
// is the one reader of manifest files for tests and test beds alike (which
// cannot fail a testing.TB), so that all read "---", comments and JSON the
// same way.
func ReadObjects(path string) ([]*unstructured.Unstructured, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	objs, err := DecodeObjects(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return objs, nil
}

// DecodeObjects decodes every object of YAML (or JSON) data, several
// documents allowed, in order, leaving out empty documents (only comments,
// or nothing between two "---").
func DecodeObjects(data []byte) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		obj := &unstructured.Unstructured{}
		if err := dec.Decode(&obj.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		if len(obj.Object) > 0 {
			out = append(out, obj)
		}
	}
}
