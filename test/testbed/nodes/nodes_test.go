package nodes_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/mptcp-operator/mptcp-operator/internal/netnsutil"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/controlplane"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/nodes"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
)

// Two beds' nodes become real Kubernetes nodes (kubelet, containerd, runc,
// CNI ptp) registered Ready with the bed's API server; a server pod on node 2
// and a client pod on node 1, both from the traffic image, exchange an MPTCP
// stream that crosses the bed's NICs and arrives byte for byte; the pod
// reaches the API server with its own service-account token. Stopping the
// nodes and the bed leaves no process, mount namespace, cgroup, directory or
// namespace behind.
func TestRealNodesRunPodsThatTalkMPTCP(t *testing.T) {
	testbed.RequireRoot(t)
	nodes.RequireTools(t)
	images := testImages(t)
	var bed *testbed.Bed
	var fp []nodeFootprint
	// Registered first, so it runs last: after the nodes, the bed and the
	// control plane are gone.
	t.Cleanup(func() {
		if bed != nil {
			assertNothingLeft(t, bed, fp)
		}
	})
	bed = testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2})
	cp := startCluster(t)
	ctx := context.Background()
	start := time.Now()
	c, err := nodes.Start(ctx, nodes.Options{
		Bed: bed, ControlPlane: cp, Assets: testenv.Assets(t),
		Images: images.All(), SandboxImage: images[nodes.PauseImage].Ref,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("stop the real nodes: %v", err)
		}
	})
	t.Logf("2 real nodes Ready in %s", time.Since(start).Round(100*time.Millisecond))

	for _, n := range c.Nodes {
		node := &corev1.Node{}
		if err := cp.Client.Get(ctx, client.ObjectKey{Name: n.Name}, node); err != nil {
			t.Fatal(err)
		}
		if node.Spec.PodCIDR != n.Bed.PodCIDR.String() || node.Labels[nodes.LabelMultipath] != "true" ||
			!strings.HasPrefix(node.Status.NodeInfo.ContainerRuntimeVersion, "containerd://") {
			t.Errorf("node %s: podCIDR %q, labels %v, runtime %q", n.Name, node.Spec.PodCIDR, node.Labels, node.Status.NodeInfo.ContainerRuntimeVersion)
		}
	}

	server, serverPod := startServerOnNode2(t, cp, c)
	if !c.Node(2).Bed.PodCIDR.Contains(serverPod.Addr) || !strings.HasPrefix(serverPod.HostIf, "veth") {
		t.Fatalf("server pod %s: want an address of %s routed over a ptp veth, got host interface %q", serverPod.Addr, c.Node(2).Bed.PodCIDR, serverPod.HostIf)
	}
	t.Logf("server pod %s on %s, host interface %s", serverPod.Addr, c.Node(2).Name, serverPod.HostIf)
	assertPodReachesAPIServer(t, c.Node(2), server, serverPod)

	_, txBefore, err := bed.NICCounters(c.Node(1).Bed, 1)
	if err != nil {
		t.Fatal(err)
	}
	const size = 8 << 20
	w := bed.Watch(t)
	client1 := trafficPod("client", c.Node(1).Name, "send", "-to", serverPod.Addr.String()+":5201", "-mptcp",
		"-conns", "1", "-bytes", fmt.Sprint(size), "-seed", "14", "-json")
	if err := cp.Client.Create(ctx, client1); err != nil {
		t.Fatal(err)
	}
	client1 = waitPod(t, cp, c, client1, corev1.PodSucceeded)
	fp = footprint(c)
	sent := decodeLines[testbed.SenderReport](t, c.Node(1), client1)
	assertLogsThroughAPIServer(t, cp, c.Node(1), client1)
	var got []testbed.ServerReport
	deadline := time.Now().Add(20 * time.Second)
	for len(got) == 0 && time.Now().Before(deadline) {
		got = decodeLines[testbed.ServerReport](t, c.Node(2), server)
		time.Sleep(100 * time.Millisecond)
	}
	if len(sent) != 1 || len(got) != 1 {
		t.Fatalf("want one report from each end, got %d sent and %d received", len(sent), len(got))
	}
	w.Match(sent, got)
	w.Close()
	if !sent[0].MPTCP || !got[0].MPTCP || got[0].Bytes != size {
		t.Fatalf("want %d bytes over MPTCP at both ends: sent %+v, received %+v", size, sent[0], got[0])
	}
	_, txAfter, err := bed.NICCounters(c.Node(1).Bed, 1)
	if err != nil {
		t.Fatal(err)
	}
	if tx := txAfter - txBefore; tx < size {
		t.Fatalf("node 1's nic1 sent %d bytes during a %d-byte transfer: the stream did not cross the bed's NIC", tx, size)
	}
	t.Logf("%d bytes from %s to %s over MPTCP, sha256 %.12s, node 1 nic1 sent %d bytes", size, sent[0].Local, got[0].Local, got[0].SHA256, txAfter-txBefore)
}

