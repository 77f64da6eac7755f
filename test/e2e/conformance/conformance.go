// Package conformance checks an installed mptcp-operator on any cluster, as
// an admin would after `helm install`: through the API server alone, with
// no access to the nodes. It needs two nodes that run the agent with the
// paths of examples/paths.yaml and the policy of examples/policy-spread.yaml
// applied, and the traffic image on both. The chart's `helm test` runs its
// test binary as a pod (the conformance image); the e2e suite does so on the
// test bed's real nodes
// (TestChart/ChartInstalledAsAnAdminDoesSpreadsAndUninstallsWithoutATrace), and
// hack/kind.sh runs it on kind.
//
// What it asserts: a pod's MPTCP connections to a pod on another node
// arrive whole (the hashes the two ends report agree), and the sending
// node's agent steered them over at least two paths, each carrying at least
// a fifth of the bytes (its per-path counters, read through the API
// server's proxy to the agent pod). RunVM does the same with a KubeVirt VM
// as the server (vm.go).
package conformance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/nodes"
)

// Env is the cluster to check.
type Env struct {
	// Config reaches the API server as an admin.
	Config *rest.Config
	// TrafficImage is the reference of the traffic image on the nodes.
	TrafficImage string
	// PullPolicy of the traffic image (Never for imported images).
	PullPolicy corev1.PullPolicy
	// AgentNamespace is where the chart runs the agents (its release
	// namespace); AgentMetricsPort is the chart's agent.metricsPort.
	AgentNamespace   string
	AgentMetricsPort int
	// Duration of the transfer.
	Duration time.Duration
}

const (
	multipathLabel = "mptcp.io/multipath"
	serverPort     = 7100
	conns          = 2
	// minPathShare is the least share of the sent bytes each of two
	// paths must carry: the examples' weighted spread gives them half each.
	minPathShare = 0.2
)

// Run checks the cluster of env; every failure is the test's.
func Run(t *testing.T, env Env) {
	t.Helper()
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(env.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sender, receiver, agent := pickNodes(t, ctx, cs, env)
	t.Logf("sending from node %s (agent %s) to node %s", sender, agent, receiver)

	ns := "mptcp-conformance-" + randomSuffix()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{"mptcp.io/tenant": "enabled"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Gone before Run returns: the caller may check that the nodes are
	// as they were (the chart install test does, after uninstalling).
	defer deleteNamespace(t, cs, ns)
	if err := nodes.AllowAwait(ctx, c, ns); err != nil {
		t.Fatal(err)
	}

	server := nodes.TrafficPod(ns, "server", receiver, env.TrafficImage, map[string]string{"app": "server"}, []corev1.EnvVar{nodes.PodIPEnv},
		"serve", "-listen", fmt.Sprintf("$(POD_IP):%d", serverPort), "-mptcp", "-warmup", "0s", "-window", "2s")
	setPullPolicy(server, env.PullPolicy)
	if err := c.Create(ctx, server); err != nil {
		t.Fatal(err)
	}
	if err := nodes.WaitStarted(ctx, c, server, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	waitLog(t, cs, server, "listening on", time.Minute)

	before := pathTxBytes(t, cs, env, agent)
	client := nodes.TrafficPod(ns, "client", sender, env.TrafficImage, map[string]string{"app": "client"}, nil,
		"send", "-to", fmt.Sprintf("%s:%d", server.Status.PodIP, serverPort), "-mptcp", "-json",
		"-conns", fmt.Sprint(conns), "-duration", env.Duration.String(), "-seed", "11")
	setPullPolicy(client, env.PullPolicy)
	if err := c.Create(ctx, client); err != nil {
		t.Fatal(err)
	}
	waitSucceeded(t, c, client, 2*time.Minute+env.Duration)
	sent := nodes.JSONLines[testbed.SenderReport](podLog(t, cs, client))
	var got []testbed.ServerReport
	for deadline := time.Now().Add(30 * time.Second); len(got) < len(sent) && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		got = nodes.JSONLines[testbed.ServerReport](podLog(t, cs, server))
	}
	if len(sent) != conns {
		t.Fatalf("the client reported %d connections, want %d:\n%s", len(sent), conns, podLog(t, cs, client))
	}
	if _, err := testbed.MatchReports(sent, got); err != nil {
		t.Fatalf("the streams did not arrive whole: %v", err)
	}
	var total float64
	for _, r := range sent {
		total += float64(r.Bytes)
	}

	after := pathTxBytes(t, cs, env, agent)
	var carried []string
	for path, n := range after {
		share := (n - before[path]) / total
		t.Logf("path %s carried %.0f bytes from %s, %.0f%% of what the client sent", path, n-before[path], sender, 100*share)
		if share >= minPathShare {
			carried = append(carried, path)
		}
	}
	if len(carried) < 2 {
		t.Errorf("the agent of %s steered the transfer over %v; want at least two paths with %.0f%% each", sender, carried, 100*minPathShare)
	}
}

// pickNodes returns two Ready nodes labelled for multipath, sorted by name,
// and the agent pod of the first.
func pickNodes(t *testing.T, ctx context.Context, cs kubernetes.Interface, env Env) (sender, receiver, agent string) {
	t.Helper()
	list, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: multipathLabel + "=true"})
	if err != nil {
		t.Fatal(err)
	}
	var ready []string
	for _, n := range list.Items {
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				ready = append(ready, n.Name)
			}
		}
	}
	slices.Sort(ready)
	if len(ready) < 2 {
		t.Fatalf("%d Ready nodes labelled %s=true, want two", len(ready), multipathLabel)
	}
	return ready[0], ready[1], agentOn(t, ctx, cs, env, ready[0])
}

