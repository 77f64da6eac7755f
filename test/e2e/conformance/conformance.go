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
// a fifth of the bytes (its per-path counters: scraped at the agent's
// address over HTTPS with a token allowed to get /metrics when the agents'
// metrics need one, through the API server's proxy to the agent pod when
// they do not). RunVM does the same with a KubeVirt VM as the server
// (vm.go).
//
// Run by an admin (go test with a kubeconfig), it makes a namespace of its
// own; run by the chart's helm test, whose ServiceAccount may create
// nothing cluster-wide, it works in the namespace the chart made for it
// (TestNamespace) and creates only pods there.
package conformance

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
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
	// TestNamespace, when set, is where the check runs its pods (the
	// chart's helm test makes it, with the roles its pods need); empty: the
	// check makes a namespace of its own, which needs an admin's rights.
	TestNamespace string
	// MetricsAuth says the agents serve /metrics over HTTPS to authorized
	// tokens only (the chart's agent.metricsAuth.enabled): the check then
	// scrapes the agent's address itself with a token allowed to get
	// /metrics, which the API server's proxy would not forward.
	MetricsAuth bool
	// MetricsCA is a file holding the CA of the agents' certificate and
	// MetricsServerName the name it carries (agent.metricsAuth.certSecret);
	// without a CA the check does not verify the agent (the agents'
	// self-signed certificates cannot be).
	MetricsCA, MetricsServerName string
	// metricsToken is a token allowed to get /metrics when Config carries
	// none (an admin's client certificate); set by Run.
	metricsToken string
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

	ns := env.TestNamespace
	var pods []*corev1.Pod
	if ns == "" {
		ns = "mptcp-conformance-" + randomSuffix()
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
		if env.MetricsAuth {
			env.metricsToken = metricsReaderToken(t, ctx, cs, ns)
		}
	} else {
		// The chart's namespace outlives the check until helm deletes it:
		// the check's pods go before Run returns, for the same reason.
		defer deletePods(t, cs, &pods)
	}
	// A failed run says what its pods went through in its own output, which
	// is all `helm test --logs` shows once helm has deleted them.
	defer func() {
		if t.Failed() {
			describePods(t, cs, pods)
		}
	}()

	server := nodes.TrafficPod(ns, "server", receiver, env.TrafficImage, map[string]string{"app": "server"}, []corev1.EnvVar{nodes.PodIPEnv},
		"serve", "-listen", fmt.Sprintf("$(POD_IP):%d", serverPort), "-mptcp", "-warmup", "0s", "-window", "2s")
	setPullPolicy(server, env.PullPolicy)
	if err := c.Create(ctx, server); err != nil {
		t.Fatal(err)
	}
	pods = append(pods, server)
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
	pods = append(pods, client)
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

// pathTxBytes reads the agent's per-path byte counters: at its address
// with a token when its metrics need one, else through the API server's
// proxy to its pod.
func pathTxBytes(t *testing.T, cs kubernetes.Interface, env Env, agent string) map[string]float64 {
	t.Helper()
	var body []byte
	var err error
	if env.MetricsAuth {
		body, err = scrapeAgent(t, context.Background(), cs, env, agent)
	} else {
		body, err = cs.CoreV1().Pods(env.AgentNamespace).ProxyGet("http", agent, fmt.Sprint(env.AgentMetricsPort), "/metrics", nil).DoRaw(context.Background())
		if err != nil {
			err = fmt.Errorf("through the API server's proxy: %w", err)
		}
	}
	if err != nil {
		t.Fatalf("agent %s's /metrics: %v", agent, err)
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

// scrapeAgent gets agent's /metrics over HTTPS at its pod's address (the
// node's: the agent runs on the host's network), as Prometheus does, with
// a token allowed to get /metrics. The agent's certificate is verified
// against env.MetricsCA when there is one (agent.metricsAuth.certSecret
// with a ca.crt). The self-signed certificates agents make without
// certSecret cannot be verified, so for them this one read skips
// verification: whoever answered on the agent's address would get the
// check's token, which may only get /metrics, list nodes, read the
// release's pods and run baseline pods in the test's namespace until helm
// deletes its ServiceAccount (an admin's run sends a reader's token made
// for it, never the admin's credentials).
func scrapeAgent(t *testing.T, ctx context.Context, cs kubernetes.Interface, env Env, agent string) ([]byte, error) {
	t.Helper()
	pod, err := cs.CoreV1().Pods(env.AgentNamespace).Get(ctx, agent, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if pod.Status.PodIP == "" {
		return nil, fmt.Errorf("agent pod %s has no address yet", agent)
	}
	token, err := env.token()
	if err != nil {
		return nil, err
	}
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12}
	pem, err := os.ReadFile(env.MetricsCA)
	switch {
	case env.MetricsCA != "" && err == nil && len(pem) > 0:
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s holds no PEM certificate", env.MetricsCA)
		}
		tlsConfig.RootCAs, tlsConfig.ServerName = roots, env.MetricsServerName
	case env.MetricsCA != "" && err != nil && !os.IsNotExist(err):
		return nil, err
	default:
		t.Logf("not verifying agent %s's certificate: no CA given, or the certificate's Secret holds no ca.crt", agent)
		tlsConfig.InsecureSkipVerify = true
	}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfig}}
	url := "https://" + net.JoinHostPort(pod.Status.PodIP, fmt.Sprint(env.AgentMetricsPort)) + "/metrics"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s (agent.metricsAddress loopback serves no other host): %w", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s: %.200s", url, resp.Status, body)
	}
	return body, nil
}