// startCluster starts the API server as a cluster with real nodes needs it,
// without the operator.
func startCluster(t *testing.T) *controlplane.ControlPlane {
	t.Helper()
	start := time.Now()
	cp, err := controlplane.Start(context.Background(), controlplane.Options{
		Assets: testenv.Assets(t), Dir: t.TempDir(), Cluster: true, NoOperator: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("API server, kube-controller-manager and kube-scheduler up in %s", time.Since(start).Round(100*time.Millisecond))
	t.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			t.Errorf("stop control plane: %v", err)
		}
	})
	return cp
}

func trafficPod(name, node string, args ...string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "traffic", Name: name},
		Spec: corev1.PodSpec{
			NodeName:      node,
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "traffic", Image: images[nodes.TrafficImage].Ref, ImagePullPolicy: corev1.PullNever, Args: args,
			}},
		},
	}
}

// waitPod waits until the pod reaches phase, failing early (with its
// container's log) when it ends otherwise.
func waitPod(t *testing.T, cp *controlplane.ControlPlane, c *nodes.Cluster, pod *corev1.Pod, phase corev1.PodPhase) *corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		cur := &corev1.Pod{}
		if err := cp.Client.Get(context.Background(), client.ObjectKeyFromObject(pod), cur); err != nil {
			t.Fatal(err)
		}
		if cur.Status.Phase == phase {
			return cur
		}
		ended := cur.Status.Phase == corev1.PodSucceeded || cur.Status.Phase == corev1.PodFailed
		if ended || time.Now().After(deadline) {
			log, _ := c.NodeOf(cur).ContainerLog(cur, "traffic", "")
			t.Fatalf("pod %s: phase %s, want %s; status %+v\ncontainer log:\n%s", pod.Name, cur.Status.Phase, phase, cur.Status, log)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// decodeLines decodes the JSON lines of a pod's stdout.
func decodeLines[T any](t *testing.T, n *nodes.Node, pod *corev1.Pod) []T {
	t.Helper()
	log, err := n.ContainerLog(pod, "traffic", "stdout")
	if err != nil {
		t.Fatal(err)
	}
	var out []T
	sc := bufio.NewScanner(strings.NewReader(log))
	for sc.Scan() {
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("pod %s: %q: %v", pod.Name, sc.Text(), err)
		}
		out = append(out, v)
	}
	return out
}

