package controlplane_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	mptcpv1alpha1 "github.com/mptcp-operator/mptcp-operator/api/v1alpha1"
	"github.com/mptcp-operator/mptcp-operator/e2e/framework"
	"github.com/mptcp-operator/mptcp-operator/hack/testbed"
	"github.com/mptcp-operator/mptcp-operator/hack/testbed/controlplane"
	"github.com/mptcp-operator/mptcp-operator/hack/testbed/kubelet"
	"github.com/mptcp-operator/mptcp-operator/internal/controller/testenv"
)

// The controller binary, run against the bed's Nodes and Pods as the
// kubelet stand-in registers them, compiles examples/ into node states that
// name the bed's NICs: the examples are valid for the bed.
func TestControllerCompilesExamplesForBed(t *testing.T) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1})
	ctx := context.Background()
	cp := controlplane.StartForTest(t)
	k, err := kubelet.Start(ctx, kubelet.Options{Bed: bed, Config: cp.Env.Config})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k.Stop() })

	examples, _ := filepath.Glob(filepath.Join(testenv.RepoRoot(), "examples", "*.yaml"))
	if err := cp.ApplyFiles(ctx, examples...); err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "demo", Labels: map[string]string{"mptcp.io/tenant": "enabled"}}}
	if err := cp.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	node := k.NodeName(bed.Node(1))
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: "demo"},
		Spec: corev1.PodSpec{
			NodeName:       node,
			ReadinessGates: []corev1.PodReadinessGate{{ConditionType: "mptcp.io/ready"}},
			Containers:     []corev1.Container{{Name: "app", Image: "none", Command: []string{"sleep", "600"}}},
		},
	}
	if err := cp.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}

	deadline := time.Now().Add(60 * time.Second)
	var st mptcpv1alpha1.MPTCPNodeState
	for {
		err := cp.Client.Get(ctx, client.ObjectKey{Name: node}, &st)
		if err == nil && len(st.Spec.Pods) == 1 && len(st.Spec.Pods[0].IPs) == 1 && len(st.Spec.Paths) == 2 {
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(cp.ControllerLog)
			t.Fatalf("node state of %s not compiled: %v, spec %+v\ncontroller log:\n%s", node, err, st.Spec, log)
		}
		select {
		case <-cp.ControllerExited():
			log, _ := os.ReadFile(cp.ControllerLog)
			t.Fatalf("controller exited:\n%s", log)
		case <-time.After(100 * time.Millisecond):
		}
	}
	var ifaces []string
	for _, p := range st.Spec.Paths {
		ifaces = append(ifaces, p.Name+"="+p.Interface.Name)
	}
	if want := []string{"fabric-a=nic1", "fabric-b=nic2"}; !slices.Equal(ifaces, want) {
		t.Errorf("paths of %s: %v, want %v", node, ifaces, want)
	}
	if got, want := st.Spec.Pods[0].IPs[0], bed.Pod(1, 1).Addr.String(); got != want {
		t.Errorf("pod IP in the node state %s, want the bed pod's %s", got, want)
	}
	if got := st.Spec.PodCIDRs; !slices.Equal(got, []string{bed.Node(1).PodCIDR.String()}) {
		t.Errorf("pod CIDRs %v, want [%s]", got, bed.Node(1).PodCIDR)
	}
}

// The relay answers the API server's address inside a node namespace, where
// an agent runs, with the API server itself.
func TestRelayReachesAPIServerFromNodeNamespace(t *testing.T) {
	assets := testenv.Assets(t)
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 1, NICs: 1, PodsPerNode: 0})
	cp, err := controlplane.Start(context.Background(), controlplane.Options{Assets: assets, Dir: t.TempDir(), Controller: "/bin/sleep"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Stop() })
	u, _ := url.Parse(cp.Env.Config.Host)
	if _, err := dialIn(bed.Node(1).NetNS, u.Host); err == nil {
		t.Fatalf("%s answered inside the node namespace before any relay: the test proves nothing", u.Host)
	}
	if _, err := cp.RelayInto(bed.Node(1).NetNS); err != nil {
		t.Fatal(err)
	}
	c, err := dialIn(bed.Node(1).NetNS, u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only proves an API server answers
	fmt.Fprintf(tc, "GET /livez HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", u.Host)
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		t.Fatalf("no HTTP answer through the relay: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusForbidden {
		t.Fatalf("unexpected status through the relay: %s", resp.Status)
	}
}