// randomSuffix names a namespace of one run.
func randomSuffix() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func setPullPolicy(pod *corev1.Pod, p corev1.PullPolicy) {
	if p == "" {
		return
	}
	for i := range pod.Spec.InitContainers {
		pod.Spec.InitContainers[i].ImagePullPolicy = p
	}
	for i := range pod.Spec.Containers {
		pod.Spec.Containers[i].ImagePullPolicy = p
	}
}

// pathTxBytes reads the agent's per-path byte counters through the API
// server's proxy to its pod.
func pathTxBytes(t *testing.T, cs kubernetes.Interface, env Env, agent string) map[string]float64 {
	t.Helper()
	body, err := cs.CoreV1().Pods(env.AgentNamespace).ProxyGet("http", agent, fmt.Sprint(env.AgentMetricsPort), "/metrics", nil).DoRaw(context.Background())
	if err != nil {
		t.Fatalf("agent %s's /metrics through the API server: %v", agent, err)
	}
	s, err := framework.ParseScrape(body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, m := range s["mptcp_agent_path_tx_bytes_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "path" {
				out[l.GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("agent %s exports no mptcp_agent_path_tx_bytes_total: has it any path?", agent)
	}
	return out
}

// podLog is the logs of the pod's workload container, through the API.
func podLog(t *testing.T, cs kubernetes.Interface, pod *corev1.Pod) string {
	t.Helper()
	raw, err := cs.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: nodes.WorkloadContainer}).DoRaw(context.Background())
	if err != nil {
		t.Fatalf("logs of %s: %v", pod.Name, err)
	}
	return string(raw)
}

func waitLog(t *testing.T, cs kubernetes.Interface, pod *corev1.Pod, want string, timeout time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(200 * time.Millisecond) {
		log := podLog(t, cs, pod)
		if strings.Contains(log, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not log %q within %v:\n%s", pod.Name, want, timeout, log)
		}
	}
}

func waitSucceeded(t *testing.T, c client.Client, pod *corev1.Pod, timeout time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(200 * time.Millisecond) {
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(pod), pod); err != nil {
			t.Fatal(err)
		}
		switch pod.Status.Phase {
		case corev1.PodSucceeded:
			return
		case corev1.PodFailed:
			t.Fatalf("%s failed: %+v", pod.Name, pod.Status.ContainerStatuses)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not done after %v: phase %s", pod.Name, timeout, pod.Status.Phase)
		}
	}
}

// deleteNamespace deletes ns and waits until it, and so its pods and their
// sandboxes, are gone.
func deleteNamespace(t *testing.T, cs kubernetes.Interface, ns string) {
	t.Helper()
	ctx := context.Background()
	if err := cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		t.Errorf("deleting namespace %s: %v", ns, err)
		return
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		_, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("namespace %s still there 2 minutes after its deletion (%v)", ns, err)
			return
		}
	}
}
