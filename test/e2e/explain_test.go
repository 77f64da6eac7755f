package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/internal/explain"
	"github.com/mptcp-operator/mptcp-operator/internal/kubectlmptcp"
	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/nodes"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/release"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// kubectlMPTCP runs the kubectl mptcp plugin, built from cmd/kubectl-mptcp,
// against a bed's API server with an admin's kubeconfig.
type kubectlMPTCP struct {
	bin, kubeconfig string
}

func buildKubectlMPTCP(t *testing.T, env *testenv.Env) *kubectlMPTCP {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kubectl-mptcp")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/kubectl-mptcp")
	cmd.Dir = testenv.RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building kubectl-mptcp: %v\n%s", err, out)
	}
	return &kubectlMPTCP{bin: bin, kubeconfig: env.Kubeconfig(t)}
}

// run runs the plugin with args and -o json, decodes its output into out,
// and returns its exit code.
func (k *kubectlMPTCP) run(t *testing.T, out any, args ...string) int {
	t.Helper()
	cmd := exec.Command(k.bin, append([]string{"--kubeconfig", k.kubeconfig, "-o", "json"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	if code == 1 || code == 2 {
		t.Fatalf("kubectl mptcp %s: exit %d: %s", strings.Join(args, " "), code, stderr.String())
	}
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
		t.Fatalf("kubectl mptcp %s: %v: %s (stderr %s)", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return code
}

// explain is kubectl mptcp explain of pod name in namespace apps. It fails
// the test unless the exit code says whether a cause was found.
func (k *kubectlMPTCP) explain(t *testing.T, name string) explain.Explanation {
	t.Helper()
	var e explain.Explanation
	code := k.run(t, &e, "-n", appsNS, "explain", name)
	if (code == 3) != (len(e.Causes) > 0) {
		t.Errorf("kubectl mptcp explain %s: exit %d with causes %v: the exit code must say whether a cause was found", name, code, e.Causes)
	}
	return e
}

// requireCause fails the test unless kubectl mptcp explain of pod name
// names cause, within 20 s (the agent's counters and the node state's
// status follow what happened within a reconcile).
func (k *kubectlMPTCP) requireCause(t *testing.T, name string, cause explain.Cause) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		e := k.explain(t, name)
		if e.Has(cause) {
			t.Logf("explain %s: %v: %s", name, e.Causes, stepOf(e, cause))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("kubectl mptcp explain %s names %v, want %s; steps %+v", name, e.Causes, cause, e.Steps)
		}
		time.Sleep(time.Second)
	}
}

func stepOf(e explain.Explanation, c explain.Cause) string {
	for _, s := range e.Steps {
		if s.Cause == c {
			return s.Detail
		}
	}
	return ""
}

// Each pod is made to have one cause of a single subflow, and kubectl mptcp
// explain, through the API server alone (the agent's data through pods/exec
// in the agent's pod), names that cause: a pod no policy selects; a pod
// capped to one subflow; a client whose server does not speak MPTCP; a
// server whose policy blocks the path its client's joins arrive on; a
// server whose client's ACK dropped MPTCP because a middlebox stripped its
// SYN-ACK's MP_CAPABLE; a client one of whose paths lost its carrier.
// kubectl mptcp subflows shows a live connection's subflow on its path with
// its bytes, and status the nodes, paths and policies, the down path too.
// A real Prometheus scrapes the agents and the controller all along with the
// chart's alerts: at the end every alert and every panel of the chart's
// dashboard returns series, and the alerts of the down path and of node
// states made Degraded are pending or firing.
func testExplainAndAlertsNameWhatLimitsSubflows(t *testing.T) {
	kb := startKubeBed(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 3, LinkRate: "100mbit"})
	bed, c := kb.bed, kb.env.Client
	plugin := buildKubectlMPTCP(t, kb.env)
	ctx := background(t)
	prom := startPrometheus(t, kb)

	// preferredFirst: every connection's initial subflow takes fabric-a,
	// its join fabric-b.
	for _, p := range []string{
		`{"metadata":{"name":"spread"},"spec":{"namespaceSelector":{"matchLabels":{"mptcp.io/tenant":"enabled"}},
			"podSelector":{"matchLabels":{"case":"spread"}},"spread":{"mode":"preferredFirst","paths":[{"name":"fabric-a"},{"name":"fabric-b"}]}}}`,
		`{"metadata":{"name":"capped"},"spec":{"namespaceSelector":{"matchLabels":{"mptcp.io/tenant":"enabled"}},
			"podSelector":{"matchLabels":{"case":"capped"}},"maxSubflows":1,"spread":{"paths":[{"name":"fabric-a"},{"name":"fabric-b"}]}}}`,
		`{"metadata":{"name":"blocked"},"spec":{"namespaceSelector":{"matchLabels":{"mptcp.io/tenant":"enabled"}},
			"podSelector":{"matchLabels":{"case":"blocked"}},"spread":{"paths":[{"name":"fabric-a"}]},"blockedPaths":["fabric-b"]}}`,
	} {
		applyObject(t, c, &mptcpv1alpha1.MPTCPPolicy{}, `{"apiVersion":"mptcp.io/v1alpha1","kind":"MPTCPPolicy",`+p[1:])
	}
	// A tenant's decoy: a pod with the agent's labels and container name on
	// node 1, in a namespace listed before the release's. The plugin must
	// keep reading the chart's agent (the explanations below need its
	// counters), never exec into the decoy.
	kb.namespace(t, "aaa-decoy", nil)
	decoy := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "aaa-decoy", Name: "mptcp-agent-fake",
		Labels: map[string]string{"app.kubernetes.io/component": "agent", "app.kubernetes.io/name": "mptcp-operator"}},
		Spec: corev1.PodSpec{NodeName: framework.NodeName(bed.Node(1)), Containers: []corev1.Container{{
			Name: "agent", Image: kb.images[nodes.TrafficImage].Ref, ImagePullPolicy: corev1.PullNever, Args: []string{"echo", "-listen", ":7"}}}}}
	if err := c.Create(ctx, decoy); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); decoy.Status.Phase != corev1.PodRunning; time.Sleep(200 * time.Millisecond) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(decoy), decoy); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the decoy pod does not run: %+v", decoy.Status)
		}
	}
	// p1-3 and p2-3 stay unselected.
	cases := map[string]string{"p1-1": "capped", "p1-2": "spread", "p2-1": "spread", "p2-2": "blocked"}
	for name, value := range cases {
		pod := &corev1.Pod{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: appsNS, Name: name}, pod); err != nil {
			t.Fatal(err)
		}
		patch := fmt.Sprintf(`{"metadata":{"labels":{"case":%q}}}`, value)
		if err := c.Patch(ctx, pod, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
			t.Fatal(err)
		}
	}
	waitGatesTrue(t, kb, slices.Sorted(func(yield func(string) bool) {
		for name := range cases {
			if !yield(name) {
				return
			}
		}
	}))

	// A node state the controller rewrote as the pods came (their
	// placement) is "behind" until its agent applies it: status converges
	// within seconds.
	var status kubectlmptcp.Status
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		status = kubectlmptcp.Status{}
		plugin.run(t, &status, "status")
		if len(status.Nodes) != 2 || len(status.Policies) != 3 || len(status.Paths) != 3 {
			t.Fatalf("kubectl mptcp status: %+v, want 2 nodes, 3 policies, the examples' 3 paths", status)
		}
		settled := slices.IndexFunc(status.Nodes, func(n kubectlmptcp.NodeStatus) bool {
			return n.Agent != "applied" || n.Ready != "True" || len(n.Paths) != 2 || !n.Paths[0].Up() || !n.Paths[1].Up()
		}) < 0
		if settled {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kubectl mptcp status: nodes %+v after 20 s, want each agent applied, Ready, both paths up", status.Nodes)
		}
	}

	// Causes the API's objects show.
	if e := plugin.explain(t, "p1-3"); !slices.Equal(e.Causes, []explain.Cause{explain.CauseNotSelected}) {
		t.Errorf("explain p1-3 (no policy selects its labels): causes %v, want only NotSelected; steps %+v", e.Causes, e.Steps)
	}
	plugin.requireCause(t, "p1-1", explain.CauseCappedToOne)
	if e := plugin.explain(t, "p2-1"); len(e.Causes) != 0 {
		t.Errorf("explain p2-1 before any traffic: causes %v, want none; steps %+v", e.Causes, e.Steps)
	}

	// The peer does not speak MPTCP: a TCP server.
	client1 := bed.Pod(1, 2)
	wholeTransfer(t, ctx, bed, client1, bed.Pod(2, 3), 5801, false)
	plugin.requireCause(t, "p1-2", explain.CausePeerNotMPTCP)

	// Joins refused on a blocked path: p2-2's policy blocks fabric-b, where
	// p1-2's joins arrive. Meanwhile the connection's subflow on fabric-a
	// is live, with its bytes.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		wholeTransfer(t, ctx, bed, client1, bed.Pod(2, 2), 5802, true, "-duration", "4s")
	}()
	requireLiveSubflow(t, plugin, "p1-2", netip.AddrPortFrom(bed.Pod(2, 2).Addr, 5802), "fabric-a")
	wg.Wait()
	plugin.requireCause(t, "p2-2", explain.CauseJoinsRefused)

	// A middlebox strips the MP_CAPABLE of p2-1's SYN-ACKs: its connection
	// falls back after it negotiated MPTCP.
	var removes []func() error
	for k := 1; k <= 2; k++ {
		_, remove, err := bed.StripMPCapable(2, k)
		if err != nil {
			t.Fatal(err)
		}
		removes = append(removes, remove)
	}
	wholeTransfer(t, ctx, bed, client1, bed.Pod(2, 1), 5803, true)
	for _, remove := range removes {
		if err := remove(); err != nil {
			t.Fatal(err)
		}
	}
	plugin.requireCause(t, "p2-1", explain.CauseFallback)

	// A path down: node 1's fabric-b NIC loses its carrier.
	if err := bed.SetCarrier(1, 2, false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bed.SetCarrier(1, 2, true) })
	plugin.requireCause(t, "p1-2", explain.CausePathDown)
	plugin.run(t, &status, "status")
	i := slices.IndexFunc(status.Nodes, func(n kubectlmptcp.NodeStatus) bool { return n.Name == framework.NodeName(bed.Node(1)) })
	if i < 0 || slices.ContainsFunc(status.Nodes[i].Paths, func(p kubectlmptcp.NodePathState) bool { return p.Name == "fabric-b" && p.Up() }) {
		t.Errorf("kubectl mptcp status with node 1's nic2 down: %+v, want fabric-b down on node 1", status.Nodes)
	}

	// A path whose interface no node has: both node states are Degraded.
	applyObject(t, c, &mptcpv1alpha1.MPTCPPath{}, `{"apiVersion":"mptcp.io/v1alpha1","kind":"MPTCPPath","metadata":{"name":"fabric-x"},
		"spec":{"nodeSelector":{"matchLabels":{"mptcp.io/multipath":"true"}},"interface":{"name":"nic9"},"capacity":"10G"}}`)
	requireAlertsAndPanels(t, ctx, prom, framework.NodeName(bed.Node(1)))
	requirePreflight(t, kb, plugin)
}

