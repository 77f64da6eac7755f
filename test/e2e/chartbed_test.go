package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/mptcp-operator/mptcp-operator/test/framework"
	"github.com/mptcp-operator/mptcp-operator/test/testbed"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/controlplane"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/nodes"
	"github.com/mptcp-operator/mptcp-operator/test/testbed/release"
	"github.com/mptcp-operator/mptcp-operator/test/testenv"
	"github.com/mptcp-operator/mptcp-operator/test/testutil"
)

// chartBed is a test bed whose nodes are real Kubernetes nodes (a kubelet
// and a containerd each, test/testbed/nodes) of a cluster that has no
// operator yet: a test installs it with the Helm chart, as an admin does,
// and its controller and agents then run as the chart's pods.
type chartBed struct {
	bed    *testbed.Bed
	cp     *controlplane.ControlPlane
	c      client.Client
	nodes  *nodes.Cluster
	images nodes.Images
	helm   release.Helm
	// readerToken: metricsReaderToken's, once made.
	readerToken string
}

// startChartBed brings up a bed, a control plane with the cluster's
// controllers and scheduler but no operator, and real nodes with the
// images of this tree (make images' builder) imported, and those of other
// (an earlier release's); everything stops when the test ends.
func startChartBed(t *testing.T, cfg testbed.Config, other ...nodes.Image) *chartBed {
	t.Helper()
	return startChartBedWith(t, cfg, nil, other...)
}

// startChartBedWith is startChartBed with mod changing the nodes' options
// (nil: none).
func startChartBedWith(t *testing.T, cfg testbed.Config, mod func(*nodes.Options), other ...nodes.Image) *chartBed {
	t.Helper()
	testbed.RequireTools(t, testbed.CaptureTools...)
	nodes.RequireTools(t)
	helm := testutil.BuiltTool(t, "HELM", "helm")
	images := testImages(t)
	bed := testbed.NewForTest(t, cfg)
	cp, err := controlplane.Start(context.Background(), controlplane.Options{Assets: testenv.Assets(t), Dir: t.TempDir(), Cluster: true, NoOperator: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
	})
	imports := nodes.Images{}
	for name, im := range images {
		// The helm test's image only where the test runs helm test
		// (it passes it in other): every node imports what it is given.
		if name != nodes.ConformanceImage {
			imports[name] = im
		}
	}
	for i, im := range other {
		imports[fmt.Sprintf("other-%d", i)] = im
	}
	var mods []func(*nodes.Options)
	if mod != nil {
		mods = append(mods, mod)
	}
	cl := nodes.StartForTest(t, bed, cp, imports, mods...)
	return &chartBed{bed: bed, cp: cp, c: cp.Client, nodes: cl, images: images,
		helm: release.Helm{Binary: helm, Kubeconfig: cp.Kubeconfig, Timeout: 3 * time.Minute}}
}

// treeImages are this tree's images (controller, agent, traffic, libc-client, conformance, pause),
// built (or read from $MPTCP_TEST_IMAGES) once for the package; TestMain
// removes what it built.
var treeImages nodes.TestImages

func testImages(t *testing.T) nodes.Images {
	t.Helper()
	return treeImages.ForTest(t)
}

// install runs `helm install` of chart with this tree's images (imported
// on every node, pullPolicy Never) and extra values, and returns once the
// controller and every agent are ready (--wait). When the test ends the
// release is uninstalled if it still exists, and the agents must have left
// no pin, rule or route behind.
func (cb *chartBed) install(t *testing.T, chart string, images nodes.Images, values ...string) {
	t.Helper()
	args, err := release.ImageValues(images)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if out, err := cb.helm.Install(context.Background(), chart, append(args, values...)...); err != nil {
		cb.logAgents(t)
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("helm install: controller and agents ready in %s", time.Since(start).Round(100*time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			cb.logAgents(t)
		}
		if _, err := cb.helm.Status(context.Background()); err != nil {
			return // uninstalled by the test
		}
		cb.uninstall(t)
		for _, a := range cb.agents() {
			if err := a.Leftovers(); err != nil {
				t.Errorf("after helm uninstall: %v", err)
			}
		}
	})
}