// dialIn connects to addr from inside namespace ns.
func dialIn(ns, addr string) (net.Conn, error) {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return nil, err
	}
	target, err := netns.GetFromName(ns)
	if err != nil {
		return nil, err
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		return nil, err
	}
	c, derr := net.DialTimeout("tcp", addr, 2*time.Second)
	if err := netns.Set(orig); err != nil {
		return nil, err // the thread stays locked and is retired
	}
	orig.Close()
	runtime.UnlockOSThread()
	return c, derr
}

// The whole chain without the demo's traffic: the controller compiles
// examples/ for a Pod the stand-in runs, the node's real agent (kube mode,
// through the relay) configures it and sets mptcp.io/ready, and only then
// does the stand-in start the workload.
func TestAgentGateStartsWorkload(t *testing.T) {
	bed := testbed.NewForTest(t, testbed.Config{Nodes: 2, NICs: 2, PodsPerNode: 1})
	ctx := context.Background()
	cp := controlplane.StartForTest(t)
	bins, err := framework.BuildBinaries(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := controlplane.AgentKubeMode(bins.Agent); err != nil {
		t.Fatal(err)
	}
	k, err := kubelet.Start(ctx, kubelet.Options{Bed: bed, Config: cp.Env.Config})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k.Stop() })
	examples, _ := filepath.Glob(filepath.Join(testenv.RepoRoot(), "examples", "*.yaml"))
	if err := cp.ApplyFiles(ctx, examples...); err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "demo", Labels: map[string]string{"mptcp.io/tenant": "enabled"}}}
	if err := cp.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(t.TempDir(), "started")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: "demo"},
		Spec: corev1.PodSpec{
			NodeName:       k.NodeName(bed.Node(1)),
			ReadinessGates: []corev1.PodReadinessGate{{ConditionType: "mptcp.io/ready"}},
			Containers: []corev1.Container{{Name: "app", Image: "none", Command: []string{"sh", "-c"},
				Args: []string{"touch " + marker + "; exec sleep 600"}}},
		},
	}
	if err := cp.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	// Without agents the pod runs (it has its IP) but its workload waits.
	deadline := time.Now().Add(30 * time.Second)
	for pod.Status.PodIP == "" {
		if time.Now().After(deadline) {
			t.Fatalf("pod got no IP: %+v", pod.Status)
		}
		time.Sleep(100 * time.Millisecond)
		if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second)
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the workload started before any agent ran")
	}

	configs := map[*testbed.Node]string{}
	for _, n := range bed.Nodes {
		cfg := framework.AgentConfig(bed, n, mptcpv1alpha1.CompiledRule{})
		cfg.Node = k.NodeName(n)
		raw, err := yaml.Marshal(cfg.Settings)
		if err != nil {
			t.Fatal(err)
		}
		configs[n] = filepath.Join(t.TempDir(), "agent.yaml")
		if err := os.WriteFile(configs[n], raw, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	agents, err := cp.StartAgents(ctx, bed, bins.Agent, k.NodeName, func(n *testbed.Node) []string { return []string{"-config", configs[n]} })
	t.Cleanup(func() { _ = controlplane.StopAgents(agents) })
	if err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(marker); err == nil {
			break
		}
		if time.Now().After(deadline) {
			_ = cp.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod)
			t.Fatalf("workload not started after the agents ran: conditions %+v\nagent stderr:\n%s", pod.Status.Conditions, agents[0].Proc.ErrOutput())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
		t.Fatal(err)
	}
	gate := false
	for _, c := range pod.Status.Conditions {
		gate = gate || (c.Type == "mptcp.io/ready" && c.Status == corev1.ConditionTrue)
	}
	if !gate {
		t.Errorf("workload started but the gate is not True: %+v", pod.Status.Conditions)
	}
}
