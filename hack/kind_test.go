// Package hack tests hack/kind.sh, which needs Docker and so cannot run
// here: its dry run prints every command it would run, and writes the kind
// configuration it would use, which these tests check.
package hack

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

type kindNode struct {
	Role   string            `json:"role"`
	Image  string            `json:"image"`
	Labels map[string]string `json:"labels"`
}

type kindConfig struct {
	Kind       string     `json:"kind"`
	APIVersion string     `json:"apiVersion"`
	Name       string     `json:"name"`
	Nodes      []kindNode `json:"nodes"`
}

// dryRun runs hack/kind.sh --dry-run with env and returns each printed
// command as its words, and the output.
func dryRun(t *testing.T, env []string, args ...string) ([][]string, string, error) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{filepath.Join(testenv.RepoRoot(), "hack", "kind.sh"), "--dry-run"}, args...)...)
	// The tools by their plain names, whatever the caller's environment
	// says (make test exports HELM as the pinned binary's path).
	cmd.Env = append(os.Environ(), "KIND=kind", "DOCKER=docker", "KUBECTL=kubectl", "HELM=helm")
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	var cmds [][]string
	for _, line := range strings.Split(string(out), "\n") {
		if rest, ok := strings.CutPrefix(line, "run: "); ok {
			cmds = append(cmds, shellWords(rest))
		}
	}
	return cmds, string(out), err
}

// shellWords splits a line that printf %q quoted: words are separated by
// unescaped spaces, and a backslash escapes the next character.
func shellWords(line string) []string {
	var words []string
	var cur strings.Builder
	escaped := false
	for _, r := range line {
		switch {
		case escaped:
			cur.WriteRune(r)
			escaped = false
		case r == '\\':
			escaped = true
		case r == ' ':
			words = append(words, cur.String())
			cur.Reset()
		default:
			cur.WriteRune(r)
		}
	}
	return append(words, cur.String())
}

// find returns the commands that start with prefix.
func find(cmds [][]string, prefix ...string) [][]string {
	var found [][]string
	for _, c := range cmds {
		if len(c) >= len(prefix) && slices.Equal(c[:len(prefix)], prefix) {
			found = append(found, c)
		}
	}
	return found
}

func fakeImages(t *testing.T, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n+".tar"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// chartAgentNodeSelector is the chart's default agent.nodeSelector: the
// workers must carry it, or no agent would run on them.
func chartAgentNodeSelector(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "charts", "mptcp-operator", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		Agent struct {
			NodeSelector map[string]string `json:"nodeSelector"`
		} `json:"agent"`
	}
	if err := yaml.Unmarshal(b, &values); err != nil {
		t.Fatal(err)
	}
	return values.Agent.NodeSelector
}

func TestKindUpBuildsAMultiNICClusterAndInstallsTheChart(t *testing.T) {
	work := t.TempDir()
	images := fakeImages(t, "controller", "agent", "traffic")
	cmds, out, err := dryRun(t, []string{"KIND_WORKDIR=" + work, "IMAGES_DIR=" + images, "KIND_WORKERS=3", "KIND_NICS=2", "KIND_CLUSTER=mp"}, "up")
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, out)
	}

	// The cluster: a control plane and three workers, the workers labelled
	// for the chart's agents, every node on the pinned image.
	configPath := filepath.Join(work, "kind-config.yaml")
	create := find(cmds, "kind", "create", "cluster")
	if len(create) != 1 || !slices.Contains(create[0], "--config") || create[0][slices.Index(create[0], "--config")+1] != configPath {
		t.Fatalf("kind create cluster with the rendered config: %v", create)
	}
	raw, err := os.ReadFile(configPath)
	if err != nil {
		t.Fatal(err)
	}
	var cfg kindConfig
	if err := yaml.UnmarshalStrict(raw, &cfg); err != nil {
		t.Fatalf("kind config: %v\n%s", err, raw)
	}
	if cfg.Kind != "Cluster" || cfg.APIVersion != "kind.x-k8s.io/v1alpha4" || cfg.Name != "mp" {
		t.Errorf("kind config header %s %s %s", cfg.Kind, cfg.APIVersion, cfg.Name)
	}
	selector := chartAgentNodeSelector(t)
	workers := 0
	for _, n := range cfg.Nodes {
		if !strings.HasPrefix(n.Image, "kindest/node:v") {
			t.Errorf("node image %q is not a pinned kindest/node", n.Image)
		}
		switch n.Role {
		case "worker":
			workers++
			for k, v := range selector {
				if n.Labels[k] != v {
					t.Errorf("a worker lacks the agent's node selector %s=%s: %v", k, v, n.Labels)
				}
			}
		case "control-plane":
			if len(n.Labels) != 0 {
				t.Errorf("the control plane is labelled %v: no agent runs there, it has no fabric NICs", n.Labels)
			}
		default:
			t.Errorf("node role %q", n.Role)
		}
	}
	if workers != 3 {
		t.Errorf("%d workers, want 3", workers)
	}

	// Two fabrics, each its own subnet; every worker on each with its own
	// address, its NIC renamed nic1 or nic2 as examples/paths.yaml names them.
	nets := find(cmds, "docker", "network", "create")
	if len(nets) != 2 || nets[0][len(nets[0])-1] == nets[1][len(nets[1])-1] {
		t.Fatalf("fabrics %v", nets)
	}
	connects := find(cmds, "docker", "network", "connect")
	if len(connects) != 2*3 {
		t.Errorf("%d NICs connected, want 6 (3 workers x 2 fabrics): %v", len(connects), connects)
	}
	addrs := map[string]bool{}
	for _, c := range connects {
		addrs[c[4]] = true
	}
	if len(addrs) != 6 {
		t.Errorf("fabric addresses are not distinct: %v", connects)
	}
	for _, node := range []string{"mp-worker", "mp-worker2", "mp-worker3"} {
		for _, nic := range []string{"nic1", "nic2"} {
			if len(find(cmds, "docker", "exec", node, "ip", "link", "set", nic, "up")) != 1 {
				t.Errorf("%s has no %s up", node, nic)
			}
		}
	}

	// The images of make images, then the chart using them as loaded.
	var loaded []string
	for _, c := range find(cmds, "kind", "load", "image-archive") {
		if c[len(c)-2] != "--name" || c[len(c)-1] != "mp" {
			t.Errorf("image loaded into another cluster: %v", c)
		}
		loaded = append(loaded, filepath.Base(c[3]))
		if filepath.Dir(c[3]) != images {
			t.Errorf("image archive %s is not from IMAGES_DIR %s", c[3], images)
		}
	}
	if !slices.Equal(loaded, []string{"controller.tar", "agent.tar", "traffic.tar"}) {
		t.Errorf("loaded %v", loaded)
	}
	install := find(cmds, "helm", "upgrade", "--install", "mptcp")
	if len(install) != 1 {
		t.Fatalf("helm install: %v", install)
	}
	for _, want := range []string{"controller.image.pullPolicy=Never", "agent.image.pullPolicy=Never", filepath.Join(testenv.RepoRoot(), "charts", "mptcp-operator")} {
		if !slices.Contains(install[0], want) {
			t.Errorf("helm install %v lacks %s", install[0], want)
		}
	}
	if i, l := slices.IndexFunc(cmds, func(c []string) bool { return c[0] == "helm" }), slices.IndexFunc(cmds, func(c []string) bool { return c[0] == "kind" && c[1] == "load" }); i < l {
		t.Error("the chart is installed before the images are loaded")
	}
}

