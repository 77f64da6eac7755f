// Package release installs, upgrades and uninstalls the Helm chart on a test
// bed's cluster (test/testbed/nodes on a controlplane started with Cluster and
// NoOperator) with the helm binary `make` builds, as an admin does:
// `helm install mptcp charts/mptcp-operator -n mptcp-system --create-namespace`
// with only the values a cluster without a registry needs (images imported
// into every node, so pullPolicy Never). The e2e tests and `make demo` share
// it. See docs/testbed.md, "The chart on real nodes".
package release

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/mptcp-operator/mptcp-operator/test/testbed/nodes"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

// PreviousChart is the release a chart upgrade starts from: the commit of
// main that is the last release (chart 0.17.0, images 0.15.0). The upgrade
// test builds its chart and images from source. With each release, set it
// to the commit that release was cut from and run
// TestChart/HelmUpgradeUnderTrafficReplacesAgentsOneNodeAtATime.
const PreviousChart = "23f81d6"

// OldestChart is the first chart that ran on the test bed's real nodes
// (88bc912: before the pod webhook, join holdoff and agents that know their
// DaemonSet); no earlier revision has a chart. `helm upgrade --reuse-values`
// from it proves every values key added since is optional
// (TestHelmChart/HelmUpgradeReuseValuesFromTheOldestChart).
const OldestChart = "88bc912"

// Names the chart is installed under, as docs/install.md says.
const (
	Name      = "mptcp"
	Namespace = "mptcp-system"
	// AgentDaemonSet and ControllerDeployment are the chart's fixed names.
	AgentDaemonSet       = "mptcp-agent"
	ControllerDeployment = "mptcp-controller"
	// AgentMetricsPort is the chart's default agent.metricsPort.
	AgentMetricsPort = 9402
)

// Names of the images the chart runs, as images.json names them.
const (
	AgentImage      = "agent"
	ControllerImage = "controller"
)

// Chart is the chart of this tree.
func Chart() string { return filepath.Join(testenv.RepoRoot(), "charts", "mptcp-operator") }

// Helm runs one helm binary against one cluster.
type Helm struct {
	// Binary is helm (`make -s print-helm`; make test sets HELM).
	Binary string
	// Kubeconfig is an admin kubeconfig of the cluster.
	Kubeconfig string
	// Timeout bounds each install, upgrade and uninstall, --wait included.
	Timeout time.Duration
}

// ImageValues are the --set arguments that make the chart run images that
// were imported into every node (nodes.Options.Images) rather than pulled:
// each component's repository and tag, from the image's reference, and
// pullPolicy Never (docs/install.md, "Into each node's runtime").
func ImageValues(images nodes.Images) ([]string, error) {
	var out []string
	for key, name := range map[string]string{"agent": AgentImage, "controller": ControllerImage} {
		im, ok := images[name]
		if !ok {
			return nil, fmt.Errorf("no %s image among %v", name, images)
		}
		repo, tag, ok := splitRef(im.Ref)
		if !ok {
			return nil, fmt.Errorf("image %s: reference %q has no tag", name, im.Ref)
		}
		out = append(out,
			"--set", key+".image.repository="+repo,
			"--set", key+".image.tag="+tag,
			"--set", key+".image.pullPolicy=Never")
	}
	// The helm test's images, where the images have them (an earlier
	// release's chart has no tests key).
	if _, ok := images[nodes.ConformanceImage]; ok {
		for key, name := range map[string]string{"tests.image": nodes.ConformanceImage, "tests.trafficImage": nodes.TrafficImage} {
			repo, tag, ok := splitRef(images[name].Ref)
			if !ok {
				return nil, fmt.Errorf("image %s: reference %q has no tag", name, images[name].Ref)
			}
			out = append(out, "--set", key+".repository="+repo, "--set", key+".tag="+tag, "--set", key+".pullPolicy=Never")
		}
		// The check's transfer: long enough to see both paths carry.
		out = append(out, "--set", "tests.duration=3s")
	}
	return out, nil
}

// splitRef splits registry/path:tag at the tag's colon (a registry may have
// a port: the colon after the last slash).
func splitRef(ref string) (repo, tag string, ok bool) {
	i := strings.LastIndex(ref, ":")
	if i < 0 || strings.Contains(ref[i:], "/") {
		return "", "", false
	}
	return ref[:i], ref[i+1:], true
}

// Install runs `helm install mptcp CHART -n mptcp-system --create-namespace
// --wait` with args (values), and returns helm's output.
func (h Helm) Install(ctx context.Context, chart string, args ...string) (string, error) {
	return h.run(ctx, append([]string{"install", Name, chart, "--namespace", Namespace, "--create-namespace", "--wait"}, args...)...)
}

// Upgrade runs `helm upgrade mptcp CHART -n mptcp-system --wait` with args.
// --wait returns once every agent pod of the new revision is ready, i.e.
// after the DaemonSet's rolling update.
func (h Helm) Upgrade(ctx context.Context, chart string, args ...string) (string, error) {
	return h.run(ctx, append([]string{"upgrade", Name, chart, "--namespace", Namespace, "--wait"}, args...)...)
}

// Uninstall runs `helm uninstall mptcp -n mptcp-system --wait`, which
// returns once the release's objects, their pods included, are gone.
func (h Helm) Uninstall(ctx context.Context) (string, error) {
	return h.run(ctx, "uninstall", Name, "--namespace", Namespace, "--wait")
}

// Test runs `helm test mptcp -n mptcp-system --logs`: the chart's
// conformance check as a pod. Its output holds the pod's log.
func (h Helm) Test(ctx context.Context) (string, error) {
	return h.run(ctx, "test", Name, "--namespace", Namespace, "--logs")
}

// Status runs `helm status mptcp -n mptcp-system`.
func (h Helm) Status(ctx context.Context) (string, error) {
	return h.run(ctx, "status", Name, "--namespace", Namespace)
}

func (h Helm) run(ctx context.Context, args ...string) (string, error) {
	if h.Binary == "" || h.Kubeconfig == "" {
		return "", errors.New("release: helm binary and kubeconfig are required")
	}
	timeout := h.Timeout
	if timeout == 0 {
		timeout = 3 * time.Minute
	}
	args = append(args, "--kubeconfig", h.Kubeconfig, "--timeout", timeout.String())
	cmd := exec.CommandContext(ctx, h.Binary, args...)
	// helm keeps its cache, configuration and data under HOME by default;
	// a throwaway place keeps runs apart and the machine's helm untouched.
	dir, err := os.MkdirTemp("", "helm-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(dir, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(dir, "config"),
		"HELM_DATA_HOME="+filepath.Join(dir, "data"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %w\n%s", strings.Join(args[:2], " "), err, out)
	}
	return string(out), nil
}