// uninstall runs helm uninstall and waits until the chart's pods are gone
// (helm's --wait waits for the objects it deletes, not for the pods the
// garbage collector deletes after them): the agents have then stopped,
// and uninstalled themselves.
func (cb *chartBed) uninstall(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	start := time.Now()
	if out, err := cb.helm.Uninstall(ctx); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		var pods corev1.PodList
		if err := cb.c.List(ctx, &pods, client.InNamespace(release.Namespace)); err != nil {
			t.Fatal(err)
		}
		if len(pods.Items) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the chart's pods still exist a minute after helm uninstall: %d", len(pods.Items))
		}
	}
	t.Logf("helm uninstall: the chart's pods gone in %s", time.Since(start).Round(100*time.Millisecond))
}

// agents are the chart's agents, one per bed node, seen from the machine.
func (cb *chartBed) agents() []*framework.Agent {
	var out []*framework.Agent
	for i, n := range cb.bed.Nodes {
		out = append(out, framework.ChartAgent(cb.bed, n, filepath.Join(cb.nodes.Nodes[i].Dir, "run", "mptcp-operator")))
	}
	return out
}

// metricsReaderToken is a token of a service account the chart's
// mptcp-metrics-reader is bound to, made the first time it is asked for: the
// chart's agents and controller serve /metrics only to such tokens by
// default, as Prometheus would scrape them.
func (cb *chartBed) metricsReaderToken(t *testing.T) string {
	t.Helper()
	if cb.readerToken != "" {
		return cb.readerToken
	}
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "metrics-reader"}}
	if err := cb.c.Create(ctx, sa); err != nil {
		t.Fatal(err)
	}
	if err := cb.c.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "test-metrics-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "mptcp-metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: sa.Namespace, Name: sa.Name}},
	}); err != nil {
		t.Fatal(err)
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(6 * 3600))}}
	if err := cb.c.SubResource("token").Create(ctx, sa, tr); err != nil || tr.Status.Token == "" {
		t.Fatalf("a token of %s/%s: %v", sa.Namespace, sa.Name, err)
	}
	cb.readerToken = tr.Status.Token
	return cb.readerToken
}

// agentPod is the running agent pod of bed node n.
func (cb *chartBed) agentPod(t *testing.T, n *testbed.Node) *corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	if err := cb.c.List(context.Background(), &pods, client.InNamespace(release.Namespace),
		client.MatchingLabels{"app.kubernetes.io/component": "agent"}); err != nil {
		t.Fatal(err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName == framework.NodeName(n) && p.DeletionTimestamp == nil {
			return p
		}
	}
	t.Fatalf("no agent pod on %s", framework.NodeName(n))
	return nil
}

// agentPID is the agent process of bed node n's agent pod (not its
// sandbox's), found in the pod's cgroup.
func (cb *chartBed) agentPID(t *testing.T, n *testbed.Node) int {
	t.Helper()
	pod := cb.agentPod(t, n)
	for _, pid := range cb.nodes.Node(n.Index).PodPIDs(pod) {
		if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil && strings.TrimSpace(string(comm)) == "agent" {
			return pid
		}
	}
	t.Fatalf("no agent process in pod %s", pod.Name)
	return 0
}

// restarts is how often the kubelet restarted the agent container of node n.
func (cb *chartBed) restarts(t *testing.T, n *testbed.Node) int32 {
	t.Helper()
	for _, cs := range cb.agentPod(t, n).Status.ContainerStatuses {
		if cs.Name == "agent" {
			return cs.RestartCount
		}
	}
	return 0
}

// signalAgent sends sig to node n's agent process.
func (cb *chartBed) signalAgent(t *testing.T, n *testbed.Node, sig syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(cb.agentPID(t, n), sig); err != nil {
		t.Fatalf("%v to the agent of %s: %v", sig, framework.NodeName(n), err)
	}
}