func TestKindUpRefusesToStartWithoutTheImages(t *testing.T) {
	images := fakeImages(t, "controller", "traffic")
	_, out, err := dryRun(t, []string{"KIND_WORKDIR=" + t.TempDir(), "IMAGES_DIR=" + images}, "up")
	if err == nil {
		t.Fatalf("kind.sh up ran without agent.tar:\n%s", out)
	}
	if !strings.Contains(out, "agent.tar is missing: run make images") {
		t.Errorf("the refusal does not say what to do:\n%s", out)
	}
}

func TestKindDownRemovesClusterRoutersAndFabrics(t *testing.T) {
	cmds, out, err := dryRun(t, []string{"KIND_NICS=3"}, "down")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(find(cmds, "kind", "delete", "cluster", "--name", "mptcp")) != 1 ||
		len(find(cmds, "docker", "rm", "-f")) != 3 || len(find(cmds, "docker", "network", "rm")) != 3 {
		t.Errorf("down does not remove the cluster, 3 routers and 3 fabrics:\n%s", out)
	}
}

// e2e runs the conformance test against the kind cluster with its own
// kubeconfig and the traffic image make images named; print-image reads
// that name from images.json, as e2e does.
func TestKindE2ERunsTheConformanceTestOnTheCluster(t *testing.T) {
	work, images := t.TempDir(), t.TempDir()
	cmds, out, err := dryRun(t, []string{"KIND_WORKDIR=" + work, "IMAGES_DIR=" + images, "KIND_CLUSTER=mp", "NAMESPACE=ops"}, "e2e")
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, out)
	}
	want := [][]string{
		{"kind", "get", "kubeconfig", "--name", "mp"},
		{"go", "-C", testenv.RepoRoot(), "test", "-count=1", "-v", "-run", "^TestInstalledOperator$", "./test/e2e/conformance/", "-args",
			"-conformance.kubeconfig=" + filepath.Join(work, "kubeconfig"), "-conformance.traffic-image=ghcr.io/mptcp-operator/traffic:" + appVersion(t),
			"-conformance.namespace=ops"},
	}
	if !slices.EqualFunc(cmds, want, slices.Equal) {
		t.Errorf("e2e runs\n%q\nwant\n%q", cmds, want)
	}

	manifest := `{"images": [
  {"name": "agent", "ref": "registry.example/agent:v9", "archive": "agent.tar"},
  {"name": "traffic", "ref": "registry.example/traffic:v9", "archive": "traffic.tar"}
]}`
	if err := os.WriteFile(filepath.Join(images, "images.json"), []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", filepath.Join(testenv.RepoRoot(), "hack", "kind.sh"), "print-image", "traffic")
	cmd.Env = append(os.Environ(), "IMAGES_DIR="+images)
	got, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(got)) != "registry.example/traffic:v9" {
		t.Errorf("print-image traffic: %q, %v; want registry.example/traffic:v9", got, err)
	}
}

// appVersion is the chart's appVersion, the tag of the images it runs.
func appVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "charts", "mptcp-operator", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^appVersion: *"?([^"\s]+)"?`).FindSubmatch(b)
	if m == nil {
		t.Fatal("Chart.yaml has no appVersion")
	}
	return string(m[1])
}