// assertPodReachesAPIServer does what an in-cluster client in the pod does:
// the API server at KUBERNETES_SERVICE_HOST:PORT from the container's
// environment, from the pod's network namespace, trusting the CA and bearing
// the token the kubelet mounted. The API server must say the caller is the
// pod's service account, bound to the pod and its node.
func assertPodReachesAPIServer(t *testing.T, n *nodes.Node, pod *corev1.Pod, bedPod *testbed.Pod) {
	t.Helper()
	pids := n.PodPIDs(pod)
	var env map[string]string
	var root string
	for _, pid := range pids {
		e := procEnv(pid)
		if e["KUBERNETES_SERVICE_HOST"] != "" {
			env, root = e, fmt.Sprintf("/proc/%d/root", pid)
		}
	}
	if env == nil {
		t.Fatalf("no process of pod %s has KUBERNETES_SERVICE_HOST", pod.Name)
	}
	sa := filepath.Join(root, "var/run/secrets/kubernetes.io/serviceaccount")
	token, err := os.ReadFile(filepath.Join(sa, "token"))
	if err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(filepath.Join(sa, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	addr := net.JoinHostPort(env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"])
	var conn net.Conn
	err = netnsutil.Do("/var/run/netns/"+bedPod.NetNS, func() error {
		var err error
		conn, err = net.DialTimeout("tcp", addr, 5*time.Second)
		return err
	})
	if err != nil {
		t.Fatalf("dial %s from pod %s: %v", addr, pod.Name, err)
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext:     func(context.Context, string, string) (net.Conn, error) { return conn, nil },
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: env["KUBERNETES_SERVICE_HOST"]},
	}}
	body := `{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`
	req, _ := http.NewRequest(http.MethodPost, "https://"+addr+"/apis/authentication.k8s.io/v1/selfsubjectreviews", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("pod %s to the API server at %s: %v", pod.Name, addr, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var review struct {
		Status struct {
			UserInfo struct {
				Username string              `json:"username"`
				Extra    map[string][]string `json:"extra"`
			} `json:"userInfo"`
		} `json:"status"`
	}
	if err := json.Unmarshal(raw, &review); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("self subject review from pod %s: %s: %s", pod.Name, resp.Status, raw)
	}
	u := review.Status.UserInfo
	if u.Username != "system:serviceaccount:traffic:default" || len(u.Extra["authentication.kubernetes.io/node-name"]) != 1 ||
		u.Extra["authentication.kubernetes.io/node-name"][0] != n.Name {
		t.Fatalf("pod %s is %q with extra %v, want the default service account bound to node %s", pod.Name, u.Username, u.Extra, n.Name)
	}
	t.Logf("pod %s reached the API server at %s as %s (node %s)", pod.Name, addr, u.Username, n.Name)
}

func procEnv(pid int) map[string]string {
	raw, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	env := map[string]string{}
	for _, kv := range strings.Split(string(raw), "\x00") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	return env
}

// A run that dies with real nodes up (no Stop) leaves containerd, kubelet,
// shims and pods running, cgroups and state directories behind; the bed's
// Sweep, which the next run calls for stale beds, removes all of it from the
// bed's prefix alone.
func TestSweepRemovesRealNodesOfACrashedRun(t *testing.T) {
	testbed.RequireRoot(t)
	nodes.RequireTools(t)
	images := testImages(t)
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 1, NICs: 1})
	cp := startCluster(t)
	ctx := context.Background()
	c, err := nodes.Start(ctx, nodes.Options{
		Bed: bed, ControlPlane: cp, Assets: testenv.Assets(t),
		Images: images.All(), SandboxImage: images[nodes.PauseImage].Ref,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "traffic"}}); err != nil {
		t.Fatal(err)
	}
	pod := trafficPod("server", c.Node(1).Name, "serve", "-listen", "0.0.0.0:5201")
	if err := cp.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	pod = waitPod(t, cp, c, pod, corev1.PodRunning)
	if _, err := c.AttachPod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	fp := footprint(c)
	if len(fp[0].procs) < 5 {
		t.Fatalf("want containerd, kubelet, a shim, the pod's sandbox and container running, got %v", fp[0].procs)
	}

	if err := testbed.Sweep(bed.Name); err != nil {
		t.Fatalf("sweep: %v", err)
	}
	assertNothingLeft(t, bed, fp)
	// Unlike a crashed run, this process still holds the node's mount
	// namespace open (Node.mountNSRef); Stop after a sweep finds nothing to
	// stop and lets it go.
	if err := c.Stop(); err != nil {
		t.Fatalf("stop after sweep: %v", err)
	}
}

// assertLogsThroughAPIServer reads a container's log as kubectl logs does,
// from the API server, which reaches the kubelet through its egress proxy
// from inside the node, and compares it with the kubelet's file.
func assertLogsThroughAPIServer(t *testing.T, cp *controlplane.ControlPlane, n *nodes.Node, pod *corev1.Pod) {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cp.Env.Config)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := cs.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: "traffic"}).DoRaw(context.Background())
	if err != nil {
		t.Fatalf("logs of pod %s through the API server: %v", pod.Name, err)
	}
	file, err := n.ContainerLog(pod, "traffic", "")
	if err != nil {
		t.Fatal(err)
	}
	if string(raw) != file {
		t.Fatalf("logs of pod %s through the API server:\n%s\nin the kubelet's file:\n%s", pod.Name, raw, file)
	}
}

// startServerOnNode2 runs an MPTCP traffic server pod on node 2, in
// namespace traffic, and attaches the bed to it.
func startServerOnNode2(t *testing.T, cp *controlplane.ControlPlane, c *nodes.Cluster) (*corev1.Pod, *testbed.Pod) {
	t.Helper()
	ctx := context.Background()
	if err := cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "traffic"}}); err != nil {
		t.Fatal(err)
	}
	server := trafficPod("server", c.Node(2).Name, "serve", "-listen", "0.0.0.0:5201", "-mptcp")
	if err := cp.Client.Create(ctx, server); err != nil {
		t.Fatal(err)
	}
	server = waitPod(t, cp, c, server, corev1.PodRunning)
	serverPod, err := c.AttachPod(ctx, server)
	if err != nil {
		t.Fatal(err)
	}
	return server, serverPod
}