// startPrometheus starts a real Prometheus in node 1's network namespace,
// scraping both agents and the controller as the chart's ServiceMonitor
// would (jobs named by their Services; over HTTPS with a token bound to
// mptcp-metrics-reader, as both serve their metrics by default) every
// second, with the chart's alerts.
func startPrometheus(t *testing.T, kb *kubeBed) *framework.Prometheus {
	t.Helper()
	bin := testutil.BuiltTool(t, "PROMETHEUS", "prometheus")
	var pods corev1.PodList
	if err := kb.env.Client.List(context.Background(), &pods, client.InNamespace("mptcp-system"),
		client.MatchingLabels{"app.kubernetes.io/component": "controller"}); err != nil || len(pods.Items) != 1 || pods.Items[0].Status.PodIP == "" {
		t.Fatalf("the controller's pod: %v (%d pods)", err, len(pods.Items))
	}
	var agents []string
	for _, n := range kb.bed.Nodes {
		agents = append(agents, netip.AddrPortFrom(n.NICs[0].Addr.Addr(), 9402).String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	prom, err := framework.StartPrometheus(ctx, kb.bed, kb.bed.Node(1), bin, framework.PrometheusOptions{
		Jobs: map[string][]string{
			"mptcp-agent-metrics":      agents,
			"mptcp-controller-metrics": {net.JoinHostPort(pods.Items[0].Status.PodIP, "8080")},
		},
		RuleFiles: []string{filepath.Join(release.Chart(), "files", "alerts.yaml")},
		Interval:  time.Second,
		Token:     kb.metricsReaderToken(t),
		HTTPS:     []string{"mptcp-agent-metrics", "mptcp-controller-metrics"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = prom.Stop() })
	return prom
}

// requireAlertsAndPanels checks the chart's alerts and dashboard against
// what prom scraped: every target is up; every alert evaluates without
// error, and each series selector of its expression returns series; every
// panel query of the dashboard returns series; and the alerts of the path
// down on node and the degraded node states are pending or firing.
func requireAlertsAndPanels(t *testing.T, ctx context.Context, prom *framework.Prometheus, node string) {
	t.Helper()
	targets, err := prom.Targets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(targets) != 3 {
		t.Errorf("prometheus scrapes %d targets, want both agents and the controller: %+v", len(targets), targets)
	}
	for _, tg := range targets {
		if tg.Health != "up" {
			t.Errorf("target %s is %s: %s", tg.ScrapeURL, tg.Health, tg.LastError)
		}
	}
	requireSeries := func(what, expr string) {
		t.Helper()
		selectors, err := prom.Selectors(ctx, expr)
		if err != nil || len(selectors) == 0 {
			t.Errorf("%s: %q: selectors %v, %v", what, expr, selectors, err)
		}
		for _, sel := range selectors {
			if got, err := prom.Query(ctx, sel); err != nil || len(got) == 0 {
				t.Errorf("%s: %q: its selector %s returns %d series (%v): a metric or label it names does not exist", what, expr, sel, len(got), err)
			}
		}
	}
	want := map[string]bool{"MPTCPPathDown": false, "MPTCPNodeStateDegraded": false}
	deadline := time.Now().Add(30 * time.Second)
	for {
		alerts, err := prom.Alerts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range alerts {
			switch name := a.Labels["alertname"]; {
			case name == "MPTCPPathDown" && a.Labels["path"] == "fabric-b" && strings.HasPrefix(a.Labels["instance"], "10.101.1.2:"):
				want[name] = true
			case name == "MPTCPNodeStateDegraded" && a.Labels["node"] == node && a.Labels["reason"] == "InterfaceMissing":
				want[name] = true
			}
		}
		if want["MPTCPPathDown"] && want["MPTCPNodeStateDegraded"] {
			t.Logf("prometheus: %d alerts pending or firing, the path's and the node state's among them", len(alerts))
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("alerts pending or firing %+v, want MPTCPPathDown for fabric-b on node 1 and MPTCPNodeStateDegraded for %s (found: %v)", alerts, node, want)
			break
		}
		time.Sleep(time.Second)
	}
	rules, err := prom.Rules(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) < 7 {
		t.Errorf("prometheus loaded %d rules from the chart's alerts, want all 7", len(rules))
	}
	for _, r := range rules {
		if r.Health != "ok" {
			t.Errorf("alert %s: health %s: %s", r.Name, r.Health, r.LastError)
		}
		requireSeries("alert "+r.Name, r.Query)
	}
	var dashboard struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	b, err := os.ReadFile(filepath.Join(release.Chart(), "files", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &dashboard); err != nil || len(dashboard.Panels) == 0 {
		t.Fatalf("the chart's dashboard: %v, %d panels", err, len(dashboard.Panels))
	}
	queries := 0
	for _, p := range dashboard.Panels {
		for _, tg := range p.Targets {
			queries++
			if got, err := prom.Query(ctx, tg.Expr); err != nil || len(got) == 0 {
				t.Errorf("panel %q: %q returns %d series (%v)", p.Title, tg.Expr, len(got), err)
			}
		}
	}
	t.Logf("prometheus: %d alerts evaluate and select series, %d panel queries return series", len(rules), queries)
}

// wholeTransfer sends 200 KB (or what args say) from client to a traffic server
// on server:port and fails the test unless the stream arrives whole.
func wholeTransfer(t *testing.T, ctx context.Context, bed *testbed.Bed, client, server *testbed.Pod, port int, mptcp bool, args ...string) {
	t.Helper()
	srv, err := bed.StartTrafficServer(ctx, bins.Traffic, server, port, mptcp)
	if err != nil {
		t.Error(err)
		return
	}
	defer srv.Stop()
	if len(args) == 0 {
		args = []string{"-bytes", "200000"}
	}
	sent, err := bed.Send(ctx, bins.Traffic, client, srv.Addr, true, args...)
	if err != nil {
		t.Error(err)
		return
	}
	got, err := srv.WaitReports(ctx, len(sent))
	if err != nil {
		t.Error(err)
		return
	}
	if _, err := testbed.MatchReports(sent, got); err != nil {
		t.Errorf("%s to %s:%d: %v", client.Name, server.Name, port, err)
	}
}

// waitGatesTrue waits until the mptcp.io/ready gate of each pod is True.
func waitGatesTrue(t *testing.T, kb *kubeBed, names []string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for _, name := range names {
		for {
			var pod corev1.Pod
			if err := kb.env.Client.Get(context.Background(), types.NamespacedName{Namespace: appsNS, Name: name}, &pod); err != nil {
				t.Fatal(err)
			}
			if slices.ContainsFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool {
				return string(c.Type) == mptcpv1alpha1.PodReadyCondition && c.Status == corev1.ConditionTrue
			}) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("pod %s: gate not True after a minute: %+v", name, pod.Status.Conditions)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// requireLiveSubflow waits until kubectl mptcp subflows of pod name lists a
// subflow to remote on path that carried bytes.
func requireLiveSubflow(t *testing.T, plugin *kubectlMPTCP, name string, remote netip.AddrPort, path string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		var s kubectlmptcp.PodSubflows
		plugin.run(t, &s, "-n", appsNS, "subflows", name)
		for _, c := range s.Connections {
			for _, sf := range c.Subflows {
				if sf.Remote == remote.String() && sf.Path == path && sf.Role == "initiator" && sf.TxBytes > 0 {
					t.Logf("subflows %s: connection %s, subflow %s -> %s on %s, %d bytes sent", name, c.Token, sf.Local, sf.Remote, sf.Path, sf.TxBytes)
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("kubectl mptcp subflows %s: %+v, want a subflow to %s on %s that sent bytes", name, s, remote, path)
		}
		time.Sleep(300 * time.Millisecond)
	}
}