// token is the bearer token the check scrapes agents with: the one made
// for it, else its own (the pod's ServiceAccount under helm test, read
// again for each scrape since the kubelet rotates it).
func (env Env) token() (string, error) {
	if env.metricsToken != "" {
		return env.metricsToken, nil
	}
	if f := env.Config.BearerTokenFile; f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		return strings.TrimSpace(string(b)), nil
	}
	if env.Config.BearerToken != "" {
		return env.Config.BearerToken, nil
	}
	return "", fmt.Errorf("no bearer token to scrape the agents with")
}

// metricsReaderToken makes a ServiceAccount in ns, binds it to the chart's
// ClusterRole mptcp-metrics-reader and returns a token of it: an admin's
// run scrapes the agents with that, never with the admin's own
// credentials. The binding is deleted when the test ends, the
// ServiceAccount with ns.
func metricsReaderToken(t *testing.T, ctx context.Context, cs kubernetes.Interface, ns string) string {
	t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "metrics-reader", Namespace: ns}}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-metrics-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "mptcp-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: ns}},
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cs.RbacV1().ClusterRoleBindings().Delete(context.Background(), crb.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting ClusterRoleBinding %s: %v", crb.Name, err)
		}
	})
	expiry := int64(time.Hour / time.Second)
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa.Name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// deletePods deletes the check's pods and waits until they, and so their
// sandboxes, are gone.
func deletePods(t *testing.T, cs kubernetes.Interface, pods *[]*corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	for _, p := range *pods {
		if err := cs.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting pod %s/%s: %v", p.Namespace, p.Name, err)
		}
	}
	for _, p := range *pods {
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
			_, err := cs.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("pod %s/%s still there 2 minutes after its deletion (%v)", p.Namespace, p.Name, err)
				break
			}
		}
	}
}

// describePods logs what the pods' status and every container's log say,
// for a failed run.
func describePods(t *testing.T, cs kubernetes.Interface, pods []*corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	limit := int64(64 << 10)
	for _, p := range pods {
		cur, err := cs.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			t.Logf("pod %s: %v", p.Name, err)
			continue
		}
		t.Logf("pod %s on node %s: phase %s, conditions %+v, init containers %+v, containers %+v", cur.Name, cur.Spec.NodeName,
			cur.Status.Phase, cur.Status.Conditions, cur.Status.InitContainerStatuses, cur.Status.ContainerStatuses)
		for _, c := range append(slices.Clone(cur.Spec.InitContainers), cur.Spec.Containers...) {
			raw, err := cs.CoreV1().Pods(cur.Namespace).GetLogs(cur.Name, &corev1.PodLogOptions{Container: c.Name, LimitBytes: &limit}).DoRaw(ctx)
			t.Logf("pod %s, container %s, log (%v):\n%s", cur.Name, c.Name, err, raw)
		}
	}
}
