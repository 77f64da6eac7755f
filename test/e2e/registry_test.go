package e2e

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/nodes"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/release"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

// testInstalledFromARegistryAsAnAdminWould: the chart and its images pushed
// to a registry (go-containerregistry's, in this process), and installed as
// install.md tells an admin: `helm install oci://...` with one
// global.imageRegistry value. The nodes import only the sandbox and the
// tenants' images, so containerd pulls the controller's and the agent's
// from the registry, which counts the manifests each node asked for.
func testInstalledFromARegistryAsAnAdminWould(t *testing.T) {
	reg := startRegistry(t)
	cb := startChartBedWith(t, testbed.Config{Nodes: 2, NICs: 2, LinkRate: "100mbit"}, func(o *nodes.Options) {
		o.Registry = reg.host
		var keep []nodes.Image
		for _, im := range o.Images {
			if !strings.Contains(im.Ref, "/"+release.AgentImage+":") && !strings.Contains(im.Ref, "/"+release.ControllerImage+":") {
				keep = append(keep, im)
			}
		}
		o.Images = keep
	})
	for _, n := range cb.nodes.Nodes {
		reg.serveIn(t, "/var/run/netns/"+n.Bed.NetNS)
	}
	// Pushed as a release publishes them: the images under the chart's
	// repositories with the registry in front, the chart as an OCI artifact.
	for _, im := range []string{release.AgentImage, release.ControllerImage} {
		reg.pushImage(t, cb.images[im])
	}
	chart := reg.pushChart(t, cb.helm.Binary)

	start := time.Now()
	args := append([]string{chart.ref, "--version", chart.version, "--plain-http", "--set", "global.imageRegistry=" + reg.host}, kubeBedValues...)
	if out, err := cb.helm.Install(context.Background(), args[0], args[1:]...); err != nil {
		cb.logAgents(t)
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("helm install %s --version %s: controller and agents ready in %s", chart.ref, chart.version, time.Since(start).Round(100*time.Millisecond))
	t.Cleanup(func() { cb.uninstall(t) })

	var pods corev1.PodList
	if err := cb.c.List(context.Background(), &pods, client.InNamespace(release.Namespace)); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		for _, c := range p.Status.ContainerStatuses {
			if !strings.HasPrefix(c.Image, reg.host+"/") {
				t.Errorf("pod %s runs %s, not an image of the registry %s", p.Name, c.Image, reg.host)
			}
		}
	}
	for _, n := range cb.nodes.Nodes {
		ns := "/var/run/netns/" + n.Bed.NetNS
		if got := reg.manifestPulls(ns, release.AgentImage); got == 0 {
			t.Errorf("node %s's containerd never asked the registry for the agent's manifest", n.Name)
		}
	}
	t.Logf("manifest requests by node: %v", reg.pullsByListener())
}

// testRegistry is a registry served on the loopback of the machine (where
// helm runs) and of each node (where containerd pulls), on one port, one
// store.
type testRegistry struct {
	host    string // 127.0.0.1:PORT
	port    string
	handler http.Handler

	mu    sync.Mutex
	pulls map[string]map[string]int // listener (netns path, "" for the machine) -> repository -> manifest GETs
}

func startRegistry(t *testing.T) *testRegistry {
	t.Helper()
	r := &testRegistry{handler: registry.New(registry.Logger(log.New(io.Discard, "", 0))), pulls: map[string]map[string]int{}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.host = l.Addr().String()
	_, r.port, _ = net.SplitHostPort(r.host)
	r.serve(t, l, "")
	return r
}

// serveIn serves the registry on the loopback of the network namespace ns.
func (r *testRegistry) serveIn(t *testing.T, ns string) {
	t.Helper()
	var l net.Listener
	if err := netnsutil.Do(ns, func() (err error) {
		l, err = net.Listen("tcp", net.JoinHostPort("127.0.0.1", r.port))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	r.serve(t, l, ns)
}

func (r *testRegistry) serve(t *testing.T, l net.Listener, ns string) {
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if repo, _, ok := strings.Cut(strings.TrimPrefix(req.URL.Path, "/v2/"), "/manifests/"); ok && req.Method == http.MethodGet {
			r.mu.Lock()
			if r.pulls[ns] == nil {
				r.pulls[ns] = map[string]int{}
			}
			r.pulls[ns][repo]++
			r.mu.Unlock()
		}
		r.handler.ServeHTTP(w, req)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// manifestPulls counts the manifest GETs of repositories ending in /image
// that came through the listener of ns.
func (r *testRegistry) manifestPulls(ns, image string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for repo, c := range r.pulls[ns] {
		if strings.HasSuffix(repo, "/"+image) {
			n += c
		}
	}
	return n
}

func (r *testRegistry) pullsByListener() map[string]map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]map[string]int{}
	for ns, repos := range r.pulls {
		out[filepath.Base(ns)] = repos
	}
	return out
}

// pushImage pushes an image archive under the reference global.imageRegistry
// gives it: the registry in place of the reference's own.
func (r *testRegistry) pushImage(t *testing.T, im nodes.Image) {
	t.Helper()
	img, err := tarball.ImageFromPath(im.Archive, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, path, ok := strings.Cut(im.Ref, "/")
	if !ok {
		t.Fatalf("image reference %q has no registry", im.Ref)
	}
	ref, err := name.ParseReference(r.host+"/"+path, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}
}

type pushedChart struct{ ref, version string }

// pushChart packages the tree's chart and pushes it with helm push.
func (r *testRegistry) pushChart(t *testing.T, helm string) pushedChart {
	t.Helper()
	dir := t.TempDir()
	run := func(args ...string) {
		cmd := exec.Command(helm, args...)
		// helm keeps its registry configuration under HOME.
		cmd.Env = append(os.Environ(), "HOME="+dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("package", filepath.Join(testenv.RepoRoot(), "charts", "mptcp-operator"), "--destination", dir)
	pkgs, err := filepath.Glob(filepath.Join(dir, "mptcp-operator-*.tgz"))
	if err != nil || len(pkgs) != 1 {
		t.Fatalf("helm package wrote %v: %v", pkgs, err)
	}
	run("push", pkgs[0], "oci://"+r.host+"/charts", "--plain-http")
	version := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(pkgs[0]), "mptcp-operator-"), ".tgz")
	return pushedChart{ref: fmt.Sprintf("oci://%s/charts/mptcp-operator", r.host), version: version}
}
