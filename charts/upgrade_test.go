package charts

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	chartrelease "github.com/mptcp-operator/mptcp-operator/test/testbed/release"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// `helm upgrade --reuse-values` from the oldest chart works. Helm then
// renders the new chart with the release's values, the previous chart's
// defaults included and the new chart's left out, so every key added since
// must be optional in the schema and defaulted by the templates. A real helm
// installs the oldest chart (chartrelease.OldestChart, from git)
// into a real API server and upgrades it to this chart with --reuse-values,
// which keeps the release's values as they were; then with
// --reset-then-reuse-values, which brings the new chart's defaults. The
// API server accepts every object of each (no node runs them: the upgrade
// under traffic is the e2e's, TestChart).
func helmUpgradeReuseValuesFromTheOldestChart(t *testing.T) {
	helm := testutil.BuiltTool(t, "HELM", "helm")
	old := t.TempDir()
	archive := exec.Command("sh", "-c", "git archive "+chartrelease.OldestChart+" charts/mptcp-operator | tar -x -C "+old)
	archive.Dir = testenv.RepoRoot()
	if out, err := archive.CombinedOutput(); err != nil {
		testutil.Unavailable(t, "the oldest chart (git archive %s): %v: %s", chartrelease.OldestChart, err, out)
	}
	env := testenv.Start(t)
	kubeconfig := env.Kubeconfig(t)
	home := t.TempDir()
	command := func(args ...string) *exec.Cmd {
		cmd := exec.Command(helm, append(args, "--kubeconfig", kubeconfig, "--namespace", chartrelease.Namespace)...)
		cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
			"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
		return cmd
	}
	run := func(args ...string) string {
		t.Helper()
		out, err := command(args...).CombinedOutput()
		if err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args[:2], " "), err, out)
		}
		return string(out)
	}
	values := func() map[string]any {
		t.Helper()
		var v map[string]any
		if err := json.Unmarshal([]byte(run("get", "values", chartrelease.Name, "--all", "--output", "json")), &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	// The test's API server has the CRDs already (this tree's, which serve
	// the previous release's objects too).
	run("install", chartrelease.Name, filepath.Join(old, "charts", "mptcp-operator"), "--create-namespace", "--skip-crds")
	if _, ok := values()["webhook"]; ok {
		t.Fatalf("the oldest chart's values have a webhook key: %s is not the chart before the webhook", chartrelease.OldestChart)
	}

	run("upgrade", chartrelease.Name, chartDir(), "--reuse-values")
	v := values()
	if _, ok := v["webhook"]; ok {
		t.Error("after --reuse-values the release has the new chart's webhook defaults: Helm no longer works as this test assumes")
	}
	manifest := run("get", "manifest", chartrelease.Name)
	for _, want := range []string{"kind: DaemonSet", "kind: Deployment", "-metrics-addr=:9402"} {
		if !strings.Contains(manifest, want) {
			t.Errorf("the release after --reuse-values renders no %q", want)
		}
	}
	if strings.Contains(manifest, "kind: MutatingWebhookConfiguration") || strings.Contains(manifest, "-join-holdoff") {
		t.Error("after --reuse-values the chart renders keys the release's values lack (the webhook, -join-holdoff) instead of leaving them to the binaries' defaults")
	}

	run("upgrade", chartrelease.Name, chartDir(), "--reset-then-reuse-values")
	if _, ok := values()["webhook"]; !ok {
		t.Error("after --reset-then-reuse-values the release lacks the new chart's webhook defaults")
	}
	if manifest := run("get", "manifest", chartrelease.Name); !strings.Contains(manifest, "kind: MutatingWebhookConfiguration") {
		t.Error("after --reset-then-reuse-values the chart renders no webhook, on by default")
	}

	// helm deletes a test hook's namespace by name, whoever made it: a
	// namespace of the test's name that is not the release's refuses the
	// upgrade that would make helm test take it.
	testNS := env.Namespace(t, chartrelease.Namespace+"-conformance", map[string]string{"team": "payments"})
	if out, err := command("upgrade", chartrelease.Name, chartDir(), "--reuse-values").CombinedOutput(); err == nil || !strings.Contains(string(out), "namespace "+testNS+" exists and is not this release's helm test namespace") {
		t.Errorf("helm upgrade with a foreign namespace %s where helm test makes its own: %v\n%s", testNS, err, out)
	}
}