// waitAgentRestarted waits until the kubelet has restarted node n's agent
// container after a kill (its restart count above before) and the new
// process is ready (it has reconciled once).
func (cb *chartBed) waitAgentRestarted(t *testing.T, n *testbed.Node, before int32) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		pod := cb.agentPod(t, n)
		for _, cs := range pod.Status.ContainerStatuses {
			if cs.Name == "agent" && cs.RestartCount > before && cs.Ready {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent of %s was not restarted and ready within a minute: %+v", framework.NodeName(n), pod.Status.ContainerStatuses)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// logAgents logs the end of every agent pod's log, for a failed test.
func (cb *chartBed) logAgents(t *testing.T) {
	var pods corev1.PodList
	if err := cb.c.List(context.Background(), &pods, client.InNamespace(release.Namespace)); err != nil {
		t.Logf("listing the chart's pods: %v", err)
		return
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		n := cb.nodes.NodeOf(p)
		if n == nil {
			continue
		}
		for _, c := range p.Spec.Containers {
			log, _ := n.ContainerLog(p, c.Name, "")
			if len(log) > 4000 {
				log = "..." + log[len(log)-4000:]
			}
			t.Logf("pod %s/%s container %s (phase %s):\n%s", p.Namespace, p.Name, c.Name, p.Status.Phase, log)
		}
	}
}

// podOption changes a workload pod's spec.
type podOption func(*corev1.Pod)

// workloadPods creates perNode pods on every node in namespace ns (labelled
// app=traffic; the namespace is created with labels unless it exists),
// each running the traffic image with the agent's readiness gate, and
// makes each a pod of the bed once the node gave it an address: bed.Pod(i,
// j) is pod j of node i, bed commands and traffic run in its network
// namespace. Pods are named p<i>-<j>.
func (cb *chartBed) workloadPods(t *testing.T, ns string, labels map[string]string, perNode int, opts ...podOption) {
	t.Helper()
	ctx := context.Background()
	cb.namespace(t, ns, labels)
	var pods []*corev1.Pod
	for _, n := range cb.bed.Nodes {
		for j := 1; j <= perNode; j++ {
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("p%d-%d", n.Index, j), Labels: map[string]string{"app": "traffic"}},
				Spec: corev1.PodSpec{
					NodeName:       framework.NodeName(n),
					ReadinessGates: []corev1.PodReadinessGate{{ConditionType: nodes.ReadyCondition}},
					// Something to run: the tests' traffic runs in
					// the pod's namespace from the machine.
					Containers: []corev1.Container{{
						Name: nodes.WorkloadContainer, Image: cb.images[nodes.TrafficImage].Ref, ImagePullPolicy: corev1.PullNever,
						Args: []string{"echo", "-listen", ":7"},
					}},
				},
			}
			for _, o := range opts {
				o(pod)
			}
			if err := cb.c.Create(ctx, pod); err != nil {
				t.Fatal(err)
			}
			pods = append(pods, pod)
		}
	}
	for _, pod := range pods {
		cb.attach(t, pod)
	}
}

// namespace creates namespace ns with labels, unless it exists.
func (cb *chartBed) namespace(t *testing.T, ns string, labels map[string]string) {
	t.Helper()
	err := cb.c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: labels}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// attach waits until pod runs with an address and makes it a bed pod.
func (cb *chartBed) attach(t *testing.T, pod *corev1.Pod) *testbed.Pod {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if err := cb.c.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			t.Fatal(err)
		}
		if pod.Status.PodIP != "" && len(cb.nodes.NodeOf(pod).PodPIDs(pod)) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s has no address after a minute: %+v", pod.Name, pod.Status)
		}
		time.Sleep(100 * time.Millisecond)
	}
	bp, err := cb.nodes.AttachPod(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	if err := cb.bed.AddPod(bp); err != nil {
		t.Fatal(err)
	}
	return bp
}
